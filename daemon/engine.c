/* engine.c - the Llama forward pass over a flattened batch of token rows.
 *
 * It owns the backend and the KV pool and runs one step at a time: embed, then per layer RMSNorm, Q/K/V, RoPE, paged
 * attention, output projection, RMSNorm, SwiGLU FFN, and finally the logits
 * of the rows that want them.  It does not choose what runs nor own the
 * sequences' block tables (sched.c), nor sample (sampler.c).
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

struct engine {
	const struct model *m;       /* borrowed */
	struct engine_params p;
	struct backend *be;          /* owned */
	struct kv_pool *kv;          /* owned */
	int32_t n_ctx;               /* positions per sequence */
	/* Step scratch, (max_batch, width) floats each, in the backend's memory
	 * (backend_alloc): device memory on CUDA. */
	float *x;                    /* residual stream (T, n_embd) */
	float *xn;                   /* normalized (T, n_embd) */
	float *q;                    /* (T, n_head*head_dim) */
	float *k, *v;                /* (T, n_head_kv*head_dim) */
	float *att;                  /* attention output (T, n_head*head_dim) */
	float *g, *u;                /* FFN gate and up (T, n_ff) */
	float *logits;               /* (max_batch, n_vocab) when the backend's memory is
	                                not the host's (ops->download), else NULL */
};

void engine_params_default(struct engine_params *p)
{
	memset(p, 0, sizeof *p);
	p->n_threads = 2;
	p->kv_type = QT_F16;
	p->kv_block_tokens = KV_BLOCK_TOKENS;
	p->kv_tokens = 8192;
	p->n_ctx = 0;
	p->max_batch = 512;
	p->backend = ENGINE_BACKEND_CPU;
	p->device = 0;
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	kv_pool_free(e->kv);
	if (e->be) {
		float *bufs[] = { e->x, e->xn, e->q, e->k, e->v, e->att, e->g, e->u, e->logits };
		for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
			backend_release(e->be, bufs[i]);
	}
	backend_free(e->be);
	free(e);
}

/* What makes cached KV blocks of one engine meaningless to another: the
 * model file and the KV element type (FNV-1a). */
static uint64_t kv_salt(const struct model *m, const struct engine_params *p)
{
	uint64_t h = 0xcbf29ce484222325ull;
	uint64_t parts[3] = { m->file_bytes, m->weight_bytes, p->kv_type };

	for (const char *c = m->path; *c; c++)
		h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
	for (int i = 0; i < 3; i++)
		h = (h ^ parts[i]) * 0x100000001b3ull;
	return h;
}

int engine_new(const struct model *m, const struct engine_params *p, struct engine **ret,
	       char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	struct engine *e;
	int64_t n_blocks;
	size_t T;
	int r;

	if (p->n_threads < 1 || p->n_threads > 256 || p->max_batch < 1 ||
	    p->kv_block_tokens < 1 || p->kv_tokens < 0 || p->kv_mib < 0 ||
	    (p->kv_tokens == 0 && p->kv_mib == 0) || p->n_ctx < 0 ||
	    (p->kv_type != QT_F16 && p->kv_type != QT_F32 && p->kv_type != QT_Q8_0) ||
	    (p->backend != ENGINE_BACKEND_CPU && p->backend != ENGINE_BACKEND_CUDA) || p->device < 0) {
		snprintf(err, errlen, "invalid engine parameters");
		return -EINVAL;
	}
	/* Q8_0 rows are 32-element blocks, and attention takes a head's scale
	 * from the one block holding it: a head may fill whole blocks or share
	 * one, never straddle two. */
	if (p->kv_type == QT_Q8_0 &&
	    ((hp->n_head_kv * hp->head_dim) % QK || (hp->head_dim % QK && QK % hp->head_dim))) {
		snprintf(err, errlen, "a q8_0 KV cache needs head_dim a multiple of %d (or a divisor "
			 "of it, with n_head_kv * head_dim a multiple of %d); this model has head_dim %d "
			 "and %d KV heads: use f16", QK, QK, hp->head_dim, hp->n_head_kv);
		return -EINVAL;
	}
	e = calloc(1, sizeof *e);
	if (!e)
		goto nomem;
	e->m = m;
	e->p = *p;
	e->n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train;
	if (p->kv_tokens) {
		n_blocks = (p->kv_tokens + p->kv_block_tokens - 1) / p->kv_block_tokens;
	} else {
		size_t bb = kv_pool_block_bytes(p->kv_type, p->kv_block_tokens, hp->n_layer,
						hp->n_head_kv * hp->head_dim);
		n_blocks = (int64_t)(((uint64_t)p->kv_mib << 20) / bb);
	}
	if (n_blocks < 1 || n_blocks > (1 << 28)) {
		snprintf(err, errlen, "a KV pool of %lld blocks is out of range (1..%d)",
			 (long long)n_blocks, 1 << 28);
		free(e);
		return -EINVAL;
	}
	if (p->backend == ENGINE_BACKEND_CUDA) {
#ifdef LLMD_CUDA_BACKEND
		r = cuda_backend_new(p->device, &e->be, err, errlen);
#else
		snprintf(err, errlen, "this llmd was built without a CUDA backend "
			 "(configure --enable-cuda or --enable-cuda-emu)");
		r = -ENOTSUP;
#endif
		if (r < 0) {
			free(e);
			return r;
		}
	} else {
		r = cpu_backend_new(p->n_threads, &e->be);
		if (r < 0) {
			snprintf(err, errlen, "cannot start %d CPU threads", p->n_threads);
			free(e);
			return r;
		}
	}
	r = kv_pool_new(p->kv_type, p->kv_block_tokens, hp->n_layer, hp->n_head_kv * hp->head_dim,
			(int32_t)n_blocks, kv_salt(m, p), &e->kv, err, errlen);
	if (r < 0) {
		engine_free(e);
		return r;
	}
	T = (size_t)p->max_batch;
	e->x = backend_alloc(e->be, T * hp->n_embd * sizeof(float));
	e->xn = backend_alloc(e->be, T * hp->n_embd * sizeof(float));
	e->q = backend_alloc(e->be, T * hp->n_head * hp->head_dim * sizeof(float));
	e->att = backend_alloc(e->be, T * hp->n_head * hp->head_dim * sizeof(float));
	e->k = backend_alloc(e->be, T * hp->n_head_kv * hp->head_dim * sizeof(float));
	e->v = backend_alloc(e->be, T * hp->n_head_kv * hp->head_dim * sizeof(float));
	e->g = backend_alloc(e->be, T * hp->n_ff * sizeof(float));
	e->u = backend_alloc(e->be, T * hp->n_ff * sizeof(float));
	if (!e->x || !e->xn || !e->q || !e->att || !e->k || !e->v || !e->g || !e->u)
		goto nomem;
	/* TODO(cuda): size this by the rows that want logits (usually one per
	 * sequence), not max_batch. */
	if (e->be->ops->download &&
	    !(e->logits = backend_alloc(e->be, T * (size_t)hp->n_vocab * sizeof(float))))
		goto nomem;
	*ret = e;
	return 0;
nomem:
#ifdef LLMD_CUDA_BACKEND
	if (e && e->be && p->backend == ENGINE_BACKEND_CUDA)
		snprintf(err, errlen, "out of device memory for %d-row step buffers: %s", p->max_batch,
			 cuda_backend_last_error(e->be));
	else
#endif
		snprintf(err, errlen, "out of memory");
	engine_free(e);
	return -ENOMEM;
}

/* ---- the step ---- */

static int check_batch(const struct engine *e, const struct engine_batch *b)
{
	const int32_t bt = e->p.kv_block_tokens, n_blocks = e->kv->view.n_blocks;

	if (b->n < 1 || b->n > e->p.max_batch)
		return -EINVAL;
	for (int32_t t = 0; t < b->n; t++) {
		if (b->token[t] < 0 || b->token[t] >= e->m->hp.n_vocab || b->pos[t] < 0 ||
		    b->pos[t] >= e->n_ctx || !b->table[t])
			return -EINVAL;
		/* the row's own block; earlier ones were checked when written */
		int32_t blk = b->table[t][b->pos[t] / bt];
		if (blk < 0 || blk >= n_blocks)
			return -EINVAL;
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
	struct bk_rows rows = { T, b->pos, b->table };
	struct bk_attn attn = { hp->n_head, hp->n_head_kv, hp->head_dim, 1.0f / sqrtf((float)hp->head_dim) };
	int32_t n_out = 0;
	int r;

	r = check_batch(e, b);
	if (r < 0)
		return r;
	if ((r = backend_begin_step(be, &rows)) < 0)
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
		    (r = ops->rope(be, e->q, T, hp->n_head, hp->head_dim, hp->n_rot, b->pos,
				   hp->rope_base, hp->rope_style)) < 0 ||
		    (r = ops->rope(be, e->k, T, hp->n_head_kv, hp->head_dim, hp->n_rot, b->pos,
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
			if (n_out != t &&
			    (r = backend_copy_rows(be, e->x + (size_t)n_out * d, e->x + (size_t)t * d, d)) < 0)
				return r;
			n_out++;
		}
	}
	if (n_out == 0)
		return 0;
	const struct bk_weight *out_w = &m->output;
	float *out = e->logits ? e->logits : logits;
	if ((r = ops->rmsnorm(be, e->x, m->output_norm, n_out, d, hp->rms_eps, e->xn)) < 0 ||
	    (r = ops->matmul(be, &out_w, 1, e->xn, n_out, &out)) < 0)
		return r;
	if (e->logits &&
	    (r = ops->download(be, logits, e->logits, (size_t)n_out * hp->n_vocab * sizeof(float))) < 0)
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

int64_t engine_kv_capacity(const struct engine *e)
{
	return (int64_t)e->kv->view.n_blocks * e->kv->view.block_tokens;
}

struct kv_pool *engine_kv_pool(const struct engine *e)
{
	return e->kv;
}

const char *engine_backend_name(const struct engine *e)
{
	return e->be->ops->name;
}

void engine_device_info(const struct engine *e, struct bk_device_info *ret)
{
	backend_device_info(e->be, ret);
}

const char *engine_last_error(const struct engine *e)
{
#ifdef LLMD_CUDA_BACKEND
	if (e->p.backend == ENGINE_BACKEND_CUDA)
		return cuda_backend_last_error(e->be);
#endif
	(void)e;
	return "";
}

int engine_failure_is_sticky(const struct engine *e)
{
	return e->p.backend == ENGINE_BACKEND_CUDA;
}
