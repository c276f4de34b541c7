/* cpu_backend.c - the CPU backend: the reference implementation of every op.
 *
 * Matmuls quantize each activation row once and split weight rows across the
 * persistent worker pool (quant.c does the arithmetic), reading each model
 * weight from the ISA's packed copy where it has one (made when the engine
 * loads the weight, so the file's blocks are then only read for embeddings;
 * other weights are read as they are);
 * attention walks each
 * row's block table in the paged KV pool with an online softmax.  Small
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
	struct cpu_packed *packed; /* (packed_cap) open addressing; owned */
	size_t packed_cap;       /* power of two, 0 before the first weight */
	size_t packed_n;         /* slots in use */
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

static inline void vec_scale(float *y, float a, int n)
{
	int i = 0;
	for (; i + 16 <= n; i += 16)
		*(v16f *)(y + i) *= a;
	for (; i < n; i++)
		y[i] *= a;
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

struct norm_job {
	const float *x, *g;
	float *out;
	int64_t n;
	float eps;
};

static void norm_row(const struct norm_job *j, int t)
{
	const float *x = j->x + (size_t)t * j->n;
	float *y = j->out + (size_t)t * j->n;
	double sum = 0; /* ggml sums squares in double */
	for (int64_t i = 0; i < j->n; i++)
		sum += (double)(x[i] * x[i]);
	float scale = 1.0f / sqrtf((float)(sum / j->n) + j->eps);
	for (int64_t i = 0; i < j->n; i++)
		y[i] = (x[i] * scale) * j->g[i];
}

static void norm_task(void *ctx, int t, int worker)
{
	norm_row(ctx, t);
}

static int cpu_rmsnorm(struct backend *be, const float *x, const float *g, int32_t T,
		       int64_t n, float eps, float *out)
{
	struct norm_job j = { x, g, out, n, eps };
	if ((int64_t)T * n < PAR_MIN_ELEMS) {
		for (int32_t t = 0; t < T; t++)
			norm_row(&j, t);
	} else {
		cpu_pool_run(cpu(be)->pool, norm_task, &j, T);
	}
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
	int64_t chunk;                /* weight rows per task */
	int first_task[MM_MAX_WEIGHTS + 1]; /* task index where weight k starts */
};

struct quant_job {
	const float *x;
	void *xq;
	int64_t n;
	size_t lda;
	uint32_t vec_type;
};

static void quant_task(void *ctx, int t, int worker)
{
	struct quant_job *j = ctx;
	quant_quantize_row(j->vec_type, j->x + (size_t)t * j->n, (char *)j->xq + (size_t)t * j->lda, j->n);
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
	if (j->pk[k])
		quant_gemm_packed(j->pk[k], (int)r0, (int)nr, j->xq, j->lda, j->T, j->out[k] + r0, (size_t)w->n_out);
	else
		quant_gemm(w->type, w->n_in, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
			   (int)nr, j->xq, j->lda, j->T, j->out[k] + r0, (size_t)w->n_out);
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
	for (int k = 1; k < nw; k++)
		if (w[k]->type != w[0]->type || w[k]->n_in != n_in)
			return -EINVAL;

	size_t lda = qtype_row_bytes(vec_type, n_in);
	size_t need = lda * (size_t)T;
	if (need > c->xq_cap) {
		void *p = realloc(c->xq, need);
		if (!p)
			return -ENOMEM;
		c->xq = p;
		c->xq_cap = need;
	}
	struct quant_job qj = { x, c->xq, n_in, lda, vec_type };
	if (T >= 4)
		cpu_pool_run(c->pool, quant_task, &qj, T);
	else
		for (int t = 0; t < T; t++)
			quant_task(&qj, t, 0);

	/* Decode: about 64 KiB of weights per task (a task's software prefetch
	 * stops at its end, so longer runs stream faster), but at least two
	 * tasks per thread to balance them.  Many rows: each task repacks all
	 * T activation rows, so about four tasks per thread.  Multiples of 16
	 * rows either way. */
	int64_t rows = 0;
	for (int k = 0; k < nw; k++)
		rows += w[k]->n_out;
	int64_t chunk = (int64_t)(65536 / w[0]->row_bytes) & ~(int64_t)15;
	int64_t even = (rows / (2 * cpu_pool_threads(c->pool)) + 15) & ~(int64_t)15;
	if (chunk > even)
		chunk = even;
	if (T >= 16)
		chunk = (rows / (4 * cpu_pool_threads(c->pool)) + 15) & ~(int64_t)15;
	if (chunk < 16)
		chunk = 16;
	memset(&j, 0, sizeof j);
	j.w = w;
	j.out = out;
	j.nw = nw;
	j.T = T;
	j.xq = c->xq;
	j.lda = lda;
	j.chunk = chunk;
	for (int k = 0; k < nw; k++) {
		j.pk[k] = packed_find(c, w[k]);
		j.first_task[k + 1] = j.first_task[k] + (int)((w[k]->n_out + chunk - 1) / chunk);
	}
	cpu_pool_run(c->pool, mm_task, &j, j.first_task[nw]);
	return 0;
}

/* ---- rope ---- */

static int cpu_rope(struct backend *be, float *x, int32_t T, int32_t n_head, int32_t head_dim,
		    int32_t n_rot, const int32_t *pos, float freq_base, enum bk_rope_style style)
{
	/* As ggml: theta_i = pos * base^(-2i/n_rot), advanced by repeated
	 * multiplication in float. */
	const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
	float cs[512][2];

	if (n_rot > head_dim || n_rot % 2 || n_rot > 1024)
		return -EINVAL;
	for (int32_t t = 0; t < T; t++) {
		float theta = (float)pos[t];
		for (int32_t i = 0; i < n_rot / 2; i++) {
			cs[i][0] = cosf(theta);
			cs[i][1] = sinf(theta);
			theta *= theta_scale;
		}
		for (int32_t h = 0; h < n_head; h++) {
			float *v = x + ((size_t)t * n_head + h) * head_dim;
			for (int32_t i = 0; i < n_rot / 2; i++) {
				int32_t a = style == BK_ROPE_NORMAL ? 2 * i : i;
				int32_t b = style == BK_ROPE_NORMAL ? 2 * i + 1 : i + n_rot / 2;
				float x0 = v[a], x1 = v[b];
				v[a] = x0 * cs[i][0] - x1 * cs[i][1];
				v[b] = x0 * cs[i][1] + x1 * cs[i][0];
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
	case QT_F16: {
		qt_f16 *d = dst;
		for (int32_t c = 0; c < kv->kv_dim; c++)
			d[c] = qt_f32_to_f16(src[c]);
		break;
	}
	case QT_Q8_0:
		quant_quantize_row(QT_Q8_0, src, dst, kv->kv_dim);
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

/* ---- attention ---- */

#define ATTN_MAX_GROUP 16   /* query heads per kv head */
#define ATTN_MAX_HEAD_DIM 256

struct attn_job {
	const struct bk_kv *kv;
	int32_t layer;
	const struct bk_rows *rows;
	const struct bk_attn *a;
	const float *q;
	float *out;
};

/* Positions handled at once: converted K/V rows and their scores stay in L1. */
#define ATTN_CHUNK 32

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
	for (int32_t p = 0; p < n_pos;) {
		int32_t n = n_pos - p, to_edge = bt - p % bt;
		if (n > to_edge)
			n = to_edge;
		if (n > ATTN_CHUNK)
			n = ATTN_CHUNK;
		const float *kr = kv->type == QT_F32 ? NULL : kv_rows(kv, table, j->layer, 0, p, n, hk, hd, kbuf);
		const float *vr = kv->type == QT_F32 ? NULL : kv_rows(kv, table, j->layer, 1, p, n, hk, hd, vbuf);
		for (int g = 0; g < group; g++) {
			float mx = m[g];
			for (int32_t i = 0; i < n; i++) {
				const float *k = kr ? kr + (size_t)i * hd : kv_rows(kv, table, j->layer, 0, p + i, 1, hk, hd, NULL);
				sc[i] = vec_dot_f32(qh[g], k, hd) * a->scale;
				if (sc[i] > mx)
					mx = sc[i];
			}
			if (mx > m[g]) {
				float corr = expf(m[g] - mx); /* 0 on the first chunk */
				l[g] *= corr;
				vec_scale(acc[g], corr, hd);
				m[g] = mx;
			}
			for (int32_t i = 0; i < n; i++) {
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

static int cpu_attention(struct backend *be, const struct bk_kv *kv, int32_t layer,
			 const struct bk_rows *rows, const struct bk_attn *a,
			 const float *q, float *out)
{
	struct attn_job j = { kv, layer, rows, a, q, out };

	if (a->n_head_kv < 1 || a->n_head % a->n_head_kv || a->n_head / a->n_head_kv > ATTN_MAX_GROUP ||
	    a->head_dim > ATTN_MAX_HEAD_DIM || a->head_dim * a->n_head_kv != kv->kv_dim ||
	    (kv->type == QT_Q8_0 && a->head_dim % QK && QK % a->head_dim))
		return -EINVAL;
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
	for (int64_t k = lo; k < hi; k++)
		j->out[k] = j->a[k] / (1.0f + expf(-j->a[k])) * j->b[k];
}

static void add_task(void *ctx, int i, int worker)
{
	const struct ew_job *j = ctx;
	int64_t lo = (int64_t)i * EW_CHUNK, hi = lo + EW_CHUNK < j->n ? lo + EW_CHUNK : j->n;
	int k = 0;
	for (; lo + k + 16 <= hi; k += 16)
		*(v16f *)(j->out + lo + k) += *(const v16f *)(j->a + lo + k);
	for (; lo + k < hi; k++)
		j->out[lo + k] += j->a[lo + k];
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

static int cpu_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *out)
{
	struct ew_job j = { g, u, out, n };
	ew_run(be, swiglu_task, &j);
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
	packed_get(cpu(be), w);
	return 0;
}

/* ---- lifecycle ---- */

static void cpu_free(struct backend *be)
{
	struct cpu_backend *c = cpu(be);
	cpu_pool_free(c->pool);
	for (size_t i = 0; i < c->packed_cap; i++)
		quant_packed_free(c->packed[i].pk);
	free(c->packed);
	free(c->xq);
	free(c);
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.free = cpu_free,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.matmul = cpu_matmul,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.load_weight = cpu_load_weight,
};

int cpu_backend_new(int n_threads, struct backend **ret)
{
	struct cpu_backend *c = calloc(1, sizeof *c);
	int r;

	if (!c)
		return -ENOMEM;
	c->base.ops = &cpu_ops;
	r = cpu_pool_new(n_threads, &c->pool);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret = &c->base;
	return 0;
}
