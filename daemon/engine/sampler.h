/* sampler.h - picks the next token from a logit vector.
 *
 * Greedy, temperature, top-k, top-p, min-p, repetition / presence /
 * frequency penalties, and a per-sequence seeded RNG so that the same seed
 * gives the same tokens whatever else runs.  Also returns the
 * log-probability of the sampled token (under the full, unfiltered softmax
 * of the penalized logits, as llama.cpp's n_probs reports it).
 * A struct sampler belongs to one sequence and one thread at a time
 * (the engine thread).  A grammar constrains the draw through a token mask
 * (sampler_sample_masked).
 */
#ifndef LLMD_SAMPLER_H
#define LLMD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

struct sampler_params {
	float temperature;       /* <= 0: greedy (argmax, lowest id on ties) */
	int32_t top_k;           /* <= 0: off */
	float top_p;             /* >= 1: off */
	float min_p;             /* 0: off; must be in [0, 1] */
	float repeat_penalty;    /* 1: off (llama.cpp semantics: divide positive
	                            logits, multiply negative ones) */
	float presence_penalty;  /* 0: off */
	float frequency_penalty; /* 0: off */
	int32_t penalty_last_n;  /* tokens of history the penalties look at; 0: off */
	uint64_t seed;           /* RNG seed */
};

/* llama.cpp-like defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * penalties off, last_n 64, seed 0. */
void sampler_params_default(struct sampler_params *p);

struct sampler;

#define SAMPLER_MAX_LAST_N (1 << 20) /* the longest penalty history (a client-controlled
                                        allocation) */

/* 0, or -EINVAL with a message naming the parameter as clients name it
 * (temperature, top_p, min_p, repeat_penalty, presence_penalty,
 * frequency_penalty, repeat_last_n) in ERR (may be NULL).  Any thread. */
int sampler_params_check(const struct sampler_params *p, char *err, size_t errlen);

/* Returns 0 or -EINVAL (bad parameter: NaN, negative top_p...) / -ENOMEM. */
int sampler_new(const struct sampler_params *p, int32_t n_vocab, struct sampler **ret);
void sampler_free(struct sampler *s); /* NULL-safe */

/* A new sampler with SRC's parameters in SRC's state (sampler_copy_state).
 * 0 or -ENOMEM. */
int sampler_dup(const struct sampler *src, struct sampler **ret);

/* Puts DST (made with SRC's parameters and vocabulary, as sampler_dup makes
 * it) in SRC's state: its RNG and penalty history, so that it draws what SRC
 * would draw from the same logits.  A draft model samples its proposals
 * with such a copy, with the very random numbers the target's draws will
 * take.  0 or -EINVAL. */
int sampler_copy_state(struct sampler *dst, const struct sampler *src);

/* Whether S draws at random (temperature > 0) rather than taking the argmax. */
int sampler_draws(const struct sampler *s);

/* Records a token in the penalty history (prompt tokens and sampled ones). */
void sampler_accept(struct sampler *s, int32_t token);

/* Samples from LOGITS (n_vocab floats, not modified).  Sets *ret_logprob
 * (may be NULL).  Returns the token id. */
int32_t sampler_sample(struct sampler *s, const float *logits, float *ret_logprob);

/* sampler_sample, and the K (<= SAMPLER_MAX_TOP) most likely tokens with
 * their log-probabilities, best first (ties: lower id first), from the same
 * distribution *RET_LOGPROB is of: the logits after the penalties, before
 * temperature and truncation.  *RET_N_TOP is how many (K unless fewer
 * logits are numbers). */
#define SAMPLER_MAX_TOP 20
int32_t sampler_sample_top(struct sampler *s, const float *logits, float *ret_logprob, int32_t k,
			   int32_t *top_ids, float *top_logprobs, int32_t *ret_n_top);

/* sampler_sample_top where only the tokens ALLOWED has a bit for may come
 * (bit t % 32 of word t / 32 is token t; NULL = every token): the others
 * count as logits of -inf, after the penalties, so the draw, *RET_LOGPROB
 * and the alternatives are those of the constrained distribution.  At least
 * one token must be allowed.  -ENOMEM the first time when a scratch vector
 * cannot be had. */
int32_t sampler_sample_masked(struct sampler *s, const float *logits, const uint32_t *allowed,
			      float *ret_logprob, int32_t k, int32_t *top_ids, float *top_logprobs,
			      int32_t *ret_n_top);

#endif
