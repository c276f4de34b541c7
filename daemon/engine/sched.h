/* sched.h - continuous batching: many requests, one forward step at a time.
 *
 * Each step spends a token budget: every running sequence's next decode
 * token first, then chunks of prompts being prefilled, then newly admitted
 * requests (highest priority first, the client with the fewest running
 * sequences first within a priority, FIFO within a client).  With a
 * step-time budget, a step that carries decode tokens takes only as much
 * prefill as a cost model learned from the measured steps (stepcost.h)
 * predicts will fit it, so a long prompt does not stall the running
 * streams; prefill still gets at least a block's worth of rows per step.  Prompts reuse
 * the longest chain of cached KV blocks (prefix cache).  When a decode needs
 * a block and none is free, the lowest-priority, most recently admitted
 * sequence is preempted: its blocks are released and it is recomputed later
 * from its tokens, resuming exactly where it was.  Results come back as
 * events through a callback.  Everything here runs on the engine thread.
 *
 * Speculative decoding (prompt lookup): a decoding sequence whose last
 * tokens occurred earlier in its own prompt or output proposes the tokens
 * that followed them, and the step verifies them as extra rows of that
 * sequence beside everyone else's rows.  Each row's logits are sampled in
 * turn exactly as a decode step would (same sampler, same RNG draw); a
 * proposal stands while the drawn token equals it, and the first token that
 * differs is kept instead and ends the run.  For a proposer that names one
 * token per position this is the standard rejection rule (accept with
 * probability min(1, p/q) = p(token), else draw from the residual, p
 * without the token): the output is the one decoding without speculation
 * gives, token for token, because the kernels give a row the same bits
 * whatever else the step holds.  Rejected rows' KV is dropped (their blocks
 * freed, nothing of them published).  How many rows a sequence proposes
 * follows what they are worth: each sequence's acceptance rate (learned
 * also from proposals not made) against the step-cost model's price of a
 * row, so a batch that is compute-bound, or text that does not repeat,
 * proposes little or nothing.
 *
 * With a draft model (sched_set_draft: a small model of the same
 * vocabulary, its own engine and KV pool), a sequence may instead propose
 * the draft's continuation: the draft catches up on the sequence's tokens
 * (its KV kept between steps, cut back to what the target accepted) and
 * runs one batched step per proposed token for all drafting sequences
 * before the target's step.  Its token is the greedy one, or for a request
 * that draws, a draw with a copy of the request's sampler: the same random
 * numbers the target's draws will take, so that where the two models agree
 * the two draws agree too.  Either way a proposal is one token per
 * position, so the same rule keeps the output exact; the draft's steps are
 * priced into what a proposal must be worth.
 */
#ifndef LLMD_SCHED_H
#define LLMD_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "sampler.h"
#include "stepcost.h"

struct engine;
struct grammar_state;
struct model;
struct sched;

struct sched_params {
	int32_t max_seqs;           /* sequences running at once */
	int32_t max_batched_tokens; /* token rows per step (<= the engine's max_batch) */
	int32_t max_queue;          /* requests waiting before submit says -EBUSY */
	int prefix_cache;           /* 1: reuse cached blocks of equal prefixes */
	int32_t step_ms;            /* step-time budget while sequences decode, milliseconds:
	                               prefill chunks shrink to keep a step's predicted time
	                               within it; 0 = off (full chunks) */
	int32_t spec_mode;          /* SCHED_SPEC_OFF, _NGRAM or _DRAFT: what requests that do
	                               not say get (_DRAFT without a draft model: off) */
	int32_t spec_max_draft;     /* tokens a sequence proposes a step at most
	                               (1..SCHED_SPEC_MAX_DRAFT) */
	int32_t spec_min_match;     /* the n-gram that must recur, tokens (>= 1) */
};

enum sched_spec {
	SCHED_SPEC_DEFAULT = 0, /* (requests) the scheduler's spec_mode */
	SCHED_SPEC_OFF = 1,
	SCHED_SPEC_NGRAM = 2,   /* prompt lookup */
	SCHED_SPEC_DRAFT = 3,   /* a draft model's tokens (sched_set_draft) */
};
#define SCHED_SPEC_MAX_DRAFT 16

/* Defaults: 32 sequences, 512 tokens, 1024 queued, prefix cache on, no
 * step-time budget, speculation off (max_draft 8, min_match 2 when on). */
void sched_params_default(struct sched_params *p);

/* A request, copied by sched_submit. */
struct sched_request {
	uint64_t id;                 /* caller's id, echoed in events; unique while live */
	uint32_t client;             /* fairness key (the daemon passes the uid) */
	int32_t priority;            /* higher runs first */
	const int32_t *prompt;       /* (n_prompt) token ids */
	int32_t n_prompt;
	int32_t max_tokens;          /* tokens to generate at most (>= 1) */
	struct sampler_params sampling;
	const char *const *stops;    /* (n_stops) stop strings */
	int n_stops;
	int ignore_eos;              /* 1: generate past end-of-generation tokens */
	int logprobs;                /* 1: report each token's log-probability */
	int32_t top_logprobs;        /* and this many alternatives (<= SAMPLER_MAX_TOP) */
	struct grammar_state *grammar; /* NULL, or where the output is in the grammar that
	                                  constrains it (grammar.h), at its start: borrowed,
	                                  the engine thread's until the FINISH event; each
	                                  token is drawn from its mask and advances it, and
	                                  the request stops when the grammar is complete */
	int32_t spec;                /* SCHED_SPEC_*: speculative decoding (never with a
	                                grammar; _DRAFT without a draft model: -EINVAL) */
	int32_t spec_max_draft;      /* 0: the scheduler's; else 1..SCHED_SPEC_MAX_DRAFT */
};

enum sched_event_kind {
	SCHED_EV_TOKEN = 1,  /* a generated token and the text it completes */
	SCHED_EV_FINISH = 2, /* the request is over; no more events for its id */
};

enum sched_finish {
	SCHED_FIN_STOP = 1,      /* end-of-generation token or stop string */
	SCHED_FIN_LENGTH = 2,    /* max_tokens, or the context is full */
	SCHED_FIN_CANCELLED = 3, /* sched_cancel */
	SCHED_FIN_ERROR = 4,     /* see error and message */
};

struct sched_usage {
	int32_t prompt_tokens;    /* n_prompt */
	int32_t cached_tokens;    /* prompt tokens served from the prefix cache (first admission) */
	int32_t generated_tokens;
	int32_t preemptions;      /* times this request was preempted */
	int32_t spec_steps;       /* steps that verified proposed tokens of it */
	int32_t spec_proposed;    /* tokens proposed */
	int32_t spec_accepted;    /* ... that stood */
	double queue_s;           /* submit to first admission */
	double prefill_s;         /* first admission to first token */
	double decode_s;          /* first token to finish */
};

struct sched_event {
	enum sched_event_kind kind;
	uint64_t id;                /* the request's id */
	/* SCHED_EV_TOKEN */
	int32_t token;
	float logprob;              /* 0 unless the request asked for logprobs */
	int32_t n_top;              /* the most likely tokens, best first, when asked */
	const int32_t *top_ids;     /* (n_top); valid during the callback */
	const float *top_logprobs;  /* (n_top) */
	const char *text;           /* complete UTF-8 text released by this token
	                               (may be empty); valid during the callback */
	size_t text_len;
	/* SCHED_EV_FINISH */
	enum sched_finish finish;
	int error;                  /* negative errno with SCHED_FIN_ERROR */
	const char *message;        /* with SCHED_FIN_ERROR; with SCHED_FIN_LENGTH, a
	                               notice when the grammar was left incomplete; else
	                               NULL */
	struct sched_usage usage;
};

typedef void (*sched_event_fn)(void *ctx, const struct sched_event *ev);

struct sched_counters {
	int32_t pool_blocks;        /* KV pool capacity, blocks */
	int32_t block_tokens;       /* tokens per block */
	int32_t used_blocks;        /* referenced by sequences */
	int32_t cached_blocks;      /* unreferenced, kept for the prefix cache */
	int32_t wasted_slots;       /* allocated but unfilled token slots (block tails) */
	uint64_t prefix_lookups;    /* block lookups */
	uint64_t prefix_hit_tokens; /* prompt tokens not recomputed thanks to the cache */
	uint64_t preemptions;
	uint64_t evictions;         /* cached blocks reclaimed */
	int32_t waiting;            /* queue length (preempted ones included) */
	int32_t running;
	uint64_t steps;
	uint64_t step_rows;         /* token rows over all steps */
	int32_t last_step_rows;
	int32_t last_step_seqs;
	uint64_t prefill_rows;      /* prompt rows computed (recomputation included) */
	uint64_t decode_rows;       /* decode rows computed (proposed rows not counted) */
	uint64_t spec_steps;        /* sequence-steps that verified proposals */
	uint64_t spec_proposed;     /* proposed tokens verified (rows beyond decode_rows) */
	uint64_t spec_accepted;     /* ... that stood: tokens a step gained */
	uint64_t draft_steps;       /* the draft model's forward steps */
	uint64_t draft_rows;        /* ... and their rows (catching up, then proposing) */
	int32_t draft_pool_blocks;  /* the draft's KV pool, blocks (0 without a draft) */
	int32_t draft_used_blocks;  /* ... held by sequences */
	uint64_t generated_tokens;
	uint64_t finished;
	uint64_t prefix_waits;      /* admissions put off a step because a running sequence
	                               was computing the same prefix blocks */
	/* the step-time budget and the cost model behind it */
	int32_t step_ms;            /* the budget (sched_params); 0 = off */
	double last_step_s;         /* the last step's forward pass, measured, seconds */
	double last_step_pred_s;    /* ... as the cost model predicted it when planning,
	                               seconds; 0 while the model had too few steps */
	double cost_base_s;         /* the model: seconds per step */
	double cost_row_s;          /* ... plus seconds per token row */
	double cost_pos_s;          /* ... plus seconds per position a row attends to */
	double cost_ctx_s;          /* ... plus seconds per KV position a sequence reads */
	uint64_t cost_samples;      /* steps it has learned from */
	uint64_t budget_cuts;       /* steps whose prefill the budget held back */
	uint64_t budget_overruns;   /* steps under the budget (sequences decoding) that
	                               took longer than step_ms */
};

/* E and M must outlive the scheduler.  Returns 0 or a negative errno with a
 * message. */
int sched_new(struct engine *e, const struct model *m, const struct sched_params *p,
	      sched_event_fn fn, void *ctx, struct sched **ret, char *err, size_t errlen);
/* 0 when DM may be M's draft model (the same vocabulary, token for token),
 * else -EINVAL with a message: the sizes, or the first token that differs.
 * Any thread. */
int sched_draft_check(const struct model *m, const struct model *dm, char *err, size_t errlen);
/* Gives S a draft model for SCHED_SPEC_DRAFT: DM, run by engine DE (both
 * the caller's, outliving S), must have the target's vocabulary, token for
 * token.  Before any request.  0, or -EINVAL with a message (another
 * vocabulary, naming the first token that differs; requests already
 * submitted), -ENOMEM. */
int sched_set_draft(struct sched *s, struct engine *de, const struct model *dm, char *err,
		    size_t errlen);

/* Finishes nothing: pending requests are dropped without events. NULL-safe. */
void sched_free(struct sched *s);

/* Queues a request.  Returns 0, -EINVAL (bad parameters, empty prompt, bad
 * token), -E2BIG (the prompt can never fit the context or the KV pool),
 * -EBUSY (the queue is full), -EEXIST (the id is live), -ENOMEM.  No event
 * is sent for a refused request. */
int sched_submit(struct sched *s, const struct sched_request *r);

/* Cancels request ID wherever it is (queued, prefilling, decoding,
 * preempted); its blocks are freed and its FINISH event sent at the next
 * step.  0 or -ENOENT. */
int sched_cancel(struct sched *s, uint64_t id);

/* Holds (HOLD = 1) or releases (0) request ID: a held request gets no rows
 * (no prefill, no decode, no admission) but keeps its blocks, unless the
 * pool runs short and it is preempted like any other.  The daemon holds the
 * requests of a client whose ring is full until it reads.  0 or -ENOENT. */
int sched_hold(struct sched *s, uint64_t id, int hold);

enum sched_state {
	SCHED_ST_QUEUED = 1,     /* waiting for admission (never admitted) */
	SCHED_ST_PREEMPTED = 2,  /* waiting to be recomputed */
	SCHED_ST_PREFILL = 3,    /* admitted, prompt being computed */
	SCHED_ST_DECODE = 4,     /* generating */
};

struct sched_info {
	enum sched_state state;
	int held;                /* sched_hold */
	int32_t queue_pos;       /* 1-based admission rank among waiting ones; 0 when running */
	int32_t priority;
	int32_t prompt_tokens;
	int32_t computed_tokens; /* tokens whose KV is in blocks */
	int32_t generated_tokens;
	int32_t blocks;          /* KV blocks held */
};

/* What request ID is doing, for `llmctl ps`.  0 or -ENOENT.  O(live). */
int sched_info(const struct sched *s, uint64_t id, struct sched_info *ret);

typedef void (*sched_info_fn)(void *ctx, uint64_t id, const struct sched_info *in);

/* What every live request is doing, at once: FN(CTX, id, info) for each,
 * running ones first, then waiting ones in admission order.  O(live log
 * live), where calling sched_info for each would be O(live^2).  0 or
 * -ENOMEM (FN not called). */
int sched_info_each(const struct sched *s, sched_info_fn fn, void *ctx);

/* Runs one step.  Returns the number of token rows run (0 when there was
 * nothing to do), or a negative errno when the engine failed (every running
 * request then gets a FINISH with SCHED_FIN_ERROR). */
int sched_step(struct sched *s);

/* Requests not yet finished. */
int32_t sched_live(const struct sched *s);

/* The highest priority among the live requests that can run (not held,
 * not cancelled); INT32_MIN when there is none.  O(live). */
int32_t sched_top_priority(const struct sched *s);

void sched_counters(const struct sched *s, struct sched_counters *ret);

/* Fixes the step-cost model at COEF instead of what the measured steps
 * teach (NULL: learn again), so that which chunks a budget allows does not
 * depend on the machine's speed.  For tests and benchmarks. */
void sched_pin_cost(struct sched *s, const struct stepcost_coef *coef);

/* The same for the draft model's steps (sched_set_draft), whose cost
 * prices its proposals and its catching up on a sequence's tokens. */
void sched_pin_draft_cost(struct sched *s, const struct stepcost_coef *coef);

/* Checks the invariants of the scheduler and the pool (block ownership,
 * refcounts, free list, positions): 0 or -EUCLEAN with a description.  For
 * tests; O(blocks). */
int sched_check(const struct sched *s, char *err, size_t errlen);

#endif
