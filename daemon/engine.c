/* engine.c - the Llama forward pass over a flattened batch of token rows.
 *
 * It owns the backend, the KV pool and the per-sequence block tables, and
 * runs one step at a time: embed, then per layer RMSNorm, Q/K/V, RoPE, paged
 * attention, output projection, RMSNorm, SwiGLU FFN, and finally the logits
 * of the rows that want them.  It does not choose what runs (the scheduler)
 * nor what is sampled (sampler.c).
 */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"

struct engine_seq {
	int used;            /* 1 while the id is handed out */
	int32_t len;         /* positions held in the KV cache */
	int32_t n_blocks;    /* entries of blocks in use */
	int32_t *blocks;     /* (max_blocks) KV block ids; owned */
};

struct engine {
	const struct model *m;       /* borrowed */
	struct engine_params p;
	struct backend *be;          /* owned */
	struct kv_pool *kv;          /* owned */
	int32_t n_ctx;               /* positions per sequence */
	int32_t max_blocks;          /* block-table entries per sequence */
	struct engine_seq *seqs;     /* (max_seqs) */
	int32_t *pending;            /* (max_seqs) rows per sequence while planning; 0 between steps */
	/* Step scratch, (max_batch, width) floats each. */
	float *x;                    /* residual stream (T, n_embd) */
	float *xn;                   /* normalized (T, n_embd) */
	float *q;                    /* (T, n_head*head_dim) */
	float *k, *v;                /* (T, n_head_kv*head_dim) */
	float *att;                  /* attention output (T, n_head*head_dim) */
	float *g, *u;                /* FFN gate and up (T, n_ff) */
	int32_t *pos;                /* (T) */
	const int32_t **tables;      /* (T) */
	int32_t *logit_rows;         /* (T) indices of rows that want logits */
};

void engine_params_default(struct engine_params *p)
{
	memset(p, 0, sizeof *p);
	p->n_threads = 2;
	p->kv_type = QT_F16;
	p->kv_block_tokens = 16;
	p->kv_tokens = 8192;
	p->n_ctx = 0;
	p->max_seqs = 64;
	p->max_batch = 512;
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	if (e->seqs)
		for (int32_t i = 0; i < e->p.max_seqs; i++)
			free(e->seqs[i].blocks);
	free(e->seqs);
	free(e->pending);
	kv_pool_free(e->kv);
	backend_free(e->be);
	free(e->x);
	free(e->xn);
	free(e->q);
	free(e->k);
	free(e->v);
	free(e->att);
	free(e->g);
	free(e->u);
	free(e->pos);
	free(e->tables);
	free(e->logit_rows);
	free(e);
}

int engine_new(const struct model *m, const struct engine_params *p, struct engine **ret,
	       char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	struct engine *e;
	int64_t n_blocks;
	size_t T;
	int r;

	if (p->n_threads < 1 || p->n_threads > 256 || p->max_seqs < 1 || p->max_batch < 1 ||
	    p->kv_block_tokens < 1 || p->kv_tokens < 1 || p->n_ctx < 0 ||
	    (p->kv_type != QT_F16 && p->kv_type != QT_F32)) {
		snprintf(err, errlen, "invalid engine parameters");
		return -EINVAL;
	}
	e = calloc(1, sizeof *e);
	if (!e)
		goto nomem;
	e->m = m;
	e->p = *p;
	e->n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train;
	e->max_blocks = (e->n_ctx + p->kv_block_tokens - 1) / p->kv_block_tokens;
	n_blocks = (p->kv_tokens + p->kv_block_tokens - 1) / p->kv_block_tokens;
	if (n_blocks > INT32_MAX / 2) {
		snprintf(err, errlen, "KV pool of %lld tokens is too large", (long long)p->kv_tokens);
		free(e);
		return -EINVAL;
	}
	r = cpu_backend_new(p->n_threads, &e->be);
	if (r < 0) {
		snprintf(err, errlen, "cannot start %d CPU threads", p->n_threads);
		free(e);
		return r;
	}
	r = kv_pool_new(p->kv_type, p->kv_block_tokens, hp->n_layer, hp->n_head_kv * hp->head_dim,
			(int32_t)n_blocks, &e->kv, err, errlen);
	if (r < 0) {
		engine_free(e);
		return r;
	}
	e->seqs = calloc((size_t)p->max_seqs, sizeof *e->seqs);
	e->pending = calloc((size_t)p->max_seqs, sizeof *e->pending);
	if (!e->seqs || !e->pending)
		goto nomem;
	for (int32_t i = 0; i < p->max_seqs; i++) {
		e->seqs[i].blocks = malloc((size_t)e->max_blocks * sizeof(int32_t));
		if (!e->seqs[i].blocks)
			goto nomem;
	}
	T = (size_t)p->max_batch;
	e->x = malloc(T * hp->n_embd * sizeof(float));
	e->xn = malloc(T * hp->n_embd * sizeof(float));
	e->q = malloc(T * hp->n_head * hp->head_dim * sizeof(float));
	e->att = malloc(T * hp->n_head * hp->head_dim * sizeof(float));
	e->k = malloc(T * hp->n_head_kv * hp->head_dim * sizeof(float));
	e->v = malloc(T * hp->n_head_kv * hp->head_dim * sizeof(float));
	e->g = malloc(T * hp->n_ff * sizeof(float));
	e->u = malloc(T * hp->n_ff * sizeof(float));
	e->pos = malloc(T * sizeof(int32_t));
	e->tables = malloc(T * sizeof(*e->tables));
	e->logit_rows = malloc(T * sizeof(int32_t));
	if (!e->x || !e->xn || !e->q || !e->att || !e->k || !e->v || !e->g || !e->u || !e->pos ||
	    !e->tables || !e->logit_rows)
		goto nomem;
	*ret = e;
	return 0;
nomem:
	engine_free(e);
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

/* ---- sequences ---- */

static struct engine_seq *seq_get(const struct engine *e, int32_t id)
{
	if (id < 0 || id >= e->p.max_seqs || !e->seqs[id].used)
		return NULL;
	return &e->seqs[id];
}

int engine_seq_new(struct engine *e, int32_t *ret_id)
{
	for (int32_t i = 0; i < e->p.max_seqs; i++) {
		if (!e->seqs[i].used) {
			e->seqs[i].used = 1;
			e->seqs[i].len = 0;
			e->seqs[i].n_blocks = 0;
			*ret_id = i;
			return 0;
		}
	}
	return -ENOSPC;
}

int engine_seq_truncate(struct engine *e, int32_t id, int32_t len)
{
	struct engine_seq *s = seq_get(e, id);
	int32_t keep;

	if (!s || len < 0)
		return -EINVAL;
	if (len >= s->len)
		return 0;
	keep = (len + e->p.kv_block_tokens - 1) / e->p.kv_block_tokens;
	while (s->n_blocks > keep)
		kv_pool_unref(e->kv, s->blocks[--s->n_blocks]);
	s->len = len;
	return 0;
}

void engine_seq_free(struct engine *e, int32_t id)
{
	struct engine_seq *s = seq_get(e, id);

	if (!s)
		return;
	engine_seq_truncate(e, id, 0);
	s->used = 0;
}

int32_t engine_seq_len(const struct engine *e, int32_t id)
{
	const struct engine_seq *s = seq_get(e, id);
	return s ? s->len : -EINVAL;
}

/* ---- the step ---- */

/* Checks the batch, assigns positions, and allocates the KV blocks the new
 * positions need: all or nothing. */
static int plan_step(struct engine *e, const struct engine_batch *b)
{
	const int32_t bt = e->p.kv_block_tokens;
	int32_t need = 0, T = b->n;
	int r = 0;

	if (T < 1 || T > e->p.max_batch)
		return -EINVAL;
	for (int32_t t = 0; t < T; t++)
		if (!seq_get(e, b->seq[t]) || b->token[t] < 0 || b->token[t] >= e->m->hp.n_vocab)
			return -EINVAL;
	for (int32_t t = 0; t < T; t++) {
		const struct engine_seq *s = &e->seqs[b->seq[t]];
		int32_t pos = s->len + e->pending[b->seq[t]]++;
		if (pos >= e->n_ctx)
			r = -E2BIG;
		if (pos % bt == 0 && pos / bt >= s->n_blocks)
			need++;
		e->pos[t] = pos;
	}
	for (int32_t t = 0; t < T; t++)
		e->pending[b->seq[t]] = 0;
	if (r == 0 && need > kv_pool_n_free(e->kv))
		r = -ENOSPC;
	if (r)
		return r;
	for (int32_t t = 0; t < T; t++) {
		struct engine_seq *s = &e->seqs[b->seq[t]];
		if (e->pos[t] / bt >= s->n_blocks)
			s->blocks[s->n_blocks++] = kv_pool_alloc(e->kv);
		s->len = e->pos[t] + 1;
		e->tables[t] = s->blocks;
	}
	return 0;
}

int engine_step(struct engine *e, const struct engine_batch *b, float *logits)
{
	const struct model *m = e->m;
	const struct model_hparams *hp = &m->hp;
	const struct backend_ops *ops = e->be->ops;
	struct backend *be = e->be;
	int32_t T = b->n, d = hp->n_embd;
	struct bk_rows rows = { T, e->pos, e->tables };
	struct bk_attn attn = { hp->n_head, hp->n_head_kv, hp->head_dim, 1.0f / sqrtf((float)hp->head_dim) };
	int32_t n_out = 0;
	int r;

	r = plan_step(e, b);
	if (r < 0)
		return r;

	if ((r = ops->embed(be, &m->tok_embd, b->token, T, e->x)) < 0)
		return r;
	for (int32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const struct bk_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
		float *qkv_out[3] = { e->q, e->k, e->v };
		const struct bk_weight *wo = &L->wo, *gu[2] = { &L->w_gate, &L->w_up };
		const struct bk_weight *wd = &L->w_down;
		float *gu_out[2] = { e->g, e->u };

		if ((r = ops->rmsnorm(be, e->x, L->attn_norm, T, d, hp->rms_eps, e->xn)) < 0 ||
		    (r = ops->matmul(be, qkv, 3, e->xn, T, qkv_out)) < 0 ||
		    (r = ops->rope(be, e->q, T, hp->n_head, hp->head_dim, hp->n_rot, e->pos,
				   hp->rope_base, hp->rope_style)) < 0 ||
		    (r = ops->rope(be, e->k, T, hp->n_head_kv, hp->head_dim, hp->n_rot, e->pos,
				   hp->rope_base, hp->rope_style)) < 0 ||
		    (r = ops->kv_store(be, &e->kv->view, l, &rows, e->k, e->v)) < 0 ||
		    (r = ops->attention(be, &e->kv->view, l, &rows, &attn, e->q, e->att)) < 0 ||
		    (r = ops->matmul(be, &wo, 1, e->att, T, &e->xn)) < 0 ||
		    (r = ops->add(be, e->x, e->xn, (int64_t)T * d)) < 0 ||
		    (r = ops->rmsnorm(be, e->x, L->ffn_norm, T, d, hp->rms_eps, e->xn)) < 0 ||
		    (r = ops->matmul(be, gu, 2, e->xn, T, gu_out)) < 0 ||
		    (r = ops->swiglu(be, e->g, e->u, (int64_t)T * hp->n_ff, e->g)) < 0 ||
		    (r = ops->matmul(be, &wd, 1, e->g, T, &e->xn)) < 0 ||
		    (r = ops->add(be, e->x, e->xn, (int64_t)T * d)) < 0)
			return r;
	}

	/* Gather the rows that want logits, then norm and project only those. */
	for (int32_t t = 0; t < T; t++) {
		if (b->logits ? b->logits[t] : t == T - 1) {
			if (n_out != t)
				memcpy(e->x + (size_t)n_out * d, e->x + (size_t)t * d, (size_t)d * sizeof(float));
			n_out++;
		}
	}
	if (n_out == 0)
		return 0;
	const struct bk_weight *out_w = &m->output;
	if ((r = ops->rmsnorm(be, e->x, m->output_norm, n_out, d, hp->rms_eps, e->xn)) < 0 ||
	    (r = ops->matmul(be, &out_w, 1, e->xn, n_out, &logits)) < 0)
		return r;
	return n_out;
}

int32_t engine_n_vocab(const struct engine *e)
{
	return e->m->hp.n_vocab;
}

int32_t engine_n_ctx(const struct engine *e)
{
	return e->n_ctx;
}

int32_t engine_max_batch(const struct engine *e)
{
	return e->p.max_batch;
}

const struct kv_pool *engine_kv_pool(const struct engine *e)
{
	return e->kv;
}

const char *engine_backend_name(const struct engine *e)
{
	return e->be->ops->name;
}
