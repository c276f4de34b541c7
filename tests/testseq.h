/* testseq.h - one sequence driven straight on the engine, for tests that
 * check the forward pass itself without the scheduler: it owns a block table
 * and takes blocks from the engine's pool as positions need them. */
#ifndef LLMD_TESTSEQ_H
#define LLMD_TESTSEQ_H

#include <errno.h>
#include <stdlib.h>

#include "engine.h"
#include "kv_pool.h"

#define TSEQ_MAX_BLOCKS 1024

struct tseq {
	int32_t table[TSEQ_MAX_BLOCKS]; /* block ids */
	int32_t n_blocks;
	int32_t len;                    /* positions computed */
};

/* Makes sure positions up to LEN + N - 1 have blocks. */
static inline int tseq_reserve(struct engine *e, struct tseq *s, int n)
{
	struct kv_pool *kv = engine_kv_pool(e);
	int32_t bt = kv->view.block_tokens, want = (s->len + n + bt - 1) / bt;

	if (want > TSEQ_MAX_BLOCKS || want - s->n_blocks > kv_pool_n_available(kv))
		return -ENOSPC;
	while (s->n_blocks < want)
		s->table[s->n_blocks++] = kv_pool_alloc(kv);
	return 0;
}

/* Appends N tokens in steps of at most CHUNK rows; LOGITS gets the last
 * row's logits.  Returns the last engine_step result. */
static inline int tseq_feed(struct engine *e, struct tseq *s, const int32_t *ids, int n, int chunk,
			    float *logits)
{
	int32_t pos[1024];
	const int32_t *tab[1024];
	int r = 0;

	if (chunk > 1024)
		chunk = 1024;
	for (int i = 0; i < n && r >= 0; i += chunk) {
		int m = n - i < chunk ? n - i : chunk;
		if ((r = tseq_reserve(e, s, m)) < 0)
			return r;
		for (int k = 0; k < m; k++) {
			pos[k] = s->len + k;
			tab[k] = s->table;
		}
		struct engine_batch b = { m, ids + i, pos, tab, NULL };
		r = engine_step(e, &b, logits);
		if (r >= 0)
			s->len += m;
	}
	return r;
}

static inline void tseq_free(struct engine *e, struct tseq *s)
{
	while (s->n_blocks > 0)
		kv_pool_unref(engine_kv_pool(e), s->table[--s->n_blocks]);
	s->len = 0;
}

/* The index of the largest of V's N values (the lowest on ties). */
static inline int32_t tseq_argmax(const float *v, int32_t n)
{
	int32_t best = 0;
	for (int32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

/* Greedy on the bare engine: the prompt in one step, then one token per
 * step.  Writes N_GEN ids to OUT; returns how many, or -1. */
static inline int tseq_greedy(struct engine *e, const int32_t *prompt, int n_prompt, int n_gen,
			      int32_t *out)
{
	int32_t n_vocab = engine_n_vocab(e);
	float *logits = malloc((size_t)n_vocab * sizeof(float));
	struct tseq sq = { .n_blocks = 0 };
	int n = 0;

	if (logits && tseq_feed(e, &sq, prompt, n_prompt, n_prompt, logits) == 1) {
		while (n < n_gen) {
			out[n] = tseq_argmax(logits, n_vocab);
			n++;
			if (n < n_gen && tseq_feed(e, &sq, &out[n - 1], 1, 1, logits) != 1) {
				n = -1;
				break;
			}
		}
	} else {
		n = -1;
	}
	tseq_free(e, &sq);
	free(logits);
	return n;
}

#endif
