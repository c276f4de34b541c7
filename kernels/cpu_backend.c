/* cpu_backend.c - the CPU backend: the reference implementation of every op.
 *
 * Matmuls quantize each activation row once and split weight rows across the
 * persistent worker pool (quant.c does the arithmetic), reading each model
 * weight from the ISA's packed copy where it has one (made when the engine
 * loads the weight, so the file's blocks are then only read for embeddings;
 * other weights are read as they are);
 * attention walks each row's block table in the paged KV pool with an
 * online softmax, the rows of a prefill chunk together.  Small
 * element-wise ops run inline on the engine thread: a dispatch would cost
 * more than the work.  Not thread-safe: one engine thread drives it.
 */
#include "backend.h"
#include "cpu_pool.h"
#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN_ELEMS 32768  /* below this an element-wise op runs inline */
#define MM_MAX_WEIGHTS 8     /* weights sharing one input in a matmul call */

/* A weight's packed copy, found by the weight's data pointer. */
struct cpu_packed {
	const void *data;           /* key: bk_weight.data; NULL = empty slot */
	struct quant_packed *pk;    /* owned; NULL when the ISA has no layout for it */
};

struct cpu_backend {
	struct backend base;
	struct cpu_pool *pool;   /* workers; owned */
	void *xq;                /* quantized activations scratch; owned */
	size_t xq_cap;           /* bytes of xq */
	void *xp;                /* xq in a packed matrix's layout; owned, 64-byte aligned */
	size_t xp_cap;           /* bytes of xp */
	struct cpu_packed *packed; /* (packed_cap) open addressing; owned */
	size_t packed_cap;       /* power of two, 0 before the first weight */
	size_t packed_n;         /* slots in use */
	struct attn_group *attn_groups; /* (attn_groups_cap) attention's row groups; owned */
	size_t attn_groups_cap;
	float *attn_scratch;     /* attention's per-worker state; owned */
	size_t attn_scratch_cap; /* floats of attn_scratch */
	/* RoPE's cos and sin of the last rows it rotated, for the next call
	 * with the same positions and parameters: every layer's q and k in a
	 * step. */
	float *rope_cs;          /* (rope_T, rope_p.n_rot / 2, 2); owned */
	int32_t *rope_pos;       /* (rope_T) their positions; owned */
	size_t rope_cap;         /* pairs of room in rope_cs, positions in rope_pos */
	int32_t rope_T;          /* rows in rope_cs, 0 before the first call */
	struct bk_rope rope_p;   /* the parameters they were made with (rope_T > 0) */
};

static struct cpu_backend *cpu(struct backend *be)
{
	return (struct cpu_backend *)be;
}

/* ---- small vector helpers (auto-vectorized per ISA) ---- */

#define VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

/* GCC vector types: 16 floats, unaligned.  Inlined into a VEC_CLONES
 * function they become one zmm, two ymm or four xmm per operation, whatever
 * the optimization level; the summation order is the same on every ISA. */
typedef float v16f __attribute__((vector_size(64), aligned(4)));
/* For new code, types no wider than the ymm of the x86-64-v3 clones: GCC
 * moves a vector wider than the target's registers through the stack
 * between operations (seen with v16f in an AVX2 clone's loop). */
typedef float v4f __attribute__((vector_size(16), aligned(4)));
typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef double v4d __attribute__((vector_size(32), aligned(8)));

/* Dot product with 16 partial sums and a fixed final order. */
static inline float vec_dot_f32(const float *a, const float *b, int n)
{
	v16f acc = { 0 };
	float s = 0;
	int i = 0;
	for (; i + 16 <= n; i += 16)
		acc += *(const v16f *)(a + i) * *(const v16f *)(b + i);
	for (; i < n; i++)
		s += a[i] * b[i];
	for (int k = 0; k < 16; k++)
		s += acc[k];
	return s;
}

static inline void vec_scale_add(float *y, const float *x, float a, int n)
{
	int i = 0;
	for (; i + 16 <= n; i += 16)
		*(v16f *)(y + i) += a * *(const v16f *)(x + i);
	for (; i < n; i++)
		y[i] += a * x[i];
}

/* y += x, element by element. */
static inline void vec_add(float *y, const float *x, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		*(v8f *)(y + i) += *(const v8f *)(x + i);
	for (; i < n; i++)
		y[i] += x[i];
}

static inline void vec_scale(float *y, float a, int n)
{
	int i = 0;
	for (; i + 16 <= n; i += 16)
		*(v16f *)(y + i) *= a;
	for (; i < n; i++)
		y[i] *= a;
}

/* GELU, tanh form, written with expf: x (1 + tanh y) / 2 = x - x / (e^2y + 1),
 * y = sqrt(2/pi) (x + 0.044715 x^3).  Every step rounded in this order
 * (no FMA: this file's portable code is built for baseline x86-64, and
 * the CUDA kernel spells each rounding out), so the AVX2 loop and the CUDA
 * backend give its bits. */
#define GELU_2C0 1.5957691216057308f /* 2 sqrt(2/pi) */
#define GELU_C1 0.044715f
static inline float gelu_of(float x)
{
	float y = GELU_2C0 * (x * (1.0f + GELU_C1 * (x * x)));
	return x - x / (expf(y) + 1.0f);
}

/* ---- embed ---- */

static int cpu_embed(struct backend *be, const struct bk_weight *w, const int32_t *ids,
		     int32_t T, float *out)
{
	for (int32_t t = 0; t < T; t++) {
		if (ids[t] < 0 || ids[t] >= w->n_out)
			return -EINVAL;
		quant_dequantize_row(w->type, (const char *)w->data + (size_t)ids[t] * w->row_bytes,
				     out + (size_t)t * w->n_in, w->n_in);
	}
	return 0;
}

/* ---- rmsnorm ---- */

/* The sum of x[i] * x[i] (each square rounded to float, as ggml's) in
 * double: 16 partial sums, lane i % 16, then the tail and the lanes in
 * order.  ggml adds one term at a time, a chain of N dependent double adds
 * (with a scalar scale loop about 1 us for a 576-wide row here, against
 * 0.3 us now); the order here differs from it only in the last bits of a
 * double, which the float scale almost never sees (test_cpu_backend).
 * Inlined into norm_row's clones: the same bits on every ISA (nothing
 * here contracts into an FMA). */
static inline double sum_squares(const float *x, int64_t n)
{
	v4d a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
	double s = 0;
	int64_t i = 0;

#define SQ(k) __builtin_convertvector(*(const v4f *)(x + i + 4 * (k)) * *(const v4f *)(x + i + 4 * (k)), v4d)
	for (; i + 16 <= n; i += 16) {
		a0 += SQ(0);
		a1 += SQ(1);
		a2 += SQ(2);
		a3 += SQ(3);
	}
#undef SQ
	for (; i < n; i++)
		s += (double)(x[i] * x[i]);
	for (int l = 0; l < 4; l++)
		s += a0[l];
	for (int l = 0; l < 4; l++)
		s += a1[l];
	for (int l = 0; l < 4; l++)
		s += a2[l];
	for (int l = 0; l < 4; l++)
		s += a3[l];
	return s;
}

struct norm_job {
	float *x;        /* (T, n); with y, x += y first */
	const float *y;  /* (T, n) or NULL */
	const float *g;
	float *out;      /* may be x or y */
	int64_t n;
	float eps;
};

/* Row T: x += y (vec_add, as cpu_add), then out = x * scale * g.  A row's y is
 * read before its out is written, so out may be y. */
VEC_CLONES
static void norm_row(const struct norm_job *j, int t)
{
	float *x = j->x + (size_t)t * j->n, *y = j->out + (size_t)t * j->n;

	if (j->y)
		vec_add(x, j->y + (size_t)t * j->n, j->n);
	float scale = 1.0f / sqrtf((float)(sum_squares(x, j->n) / j->n) + j->eps);
	int64_t i = 0;
	for (; i + 8 <= j->n; i += 8)
		*(v8f *)(y + i) = (*(const v8f *)(x + i) * scale) * *(const v8f *)(j->g + i);
	for (; i < j->n; i++)
		y[i] = (x[i] * scale) * j->g[i];
}

static void norm_task(void *ctx, int t, int worker)
{
	norm_row(ctx, t);
}

static void norm_run(struct backend *be, struct norm_job *j, int32_t T)
{
	if ((int64_t)T * j->n < PAR_MIN_ELEMS) {
		for (int32_t t = 0; t < T; t++)
			norm_row(j, t);
	} else {
		cpu_pool_run(cpu(be)->pool, norm_task, j, T);
	}
}

static int cpu_rmsnorm(struct backend *be, const float *x, const float *g, int32_t T,
		       int64_t n, float eps, float *out, const struct bk_weight *next)
{
	/* x is only written with a y */
	struct norm_job j = { (float *)x, NULL, g, out, n, eps };

	(void)next; /* the matmuls quantize their own input */
	norm_run(be, &j, T);
	return 0;
}

/* add, then rmsnorm, a row at a time: the same bits, one pass over x. */
static int cpu_add_rmsnorm(struct backend *be, float *x, const float *y, const float *g,
			   int32_t T, int64_t n, float eps, float *out, const struct bk_weight *next)
{
	struct norm_job j = { x, y, g, out, n, eps };
	norm_run(be, &j, T);
	return 0;
}

/* ---- matmul ---- */

static size_t packed_slot(const struct cpu_backend *c, const void *data)
{
	size_t h = ((uintptr_t)data >> 6) * 0x9e3779b97f4a7c15ull;
	size_t i = h & (c->packed_cap - 1);
	while (c->packed[i].data && c->packed[i].data != data)
		i = (i + 1) & (c->packed_cap - 1);
	return i;
}

struct pack_job {
	struct quant_packed *pk;
	int rows;                     /* rows per task */
};

static void pack_task(void *ctx, int t, int worker)
{
	struct pack_job *j = ctx;
	quant_pack_rows(j->pk, t * j->rows, j->rows);
}

/* W's packed copy if load_weight made one, else NULL. */
static struct quant_packed *packed_find(const struct cpu_backend *c, const struct bk_weight *w)
{
	if (!c->packed_cap)
		return NULL;
	const struct cpu_packed *e = &c->packed[packed_slot(c, w->data)];
	return e->data ? e->pk : NULL;
}

/* W's packed copy, made (in parallel) once; NULL when the ISA has no packed
 * layout for it or memory ran out (then W is read as it is). */
static struct quant_packed *packed_get(struct cpu_backend *c, const struct bk_weight *w)
{
	if (c->packed_n * 2 >= c->packed_cap) {
		size_t cap = c->packed_cap ? 2 * c->packed_cap : 256;
		struct cpu_packed *old = c->packed, *nt = calloc(cap, sizeof *nt);
		size_t old_cap = c->packed_cap;
		if (!nt)
			return NULL;
		c->packed = nt;
		c->packed_cap = cap;
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].data)
				c->packed[packed_slot(c, old[i].data)] = old[i];
		free(old);
	}
	size_t i = packed_slot(c, w->data);
	if (c->packed[i].data)
		return c->packed[i].pk;
	struct quant_packed *pk = NULL;
	if (quant_pack_new(w->type, w->n_in, w->data, w->row_bytes, (int)w->n_out, &pk) == 0) {
		struct pack_job j = { pk, 64 };
		cpu_pool_run(c->pool, pack_task, &j, (int)((w->n_out + j.rows - 1) / j.rows));
	}
	c->packed[i].data = w->data;
	c->packed[i].pk = pk;
	c->packed_n++;
	return pk;
}

struct mm_job {
	const struct bk_weight *const *w;
	struct quant_packed *pk[MM_MAX_WEIGHTS]; /* packed copies, or NULL */
	float *const *out;
	int nw;
	int32_t T;
	const void *xq;               /* (T, lda) activations in the vec type */
	size_t lda;
	const void *xp;               /* (T) activations packed for pk[*], or NULL */
	int64_t chunk;                /* weight rows per task */
	int first_task[MM_MAX_WEIGHTS + 1]; /* task index where weight k starts */
};

struct quant_job {
	const float *x;
	void *xq;
	int64_t n;
	size_t lda;
	uint32_t vec_type;
	const struct quant_packed *pk; /* with XP: pack each row for it too */
	void *xp;                      /* (T, xrow) rows in PK's activation layout, or NULL */
	size_t xrow;                   /* bytes of a row in XP */
};

static void quant_task(void *ctx, int t, int worker)
{
	struct quant_job *j = ctx;
	char *row = (char *)j->xq + (size_t)t * j->lda;
	quant_quantize_row(j->vec_type, j->x + (size_t)t * j->n, row, j->n);
	if (j->xp)
		quant_packed_pack_acts(j->pk, row, j->lda, 1, (char *)j->xp + (size_t)t * j->xrow);
}

static void mm_task(void *ctx, int task, int worker)
{
	struct mm_job *j = ctx;
	int k = 0;
	while (task >= j->first_task[k + 1])
		k++;
	const struct bk_weight *w = j->w[k];
	int64_t r0 = (int64_t)(task - j->first_task[k]) * j->chunk;
	int64_t nr = w->n_out - r0 < j->chunk ? w->n_out - r0 : j->chunk;
	if (j->xp)
		quant_gemm_packed_acts(j->pk[k], (int)r0, (int)nr, j->xp, j->T, j->out[k] + r0, (size_t)w->n_out);
	else if (j->pk[k])
		quant_gemm_packed(j->pk[k], (int)r0, (int)nr, j->xq, j->lda, j->T, j->out[k] + r0, (size_t)w->n_out);
	else
		quant_gemm(w->type, w->n_in, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
			   (int)nr, j->xq, j->lda, j->T, j->out[k] + r0, (size_t)w->n_out);
}

/* Rows per task of a matmul over many activation rows (prefill), a multiple
 * of 16.  Such a job is compute bound and its rows all cost the same, so
 * what matters is that the threads end together: each candidate is played
 * out as the pool runs it (tasks in order, each to the first thread free),
 * a task costing its rows plus MM_TASK_COST for what every task repeats
 * (ROWS: the weights' rows in all).  Of those within 1% of the shortest,
 * with at least two tasks per thread where the rows allow, the one nearest
 * four tasks per thread wins (slack for a thread that falls behind).
 * Measured on SmolLM2-135M (2 threads, a 173-token prompt), the old fixed
 * four tasks per thread cut o's and down's 576 rows into tasks of 80, ...,
 * 80, 16, one thread idle for a sixth of the job. */
#define MM_TASK_COST 8
#define MM_MAX_CAND 512
static int64_t mm_batch_chunk(const struct bk_weight *const *w, int nw, int64_t rows, int64_t threads)
{
	int64_t most = 0, span[MM_MAX_CAND], tasks[MM_MAX_CAND], best_span = INT64_MAX;
	int n = 0;

	if (threads < 2 || threads > 64) { /* one thread, or more than free_at holds */
		int64_t chunk = (rows / (4 * threads) + 15) & ~(int64_t)15;
		return chunk > 16 ? chunk : 16;
	}
	for (int k = 0; k < nw; k++)
		most = w[k]->n_out > most ? w[k]->n_out : most;
	for (; n < MM_MAX_CAND && 16 * (int64_t)n < most; n++) {
		int64_t chunk = 16 * (int64_t)(n + 1), free_at[64] = { 0 };
		span[n] = tasks[n] = 0;
		for (int k = 0; k < nw; k++)
			for (int64_t r0 = 0; r0 < w[k]->n_out; r0 += chunk, tasks[n]++) {
				int first = 0;
				for (int t = 1; t < threads; t++)
					if (free_at[t] < free_at[first])
						first = t;
				free_at[first] += (w[k]->n_out - r0 < chunk ? w[k]->n_out - r0 : chunk) + MM_TASK_COST;
				span[n] = free_at[first] > span[n] ? free_at[first] : span[n];
			}
		if (n > 0 && tasks[n] < 2 * threads)
			break; /* and fewer still from here on */
		best_span = span[n] < best_span ? span[n] : best_span;
	}
	int pick = 0;
	for (int i = 1; i < n; i++) {
		int64_t d = tasks[i] - 4 * threads, dp = tasks[pick] - 4 * threads;
		if (span[i] * 100 <= best_span * 101 &&
		    (span[pick] * 100 > best_span * 101 || llabs(d) <= llabs(dp)))
			pick = i;
	}
	return 16 * (int64_t)(pick + 1);
}

static int cpu_matmul(struct backend *be, const struct bk_weight *const *w, int nw,
		      const float *x, int32_t T, float *const *out)
{
	struct cpu_backend *c = cpu(be);
	const struct qtype_info *qi;
	struct mm_job j;
	int64_t n_in;
	uint32_t vec_type;

	if (nw < 1 || nw > MM_MAX_WEIGHTS || T < 1)
		return -EINVAL;
	qi = qtype_get(w[0]->type);
	if (!qi || !qi->weight_ok)
		return -ENOTSUP;
	n_in = w[0]->n_in;
	vec_type = qi->vec_type;
	for (int k = 1; k < nw; k++) {
		const struct qtype_info *qk = qtype_get(w[k]->type);
		if (!qk || !qk->weight_ok)
			return -ENOTSUP;
		if (qk->vec_type != vec_type || w[k]->n_in != n_in)
			return -EINVAL;
	}

	size_t lda = qtype_row_bytes(vec_type, n_in);
	size_t need = lda * (size_t)T;
	if (need > c->xq_cap) {
		void *p = realloc(c->xq, need);
		if (!p)
			return -ENOMEM;
		c->xq = p;
		c->xq_cap = need;
	}
	/* Packed matrices of one type share their activations' packed layout:
	 * each row packed once here rather than by every task. */
	struct quant_packed *pk[MM_MAX_WEIGHTS];
	size_t xrow = 0;
	for (int k = 0; k < nw; k++)
		pk[k] = packed_find(c, w[k]);
	if (pk[0]) {
		xrow = quant_packed_acts_bytes(pk[0], 1);
		for (int k = 1; k < nw; k++)
			if (!pk[k] || w[k]->type != w[0]->type)
				xrow = 0;
	}
	if (xrow * (size_t)T > c->xp_cap) {
		free(c->xp);
		c->xp_cap = 0;
		if (!(c->xp = aligned_alloc(64, (xrow * (size_t)T + 63) & ~(size_t)63)))
			return -ENOMEM;
		c->xp_cap = xrow * (size_t)T;
	}
	struct quant_job qj = { x, c->xq, n_in, lda, vec_type, pk[0], xrow ? c->xp : NULL, xrow };
	if (T >= 4)
		cpu_pool_run(c->pool, quant_task, &qj, T);
	else
		for (int t = 0; t < T; t++)
			quant_task(&qj, t, 0);

	/* Decode: about 64 KiB of weights per task (a task's software prefetch
	 * stops at its end, so longer runs stream faster), at least two tasks
	 * per thread, and a multiple of the threads in all, cut as evenly as
	 * multiples of 4 rows (the decode tile) allow: the threads then end a
	 * job together rather than one waiting out another's last long task.
	 * Many rows: mm_batch_chunk. */
	const int64_t threads = cpu_pool_threads(c->pool);
	int64_t rows = 0, chunk;
	for (int k = 0; k < nw; k++)
		rows += w[k]->n_out;
	if (T >= 16) {
		chunk = mm_batch_chunk(w, nw, rows, threads);
	} else {
		int64_t cap = (int64_t)(65536 / w[0]->row_bytes) & ~(int64_t)3;
		if (cap < 16)
			cap = 16;
		int64_t n = (rows + cap - 1) / cap;
		if (n < 2 * threads)
			n = 2 * threads;
		n = (n + threads - 1) / threads * threads;
		chunk = ((rows + n - 1) / n + 3) & ~(int64_t)3;
	}
	memset(&j, 0, sizeof j);
	j.w = w;
	j.out = out;
	j.nw = nw;
	j.T = T;
	j.xq = c->xq;
	j.lda = lda;
	j.xp = qj.xp;
	j.chunk = chunk;
	for (int k = 0; k < nw; k++) {
		j.pk[k] = pk[k];
		j.first_task[k + 1] = j.first_task[k] + (int)((w[k]->n_out + chunk - 1) / chunk);
	}
	cpu_pool_run(c->pool, mm_task, &j, j.first_task[nw]);
	return 0;
}

/* ---- rope ---- */

/* Whether A and B give the same angles (their every field). */
static int rope_same(const struct bk_rope *a, const struct bk_rope *b)
{
	return a->n_rot == b->n_rot && a->style == b->style && a->freq_factors == b->freq_factors &&
	       memcmp(&a->freq_base, &b->freq_base, sizeof(float)) == 0 &&
	       memcmp(&a->freq_scale, &b->freq_scale, sizeof(float)) == 0 &&
	       memcmp(&a->ext_factor, &b->ext_factor, sizeof(float)) == 0 &&
	       memcmp(&a->mscale, &b->mscale, sizeof(float)) == 0 &&
	       memcmp(a->corr_dims, b->corr_dims, sizeof a->corr_dims) == 0;
}

/* Pair I's angle from its unscaled one TE (backend.h's struct bk_rope):
 * ggml's rope_yarn, each rounding in its order (no FMA: this file's
 * portable code is built for baseline x86-64; the CUDA kernel spells its
 * roundings out). */
static inline float rope_angle(const struct bk_rope *rp, float te, int32_t i)
{
	float t = rp->freq_scale * te;

	if (rp->ext_factor != 0.0f) {
		float w = rp->corr_dims[1] - rp->corr_dims[0];
		float y = ((float)i - rp->corr_dims[0]) / (w > 0.001f ? w : 0.001f);
		float mix = (1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y)) * rp->ext_factor;
		t = t * (1.0f - mix) + te * mix;
	}
	return t;
}

/* The cos and sin pairs of T rows at POS, from C's cache or computed into
 * it; NULL when out of memory. */
static const float *rope_table(struct cpu_backend *c, int32_t T, const int32_t *pos, const struct bk_rope *rp)
{
	const size_t pairs = (size_t)rp->n_rot / 2;
	const int scaled = bk_rope_scaled(rp);

	if (T == c->rope_T && rope_same(rp, &c->rope_p) && memcmp(pos, c->rope_pos, (size_t)T * sizeof *pos) == 0)
		return c->rope_cs;
	if ((size_t)T * pairs > c->rope_cap) { /* T rows of PAIRS, positions as many */
		float *cs = malloc((size_t)T * pairs * 2 * sizeof *cs);
		int32_t *p = malloc((size_t)T * pairs * sizeof *p);
		if (!cs || !p) {
			free(cs);
			free(p);
			return NULL;
		}
		free(c->rope_cs);
		free(c->rope_pos);
		c->rope_cs = cs;
		c->rope_pos = p;
		c->rope_cap = (size_t)T * pairs;
	}
	/* As ggml: theta_i = pos * base^(-2i/n_rot), advanced by repeated
	 * multiplication in float, divided by its factor, then scaled. */
	const float theta_scale = powf(rp->freq_base, -2.0f / (float)rp->n_rot);
	for (int32_t t = 0; t < T; t++) {
		float theta = (float)pos[t], *cs = c->rope_cs + (size_t)t * pairs * 2;
		for (size_t i = 0; i < pairs; i++) {
			if (!scaled) {
				cs[2 * i] = cosf(theta);
				cs[2 * i + 1] = sinf(theta);
			} else {
				float a = rope_angle(rp, rp->freq_factors ? theta / rp->freq_factors[i] : theta, (int32_t)i);
				cs[2 * i] = cosf(a) * rp->mscale;
				cs[2 * i + 1] = sinf(a) * rp->mscale;
			}
			theta *= theta_scale;
		}
	}
	memcpy(c->rope_pos, pos, (size_t)T * sizeof *pos);
	c->rope_T = T;
	c->rope_p = *rp;
	return c->rope_cs;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ROPE_AVX2 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2")
#pragma GCC optimize("fp-contract=off")

/* cpu_rope's loop over rows and heads, eight elements at a time: the same
 * two products and one add or subtract per element (addsub takes an even
 * lane's x0 c - x1 s and an odd one's x1 c + x0 s), nothing fused, so the
 * scalar loop's bits; the pairs past a multiple of 4 (normal) or 8
 * (neox) go through that loop.  Returns the pairs done per head. */
static int32_t rope_avx2(float *x, int32_t T, int32_t n_head, int32_t head_dim, int32_t n_rot, const float *tab,
			 enum bk_rope_style style)
{
	const int32_t half = n_rot / 2, done = style == BK_ROPE_NORMAL ? half & ~3 : half & ~7;

	for (int32_t t = 0; t < T; t++) {
		const float *cs = tab + (size_t)t * n_rot;
		for (int32_t h = 0; h < n_head; h++) {
			float *v = x + ((size_t)t * n_head + h) * head_dim;
			if (style == BK_ROPE_NORMAL) {
				for (int32_t i = 0; i < done; i += 4) {
					__m256 xv = _mm256_loadu_ps(v + 2 * i), c = _mm256_loadu_ps(cs + 2 * i);
					__m256 p = _mm256_mul_ps(xv, _mm256_moveldup_ps(c));
					__m256 q = _mm256_mul_ps(_mm256_permute_ps(xv, 0xb1), _mm256_movehdup_ps(c));
					_mm256_storeu_ps(v + 2 * i, _mm256_addsub_ps(p, q));
				}
				continue;
			}
			for (int32_t i = 0; i < done; i += 8) {
				__m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
				__m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
				__m256 sn = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
				__m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
				_mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, sn)));
				_mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(x0, sn), _mm256_mul_ps(x1, c)));
			}
		}
	}
	return done;
}

#pragma GCC pop_options
#endif

static int cpu_rope(struct backend *be, float *x, int32_t T, int32_t n_head, int32_t head_dim,
		    const int32_t *pos, const struct bk_rope *rp)
{
	const int32_t n_rot = rp->n_rot;
	const enum bk_rope_style style = rp->style;
	const float *tab;
	int32_t i0 = 0; /* pairs the AVX2 loop did */

	if (n_rot > head_dim || n_rot % 2 || n_rot > 1024 || n_rot < 0)
		return -EINVAL;
	if (n_rot == 0 || T < 1)
		return 0;
	if (!(tab = rope_table(cpu(be), T, pos, rp)))
		return -ENOMEM;
#ifdef ROPE_AVX2
	if (quant_get_isa() >= QUANT_ISA_AVX2 && (i0 = rope_avx2(x, T, n_head, head_dim, n_rot, tab, style)) == n_rot / 2)
		return 0;
#endif
	for (int32_t t = 0; t < T; t++) {
		const float *cs = tab + (size_t)t * n_rot;
		for (int32_t h = 0; h < n_head; h++) {
			float *v = x + ((size_t)t * n_head + h) * head_dim;
			for (int32_t i = i0; i < n_rot / 2; i++) {
				int32_t a = style == BK_ROPE_NORMAL ? 2 * i : i;
				int32_t b = style == BK_ROPE_NORMAL ? 2 * i + 1 : i + n_rot / 2;
				float x0 = v[a], x1 = v[b];
				v[a] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
				v[b] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
			}
		}
	}
	return 0;
}

/* ---- paged KV ---- */

/* Address of token position POS's row (K when which == 0, V when 1) of LAYER. */
static void *kv_slot(const struct bk_kv *kv, const int32_t *table, int32_t layer, int which,
		     int32_t pos)
{
	int32_t b = table[pos / kv->block_tokens];
	int32_t t = pos % kv->block_tokens;
	size_t off = (((size_t)layer * 2 + which) * kv->block_tokens + t) * kv->row_bytes;
	return (char *)kv->base + (size_t)b * kv->block_bytes + off;
}

/* One token's row, converted on its own: the bits stored depend on nothing
 * but SRC (Q8_0: ggml's activation quantizer, blocks of 32 along the row). */
static void kv_write(const struct bk_kv *kv, void *dst, const float *src)
{
	switch (kv->type) {
	case QT_F16: /* F16C where the CPU has it: qt_f32_to_f16's bits */
	case QT_Q8_0:
		quant_quantize_row(kv->type, src, dst, kv->kv_dim);
		break;
	default:
		memcpy(dst, src, (size_t)kv->kv_dim * sizeof(float));
		break;
	}
}

static int cpu_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
			const struct bk_rows *rows, const float *k, const float *v)
{
	for (int32_t t = 0; t < rows->n; t++) {
		const int32_t *table = rows->block_table[t];
		kv_write(kv, kv_slot(kv, table, layer, 0, rows->pos[t]), k + (size_t)t * kv->kv_dim);
		kv_write(kv, kv_slot(kv, table, layer, 1, rows->pos[t]), v + (size_t)t * kv->kv_dim);
	}
	return 0;
}

/* ---- attention ----
 *
 * Two paths that give the same bits.  The portable one (attn_task) runs one
 * task per (row, kv head).  The AVX2 one (x86-64-v3 CPUs, head_dim a
 * multiple of 16) lets the rows of a prefill chunk share each K/V chunk
 * they read, converts f16 inside its dot products, lets up to three query
 * heads of a row share each load and conversion, splits a kv head's query
 * heads across tasks when there are fewer tasks than threads, and works on
 * eight positions at once.  Yet every row still does the portable path's
 * arithmetic exactly, whatever rows share its step: the same chunks, the
 * same 16 FMA partial sums added in the same order, the same online-softmax
 * updates, and glibc's expf to the bit.  The portable path is compiled per
 * ISA (VEC_CLONES) and on an x86-64-v3 CPU runs its FMA clone, which is why
 * the AVX2 path fuses exactly where that clone does.
 */

#define ATTN_MAX_GROUP 16   /* query heads per kv head */
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_MAX_Q 48       /* queries (rows x query heads) in one AVX2 task */

/* Rows of one step from one sequence at consecutive positions. */
struct attn_group {
	int32_t t0;         /* first row */
	int32_t n;          /* rows: t0 .. t0 + n - 1 */
	int64_t work;       /* n times the positions the last row attends to */
};

struct attn_job {
	const struct bk_kv *kv;
	int32_t layer;
	const struct bk_rows *rows;
	const struct bk_attn *a;
	const float *q;
	float *out;
	/* the AVX2 path's plan */
	const struct attn_group *groups; /* (n_groups) the largest first */
	int32_t split;       /* tasks per (group, kv head), each a range of its query heads */
	float *scratch;      /* (threads, scratch_floats) per-worker state */
	size_t scratch_floats;
};

/* Positions handled at once: converted K/V rows and their scores stay in L1. */
#define ATTN_CHUNK 32

/* Positions of the chunk that starts at P, of N_POS, with BT-token blocks:
 * never across a block edge, at most ATTN_CHUNK.  Both attention paths cut
 * a row's positions here, which keeps their arithmetic the same. */
static inline int32_t attn_chunk_len(int32_t p, int32_t n_pos, int32_t bt)
{
	int32_t n = n_pos - p, to_edge = bt - p % bt;
	if (n > to_edge)
		n = to_edge;
	return n < ATTN_CHUNK ? n : ATTN_CHUNK;
}

/* The start of the chunk that holds position LO, on the grid attn_chunk_len
 * cuts from position 0 (whole chunks from each block's start): a row whose
 * window starts at LO begins there, masking the positions before LO, so
 * that alone or beside other rows of its sequence it reads the same chunks. */
static inline int32_t attn_chunk_start(int32_t lo, int32_t bt)
{
	int32_t off = lo % bt;
	return lo - off + off / ATTN_CHUNK * ATTN_CHUNK;
}

/* Elements [c0, c0 + n) of a Q8_0 row as floats: each int8 times its
 * block's scale.  They are whole blocks (head_dim a multiple of 32) or lie
 * inside one block (head_dim dividing 32): a head never straddles an edge. */
static void q8_0_slice_to_f32(const char *row, int32_t c0, int32_t n, float *dst)
{
	const struct block_q8_0 *blk = (const struct block_q8_0 *)row + c0 / QK;

	if (c0 % QK == 0 && n % QK == 0) { /* whole blocks: quant.c's SIMD path */
		quant_dequantize_row(QT_Q8_0, blk, dst, n);
		return;
	}
	/* a head inside one block (head_dim dividing 32): the same products */
	float d = qt_f16_to_f32(blk->d);
	for (int32_t i = 0; i < n; i++)
		dst[i] = (float)blk->qs[c0 % QK + i] * d;
}

/* Rows [p, p + n) of K or V (WHICH) for kv head HK as floats: a pointer into
 * the pool for f32, else converted into BUF (the positions of one chunk,
 * never the sequence). */
static const float *kv_rows(const struct bk_kv *kv, const int32_t *table, int32_t layer, int which,
			    int32_t p, int32_t n, int32_t hk, int32_t hd, float *buf)
{
	const char *row0 = kv_slot(kv, table, layer, which, p);

	if (kv->type == QT_F32 && n == 1)
		return (const float *)row0 + (size_t)hk * hd;
	for (int32_t t = 0; t < n; t++) {
		const char *row = row0 + t * kv->row_bytes;
		if (kv->type == QT_Q8_0)
			q8_0_slice_to_f32(row, hk * hd, hd, buf + (size_t)t * hd);
		else
			quant_dequantize_row(kv->type, row + (size_t)hk * hd * (kv->type == QT_F16 ? 2 : 4),
					     buf + (size_t)t * hd, hd);
	}
	return buf;
}

/* One (row, kv head) pair: every query head of the group streams over the
 * row's positions a chunk at a time (never across a block boundary), with a
 * running max and sum (online softmax), so nothing is gathered into a
 * contiguous copy of the sequence. */
VEC_CLONES
static void attn_task(void *ctx, int task, int worker)
{
	const struct attn_job *j = ctx;
	const struct bk_kv *kv = j->kv;
	const struct bk_attn *a = j->a;
	int32_t t = task / a->n_head_kv, hk = task % a->n_head_kv;
	int32_t group = a->n_head / a->n_head_kv, hd = a->head_dim, bt = kv->block_tokens;
	int32_t n_pos = j->rows->pos[t] + 1;
	const int32_t *table = j->rows->block_table[t];
	float m[ATTN_MAX_GROUP], l[ATTN_MAX_GROUP], sc[ATTN_CHUNK];
	float acc[ATTN_MAX_GROUP][ATTN_MAX_HEAD_DIM];
	float kbuf[ATTN_CHUNK * ATTN_MAX_HEAD_DIM], vbuf[ATTN_CHUNK * ATTN_MAX_HEAD_DIM];
	const float *qh[ATTN_MAX_GROUP];

	for (int g = 0; g < group; g++) {
		m[g] = -INFINITY;
		l[g] = 0;
		memset(acc[g], 0, (size_t)hd * sizeof(float));
		qh[g] = j->q + ((size_t)t * a->n_head + hk * group + g) * hd;
	}
	const int32_t lo = bk_attn_first(a, n_pos - 1);
	for (int32_t p = attn_chunk_start(lo, bt); p < n_pos;) {
		int32_t n = attn_chunk_len(p, n_pos, bt), skip = lo > p ? lo - p : 0;
		const float *kr = kv->type == QT_F32 ? NULL : kv_rows(kv, table, j->layer, 0, p, n, hk, hd, kbuf);
		const float *vr = kv->type == QT_F32 ? NULL : kv_rows(kv, table, j->layer, 1, p, n, hk, hd, vbuf);
		for (int g = 0; g < group; g++) {
			float mx = m[g];
			for (int32_t i = 0; i < n; i++) {
				const float *k = kr ? kr + (size_t)i * hd : kv_rows(kv, table, j->layer, 0, p + i, 1, hk, hd, NULL);
				/* before the window: masked, and skipped below */
				sc[i] = i < skip ? -INFINITY : vec_dot_f32(qh[g], k, hd) * a->scale;
				if (sc[i] > mx)
					mx = sc[i];
			}
			if (mx > m[g]) {
				float corr = expf(m[g] - mx); /* 0 on the first chunk */
				l[g] *= corr;
				vec_scale(acc[g], corr, hd);
				m[g] = mx;
			}
			for (int32_t i = skip; i < n; i++) {
				const float *v = vr ? vr + (size_t)i * hd : kv_rows(kv, table, j->layer, 1, p + i, 1, hk, hd, NULL);
				float e = expf(sc[i] - mx);
				l[g] += e;
				vec_scale_add(acc[g], v, e, hd);
			}
		}
		p += n;
	}
	for (int g = 0; g < group; g++) {
		float *o = j->out + ((size_t)t * a->n_head + hk * group + g) * hd;
		float inv = 1.0f / l[g];
		for (int32_t c = 0; c < hd; c++)
			o[c] = acc[g][c] * inv;
	}
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_AVX2 1
#include <immintrin.h>

/* Every FMA below is written out: the compiler must not contract anything
 * else, or a row's bits would depend on what it inlined where. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")

#define ATTN_INLINE static inline __attribute__((always_inline))

/* glibc's expf (2.27 on, sysdeps/ieee754/flt-32/e_expf.c) as its FMA build,
 * the one x86-64-v3 CPUs run, computes it for |x| < 88: x*32/ln2 = k + r,
 * 2^(k/32) from this table, a cubic in r, all in double.  The contractions
 * are those of that build's object code.  Other inputs go to expf itself. */
static const uint64_t expf_tab[32] = {
	0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
	0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
	0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
	0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
	0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
	0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
	0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
	0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

ATTN_INLINE __m256d pd_bits(uint64_t u)
{
	return _mm256_castsi256_pd(_mm256_set1_epi64x((long long)u));
}

ATTN_INLINE __m128 attn_exp4(__m128 x)
{
	const __m256d invln2n = pd_bits(0x40471547652b82fe), shift = pd_bits(0x4338000000000000);
	__m256d xd = _mm256_cvtps_pd(x);
	__m256d kds = _mm256_fmadd_pd(invln2n, xd, shift);
	__m256i ki = _mm256_castpd_si256(kds);
	__m256d kd = _mm256_sub_pd(kds, shift);
	__m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
	__m256i t = _mm256_i64gather_epi64((const long long *)expf_tab,
					   _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
	__m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
	__m256d z = _mm256_fmadd_pd(pd_bits(0x3ebc6af84b912394), r, pd_bits(0x3f2ebfce50fac4f3));
	__m256d r2 = _mm256_mul_pd(r, r);
	__m256d y = _mm256_fmadd_pd(r, pd_bits(0x3f962e42ff0c52d6), _mm256_set1_pd(1.0));
	y = _mm256_fmadd_pd(z, r2, y);
	return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* expf of each lane, bit for bit. */
ATTN_INLINE __m256 attn_exp8(__m256 x)
{
	__m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20),
				       _mm256_set1_epi32(0x7ff));
	int special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
	__m256 y = _mm256_set_m128(attn_exp4(_mm256_extractf128_ps(x, 1)), attn_exp4(_mm256_castps256_ps128(x)));

	if (special) { /* |x| >= 88, infinities, NaN: rare */
		float xs[8], ys[8];
		_mm256_storeu_ps(xs, x);
		_mm256_storeu_ps(ys, y);
		for (int i = 0; i < 8; i++)
			if (special >> i & 1)
				ys[i] = expf(xs[i]);
		y = _mm256_loadu_ps(ys);
	}
	return y;
}

/* 1 when attn_exp8 gives this libm's expf bits on a sample of the inputs
 * attention (x <= 0) and SwiGLU (either sign) make (with glibc 2.36 they
 * agree on all 2^32 floats). */
static int attn_exp_matches_libm(void)
{
	float x[8], y[8];

	for (int i = 0; i < 16384; i += 8) {
		for (int k = 0; k < 8; k++) {
			int n = (i + k) % 8192;
			x[k] = n < 4096 ? -104.0f * (float)n / 4096 : -(float)(n - 4096) / 4096;
			if (i >= 8192)
				x[k] = -x[k];
		}
		_mm256_storeu_ps(y, attn_exp8(_mm256_loadu_ps(x)));
		for (int k = 0; k < 8; k++) {
			float want = expf(x[k]);
			if (memcmp(&want, &y[k], sizeof want))
				return 0;
		}
	}
	return 1;
}

/* 8 floats of a K or V row at element C, from f32 or f16 (exact either way). */
ATTN_INLINE __m256 attn_ld8(const char *row, int c, int f16)
{
	if (f16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + (size_t)c * 2)));
	return _mm256_loadu_ps((const float *)row + c);
}

/* r[k][j] = r[j][k] */
ATTN_INLINE void attn_tr8(__m256 r[8])
{
	__m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
	__m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
	__m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
	__m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
	__m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
	__m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
	__m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
	__m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
	r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
	r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
	r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
	r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
	r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
	r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
	r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
	r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* ---- a chunk for one to three query heads of a row ----
 *
 * A decode row's query heads of one kv head read the same K/V rows; up to
 * three of them share each load and f16 conversion here, which is what a
 * decode step's attention spends most of its time on where vcvtph2ps is
 * slow (two cycles a ymm on Zen 1, the kind of machine this was measured
 * on).  Every head does attn_task's arithmetic exactly, whatever heads
 * share its pass.
 */

#define ATTN_HEADS 3 /* query heads that share a chunk's loads */

/* *S += lanes 0..7 of each R[j] in lane order, eight rows as lanes. */
ATTN_INLINE void attn_tr8_sum(__m256 *s, __m256 r[8])
{
	attn_tr8(r);
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		*s = _mm256_add_ps(*s, r[j]);
}

/* S[h] lane j: vec_dot_f32(Q[h], row j) for NH (1..3) queries and the rows
 * K + min(j, nv - 1) * ks: the 16 partial sums (lanes 0-7 of a v16f, then
 * 8-15) each an FMA chain along the row, then added to 0 in lane order;
 * transposing them lets eight rows' final sums run as eight lanes.  Per
 * half, four rows at a time run NH x 4 chains from one load of each K
 * vector; heads 0 and 1 of four rows then share a transpose, and head
 * NH - 1 (unless NH is 2) transposes its eight rows. */
ATTN_INLINE void attn_dot8(const int nh, const float *const q[], const char *k, size_t ks, int nv, int hd, int f16,
			   __m256 s[])
{
	const char *kr[8];
	__m256 s01[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() }, sl = _mm256_setzero_ps();

#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		kr[j] = k + (size_t)(j < nv ? j : nv - 1) * ks;
	for (int half = 0; half < 16; half += 8) {
		__m256 last[8]; /* head NH - 1's chains for rows 0..7 */
#pragma GCC unroll 2
		for (int sub = 0; sub < 2; sub++) {
			__m256 p[ATTN_HEADS][4];
#pragma GCC unroll 3
			for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
				for (int j = 0; j < 4; j++)
					p[h][j] = _mm256_setzero_ps();
			for (int c = half; c < hd; c += 16)
#pragma GCC unroll 4
				for (int j = 0; j < 4; j++) {
					__m256 kv = attn_ld8(kr[4 * sub + j], c, f16);
#pragma GCC unroll 3
					for (int h = 0; h < nh; h++)
						p[h][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h] + c), kv, p[h][j]);
				}
			if (nh >= 2) {
				__m256 r[8] = { p[0][0], p[0][1], p[0][2], p[0][3], p[1][0], p[1][1], p[1][2], p[1][3] };
				attn_tr8_sum(&s01[sub], r);
			}
#pragma GCC unroll 4
			for (int j = 0; j < 4; j++)
				last[4 * sub + j] = p[nh - 1][j];
		}
		if (nh != 2)
			attn_tr8_sum(&sl, last);
	}
	if (nh >= 2) { /* [head 0 | head 1] of rows 0..3, then of rows 4..7 */
		s[0] = _mm256_insertf128_ps(s01[0], _mm256_castps256_ps128(s01[1]), 1);
		s[1] = _mm256_permute2f128_ps(s01[0], s01[1], 0x31);
	}
	if (nh != 2)
		s[nh - 1] = sl;
}

/* For each of NH heads, elements [c, c + 8 NB) of ACC[h] = acc * CORR[h]
 * (when UPD[h]), then += E[h][i] * V row i in position order: vec_scale and
 * vec_scale_add, element by element, each V vector loaded and converted
 * once for all heads. */
ATTN_INLINE void attn_vblock(const int nh, float *const acc[], const float *const e[], int nr, const char *v,
			     size_t vs, int c, const int nb, int f16, const int upd[], const float corr[])
{
	__m256 r[ATTN_HEADS][4];

#pragma GCC unroll 3
	for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
		for (int b = 0; b < nb; b++) {
			r[h][b] = _mm256_loadu_ps(acc[h] + c + 8 * b);
			if (upd[h])
				r[h][b] = _mm256_mul_ps(r[h][b], _mm256_set1_ps(corr[h]));
		}
	for (int i = 0; i < nr; i++) {
		const char *row = v + (size_t)i * vs;
		__m256 eb[ATTN_HEADS];
#pragma GCC unroll 3
		for (int h = 0; h < nh; h++)
			eb[h] = _mm256_broadcast_ss(e[h] + i);
#pragma GCC unroll 4
		for (int b = 0; b < nb; b++) {
			__m256 x = attn_ld8(row, c + 8 * b, f16);
#pragma GCC unroll 3
			for (int h = 0; h < nh; h++)
				r[h][b] = _mm256_fmadd_ps(eb[h], x, r[h][b]);
		}
	}
#pragma GCC unroll 3
	for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
		for (int b = 0; b < nb; b++)
			_mm256_storeu_ps(acc[h] + c + 8 * b, r[h][b]);
}

/* attn_task's loop body for NH (1..3) query heads of one row, which reach
 * the same NR positions of a chunk (rows K, V, VS bytes apart): queries
 * Q[h], running max M[h] and sum L[h], accumulators ACC[h]. */
ATTN_INLINE void attn_chunk(const int nh, const float *const q[], const char *k, const char *v, size_t vs, int nr,
			    int skip, int hd, float scale, float *m, float *l, float *const acc[], int f16)
{
	float sc[ATTN_HEADS][ATTN_CHUNK] __attribute__((aligned(32)));
	float e[ATTN_HEADS][ATTN_CHUNK] __attribute__((aligned(32)));
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const float *ep[ATTN_HEADS];
	__m256 mxv[ATTN_HEADS];
	float corr[ATTN_HEADS];
	int upd[ATTN_HEADS];

#pragma GCC unroll 3
	for (int h = 0; h < nh; h++)
		mxv[h] = _mm256_set1_ps(m[h]);
	for (int i = 0; i < nr; i += 8) {
		int nv = nr - i < 8 ? nr - i : 8;
		__m256 s[ATTN_HEADS];
		attn_dot8(nh, q, k + (size_t)i * vs, vs, nv, hd, f16, s);
#pragma GCC unroll 3
		for (int h = 0; h < nh; h++) {
			s[h] = _mm256_mul_ps(s[h], _mm256_set1_ps(scale));
			if (i < skip) /* before the row's window: -inf, and skipped below */
				s[h] = _mm256_blendv_ps(s[h], _mm256_set1_ps(-INFINITY),
							_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(skip - i), lane)));
			if (nv < 8) /* past the end: copies of the first score, which change nothing */
				s[h] = _mm256_blendv_ps(s[h], _mm256_permutevar8x32_ps(s[h], _mm256_setzero_si256()),
							_mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(nv - 1))));
			_mm256_store_ps(sc[h] + i, s[h]);
			/* sc > mx ? sc : mx, as attn_task's loop: NaN scores never win */
			mxv[h] = _mm256_max_ps(s[h], mxv[h]);
		}
	}
	for (int h = 0; h < nh; h++) {
		/* The lanes hold no NaN, so this is the loop's maximum; only the
		 * sign of a zero maximum can differ, and no result depends on it. */
		__m128 x = _mm_max_ps(_mm256_castps256_ps128(mxv[h]), _mm256_extractf128_ps(mxv[h], 1));
		x = _mm_max_ps(x, _mm_movehl_ps(x, x));
		x = _mm_max_ss(x, _mm_movehdup_ps(x));
		float mx = _mm_cvtss_f32(x), ll = l[h];

		corr[h] = 1.0f;
		upd[h] = mx > m[h];
		if (upd[h]) {
			corr[h] = expf(m[h] - mx); /* 0 on the first chunk */
			ll *= corr[h];
			m[h] = mx;
		}
		for (int i = 0; i < nr; i += 8)
			_mm256_store_ps(e[h] + i, attn_exp8(_mm256_sub_ps(_mm256_load_ps(sc[h] + i), _mm256_set1_ps(mx))));
		for (int i = skip; i < nr; i++)
			ll += e[h][i];
		l[h] = ll;
		ep[h] = e[h] + skip;
	}
	int c = 0;
	v += (size_t)skip * vs;
	for (; c + 32 <= hd; c += 32)
		attn_vblock(nh, acc, ep, nr - skip, v, vs, c, 4, f16, upd, corr);
	if (c < hd)
		attn_vblock(nh, acc, ep, nr - skip, v, vs, c, 2, f16, upd, corr);
}

/* N rows of HD elements (F16 or Q8_0 at element C0 of each pool row, ROW
 * bytes apart) as floats in DST: the values kv_rows gives. */
ATTN_INLINE void attn_convert(const struct bk_kv *kv, const char *src, int32_t c0, int32_t n, int32_t hd,
			      float *dst)
{
	for (int32_t t = 0; t < n; t++, src += kv->row_bytes, dst += hd) {
		if (kv->type == QT_F16) {
			const qt_f16 *h = (const qt_f16 *)src + c0;
			for (int32_t c = 0; c < hd; c += 8)
				_mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + c))));
			continue;
		}
		/* Q8_0: each int8 times its block's scale (q8_0_slice_to_f32) */
		for (int32_t c = 0; c < hd; c += 8) {
			const struct block_q8_0 *blk = (const struct block_q8_0 *)src + (c0 + c) / QK;
			__m256 d = _mm256_set1_ps(_cvtsh_ss(blk->d));
			__m256i qs = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs + (c0 + c) % QK)));
			_mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_cvtepi32_ps(qs), d));
		}
	}
}

/* One (row group, kv head) pair, or a range of its query heads: the group's
 * positions a chunk at a time, each chunk read (and converted) once for
 * every query whose row reaches it; a row's last chunk ends at its own
 * position, as it does alone. */
static void attn_avx2_task(void *ctx, int task, int worker)
{
	const struct attn_job *j = ctx;
	const struct bk_kv *kv = j->kv;
	const struct bk_attn *a = j->a;
	const int32_t group = a->n_head / a->n_head_kv, hd = a->head_dim, bt = kv->block_tokens;
	const int32_t split = j->split, hk = task / split % a->n_head_kv, part = task % split;
	const struct attn_group *gr = &j->groups[task / split / a->n_head_kv];
	const int32_t g0 = part * group / split, ng = (part + 1) * group / split - g0;
	const int32_t nq = gr->n * ng, pos0 = j->rows->pos[gr->t0], n_pos = pos0 + gr->n;
	const int32_t *table = j->rows->block_table[gr->t0];
	float *m = j->scratch + (size_t)worker * j->scratch_floats, *l = m + ATTN_MAX_Q;
	float *acc = l + ATTN_MAX_Q, *kbuf = acc + (size_t)ATTN_MAX_Q * hd, *vbuf = kbuf + (size_t)ATTN_CHUNK * hd;
	/* Converting each chunk once pays when many queries read it; a decode
	 * row's few are faster converting as they read. */
	const int buffered = kv->type == QT_Q8_0 || (kv->type == QT_F16 && nq >= 4);
	const size_t esz = kv->type == QT_F32 ? 4 : 2;
	/* this head's bytes in a pool row (Q8_0: its whole blocks) */
	const size_t q8b = sizeof(struct block_q8_0);
	const size_t slice_off = kv->type == QT_Q8_0 ? (size_t)(hk * hd / QK) * q8b : (size_t)hk * hd * esz;
	const size_t slice_len = kv->type == QT_Q8_0 ? (size_t)((hd + QK - 1) / QK) * q8b : (size_t)hd * esz;

	for (int32_t i = 0; i < nq; i++) {
		m[i] = -INFINITY;
		l[i] = 0;
	}
	memset(acc, 0, (size_t)nq * hd * sizeof(float));
	/* from the chunk of the first row's window (rows' windows start in
	 * position order) */
	for (int32_t p = attn_chunk_start(bk_attn_first(a, pos0), bt); p < n_pos;) {
		int32_t n = attn_chunk_len(p, n_pos, bt);
		const char *k = kv_slot(kv, table, j->layer, 0, p), *v = kv_slot(kv, table, j->layer, 1, p);
		size_t vs = kv->row_bytes;
		/* The next chunk's slices of this head, from DRAM while this one
		 * computes: a long context's K and V are far past the caches, in
		 * blocks scattered over the pool where no hardware prefetcher
		 * follows. */
		if (p + n < n_pos) {
			int32_t nn = attn_chunk_len(p + n, n_pos, bt);
			const char *kn = kv_slot(kv, table, j->layer, 0, p + n) + slice_off;
			const char *vn = kv_slot(kv, table, j->layer, 1, p + n) + slice_off;
			for (int32_t t = 0; t < nn; t++)
				for (size_t o = 0; o < slice_len; o += 64) {
					_mm_prefetch(kn + (size_t)t * kv->row_bytes + o, _MM_HINT_T0);
					_mm_prefetch(vn + (size_t)t * kv->row_bytes + o, _MM_HINT_T0);
				}
		}
		if (buffered) {
			attn_convert(kv, k, hk * hd, n, hd, kbuf);
			attn_convert(kv, v, hk * hd, n, hd, vbuf);
			k = (const char *)kbuf;
			v = (const char *)vbuf;
			vs = (size_t)hd * sizeof(float);
		} else {
			k += (size_t)hk * hd * esz;
			v += (size_t)hk * hd * esz;
		}
		/* rows before p - pos0 do not reach this chunk */
		for (int32_t r = p > pos0 ? p - pos0 : 0; r < gr->n; r++) {
			int32_t nr = pos0 + r + 1 - p < n ? pos0 + r + 1 - p : n, lo = bk_attn_first(a, pos0 + r);
			if (lo >= p + n) /* its window starts past this chunk: so do the later rows' */
				break;
			const int32_t skip = lo > p ? lo - p : 0;
			const int f16 = !buffered && kv->type == QT_F16;
			for (int32_t g = 0; g < ng;) {
				int32_t qi = r * ng + g, nh = ng - g < ATTN_HEADS ? ng - g : ATTN_HEADS;
				const float *q = j->q + ((size_t)(gr->t0 + r) * a->n_head + hk * group + g0 + g) * hd;
				const float *qs[ATTN_HEADS];
				float *as[ATTN_HEADS];
				for (int32_t h = 0; h < nh; h++) {
					qs[h] = q + (size_t)h * hd;
					as[h] = acc + (size_t)(qi + h) * hd;
				}
				/* the head count and f16 constants in each copy */
#define ATTN_CHUNK_CALL(NH) (f16 ? attn_chunk(NH, qs, k, v, vs, nr, skip, hd, a->scale, &m[qi], &l[qi], as, 1) \
			     : attn_chunk(NH, qs, k, v, vs, nr, skip, hd, a->scale, &m[qi], &l[qi], as, 0))
				switch (nh) {
				case 3: ATTN_CHUNK_CALL(3); break;
				case 2: ATTN_CHUNK_CALL(2); break;
				default: ATTN_CHUNK_CALL(1); break;
				}
#undef ATTN_CHUNK_CALL
				g += nh;
			}
		}
		p += n;
	}
	for (int32_t r = 0; r < gr->n; r++)
		for (int32_t g = 0; g < ng; g++) {
			int32_t qi = r * ng + g;
			float *o = j->out + ((size_t)(gr->t0 + r) * a->n_head + hk * group + g0 + g) * hd;
			const float *ac = acc + (size_t)qi * hd;
			__m256 inv = _mm256_set1_ps(1.0f / l[qi]);
			for (int32_t c = 0; c < hd; c += 8)
				_mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(ac + c), inv));
		}
}

/* GeGLU's gelu(a) * b eight at a time: gelu_of's steps, each rounded. */
static void geglu_avx2(const float *a, const float *b, float *out, int64_t n)
{
	const __m256 c0 = _mm256_set1_ps(GELU_2C0), c1 = _mm256_set1_ps(GELU_C1), one = _mm256_set1_ps(1.0f);
	int64_t k = 0;

	for (; k + 8 <= n; k += 8) {
		__m256 x = _mm256_loadu_ps(a + k);
		__m256 y = _mm256_mul_ps(c0, _mm256_mul_ps(x, _mm256_add_ps(one, _mm256_mul_ps(c1, _mm256_mul_ps(x, x)))));
		__m256 g = _mm256_sub_ps(x, _mm256_div_ps(x, _mm256_add_ps(attn_exp8(y), one)));
		_mm256_storeu_ps(out + k, _mm256_mul_ps(g, _mm256_loadu_ps(b + k)));
	}
	for (; k < n; k++)
		out[k] = gelu_of(a[k]) * b[k];
}

/* SwiGLU's a / (1 + expf(-a)) * b eight at a time: the scalar loop's bits
 * (negation, add, divide and multiply are exact roundings either way). */
static void swiglu_avx2(const float *a, const float *b, float *out, int64_t n)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
	int64_t k = 0;

	for (; k + 8 <= n; k += 8) {
		__m256 x = _mm256_loadu_ps(a + k);
		__m256 y = _mm256_div_ps(x, _mm256_add_ps(one, attn_exp8(_mm256_xor_ps(x, sign))));
		_mm256_storeu_ps(out + k, _mm256_mul_ps(y, _mm256_loadu_ps(b + k)));
	}
	for (; k < n; k++)
		out[k] = a[k] / (1.0f + expf(-a[k])) * b[k];
}

#pragma GCC pop_options

/* Whether this CPU runs the AVX2 code and attn_exp8 gives this libm's expf
 * bits (checked once on a sample; a libm other than glibc's may not). */
static int avx2_exp_ok(void)
{
	static int cpu_ok = -1; /* relaxed atomics: every thread computes the same */
	int ok = __atomic_load_n(&cpu_ok, __ATOMIC_RELAXED);

	if (ok < 0) {
		__builtin_cpu_init();
		ok = __builtin_cpu_supports("x86-64-v3") && attn_exp_matches_libm();
		__atomic_store_n(&cpu_ok, ok, __ATOMIC_RELAXED);
	}
	return ok;
}

/* Whether the AVX2 path gives this CPU's attn_task bits: its FMA clone runs
 * where x86-64-v3 does (the AVX-512 clone's arithmetic is the same), and
 * attn_exp8 must round as this libm's expf, which a sample checks once (a
 * libm other than glibc's may not).  QUANT_ISA_SCALAR asks for the
 * portable path, as it does of the matmuls. */
static int attn_avx2_ok(const struct bk_kv *kv, const struct bk_attn *a)
{
	return avx2_exp_ok() && a->head_dim % 16 == 0 && quant_get_isa() >= QUANT_ISA_AVX2 &&
	       (kv->type == QT_F32 || kv->type == QT_F16 || kv->type == QT_Q8_0);
}

static int group_cmp(const void *x, const void *y)
{
	const struct attn_group *a = x, *b = y;
	if (a->work != b->work)
		return a->work > b->work ? -1 : 1;
	return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

/* Plans and runs the AVX2 path: rows grouped by sequence, the largest
 * groups first so the last tasks to start are short ones. */
static int attn_avx2_run(struct cpu_backend *c, struct attn_job *j)
{
	const struct bk_rows *rows = j->rows;
	const struct bk_attn *a = j->a;
	int32_t group = a->n_head / a->n_head_kv, cap = ATTN_MAX_Q / group, n_groups = 0;
	int threads = cpu_pool_threads(c->pool);
	size_t floats = 2 * ATTN_MAX_Q + (size_t)(ATTN_MAX_Q + 2 * ATTN_CHUNK) * a->head_dim;

	if ((size_t)rows->n > c->attn_groups_cap) {
		struct attn_group *g = realloc(c->attn_groups, (size_t)rows->n * sizeof *g);
		if (!g)
			return -ENOMEM;
		c->attn_groups = g;
		c->attn_groups_cap = (size_t)rows->n;
	}
	if (floats * threads > c->attn_scratch_cap) {
		free(c->attn_scratch);
		c->attn_scratch_cap = 0;
		c->attn_scratch = aligned_alloc(64, (floats * threads * sizeof(float) + 63) & ~(size_t)63);
		if (!c->attn_scratch)
			return -ENOMEM;
		c->attn_scratch_cap = floats * threads;
	}
	for (int32_t t = 0; t < rows->n;) {
		struct attn_group *g = &c->attn_groups[n_groups++];
		g->t0 = t;
		g->n = bk_rows_run(rows, t, cap);
		g->work = (int64_t)g->n * (rows->pos[t] + g->n);
		t += g->n;
	}
	qsort(c->attn_groups, (size_t)n_groups, sizeof *c->attn_groups, group_cmp);
	j->groups = c->attn_groups;
	/* Too few tasks for the threads: split the query heads of a kv head
	 * (each part then reads the chunks again, so no more than needed). */
	j->split = 1;
	if (n_groups * a->n_head_kv < threads) {
		int32_t tasks = n_groups * a->n_head_kv;
		j->split = (threads + tasks - 1) / tasks;
		if (j->split > group)
			j->split = group;
	}
	j->scratch = c->attn_scratch;
	j->scratch_floats = floats;
	cpu_pool_run(c->pool, attn_avx2_task, j, n_groups * a->n_head_kv * j->split);
	return 0;
}
#endif /* ATTN_AVX2 */

static int cpu_attention(struct backend *be, const struct bk_kv *kv, int32_t layer,
			 const struct bk_rows *rows, const struct bk_attn *a,
			 const float *q, float *out, const struct bk_weight *next)
{
	struct attn_job j = { kv, layer, rows, a, q, out, NULL, 1, NULL, 0 };

	(void)next; /* the matmuls quantize their own input */
	if (a->n_head_kv < 1 || a->n_head % a->n_head_kv || a->n_head / a->n_head_kv > ATTN_MAX_GROUP ||
	    a->head_dim > ATTN_MAX_HEAD_DIM || a->head_dim * a->n_head_kv != kv->kv_dim ||
	    (kv->type == QT_Q8_0 && a->head_dim % QK && QK % a->head_dim))
		return -EINVAL;
#ifdef ATTN_AVX2
	if (attn_avx2_ok(kv, a))
		return attn_avx2_run(cpu(be), &j);
#endif
	cpu_pool_run(cpu(be)->pool, attn_task, &j, rows->n * a->n_head_kv);
	return 0;
}

/* ---- element-wise ---- */

#define EW_CHUNK 16384 /* elements per task of a parallel element-wise op */

struct ew_job {
	const float *a, *b;
	float *out;
	int64_t n;
};

static void swiglu_task(void *ctx, int i, int worker)
{
	const struct ew_job *j = ctx;
	int64_t lo = (int64_t)i * EW_CHUNK, hi = lo + EW_CHUNK < j->n ? lo + EW_CHUNK : j->n;
#ifdef ATTN_AVX2
	if (avx2_exp_ok() && quant_get_isa() >= QUANT_ISA_AVX2) {
		swiglu_avx2(j->a + lo, j->b + lo, j->out + lo, hi - lo);
		return;
	}
#endif
	for (int64_t k = lo; k < hi; k++)
		j->out[k] = j->a[k] / (1.0f + expf(-j->a[k])) * j->b[k];
}

static void geglu_task(void *ctx, int i, int worker)
{
	const struct ew_job *j = ctx;
	int64_t lo = (int64_t)i * EW_CHUNK, hi = lo + EW_CHUNK < j->n ? lo + EW_CHUNK : j->n;
#ifdef ATTN_AVX2
	if (avx2_exp_ok() && quant_get_isa() >= QUANT_ISA_AVX2) {
		geglu_avx2(j->a + lo, j->b + lo, j->out + lo, hi - lo);
		return;
	}
#endif
	for (int64_t k = lo; k < hi; k++)
		j->out[k] = gelu_of(j->a[k]) * j->b[k];
}

VEC_CLONES
static void add_task(void *ctx, int i, int worker)
{
	const struct ew_job *j = ctx;
	int64_t lo = (int64_t)i * EW_CHUNK, hi = lo + EW_CHUNK < j->n ? lo + EW_CHUNK : j->n;
	vec_add(j->out + lo, j->a + lo, hi - lo);
}

/* Runs FN over N elements in EW_CHUNK pieces: inline when small. */
static void ew_run(struct backend *be, cpu_task_fn fn, struct ew_job *j)
{
	int tasks = (int)((j->n + EW_CHUNK - 1) / EW_CHUNK);
	if (j->n < PAR_MIN_ELEMS)
		for (int i = 0; i < tasks; i++)
			fn(j, i, 0);
	else
		cpu_pool_run(cpu(be)->pool, fn, j, tasks);
}

static int cpu_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		      const struct bk_weight *next)
{
	struct ew_job j = { g, u, out, n };
	ew_run(be, swiglu_task, &j);
	return 0;
}

static int cpu_geglu(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		     const struct bk_weight *next)
{
	struct ew_job j = { g, u, out, n };
	ew_run(be, geglu_task, &j);
	return 0;
}

static int cpu_scale(struct backend *be, float *x, int64_t n, float s)
{
	(void)be;
	for (int64_t i = 0; i < n; i++)
		x[i] *= s;
	return 0;
}

static int cpu_add_bias(struct backend *be, float *x, const float *b, int32_t T, int64_t n)
{
	(void)be;
	for (int32_t t = 0; t < T; t++)
		vec_add(x + (size_t)t * n, b, n);
	return 0;
}

static int cpu_add(struct backend *be, float *x, const float *y, int64_t n)
{
	struct ew_job j = { y, NULL, x, n };
	ew_run(be, add_task, &j);
	return 0;
}

/* A model weight: its packed copy now.  The engine's weights stay where
 * they are, unchanged, for the backend's life (the model mapping), which is
 * what makes a copy keyed by address safe; a weight the engine did not load
 * this way is always read as it is. */
static int cpu_load_weight(struct backend *be, const struct bk_weight *w)
{
	return packed_get(cpu(be), w) ? 1 : 0;
}

/* ---- lifecycle ---- */

static void cpu_free(struct backend *be)
{
	struct cpu_backend *c = cpu(be);
	cpu_pool_free(c->pool);
	for (size_t i = 0; i < c->packed_cap; i++)
		quant_packed_free(c->packed[i].pk);
	free(c->packed);
	free(c->attn_groups);
	free(c->attn_scratch);
	free(c->rope_cs);
	free(c->rope_pos);
	free(c->xq);
	free(c->xp);
	free(c);
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.free = cpu_free,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.add_rmsnorm = cpu_add_rmsnorm,
	.matmul = cpu_matmul,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.swiglu = cpu_swiglu,
	.geglu = cpu_geglu,
	.add = cpu_add,
	.scale = cpu_scale,
	.add_bias = cpu_add_bias,
	.load_weight = cpu_load_weight,
};

int cpu_backend_new(int n_threads, struct backend **ret)
{
	return cpu_backend_new_shared(n_threads, NULL, ret);
}

int cpu_backend_share(struct backend *be, struct backend *from)
{
	struct cpu_pool *p;

	if (!be || !from || be->ops != &cpu_ops || from->ops != &cpu_ops ||
	    (p = cpu(from)->pool) == cpu(be)->pool ||
	    cpu_pool_threads(p) != cpu_pool_threads(cpu(be)->pool))
		return 0;
	cpu_pool_ref(p);
	cpu_pool_free(cpu(be)->pool);
	cpu(be)->pool = p;
	return 1;
}

int cpu_backend_new_shared(int n_threads, struct backend *share, struct backend **ret)
{
	struct cpu_backend *c = calloc(1, sizeof *c);
	int r;

	if (!c)
		return -ENOMEM;
	c->base.ops = &cpu_ops;
	if (share && share->ops == &cpu_ops) {
		c->pool = cpu(share)->pool;
		cpu_pool_ref(c->pool);
	} else if ((r = cpu_pool_new(n_threads, &c->pool)) < 0) {
		free(c);
		return r;
	}
	*ret = &c->base;
	return 0;
}
