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
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"

struct engine {
	const struct model *m;       /* borrowed */
	struct engine_params p;
	struct backend *be;          /* owned */
	struct kv_pool *kv;          /* owned */
	int32_t n_ctx;               /* positions per sequence */
	struct bk_rope *rope;        /* (n_layer) each layer's RoPE angles: the model's,
	                                with Phi-3's long factors where n_ctx is past the
	                                original context (as llama.cpp decides); owned */
	/* Step scratch, (max_batch, width) floats each, in the backend's memory
	 * (backend_alloc): device memory on CUDA. */
	float *x;                    /* residual stream (T, n_embd) */
	float *xn;                   /* normalized (T, n_embd) */
	float *q;                    /* (T, n_head*head_dim) */
	float *k, *v;                /* (T, n_head_kv*head_dim) */
	float *att;                  /* attention output (T, n_head*head_dim) */
	float *g, *u;                /* FFN gate and up (T, n_ff) */
	uint64_t n_recorded;         /* steps recorded as graphs */
	uint64_t n_replayed;         /* steps replayed from them */
	float *logits;               /* (max_batch, n_vocab) when the backend's memory is
	                                not the host's (ops->download), else NULL */
	int reads_model;             /* 1 when some op reads a weight where the model
	                                holds it (a load_weight returned 0, or the
	                                backend has none); 0: only its own copies */
	int profile;                 /* engine_set_profile */
	struct engine_profile prof;  /* times since it was turned on */
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
	p->kv_gpu_fraction = 0.9;
	p->graphs = 1;
	cuda_tuning_defaults(&p->cuda);
	cuda_tuning_from_env(&p->cuda);
}

/* ---- choosing the backend ---- */

void engine_cuda_probe(struct engine_cuda_probe *ret)
{
	memset(ret, 0, sizeof *ret);
#ifdef LLMD_CUDA_BACKEND
	int n = cuda_backend_device_count(ret->why, sizeof ret->why);
	ret->kind = cuda_backend_emulated() ? ENGINE_CUDA_EMULATED : ENGINE_CUDA_DEVICE;
	ret->n_devices = n > 0 ? n : 0;
#else
	ret->kind = ENGINE_CUDA_NONE;
	snprintf(ret->why, sizeof ret->why, "this build has no CUDA backend (configured without the CUDA "
		 "toolkit, nvcc and cuBLAS, and without --enable-cuda-emu)");
#endif
}

int engine_choose_backend(const char *want, int32_t index, const struct engine_cuda_probe *pr,
			  int32_t *ret_backend, char *msg, size_t msglen)
{
	int is_auto = !strcmp(want, "auto");

	if (!strcmp(want, "cpu")) {
		snprintf(msg, msglen, "the CPU");
		*ret_backend = ENGINE_BACKEND_CPU;
		return 0;
	}
	if (!is_auto && strcmp(want, "cuda")) {
		snprintf(msg, msglen, "'%s' is not a backend (auto, cpu or cuda)", want);
		return -EINVAL;
	}
	/* auto: the CPU unless nvcc's backend sees a device */
	if (is_auto && pr->kind == ENGINE_CUDA_NONE) {
		snprintf(msg, msglen, "the CPU (%s)", pr->why);
		*ret_backend = ENGINE_BACKEND_CPU;
		return 0;
	}
	if (is_auto && pr->kind == ENGINE_CUDA_EMULATED) {
		snprintf(msg, msglen, "the CPU (this build's CUDA backend is the emulator, "
			 "--enable-cuda-emu, which only backend cuda selects)");
		*ret_backend = ENGINE_BACKEND_CPU;
		return 0;
	}
	if (is_auto && pr->n_devices == 0) {
		snprintf(msg, msglen, "the CPU (no usable CUDA device: %s)", pr->why);
		*ret_backend = ENGINE_BACKEND_CPU;
		return 0;
	}
	/* cuda, or auto with a device: that device or an error */
	if (pr->kind == ENGINE_CUDA_NONE) {
		snprintf(msg, msglen, "%s", pr->why);
		return -ENOTSUP;
	}
	if (pr->n_devices == 0) {
		snprintf(msg, msglen, "no usable CUDA device: %s", pr->why);
		return -ENODEV;
	}
	if (index < 0 || index >= pr->n_devices) {
		snprintf(msg, msglen, "CUDA device %d does not exist: the CUDA runtime sees %d (0..%d)",
			 index, pr->n_devices, pr->n_devices - 1);
		return -ENODEV;
	}
	if (pr->kind == ENGINE_CUDA_EMULATED)
		snprintf(msg, msglen, "CUDA on the emulator (--enable-cuda-emu: the kernels' own "
			 "source run on the CPU, for tests, not for speed)");
	else
		snprintf(msg, msglen, "CUDA device %d (of %d)", index, pr->n_devices);
	*ret_backend = ENGINE_BACKEND_CUDA;
	return 0;
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
	free(e->rope);
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

/* ---- the model and the KV pool in device memory ---- */

#define MIB_UP(b) (((uint64_t)(b) + (1u << 20) - 1) >> 20)

/* Bytes of the step buffers engine_new allocates for MAX_BATCH rows; with
 * DEVICE, the logits staging buffer too. */
static uint64_t step_bytes(const struct model_hparams *hp, int32_t max_batch, int device)
{
	uint64_t row = 2 * (uint64_t)hp->n_embd + 2 * (uint64_t)hp->n_head * hp->head_dim +
		       2 * (uint64_t)hp->n_head_kv * hp->head_dim + 2 * (uint64_t)hp->n_ff;

	if (device)
		row += (uint64_t)hp->n_vocab;
	return (uint64_t)max_batch * row * sizeof(float);
}

static struct bk_weight norm_weight(const float *g, int32_t n)
{
	struct bk_weight w = { QT_F32, n, 1, g, (size_t)n * sizeof(float) };
	return w;
}

/* Every tensor the ops read from M, norm and bias vectors as one-row F32
 * weights, into *RET (malloc'd, (5 + 16 * n_layer)); returns the count or
 * -ENOMEM. */
static int model_tensors(const struct model *m, struct bk_weight **ret)
{
	const struct model_hparams *hp = &m->hp;
	struct bk_weight *w = malloc((5 + 16 * (size_t)hp->n_layer) * sizeof *w);
	int n = 0;

	if (!w)
		return -ENOMEM;
	w[n++] = m->tok_embd;
	w[n++] = m->output;
	w[n++] = norm_weight(m->output_norm, hp->n_embd);
	if (hp->rope.freq_factors)
		w[n++] = norm_weight(hp->rope.freq_factors, hp->n_rot / 2);
	if (hp->rope_factors_long)
		w[n++] = norm_weight(hp->rope_factors_long, hp->n_rot / 2);
	for (int32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const int32_t dq = hp->n_head * hp->head_dim, dkv = hp->n_head_kv * hp->head_dim;
		const struct { const float *v; int32_t n; } vecs[] = {
			{ L->attn_norm, hp->n_embd }, { L->ffn_norm, hp->n_embd },
			{ L->bq, dq }, { L->bk, dkv }, { L->bv, dkv },
			{ L->q_norm, hp->head_dim }, { L->k_norm, hp->head_dim },
			{ L->attn_post_norm, hp->n_embd }, { L->ffn_post_norm, hp->n_embd },
		};
		for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
			if (vecs[i].v)
				w[n++] = norm_weight(vecs[i].v, vecs[i].n);
		w[n++] = L->wq;
		w[n++] = L->wk;
		w[n++] = L->wv;
		w[n++] = L->wo;
		w[n++] = L->w_gate;
		w[n++] = L->w_up;
		w[n++] = L->w_down;
	}
	*ret = w;
	return n;
}

/* Bytes of the N tensors W, each distinct host buffer once (a tied output
 * is the token embedding). */
static uint64_t tensors_bytes(const struct bk_weight *w, int n)
{
	uint64_t sum = 0;

	for (int i = 0; i < n; i++) {
		int seen = 0;
		for (int j = 0; j < i && !seen; j++)
			seen = w[j].data == w[i].data;
		if (!seen)
			sum += (uint64_t)w[i].n_out * w[i].row_bytes;
	}
	return sum;
}

static int device_memory(struct engine *e, struct bk_device_info *ret, char *err, size_t errlen)
{
	int r;

	memset(ret, 0, sizeof *ret);
	if (!e->be->ops->device_info) {
		snprintf(err, errlen, "the %s backend cannot say how much memory it has",
			 e->be->ops->name);
		return -ENOTSUP;
	}
	if ((r = e->be->ops->device_info(e->be, ret)) < 0) {
		snprintf(err, errlen, "cannot read the device's free memory: %s", engine_last_error(e));
		return r;
	}
	return 0;
}

/* A backend on host memory gets the weights too, in place (the CPU backend
 * keeps a packed copy of those its kernels read faster that way). */
static int host_load(struct engine *e, char *err, size_t errlen)
{
	struct bk_weight *w = NULL;
	int n, r = 0;

	if (!e->be->ops->load_weight) {
		e->reads_model = 1;
		return 0;
	}
	if ((n = model_tensors(e->m, &w)) < 0) {
		snprintf(err, errlen, "out of memory");
		return n;
	}
	/* A weight the backend copied (the CPU's packed layouts) leaves the
	 * resident set: the copy is about the file's size, so this halves what
	 * the weights take. */
	for (int i = 0; i < n && r >= 0; i++)
		if ((r = backend_load_weight(e->be, &w[i])) < 0)
			snprintf(err, errlen, "cannot prepare the weights: %s", strerror(-r));
		else if (r == 1)
			model_drop_weight(e->m, &w[i]);
		else
			e->reads_model = 1;
	free(w);
	return r < 0 ? r : 0;
}

/* Before anything goes to the device: the model (weights, step buffers)
 * plus N_BLOCKS blocks of BB bytes (or, when 0, the smallest automatic
 * pool) must fit its free memory; then the weights are uploaded. */
static int device_fit(struct engine *e, size_t bb, int64_t n_blocks, char *err, size_t errlen)
{
	const struct engine_params *p = &e->p;
	struct bk_device_info dev;
	struct bk_weight *w = NULL;
	int64_t min_blocks = (p->max_batch + p->kv_block_tokens - 1) / p->kv_block_tokens;
	int64_t blocks = n_blocks ? n_blocks : min_blocks;
	uint64_t wb, sb, kvb = (uint64_t)blocks * bb;
	int n, r;

	if ((n = model_tensors(e->m, &w)) < 0) {
		snprintf(err, errlen, "out of memory");
		return n;
	}
	wb = tensors_bytes(w, n);
	sb = step_bytes(&e->m->hp, p->max_batch, 1);
	if ((r = device_memory(e, &dev, err, errlen)) < 0)
		goto out;
	if (wb + sb + kvb > dev.free_bytes) {
		snprintf(err, errlen, "%s (device %d): the model needs %llu MiB (weights %llu MiB, "
			 "step buffers %llu MiB for %d rows), %s KV pool %llu MiB (%lld tokens), and the "
			 "device has %llu MiB free", dev.name, dev.index,
			 (unsigned long long)(MIB_UP(wb) + MIB_UP(sb)), (unsigned long long)MIB_UP(wb),
			 (unsigned long long)MIB_UP(sb), p->max_batch, n_blocks ? "the" : "a minimal",
			 (unsigned long long)MIB_UP(kvb), (long long)(blocks * p->kv_block_tokens),
			 (unsigned long long)(dev.free_bytes >> 20));
		r = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if ((r = backend_load_weight(e->be, &w[i])) < 0) {
			snprintf(err, errlen, "cannot upload the weights (%llu MiB) to %s: %s",
				 (unsigned long long)MIB_UP(wb), dev.name, engine_last_error(e));
			goto out;
		}
		/* Uploaded: the host's pages need not stay resident. */
		if (r == 1)
			model_drop_weight(e->m, &w[i]);
		else
			e->reads_model = 1;
	}
	r = 0;
out:
	free(w);
	return r;
}

/* The automatic pool on a device, once the model is there: kv_gpu_fraction
 * of the free memory, in whole blocks of BB bytes, at least the smallest
 * pool (max_batch tokens). */
static int device_auto_blocks(struct engine *e, size_t bb, int64_t *ret_blocks, char *err,
			      size_t errlen)
{
	const struct engine_params *p = &e->p;
	struct bk_device_info dev;
	int64_t min_blocks = (p->max_batch + p->kv_block_tokens - 1) / p->kv_block_tokens;
	uint64_t share;
	int64_t n;
	int r;

	if ((r = device_memory(e, &dev, err, errlen)) < 0)
		return r;
	share = (uint64_t)(p->kv_gpu_fraction * (double)dev.free_bytes);
	n = (int64_t)(share / bb);
	if (n > (1 << 28))
		n = 1 << 28;
	if (n < min_blocks) {
		snprintf(err, errlen, "%s (device %d): the KV pool's share %g (kv.gpu_mem_fraction) "
			 "of the %llu MiB free after the model is %llu MiB, less than a minimal KV pool "
			 "%llu MiB (%lld tokens)", dev.name, dev.index, p->kv_gpu_fraction,
			 (unsigned long long)(dev.free_bytes >> 20), (unsigned long long)(share >> 20),
			 (unsigned long long)MIB_UP((uint64_t)min_blocks * bb),
			 (long long)(min_blocks * p->kv_block_tokens));
		return -ENOMEM;
	}
	*ret_blocks = n;
	return 0;
}

int engine_new(const struct model *m, const struct engine_params *p, struct engine **ret,
	       char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	struct engine *e;
	int64_t n_blocks = 0;
	size_t T, bb;
	int device, r;

	if (p->n_threads < 1 || p->n_threads > 256 || p->max_batch < 1 ||
	    p->kv_block_tokens < 1 || p->kv_tokens < 0 || p->kv_mib < 0 ||
	    !(p->kv_gpu_fraction > 0 && p->kv_gpu_fraction <= 1) || p->n_ctx < 0 ||
	    (p->kv_type != QT_F16 && p->kv_type != QT_F32 && p->kv_type != QT_Q8_0) ||
	    (p->backend != ENGINE_BACKEND_CPU && p->backend != ENGINE_BACKEND_CUDA) || p->device < 0 ||
	    p->gemm_rows < 0) {
		snprintf(err, errlen, "invalid engine parameters");
		return -EINVAL;
	}
	if (p->n_ctx && p->n_ctx < MODEL_MIN_CTX) {
		snprintf(err, errlen, "a context of %d position is too short: a sequence needs at least %d "
			 "(a prompt token and a generated one)", p->n_ctx, MODEL_MIN_CTX);
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
	bb = kv_pool_block_bytes(p->kv_type, p->kv_block_tokens, hp->n_layer,
				 hp->n_head_kv * hp->head_dim);
	if (p->kv_tokens)
		n_blocks = (p->kv_tokens + p->kv_block_tokens - 1) / p->kv_block_tokens;
	else if (p->kv_mib)
		n_blocks = (int64_t)(((uint64_t)p->kv_mib << 20) / bb);
	if ((p->kv_tokens || p->kv_mib) && (n_blocks < 1 || n_blocks > (1 << 28))) {
		snprintf(err, errlen, "a KV pool of %lld blocks is out of range (1..%d)",
			 (long long)n_blocks, 1 << 28);
		return -EINVAL;
	}
	e = calloc(1, sizeof *e);
	if (!e)
		goto nomem;
	e->m = m;
	e->p = *p;
	e->n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train;
	if (!(e->rope = calloc((size_t)hp->n_layer, sizeof *e->rope)))
		goto nomem; /* engine_free takes the half-built engine */
	for (int32_t l = 0; l < hp->n_layer; l++) {
		e->rope[l] = m->layers[l].rope;
		if (hp->rope_factors_long && e->n_ctx > hp->n_ctx_orig && !m->layers[l].window)
			e->rope[l].freq_factors = hp->rope_factors_long;
	}
	if (p->backend == ENGINE_BACKEND_CUDA) {
#ifdef LLMD_CUDA_BACKEND
		r = cuda_backend_new(p->device, &p->cuda, &e->be, err, errlen);
#else
		snprintf(err, errlen, "this build has no CUDA backend (configured without the CUDA "
			 "toolkit, nvcc and cuBLAS, and without --enable-cuda-emu)");
		r = -ENOTSUP;
#endif
		if (r < 0) {
			free(e);
			return r;
		}
	} else {
		r = cpu_backend_new_shared(p->n_threads, p->threads_of ? p->threads_of->be : NULL, &e->be);
		if (r < 0) {
			snprintf(err, errlen, "cannot start %d CPU threads", p->n_threads);
			free(e);
			return r;
		}
	}
	backend_set_gemm_rows(e->be, p->gemm_rows);
	/* A backend with its own memory (download) gets the weights now and
	 * the pool sized from what is left. */
	device = e->be->ops->download != NULL;
	if (device && (r = device_fit(e, bb, n_blocks, err, errlen)) < 0)
		goto fail;
	if (!device && (r = host_load(e, err, errlen)) < 0)
		goto fail;
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
	if (device && !(e->logits = backend_alloc(e->be, T * (size_t)hp->n_vocab * sizeof(float))))
		goto nomem;
	if (!n_blocks) {
		if (device) {
			if ((r = device_auto_blocks(e, bb, &n_blocks, err, errlen)) < 0)
				goto fail;
		} else {
			n_blocks = (int64_t)(((uint64_t)ENGINE_KV_MIB_HOST << 20) / bb);
			if (n_blocks < 1)
				n_blocks = 1;
			if (n_blocks > (1 << 28))
				n_blocks = 1 << 28;
		}
	}
	r = kv_pool_new(p->kv_type, p->kv_block_tokens, hp->n_layer, hp->n_head_kv * hp->head_dim,
			(int32_t)n_blocks, kv_salt(m, p), &e->kv, err, errlen);
	if (r < 0)
		goto fail;
	if ((r = backend_kv_attach(e->be, &e->kv->view)) < 0) {
		snprintf(err, errlen, "cannot allocate the KV pool (%llu MiB, %lld tokens) in device "
			 "memory: %s", (unsigned long long)MIB_UP(e->kv->bytes),
			 (long long)engine_kv_capacity(e), engine_last_error(e));
		r = -ENOMEM;
		goto fail;
	}
	*ret = e;
	return 0;
nomem:
	if (e && e->be && p->backend == ENGINE_BACKEND_CUDA)
		snprintf(err, errlen, "out of device memory for %d-row step buffers: %s", p->max_batch,
			 backend_last_error(e->be));
	else
		snprintf(err, errlen, "out of memory");
	r = -ENOMEM;
fail:
	engine_free(e);
	return r;
}

/* ---- the step ---- */

/* The type W's activations are quantized to. */
static uint32_t vec_type_of(const struct bk_weight *w)
{
	const struct qtype_info *qi = qtype_get(w->type);
	return qi ? qi->vec_type : w->type;
}

/* The N (<= 3) weights W (one input each) against X: one call per
 * activation type among them, which is one call for a layer's q, k and v
 * even where a K-quant file mixes their types (Q4_K q and k beside a Q6_K
 * v); they share one quantization of X.  A row's arithmetic is the same
 * either way. */
static int matmul_group(struct backend *be, const struct bk_weight *const *w, int n, const float *x, int32_t T,
			float *const *out)
{
	const struct bk_weight *sw[3];
	float *so[3];
	int done[3] = { 0 }, r;

	if (n > 3)
		return -EINVAL;
	for (int k = 0; k < n; k++) {
		if (done[k])
			continue;
		int m = 0;
		for (int i = k; i < n; i++)
			if (!done[i] && vec_type_of(w[i]) == vec_type_of(w[k])) {
				sw[m] = w[i];
				so[m++] = out[i];
				done[i] = 1;
			}
		if ((r = be->ops->matmul(be, sw, m, x, T, so)) < 0)
			return r;
	}
	return 0;
}

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

/* The forward pass of B's first TK rows' worth of kernels (TK >= b->n: a
 * recorded step's padded rows, whose host arrays the backend no longer
 * reads), up to the logits of the rows that want them, gathered to the
 * front.  Returns how many rows got logits, or a negative errno. */
static int forward(struct engine *e, const struct engine_batch *b, int32_t TK, float *logits)
{
	const struct model *m = e->m;
	const struct model_hparams *hp = &m->hp;
	const struct backend_ops *ops = e->be->ops;
	struct backend *be = e->be;
	int32_t T = TK, d = hp->n_embd;
	struct bk_rows rows = { TK, b->pos, b->table };
	struct bk_attn attn = { hp->n_head, hp->n_head_kv, hp->head_dim, hp->attn_scale, 0 };
	int32_t n_out = 0;
	int r;
	/* the profile's slot for this step, or NULL when it is off */
	double *prof = e->profile ? e->prof.op_s[T > 1] : NULL, t0 = 0;

	if (prof) {
		e->prof.steps[T > 1]++;
		e->prof.rows[T > 1] += (uint64_t)T;
	}
/* R = CALL, its time added to OP's when the profile is on; returns on error */
#define OP(op, call)                                         \
	do {                                                 \
		if (prof)                                    \
			t0 = clock_s();                     \
		r = (call);                                  \
		if (prof)                                    \
			prof[op] += clock_s() - t0;         \
		if (r < 0)                                   \
			return r;                            \
	} while (0)

	OP(ENGINE_OP_EMBED, ops->embed(be, &m->tok_embd, b->token, T, e->x));
	if (hp->embd_scale != 1.0f)
		OP(ENGINE_OP_EMBED, ops->scale(be, e->x, (int64_t)T * d, hp->embd_scale));
	OP(ENGINE_OP_EMBED, ops->rmsnorm(be, e->x, m->layers[0].attn_norm, T, d, hp->rms_eps, e->xn,
						&m->layers[0].wq));
	/* Each residual add is fused with the norm after it: xn holds the
	 * layer's normed input on entry. */
	for (int32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const struct bk_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
		float *qkv_out[3] = { e->q, e->k, e->v };
		const struct bk_weight *wo = &L->wo, *gu[2] = { &L->w_gate, &L->w_up };
		const struct bk_weight *wd = &L->w_down;
		float *gu_out[2] = { e->g, e->u };
		const int32_t dq = hp->n_head * hp->head_dim, dkv = hp->n_head_kv * hp->head_dim;

		attn.window = L->window;
		OP(ENGINE_OP_QKV, matmul_group(be, qkv, 3, e->xn, T, qkv_out));
		if (L->bq) {
			OP(ENGINE_OP_QKV, ops->add_bias(be, e->q, L->bq, T, dq));
			OP(ENGINE_OP_QKV, ops->add_bias(be, e->k, L->bk, T, dkv));
			OP(ENGINE_OP_QKV, ops->add_bias(be, e->v, L->bv, T, dkv));
		}
		if (L->q_norm) { /* per head: rows of head_dim */
			OP(ENGINE_OP_QKV, ops->rmsnorm(be, e->q, L->q_norm, T * hp->n_head, hp->head_dim, hp->rms_eps,
						       e->q, NULL));
			OP(ENGINE_OP_QKV, ops->rmsnorm(be, e->k, L->k_norm, T * hp->n_head_kv, hp->head_dim,
						       hp->rms_eps, e->k, NULL));
		}
		OP(ENGINE_OP_ROPE_KV, backend_rope_kv_store(be, &e->kv->view, l, &rows, &attn, &e->rope[l], e->q,
							    e->k, e->v));
		OP(ENGINE_OP_ATTENTION, ops->attention(be, &e->kv->view, l, &rows, &attn, e->q, e->att, wo));
		OP(ENGINE_OP_O, ops->matmul(be, &wo, 1, e->att, T, &e->xn));
		if (L->attn_post_norm)
			OP(ENGINE_OP_ADD_NORM, ops->rmsnorm(be, e->xn, L->attn_post_norm, T, d, hp->rms_eps, e->xn, NULL));
		OP(ENGINE_OP_ADD_NORM, backend_add_rmsnorm(be, e->x, e->xn, L->ffn_norm, T, d, hp->rms_eps, e->xn,
							   gu[0]));
		OP(ENGINE_OP_GATE_UP, matmul_group(be, gu, 2, e->xn, T, gu_out));
		if (hp->act == BK_ACT_GELU)
			OP(ENGINE_OP_SWIGLU, ops->geglu(be, e->g, e->u, (int64_t)T * hp->n_ff, e->g, wd));
		else
			OP(ENGINE_OP_SWIGLU, ops->swiglu(be, e->g, e->u, (int64_t)T * hp->n_ff, e->g, wd));
		OP(ENGINE_OP_DOWN, ops->matmul(be, &wd, 1, e->g, T, &e->xn));
		if (L->ffn_post_norm)
			OP(ENGINE_OP_ADD_NORM, ops->rmsnorm(be, e->xn, L->ffn_post_norm, T, d, hp->rms_eps, e->xn, NULL));
		if (l + 1 < hp->n_layer)
			OP(ENGINE_OP_ADD_NORM, backend_add_rmsnorm(be, e->x, e->xn, m->layers[l + 1].attn_norm, T, d,
								   hp->rms_eps, e->xn, &m->layers[l + 1].wq));
		else
			OP(ENGINE_OP_ADD_NORM, ops->add(be, e->x, e->xn, (int64_t)T * d));
	}

	/* Gather the rows that want logits, then norm and project only those
	 * (a padded step's spare rows come last and get logits too). */
	for (int32_t t = 0; t < T; t++) {
		if (t >= b->n || (b->logits ? b->logits[t] : t == T - 1)) {
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
	OP(ENGINE_OP_OUTPUT, ops->rmsnorm(be, e->x, m->output_norm, n_out, d, hp->rms_eps, e->xn, out_w));
	OP(ENGINE_OP_OUTPUT, ops->matmul(be, &out_w, 1, e->xn, n_out, &out));
#undef OP
	return n_out;
}

/* 1 when every row of B wants logits: a decode step, which a backend may
 * replay from a recording. */
static int all_rows_want_logits(const struct engine_batch *b)
{
	if (!b->logits)
		return b->n == 1;
	for (int32_t t = 0; t < b->n; t++)
		if (!b->logits[t])
			return 0;
	return 1;
}

int engine_step(struct engine *e, const struct engine_batch *b, float *logits)
{
	const struct backend_ops *ops = e->be->ops;
	struct backend *be = e->be;
	struct bk_rows rows = { b->n, b->pos, b->table };
	int32_t TK = b->n;
	int r, n_out, rec = 2;

	r = check_batch(e, b);
	if (r < 0)
		return r;
	if (e->p.graphs && ops->graph_begin && e->logits && all_rows_want_logits(b)) {
		rec = ops->graph_begin(be, &rows, b->token, e->p.max_batch, &TK);
		if (rec < 0)
			return rec;
	}
	if (rec == 1) {
		n_out = b->n; /* replayed: the real rows' logits lead */
		e->n_replayed++;
	} else {
		if (rec == 2) {
			TK = b->n;
			if ((r = backend_begin_step(be, &rows)) < 0)
				return r;
		}
		n_out = forward(e, b, TK, logits);
		if (rec == 0) {
			r = ops->graph_end(be, n_out < 0);
			if (n_out >= 0 && r < 0)
				n_out = r;
			if (n_out >= 0)
				e->n_recorded++;
		}
		if (n_out <= 0)
			return n_out;
		if (n_out > b->n)
			n_out = b->n; /* a recorded step's spare rows */
	}
	if (e->logits &&
	    (r = ops->download(be, logits, e->logits, (size_t)n_out * e->m->hp.n_vocab * sizeof(float))) < 0)
		return r;
	return n_out;
}

int engine_share_threads(struct engine *e, const struct engine *from)
{
	return cpu_backend_share(e->be, from->be);
}

void engine_graph_stats(const struct engine *e, uint64_t *recorded, uint64_t *replayed)
{
	*recorded = e->n_recorded;
	*replayed = e->n_replayed;
}

void engine_set_profile(struct engine *e, int on)
{
	e->profile = on != 0;
	memset(&e->prof, 0, sizeof e->prof);
}

void engine_get_profile(const struct engine *e, struct engine_profile *p)
{
	*p = e->prof;
}

const char *engine_op_name(enum engine_op op)
{
	static const char *const names[ENGINE_N_OPS] = {
		[ENGINE_OP_EMBED] = "embed",         [ENGINE_OP_QKV] = "qkv",
		[ENGINE_OP_ROPE_KV] = "rope_kv",     [ENGINE_OP_ATTENTION] = "attention",
		[ENGINE_OP_O] = "o",                 [ENGINE_OP_ADD_NORM] = "add_norm",
		[ENGINE_OP_GATE_UP] = "gate_up",     [ENGINE_OP_SWIGLU] = "swiglu",
		[ENGINE_OP_DOWN] = "down",           [ENGINE_OP_OUTPUT] = "output",
	};
	return (int)op >= 0 && op < ENGINE_N_OPS ? names[op] : "?";
}

int engine_reads_model_weights(const struct engine *e)
{
	return e->reads_model;
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

int engine_write_device_profile(struct engine *e, FILE *f)
{
	return backend_write_profile(e->be, f);
}

const char *engine_last_error(const struct engine *e)
{
	return backend_last_error(e->be);
}

int engine_failure_is_sticky(const struct engine *e)
{
	return e->p.backend == ENGINE_BACKEND_CUDA;
}
