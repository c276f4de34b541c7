/* backend.h - the compute interface the engine runs a step on.
 *
 * A backend is a table of ops over a flattened step batch: T token rows
 * drawn from many sequences at once.  Activations are row-major (T, n)
 * float arrays in the backend's memory; weights stay in their file format.
 * Attention reads K/V straight from the paged pool through each row's block
 * table.  The CPU backend is the reference every other backend is compared
 * with.  Every op's per-row arithmetic is independent of T and of the other
 * rows (batch invariance).  Ops are called from the engine thread only.
 */
#ifndef LLMD_BACKEND_H
#define LLMD_BACKEND_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix: N_OUT rows of N_IN elements of TYPE (ggml type id). */
struct bk_weight {
	uint32_t type;     /* enum qtype */
	int64_t n_in;      /* elements per row (ggml ne[0]) */
	int64_t n_out;     /* rows (ggml ne[1]) */
	const void *data;  /* (n_out, row_bytes); usually the model mapping */
	size_t row_bytes;  /* bytes per row */
};

enum bk_rope_style {
	BK_ROPE_NORMAL = 0, /* rotates adjacent pairs (x[2i], x[2i+1]): llama.cpp's llama */
	BK_ROPE_NEOX = 1,   /* rotates halves (x[i], x[i + n_rot/2]) */
};

/* How RoPE turns a position into angles, as ggml's rope_ext: pair i of a
 * row at position p turns by
 *   te = p * freq_base^(-2i/n_rot) / freq_factors[i]  (the power a running
 *        product in float, as ggml's; no factors: / 1),
 *   t  = freq_scale * te, mixed with te by YaRN's ramp when ext_factor != 0:
 *        r = (1 - clamp((i - corr_dims[0]) / max(0.001, corr_dims[1] -
 *        corr_dims[0]), 0, 1)) * ext_factor, t = t (1 - r) + te r,
 * and cos t, sin t are multiplied by mscale.  Without scaling (freq_scale
 * 1, ext_factor 0, mscale 1, no factors) the angles are p * theta^i. */
struct bk_rope {
	int32_t n_rot;             /* rotated dims per head (even) */
	int32_t style;             /* enum bk_rope_style (an int: C++ readers may see any value) */
	float freq_base;
	float freq_scale;          /* 1 / the factor of linear or YaRN scaling; 1: none */
	const float *freq_factors; /* (n_rot / 2) divisors of each pair's angle (Llama 3.1's
	                              rope_freqs), or NULL; a host vector the caller keeps,
	                              like a norm's (load_weight sees it first) */
	float ext_factor;          /* YaRN's extrapolation mix; 0: none */
	float mscale;              /* cos and sin times this: YaRN's magnitude; 1 */
	float corr_dims[2];        /* YaRN's ramp runs between these pairs */
};

/* Plain RoPE: N_ROT dims, STYLE, FREQ_BASE, no scaling. */
static inline struct bk_rope bk_rope_plain(int32_t n_rot, enum bk_rope_style style, float freq_base)
{
	struct bk_rope r = { n_rot, style, freq_base, 1.0f, NULL, 0.0f, 1.0f, { 0.0f, 0.0f } };
	return r;
}

/* Whether R scales anything (a backend may keep a faster path for none). */
static inline int bk_rope_scaled(const struct bk_rope *r)
{
	return r->freq_scale != 1.0f || r->freq_factors || r->ext_factor != 0.0f || r->mscale != 1.0f;
}

/* The paged KV pool as attention sees it.  Block b holds, for every layer l,
 * K then V of BLOCK_TOKENS tokens, one row of KV_DIM elements per token: row
 * (b, l, kv, t) starts at
 *   base + b * block_bytes + ((l * 2 + kv) * block_tokens + t) * row_bytes
 * and holds kv_dim values of TYPE.  A Q8_0 row is kv_dim / 32 ggml blocks
 * (an f16 scale and 32 int8) in element order: with head_dim a multiple of
 * 32 each block lies inside one head, and with head_dim dividing 32 each
 * head lies inside one block; no head is ever split across blocks. */
struct bk_kv {
	void *base;          /* (n_blocks, block_bytes) */
	uint32_t type;       /* QT_F32, QT_F16 or QT_Q8_0 */
	int32_t n_blocks;
	int32_t block_tokens;
	int32_t n_layer;
	int32_t kv_dim;      /* n_head_kv * head_dim */
	size_t row_bytes;    /* bytes of one token's K (or V) row: qtype_row_bytes(type, kv_dim) */
	size_t block_bytes;  /* 2 * n_layer * block_tokens * row_bytes */
};

/* Where each row of a step lives: its position and its sequence's block table. */
struct bk_rows {
	int32_t n;                        /* T */
	const int32_t *pos;               /* (T) token position in its sequence */
	const int32_t *const *block_table;/* (T) block ids of the row's sequence,
	                                     covering positions 0..pos */
};

/* How many rows from row T on (at most CAP) are one sequence's consecutive
 * positions: the same block table and pos[t + i] = pos[t] + i (a prefill
 * chunk), which attention may take together. */
static inline int32_t bk_rows_run(const struct bk_rows *rows, int32_t t, int32_t cap)
{
	int32_t n = 1;

	while (t + n < rows->n && n < cap && rows->block_table[t + n] == rows->block_table[t] &&
	       rows->pos[t + n] == rows->pos[t] + n)
		n++;
	return n;
}

struct bk_attn {
	int32_t n_head;
	int32_t n_head_kv;
	int32_t head_dim;
	float scale;         /* the q.k scale: 1/sqrt(head_dim) for most models */
	int32_t window;      /* sliding window: a row at position p attends to
	                        positions p - window + 1 .. p; 0: to all (causal) */
};

/* Where a row at POS starts attending: its window's first position, or 0. */
static inline int32_t bk_attn_first(const struct bk_attn *a, int32_t pos)
{
	return a->window > 0 && pos >= a->window ? pos - a->window + 1 : 0;
}

/* The gated activations of a feed-forward layer: act(g) * u. */
enum bk_act {
	BK_ACT_SILU = 0,  /* SwiGLU: g / (1 + exp(-g)) * u (Llama, Qwen, Phi-3) */
	BK_ACT_GELU = 1,  /* GeGLU, tanh approximation (Gemma) */
};

struct backend;

/* What a backend runs on. */
struct bk_device_info {
	char name[128];          /* "NVIDIA H100 80GB HBM3", "cpu" */
	int32_t index;           /* device index; 0 for the CPU */
	uint64_t total_bytes;    /* device memory; 0 when not known */
	uint64_t free_bytes;     /* free device memory now; 0 when not known */
};

struct backend_ops {
	const char *name;
	void (*free)(struct backend *be);
	/* out (T, w->n_in) = rows IDS of W (dequantized) */
	int (*embed)(struct backend *be, const struct bk_weight *w, const int32_t *ids,
		     int32_t T, float *out);
	/* out (T, n) = x / rms(x) * g;  out may equal x.  NEXT, when not
	 * NULL, is the weight of the matmul the caller runs next on out, as
	 * for add_rmsnorm. */
	int (*rmsnorm)(struct backend *be, const float *x, const float *g, int32_t T,
		       int64_t n, float eps, float *out, const struct bk_weight *next);
	/* For each k < NW: out[k] (T, w[k].n_out) = x (T, n_in) · w[k]^T.
	 * All w[k] share n_in and the activations' type (their qtype's
	 * vec_type: Q4_K and Q6_K both take Q8_K), so x is quantized once. */
	int (*matmul)(struct backend *be, const struct bk_weight *const *w, int nw,
		      const float *x, int32_t T, float *const *out);
	/* Rotates the first rp->n_rot dims of every head of x (T, n_head*head_dim) in
	 * place, at the rows' positions POS, by the angles RP describes. */
	int (*rope)(struct backend *be, float *x, int32_t T, int32_t n_head, int32_t head_dim,
		    const int32_t *pos, const struct bk_rope *rp);
	/* Writes k, v (T, kv_dim) of LAYER into the pool at each row's position,
	 * converted (rounded, quantized) to the pool's type row by row. */
	int (*kv_store)(struct backend *be, const struct bk_kv *kv, int32_t layer,
			const struct bk_rows *rows, const float *k, const float *v);
	/* out (T, n_head*head_dim) = softmax(q·K^T * scale) · V over positions
	 * 0..pos of each row's sequence (causal).  NEXT, when not NULL, is the
	 * weight of the matmul the caller runs next on out, as for
	 * add_rmsnorm. */
	int (*attention)(struct backend *be, const struct bk_kv *kv, int32_t layer,
			 const struct bk_rows *rows, const struct bk_attn *a,
			 const float *q, float *out, const struct bk_weight *next);
	/* out (n) = silu(g) * u;  out may equal g.  NEXT, when not NULL, is
	 * the weight of the matmul the caller runs next, on out as rows of
	 * next->n_in (n a multiple of it), with no op in between: a backend may
	 * prepare out for it in the same pass, as for add_rmsnorm. */
	int (*swiglu)(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		      const struct bk_weight *next);
	/* out (n) = gelu(g) * u, GELU's tanh form written with exp:
	 * 0.5 g (2 - 2 / (exp(2 y) + 1)), y = sqrt(2/pi) (g + 0.044715 g^3);
	 * otherwise as swiglu. */
	int (*geglu)(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		     const struct bk_weight *next);
	/* x (n) += y */
	int (*add)(struct backend *be, float *x, const float *y, int64_t n);
	/* x (n) *= s */
	int (*scale)(struct backend *be, float *x, int64_t n, float s);
	/* x (T, n) += b (n) on every row: a projection's bias.  B is a host
	 * vector the caller keeps, like a norm's (load_weight sees it first). */
	int (*add_bias)(struct backend *be, float *x, const float *b, int32_t T, int64_t n);

	/* ---- memory and step hooks: all optional; backend_*() below supply
	 * the CPU defaults, so a backend whose activations are host memory
	 * leaves them NULL ---- */
	/* An activation buffer of BYTES in the backend's memory, or NULL.
	 * Default: malloc. */
	void *(*alloc)(struct backend *be, size_t bytes);                        /* optional */
	/* Frees what alloc returned; NULL-safe.  Default: free. */
	void (*release)(struct backend *be, void *p);                            /* optional */
	/* Called once at the start of every step with the step's rows, before
	 * any op, so a device backend uploads positions and block tables once;
	 * the ops then get the same ROWS (and ROWS->pos).  Default: nothing. */
	int (*begin_step)(struct backend *be, const struct bk_rows *rows);       /* optional */
	/* dst (n) = src (n), both activation buffers (may not overlap).
	 * Default: memcpy. */
	int (*copy_rows)(struct backend *be, float *dst, const float *src, int64_t n); /* optional */
	/* host_dst (BYTES) = src, an activation buffer.  When absent the
	 * backend's memory is host memory: the engine writes results straight
	 * into the caller's buffers and never calls it. */
	int (*download)(struct backend *be, void *host_dst, const void *src, size_t bytes); /* optional */
	/* Recorded steps (CUDA graphs).  In place of begin_step, for a step
	 * whose every row wants logits (a decode step): the backend pads ROWS
	 * to *RET_ROWS >= rows->n rows (at most MAX_ROWS; the spare rows are
	 * its own and touch no KV of the pool) and uploads the step's IDS,
	 * positions and tables.  Returns 1 when it replayed a recorded step of
	 * that shape: the logits of all *RET_ROWS rows are where the ops put
	 * them when it was recorded.  Returns 0 when it is recording: the
	 * engine calls the ops for *RET_ROWS rows (with ROWS' host pointers,
	 * which the backend no longer reads), then graph_end.  Returns 2 when
	 * it does not record this step (begin_step follows as usual), or a
	 * negative errno. */
	int (*graph_begin)(struct backend *be, const struct bk_rows *rows, const int32_t *ids,
			   int32_t max_rows, int32_t *ret_rows);                 /* optional */
	/* Ends the recording graph_begin started and runs it; FAILED (an op
	 * failed on the way) discards it instead.  Returns 0 or a negative errno. */
	int (*graph_end)(struct backend *be, int failed);                       /* optional */
	/* The device it runs on, for `llmctl status`, and its memory, which
	 * sizes the KV pool of a backend with device memory.  Default: the CPU
	 * with no memory figures. */
	int (*device_info)(struct backend *be, struct bk_device_info *ret);       /* optional */
	/* Makes W resident in the backend's memory now rather than at its first
	 * use, so that start-up measures what the model takes before it sizes
	 * the KV pool (and a model that does not fit fails there).  A norm
	 * vector comes as a one-row QT_F32 weight.  Returns 1 when the ops
	 * read a copy of the backend's own from now on, complete when this
	 * returns, and never W's bytes again (they may be dropped from memory,
	 * where a mapped file reads back what is touched, or released for good
	 * when every weight returned 1: engine_reads_model_weights), 0 when
	 * they read W, or a negative errno.  Default: nothing. */
	int (*load_weight)(struct backend *be, const struct bk_weight *w);      /* optional */
	/* The KV pool the kv_store and attention ops will be given: a backend
	 * with device memory allocates its copy now.  Default: nothing. */
	int (*kv_attach)(struct backend *be, const struct bk_kv *kv);           /* optional */
	/* x (T, n) += y, then out = x / rms(x) * g: add and rmsnorm in one
	 * pass (a device backend saves a launch), with their bits; out may
	 * equal x or y.  NEXT, when not NULL, is the weight of the matmul the
	 * caller runs next, on out, with no op in between: a backend may
	 * prepare out for it in the same pass (the CUDA backend quantizes it
	 * there and the matmul skips its own quantization launch).  Default:
	 * add, then rmsnorm. */
	int (*add_rmsnorm)(struct backend *be, float *x, const float *y, const float *g,
			   int32_t T, int64_t n, float eps, float *out,
			   const struct bk_weight *next);                           /* optional */
	/* rope of q (T, a->n_head heads) and k (a->n_head_kv heads) in place at
	 * ROWS' positions, then kv_store of k and v: the three ops in one pass,
	 * with their bits.  Default: rope, rope, kv_store. */
	int (*rope_kv_store)(struct backend *be, const struct bk_kv *kv, int32_t layer,
			     const struct bk_rows *rows, const struct bk_attn *a,
			     const struct bk_rope *rp, float *q, float *k, const float *v); /* optional */
	/* The backend's last failure, naming the call ("cudaMalloc: out of
	 * memory ..."); "" when none.  Default: "". */
	const char *(*last_error)(const struct backend *be);                    /* optional */
	/* Writes the per-launch profile kept since the backend was made (the
	 * CUDA backend's LLMD_CUDA_PROFILE table) to F, waiting for the timed
	 * launches: 0, or -ENODATA when it keeps none.  The backend prints
	 * nothing itself.  Default: -ENODATA. */
	int (*write_profile)(struct backend *be, FILE *f);                      /* optional */
	/* Quantized matmuls of at least ROWS rows (prefill chunks) may take a
	 * faster path that is not batch invariant (the CUDA backend: weights
	 * dequantized to f16 tiles and cublasGemmEx); 0: never (the default).
	 * Default: nothing (no such path). */
	void (*set_gemm_rows)(struct backend *be, int32_t rows);               /* optional */
};

struct backend {
	const struct backend_ops *ops;
};

/* The CPU backend with N_THREADS threads (the caller counts as one).
 * Returns 0 or a negative errno. */
int cpu_backend_new(int n_threads, struct backend **ret);
/* The same, running on SHARE's worker threads when SHARE is a CPU backend
 * (N_THREADS unused then): one thread must drive both, never at once (a
 * draft model beside its target).  Else as cpu_backend_new. */
int cpu_backend_new_shared(int n_threads, struct backend *share, struct backend **ret);
/* From now on BE runs on FROM's worker threads, its own stopped, when both
 * are CPU backends of as many threads (else nothing): the one thread that
 * drives both must never drive them at once.  1 when shared, else 0. */
int cpu_backend_share(struct backend *be, struct backend *from);

static inline void backend_free(struct backend *be)
{
	if (be)
		be->ops->free(be);
}

/* ---- the optional ops with their defaults (engine thread only) ---- */

static inline void *backend_alloc(struct backend *be, size_t bytes)
{
	return be->ops->alloc ? be->ops->alloc(be, bytes) : malloc(bytes);
}

static inline void backend_release(struct backend *be, void *p)
{
	if (be && be->ops->release)
		be->ops->release(be, p);
	else
		free(p);
}

static inline int backend_begin_step(struct backend *be, const struct bk_rows *rows)
{
	return be->ops->begin_step ? be->ops->begin_step(be, rows) : 0;
}

static inline int backend_copy_rows(struct backend *be, float *dst, const float *src, int64_t n)
{
	if (be->ops->copy_rows)
		return be->ops->copy_rows(be, dst, src, n);
	memcpy(dst, src, (size_t)n * sizeof(float));
	return 0;
}

static inline int backend_add_rmsnorm(struct backend *be, float *x, const float *y, const float *g,
				      int32_t T, int64_t n, float eps, float *out,
				      const struct bk_weight *next)
{
	int r;

	if (be->ops->add_rmsnorm)
		return be->ops->add_rmsnorm(be, x, y, g, T, n, eps, out, next);
	if ((r = be->ops->add(be, x, y, (int64_t)T * n)) < 0)
		return r;
	return be->ops->rmsnorm(be, x, g, T, n, eps, out, next);
}

static inline int backend_rope_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
					const struct bk_rows *rows, const struct bk_attn *a,
					const struct bk_rope *rp, float *q, float *k, const float *v)
{
	int r;

	if (be->ops->rope_kv_store)
		return be->ops->rope_kv_store(be, kv, layer, rows, a, rp, q, k, v);
	if ((r = be->ops->rope(be, q, rows->n, a->n_head, a->head_dim, rows->pos, rp)) < 0 ||
	    (r = be->ops->rope(be, k, rows->n, a->n_head_kv, a->head_dim, rows->pos, rp)) < 0)
		return r;
	return be->ops->kv_store(be, kv, layer, rows, k, v);
}

static inline int backend_load_weight(struct backend *be, const struct bk_weight *w)
{
	return be->ops->load_weight ? be->ops->load_weight(be, w) : 0;
}

static inline int backend_kv_attach(struct backend *be, const struct bk_kv *kv)
{
	return be->ops->kv_attach ? be->ops->kv_attach(be, kv) : 0;
}

static inline const char *backend_last_error(const struct backend *be)
{
	return be->ops->last_error ? be->ops->last_error(be) : "";
}

static inline int backend_write_profile(struct backend *be, FILE *f)
{
	return be->ops->write_profile ? be->ops->write_profile(be, f) : -ENODATA;
}

static inline void backend_set_gemm_rows(struct backend *be, int32_t rows)
{
	if (be->ops->set_gemm_rows)
		be->ops->set_gemm_rows(be, rows);
}

static inline void backend_device_info(struct backend *be, struct bk_device_info *ret)
{
	memset(ret, 0, sizeof *ret);
	if (!be->ops->device_info || be->ops->device_info(be, ret) < 0) {
		memset(ret, 0, sizeof *ret);
		strcpy(ret->name, "cpu");
	}
}

/* ---- the CUDA backend's tuning ----
 * How its kernels run: their speed, never a bit of their results but
 * attn_split's (attention's last bits, within its tolerance against the
 * CPU; batch invariant at any one value).  The defaults were timed on an
 * H200 and an H100 (tools/cuda_mm_bench, .ci/gpu-run; llm-bench(1) has the
 * numbers).  llmd fills one from its config file ([cuda], llmd.conf(5)),
 * llm-bench and the tests from the environment. */
struct cuda_tuning {
	int32_t mma_min_t;  /* activation rows from which the quantized matmuls take the int8
	                       tensor-core kernels, fewer the dp4a ones (the same bits); 0: the
	                       K-quants always, Q4_0/Q4_1/Q8_0 from 2 rows (default 0) */
	int32_t mm_split;   /* warps at most on one run of 16 weight rows of the tensor-core
	                       matmuls (split-K; 1: none; default 16, the most it takes) */
	int32_t mm_warps;   /* warps at most that split-K gives one launch in all; 0: one wave
	                       of the device's resident warps (default 0) */
	int32_t mm_wide;    /* Q4_K (16-byte aligned rows) and Q6_K matmuls of one row: a warp
	                       a weight row with this many rounds of 512-byte loads in flight
	                       (1, 2, 4 or 8; 3 counts as 4, more as 8); 0: the tensor cores
	                       (default 2) */
	int32_t mm_mixed;   /* 1: one row of Q4_K and Q6_K weights sharing their input in one
	                       launch of the wide kernels; 0: a launch a type (default 1) */
	int32_t pdl;        /* 1: every launch may overlap the kernel before it (programmatic
	                       dependent launch) on devices of compute capability 9.0 and up;
	                       0: never (default 1) */
	int32_t attn_split; /* attention's positions per split block at the shortest, rounded
	                       up to whole KV blocks and doubled past 32 splits (default 16) */
};

/* The defaults above into T.  Any thread. */
static inline void cuda_tuning_defaults(struct cuda_tuning *t)
{
	t->mma_min_t = 0;
	t->mm_split = 16;
	t->mm_warps = 0;
	t->mm_wide = 2;
	t->mm_mixed = 1;
	t->pdl = 1;
	t->attn_split = 16;
}

/* *V = environment variable NAME's integer, when it is set (not empty). */
static inline void cuda_tuning_env_int(const char *name, int32_t *v)
{
	const char *s = getenv(name);

	if (s && *s)
		*v = (int32_t)strtol(s, NULL, 10);
}

/* The LLMD_CUDA_* variables that are set over T's fields, for experiments
 * (llm-bench(1), ENVIRONMENT): LLMD_CUDA_MMA_MIN_T, _MM_SPLIT, _MM_WARPS,
 * _MM_WIDE, _MM_MIXED, _PDL and _ATTN_SPLIT, the fields of those names.
 * Out-of-range values are taken as the launchers take them (a negative
 * _MM_WIDE: the default).  Any thread. */
static inline void cuda_tuning_from_env(struct cuda_tuning *t)
{
	cuda_tuning_env_int("LLMD_CUDA_MMA_MIN_T", &t->mma_min_t);
	cuda_tuning_env_int("LLMD_CUDA_MM_SPLIT", &t->mm_split);
	cuda_tuning_env_int("LLMD_CUDA_MM_WARPS", &t->mm_warps);
	cuda_tuning_env_int("LLMD_CUDA_MM_WIDE", &t->mm_wide);
	if (t->mm_wide < 0)
		t->mm_wide = 2;
	cuda_tuning_env_int("LLMD_CUDA_MM_MIXED", &t->mm_mixed);
	t->mm_mixed = t->mm_mixed != 0;
	cuda_tuning_env_int("LLMD_CUDA_PDL", &t->pdl);
	t->pdl = t->pdl != 0;
	cuda_tuning_env_int("LLMD_CUDA_ATTN_SPLIT", &t->attn_split);
}

/* ---- the CUDA backend (kernels/cuda/cuda_backend.c) ----
 * Linked where LLMD_CUDA_BACKEND is defined: built with nvcc for real GPUs
 * when configure finds the CUDA toolkit, or against the CPU emulator with
 * --enable-cuda-emu (which then wins).  The functions below may be called
 * from any one thread at a time. */

/* The CUDA backend on device DEVICE, current on the calling thread (each
 * step makes it current on the thread that runs it), its kernels run as
 * TUNING says (copied; NULL: cuda_tuning_defaults() with
 * cuda_tuning_from_env() over them).  Returns 0, or a negative errno with a
 * message in ERR: -ENODEV when there is no such device. */
int cuda_backend_new(int device, const struct cuda_tuning *tuning, struct backend **ret, char *err,
		     size_t errlen);
/* How many CUDA devices the runtime sees: a count >= 0 (with the reason in
 * ERR when 0), or -ENODEV with the runtime's reason in ERR when it cannot
 * say (no driver, driver too old). */
int cuda_backend_device_count(char *err, size_t errlen);
/* 1 when this CUDA backend is the emulator's build (the kernels run on the
 * CPU), 0 when it is nvcc's. */
int cuda_backend_emulated(void);

#ifdef __cplusplus
}
#endif

#endif
