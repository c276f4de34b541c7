/* test_cpu_backend.c - the CPU backend's paged attention gives, row for row,
 * the bits of the one-task-per-(row, kv head) algorithm it started as,
 * whatever the step around the row: prefill chunks from the start and from
 * the middle of a sequence, decode rows, ragged mixes of sequences, block
 * tables with holes, f32, f16 and q8_0 pools, several head sizes and group
 * sizes, and any number of threads.  SwiGLU gives the scalar formula's bits,
 * RoPE reusing its last cos and sin table gives a fresh backend's portable
 * loop's, and RMSNorm stays within two ulps of ggml's order, fused with the
 * residual add or not.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "clock.h"
#include "quant.h"
#include "testutil.h"

/* ---- the oracle: cpu_backend.c's attention before it learnt to group rows ----
 *
 * Compiled as that was (per ISA, with the same contractions), so on every
 * CPU it computes what the backend computed for a row on its own. */

#define VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

typedef float v16f __attribute__((vector_size(64), aligned(4)));

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

static void *kv_slot(const struct bk_kv *kv, const int32_t *table, int32_t layer, int which,
		     int32_t pos)
{
	int32_t b = table[pos / kv->block_tokens];
	int32_t t = pos % kv->block_tokens;
	size_t off = (((size_t)layer * 2 + which) * kv->block_tokens + t) * kv->row_bytes;
	return (char *)kv->base + (size_t)b * kv->block_bytes + off;
}

#define ATTN_MAX_GROUP 16
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_CHUNK 32

struct attn_job {
	const struct bk_kv *kv;
	int32_t layer;
	const struct bk_rows *rows;
	const struct bk_attn *a;
	const float *q;
	float *out;
};

static void q8_0_slice_to_f32(const char *row, int32_t c0, int32_t n, float *dst)
{
	const struct block_q8_0 *blk = (const struct block_q8_0 *)row + c0 / QK;

	if (c0 % QK == 0 && n % QK == 0) {
		quant_dequantize_row(QT_Q8_0, blk, dst, n);
		return;
	}
	float d = qt_f16_to_f32(blk->d);
	for (int32_t i = 0; i < n; i++)
		dst[i] = (float)blk->qs[c0 % QK + i] * d;
}

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

VEC_CLONES
static void oracle_task(void *ctx, int task, int worker)
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
	/* a sliding window: positions before LO are left out, from the chunk
	 * that holds LO on the grid of chunks cut from position 0 */
	int32_t lo = a->window > 0 && n_pos > a->window ? n_pos - a->window : 0, p0 = 0;
	for (int32_t p = 0, n; p + (n = bt - p % bt < ATTN_CHUNK ? bt - p % bt : ATTN_CHUNK) <= lo; p += n)
		p0 = p + n;
	for (int32_t p = p0; p < n_pos;) {
		int32_t n = n_pos - p, to_edge = bt - p % bt, skip = lo > p ? lo - p : 0;
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
				sc[i] = i < skip ? -INFINITY : vec_dot_f32(qh[g], k, hd) * a->scale;
				if (sc[i] > mx)
					mx = sc[i];
			}
			if (mx > m[g]) {
				float corr = expf(m[g] - mx);
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

static void oracle(const struct bk_kv *kv, int32_t layer, const struct bk_rows *rows,
		   const struct bk_attn *a, const float *q, float *out)
{
	struct attn_job j = { kv, layer, rows, a, q, out };
	for (int t = 0; t < rows->n * a->n_head_kv; t++)
		oracle_task(&j, t, 0);
}

/* ---- random pools and steps ---- */

#define N_LAYER 2
#define MAX_SEQ 6
#define MAX_ROWS 96

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static float frand(float s) /* uniform in [-s, s) */
{
	return s * ((float)(rnd() & 0xffffff) / (float)0x800000 - 1.0f);
}

struct pool {
	struct bk_kv kv;
	int32_t table[MAX_SEQ][64]; /* every sequence's blocks: distinct, shuffled */
};

/* A pool whose unused rows and blocks hold NaN, so reading a position a row
 * may not see poisons its output. */
static void pool_init(struct pool *p, uint32_t type, int32_t bt, int32_t kv_dim, int32_t n_blocks)
{
	struct bk_kv *kv = &p->kv;
	int32_t perm[512];

	kv->type = type;
	kv->block_tokens = bt;
	kv->n_layer = N_LAYER;
	kv->kv_dim = kv_dim;
	kv->n_blocks = n_blocks;
	kv->row_bytes = qtype_row_bytes(type, kv_dim);
	kv->block_bytes = 2 * N_LAYER * (size_t)bt * kv->row_bytes;
	kv->base = malloc((size_t)n_blocks * kv->block_bytes);
	if (!kv->base || n_blocks > 512) {
		fprintf(stderr, "pool_init: out of memory or too many blocks\n");
		exit(1);
	}
	if (type == QT_F32) {
		float *f = kv->base;
		for (size_t i = 0; i < (size_t)n_blocks * kv->block_bytes / 4; i++)
			f[i] = NAN;
	} else if (type == QT_F16) {
		qt_f16 *h = kv->base;
		for (size_t i = 0; i < (size_t)n_blocks * kv->block_bytes / 2; i++)
			h[i] = 0x7e00;
	} else {
		struct block_q8_0 *b = kv->base;
		for (size_t i = 0; i < (size_t)n_blocks * kv->block_bytes / sizeof *b; i++) {
			b[i].d = 0x7e00;
			memset(b[i].qs, 1, QK);
		}
	}
	for (int32_t i = 0; i < n_blocks; i++)
		perm[i] = i;
	for (int32_t i = n_blocks - 1; i > 0; i--) {
		int32_t k = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
		perm[i] = perm[k];
		perm[k] = t;
	}
	/* sequence s gets blocks s, s + MAX_SEQ, ... of a shuffle; the last few
	 * are no one's */
	for (int s = 0; s < MAX_SEQ; s++)
		for (int b = 0; b < 64; b++)
			p->table[s][b] = b * MAX_SEQ + s < n_blocks ? perm[b * MAX_SEQ + s] : -1;
}

/* Random K and V rows for positions [0, n) of sequence S, of magnitude MAG. */
static void pool_fill(struct pool *p, int s, int32_t n, float mag)
{
	struct bk_kv *kv = &p->kv;
	for (int32_t l = 0; l < N_LAYER; l++)
		for (int w = 0; w < 2; w++)
			for (int32_t t = 0; t < n; t++) {
				char *row = kv_slot(kv, p->table[s], l, w, t);
				if (kv->type == QT_F32) {
					for (int32_t c = 0; c < kv->kv_dim; c++)
						((float *)row)[c] = frand(mag);
				} else if (kv->type == QT_F16) {
					for (int32_t c = 0; c < kv->kv_dim; c++)
						((qt_f16 *)row)[c] = qt_f32_to_f16(frand(mag));
				} else {
					struct block_q8_0 *b = (struct block_q8_0 *)row;
					for (int32_t k = 0; k < kv->kv_dim / QK; k++) {
						b[k].d = qt_f32_to_f16(mag / 127 * (0.25f + (float)(rnd() % 100) / 100));
						for (int i = 0; i < QK; i++)
							b[k].qs[i] = (int8_t)((int)(rnd() % 255) - 127);
					}
				}
			}
}

struct step {
	int32_t n;
	int32_t pos[MAX_ROWS];
	const int32_t *tab[MAX_ROWS];
};

/* N rows of sequence S at positions P0, P0 + 1, ... */
static void step_add(struct step *st, const struct pool *p, int s, int32_t p0, int32_t n)
{
	for (int32_t i = 0; i < n && st->n < MAX_ROWS; i++) {
		st->pos[st->n] = p0 + i;
		st->tab[st->n++] = p->table[s];
	}
}

static int n_compared, n_bad;

/* The step on backends of 1, 2 and 3 threads against the oracle, bit for
 * bit; then through the portable path (QUANT_ISA_SCALAR), and each row on
 * its own.  One backend at a time: idle pools' workers spin a while. */
static void check_step(const struct pool *p, const struct step *st, const struct bk_attn *a, float qmag,
		       const char *what)
{
	size_t row_floats = (size_t)a->n_head * a->head_dim, bytes = st->n * row_floats * sizeof(float);
	float *q = malloc(bytes), *want = malloc(bytes * N_LAYER), *got = malloc(bytes);
	struct bk_rows rows = { st->n, st->pos, st->tab };

	for (size_t i = 0; i < st->n * row_floats; i++)
		q[i] = frand(qmag);
	for (int32_t layer = 0; layer < N_LAYER; layer++)
		oracle(&p->kv, layer, &rows, a, q, want + layer * st->n * row_floats);
	for (int threads = 1; threads <= 4; threads++) {
		/* 4: the portable path on 2 threads */
		struct backend *be = NULL;
		const char *path = threads < 4 ? "AVX2 path" : "portable path";
		CHECK(cpu_backend_new(threads < 4 ? threads : 2, &be) == 0);
		if (!be)
			break;
		quant_set_isa(threads < 4 ? quant_isa_best() : QUANT_ISA_SCALAR);
		for (int32_t layer = 0; layer < N_LAYER; layer++) {
			const float *w = want + layer * st->n * row_floats;
			memset(got, 0xff, bytes);
			CHECK(be->ops->attention(be, &p->kv, layer, &rows, a, q, got, NULL) == 0);
			n_compared++;
			if (memcmp(got, w, bytes)) {
				for (int32_t t = 0; t < st->n; t++)
					if (memcmp(got + t * row_floats, w + t * row_floats, row_floats * sizeof(float))) {
						fprintf(stderr, "%s: type %u head_dim %d group %d block %d layer %d %s, "
							"%d threads: row %d (pos %d) differs\n", what, p->kv.type,
							a->head_dim, a->n_head / a->n_head_kv, p->kv.block_tokens, layer,
							path, threads, t, st->pos[t]);
						break;
					}
				n_bad++;
				test_failures++;
			}
			for (int32_t t = 0; t < st->n && threads == 1; t++) {
				struct bk_rows one = { 1, &st->pos[t], &st->tab[t] };
				CHECK(be->ops->attention(be, &p->kv, layer, &one, a, q + t * row_floats, got, NULL) == 0);
				if (memcmp(got, w + t * row_floats, row_floats * sizeof(float))) {
					fprintf(stderr, "%s: row %d alone differs\n", what, t);
					test_failures++;
					break;
				}
			}
		}
		quant_set_isa(quant_isa_best());
		backend_free(be);
	}
	free(q);
	free(want);
	free(got);
}

static const struct {
	int32_t n_head, n_head_kv, head_dim;
} geos[] = {
	{ 9, 3, 64 },   /* SmolLM2-135M */
	{ 4, 2, 32 },
	{ 8, 8, 16 },
	{ 16, 1, 64 },  /* the largest group: three rows a task */
	{ 4, 4, 128 },
	{ 2, 1, 256 },
	{ 6, 2, 80 },   /* 64 + 16 */
	{ 3, 1, 96 },   /* 64 + 32 */
	{ 8, 4, 8 },    /* below 16: the portable path */
	{ 2, 2, 40 },   /* not a multiple of 16: the portable path */
};

static void test_attention_matches_oracle(void)
{
	static const uint32_t types[] = { QT_F32, QT_F16, QT_Q8_0 };
	static const int32_t bts[] = { 16, 48, 7 };
	for (size_t gi = 0; gi < sizeof geos / sizeof geos[0]; gi++)
		for (int ti = 0; ti < 3; ti++)
			for (int bi = 0; bi < 3; bi++) {
				int32_t hd = geos[gi].head_dim, kv_dim = geos[gi].n_head_kv * hd, bt = bts[bi];
				uint32_t type = types[ti];
				struct bk_attn a = { geos[gi].n_head, geos[gi].n_head_kv, hd, 1.0f / sqrtf((float)hd), 0 };
				struct pool p;
				struct step st;

				if (type == QT_Q8_0 && hd % QK && QK % hd)
					continue; /* refused: a head would straddle two blocks */
				if (hd > 96 && bt == 7)
					continue; /* enough cases of those already */
				int32_t need = 340 / bt + 2;
				pool_init(&p, type, bt, kv_dim, need * MAX_SEQ + 5);
				for (int s = 0; s < MAX_SEQ; s++)
					pool_fill(&p, s, 340, s == 5 ? 40.0f : 1.0f);

				/* decode rows at positions around chunk and block edges */
				static const int32_t dpos[] = { 0, 1, 6, 7, 15, 16, 31, 32, 33, 47, 48, 63, 64, 95, 96, 250, 339 };
				st.n = 0;
				for (size_t k = 0; k < sizeof dpos / sizeof dpos[0]; k++)
					step_add(&st, &p, (int)(k % MAX_SEQ), dpos[k], 1);
				check_step(&p, &st, &a, 2.0f, "decode rows");

				/* one decode row: with fewer kv heads than threads, the
				 * query heads of each are split across tasks */
				st.n = 0;
				step_add(&st, &p, 1, 200, 1);
				check_step(&p, &st, &a, 2.0f, "one decode row");

				/* a prefill from the start, one from the middle */
				st.n = 0;
				step_add(&st, &p, 0, 0, 41);
				check_step(&p, &st, &a, 2.0f, "prefill from 0");
				st.n = 0;
				step_add(&st, &p, 2, 50, 37);
				check_step(&p, &st, &a, 2.0f, "prefill from 50");

				/* a ragged step: prefill chunks, decode rows, a sequence
				 * whose rows go backwards, large logits (exp's slow lanes) */
				st.n = 0;
				step_add(&st, &p, 3, 100, 20);
				step_add(&st, &p, 1, 300, 1);
				step_add(&st, &p, 0, 0, 13);
				step_add(&st, &p, 4, 10, 1);
				step_add(&st, &p, 4, 5, 1);
				step_add(&st, &p, 5, 31, 19);
				step_add(&st, &p, 2, 7, 1);
				check_step(&p, &st, &a, 2.0f, "ragged step");
				check_step(&p, &st, &a, 30.0f, "ragged step, large logits");

				/* sliding windows (Gemma 3): inside a chunk, on a block
				 * edge, one position, and wider than any row */
				static const int32_t windows[] = { 37, 48, 1, 1000 };
				for (size_t w = 0; w < sizeof windows / sizeof windows[0] && bi == 0; w++) {
					a.window = windows[w];
					st.n = 0;
					step_add(&st, &p, 3, 100, 20);
					step_add(&st, &p, 1, 300, 1);
					step_add(&st, &p, 0, 0, 13);
					step_add(&st, &p, 5, 31, 50);
					step_add(&st, &p, 2, 70, 1);
					check_step(&p, &st, &a, 2.0f, "sliding window");
				}
				a.window = 0;
				free(p.kv.base);
			}
	printf("attention: %d steps compared with the oracle, %d differ\n", n_compared, n_bad);
}

/* Not a check (the machine may be shared): how much faster the AVX2 path
 * is than the portable one at SmolLM2-135M's shape, f16 KV, one thread. */
static void report_speed(void)
{
	struct bk_attn a = { 9, 3, 64, 0.125f, 0 };
	struct backend *be = NULL;
	struct pool p;
	struct step st = { .n = 0 };
	float *q = malloc(64 * 9 * 64 * sizeof(float)), *o = malloc(64 * 9 * 64 * sizeof(float));
	double best[2][2];

	pool_init(&p, QT_F16, 16, 3 * 64, 24 * MAX_SEQ);
	pool_fill(&p, 0, 340, 1.0f);
	for (int i = 0; i < 64 * 9 * 64; i++)
		q[i] = frand(1.0f);
	CHECK(cpu_backend_new(1, &be) == 0);
	for (int kind = 0; kind < 2 && be; kind++) {
		st.n = 0;
		step_add(&st, &p, 0, kind ? 276 : 339, kind ? 64 : 1); /* a decode row, a prefill chunk */
		struct bk_rows rows = { st.n, st.pos, st.tab };
		for (int path = 0; path < 2; path++) {
			quant_set_isa(path ? QUANT_ISA_SCALAR : quant_isa_best());
			best[kind][path] = 1e30;
			for (int rep = 0; rep < 20; rep++) {
				double t0 = clock_s();
				be->ops->attention(be, &p.kv, rep % N_LAYER, &rows, &a, q, o, NULL);
				if (clock_s() - t0 < best[kind][path])
					best[kind][path] = clock_s() - t0;
			}
		}
	}
	quant_set_isa(quant_isa_best());
	if (be)
		printf("attention at SmolLM2-135M's shape, f16 KV, one thread: a decode row at position 339 "
		       "%.0f us (portable path %.0f us), a 64-row prefill chunk %.0f us (portable %.0f us)\n",
		       1e6 * best[0][0], 1e6 * best[0][1], 1e6 * best[1][0], 1e6 * best[1][1]);
	backend_free(be);
	free(p.kv.base);
	free(q);
	free(o);
}

/* SwiGLU gives the scalar formula's bits on every path and thread count,
 * over both signs, the ends of expf's range and the special values. */
static void test_swiglu_matches_scalar(void)
{
	enum { N = 100003 }; /* past the size run in parallel, and not a multiple of 8 */
	static const float special[] = { 0.0f, -0.0f, 88.7f, -88.7f, 100.0f, -100.0f, -104.0f, 1e-30f,
					 INFINITY, -INFINITY, NAN };
	float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));

	for (int i = 0; i < N; i++) {
		g[i] = i < (int)(sizeof special / sizeof special[0]) ? special[i] : frand(i % 7 ? 8.0f : 120.0f);
		u[i] = frand(4.0f);
	}
	for (int threads = 1; threads <= 2; threads++) {
		for (int path = 0; path < 2; path++) {
			struct backend *be = NULL;
			CHECK(cpu_backend_new(threads, &be) == 0);
			if (!be)
				return;
			quant_set_isa(path ? QUANT_ISA_SCALAR : quant_isa_best());
			CHECK(be->ops->swiglu(be, g, u, N, out, NULL) == 0);
			for (int i = 0; i < N; i++) {
				float want = g[i] / (1.0f + expf(-g[i])) * u[i];
				if (memcmp(&want, &out[i], sizeof want) && !(isnan(want) && isnan(out[i]))) {
					fprintf(stderr, "swiglu(%.9g, %.9g) = %.9g, scalar %.9g (%d threads, %s path)\n",
						g[i], u[i], out[i], want, threads, path ? "portable" : "best");
					CHECK(0);
					break;
				}
			}
			backend_free(be);
		}
	}
	quant_set_isa(quant_isa_best());
	free(g);
	free(u);
	free(out);
}

/* RoPE keeps the cos and sin of its last positions for the next call (a
 * step's layers): each call gives what a fresh backend's portable loop
 * gives (so the AVX2 loop's bits too, for rotated widths that fill its
 * vectors, leave a tail or are shorter than one), whether the positions,
 * their count, the rotated width or the base change between calls or
 * not. */
static void test_rope_reuse(void)
{
	enum { T = 5, H = 3, HD = 64 };
	static const struct {
		int32_t pos[T], T, n_rot;
		float base;
	} calls[] = {
		{ { 0, 1, 2, 3, 4 }, 5, 64, 10000.0f }, { { 0, 1, 2, 3, 4 }, 5, 64, 10000.0f },
		{ { 7, 1, 2, 3, 4 }, 5, 64, 10000.0f }, { { 7, 1, 2, 3, 4 }, 3, 64, 10000.0f },
		{ { 7, 1, 2, 3, 4 }, 3, 32, 10000.0f }, { { 7, 1, 2, 3, 4 }, 3, 32, 500000.0f },
		{ { 900, 901, 2, 3, 4 }, 2, 64, 500000.0f }, { { 900, 901, 2, 3, 4 }, 5, 64, 500000.0f },
		/* pairs past the AVX2 loop's last whole vector, or fewer than one */
		{ { 0, 17, 300, 4095, 9 }, 5, 24, 10000.0f }, { { 0, 17, 300, 4095, 9 }, 5, 18, 10000.0f },
		{ { 0, 17, 300, 4095, 9 }, 5, 6, 10000.0f }, { { 0, 17, 300, 4095, 9 }, 5, 2, 10000.0f },
	};
	struct backend *be = NULL;
	float x[T * H * HD], want[T * H * HD], got[T * H * HD];

	CHECK(cpu_backend_new(1, &be) == 0);
	for (int i = 0; i < T * H * HD; i++)
		x[i] = frand(2.0f);
	for (size_t k = 0; be && k < sizeof calls / sizeof calls[0]; k++)
		for (int style = 0; style < 2; style++) {
			enum bk_rope_style st = style ? BK_ROPE_NEOX : BK_ROPE_NORMAL;
			struct backend *fresh = NULL;
			CHECK(cpu_backend_new(1, &fresh) == 0);
			if (!fresh)
				break;
			memcpy(want, x, sizeof x);
			memcpy(got, x, sizeof x);
			struct bk_rope rp = bk_rope_plain(calls[k].n_rot, st, calls[k].base);
			quant_set_isa(QUANT_ISA_SCALAR);
			CHECK(fresh->ops->rope(fresh, want, calls[k].T, H, HD, calls[k].pos, &rp) == 0);
			quant_set_isa(quant_isa_best());
			CHECK(be->ops->rope(be, got, calls[k].T, H, HD, calls[k].pos, &rp) == 0);
			if (memcmp(want, got, sizeof x) != 0) {
				fprintf(stderr, "rope call %zu (style %d, %s): differs from a fresh backend's portable loop\n",
					k, style, quant_isa_name(quant_get_isa()));
				CHECK(0);
			}
			backend_free(fresh);
		}
	backend_free(be);
}

/* Scaled RoPE (struct bk_rope): frequency factors of 1 change no bit and
 * factors of 2 give linear scaling by 1/2 bit for bit (both exact powers of
 * two); linear scaling by 1/4 at position 4p is the unscaled angle at p
 * within float rounding; YaRN's ramp leaves the pairs below corr_dims[0]
 * at their extrapolated (unscaled) angle and the ones past corr_dims[1]
 * at their interpolated one, cos and sin times mscale; and a backend that
 * rotated with one set of parameters does not reuse its table for another. */
static void test_rope_scaled(void)
{
	enum { T = 4, H = 2, HD = 64, PAIRS = HD / 2 };
	const int32_t pos[T] = { 0, 3, 40, 1000 }, pos4[T] = { 0, 12, 160, 4000 };
	float ones[PAIRS], twos[PAIRS], x[T * H * HD], a[T * H * HD], b[T * H * HD];
	struct backend *be = NULL;

	for (int i = 0; i < PAIRS; i++) {
		ones[i] = 1.0f;
		twos[i] = 2.0f;
	}
	for (int i = 0; i < T * H * HD; i++)
		x[i] = frand(2.0f);
	CHECK(cpu_backend_new(1, &be) == 0);
	if (!be)
		return;
	for (int style = 0; style < 2; style++) {
		const enum bk_rope_style st = style ? BK_ROPE_NEOX : BK_ROPE_NORMAL;
		struct bk_rope plain = bk_rope_plain(HD, st, 500000.0f), r = plain;

		memcpy(a, x, sizeof x);
		CHECK(be->ops->rope(be, a, T, H, HD, pos, &plain) == 0);
		r.freq_factors = ones;
		memcpy(b, x, sizeof x);
		CHECK(be->ops->rope(be, b, T, H, HD, pos, &r) == 0);
		CHECK(memcmp(a, b, sizeof a) == 0);

		r = plain;
		r.freq_factors = twos;
		memcpy(a, x, sizeof x);
		CHECK(be->ops->rope(be, a, T, H, HD, pos, &r) == 0);
		r = plain;
		r.freq_scale = 0.5f;
		memcpy(b, x, sizeof x);
		CHECK(be->ops->rope(be, b, T, H, HD, pos, &r) == 0);
		CHECK(memcmp(a, b, sizeof a) == 0);

		r = plain;
		r.freq_scale = 0.25f;
		memcpy(a, x, sizeof x);
		CHECK(be->ops->rope(be, a, T, H, HD, pos4, &r) == 0);
		memcpy(b, x, sizeof x);
		CHECK(be->ops->rope(be, b, T, H, HD, pos, &plain) == 0);
		double worst = 0;
		for (int i = 0; i < T * H * HD; i++)
			worst = fmax(worst, fabs((double)a[i] - b[i]));
		CHECK(worst < 2e-3); /* angles near 1000 rad in float */

		/* YaRN: pairs 0..7 extrapolate, 20.. interpolate at 1/4 */
		r = plain;
		r.freq_scale = 0.25f;
		r.ext_factor = 1.0f;
		r.mscale = 1.5f;
		r.corr_dims[0] = 8;
		r.corr_dims[1] = 20;
		struct bk_rope ex = plain, in = plain;
		ex.mscale = 1.5f;
		in.mscale = 1.5f;
		in.freq_scale = 0.25f;
		float e[T * H * HD], n[T * H * HD];
		memcpy(a, x, sizeof x);
		memcpy(e, x, sizeof x);
		memcpy(n, x, sizeof x);
		CHECK(be->ops->rope(be, a, T, H, HD, pos, &r) == 0);
		CHECK(be->ops->rope(be, e, T, H, HD, pos, &ex) == 0);
		CHECK(be->ops->rope(be, n, T, H, HD, pos, &in) == 0);
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++)
				for (int i = 0; i < PAIRS; i++) {
					const size_t row = ((size_t)t * H + h) * HD;
					const int k0 = st == BK_ROPE_NORMAL ? 2 * i : i;
					const int k1 = st == BK_ROPE_NORMAL ? 2 * i + 1 : i + PAIRS;
					const float *want = i < 8 ? e : i >= 20 ? n : NULL;
					if (want && (a[row + k0] != want[row + k0] || a[row + k1] != want[row + k1])) {
						fprintf(stderr, "yarn: row %d head %d pair %d differs\n", t, h, i);
						CHECK(0);
					}
				}
	}
	backend_free(be);
}

/* RMSNorm against ggml's one-term-at-a-time double sum, within two ulps
 * of the float result (the backend sums 16 lanes, then them); add gives
 * x + y and add_rmsnorm add then rmsnorm's bits, for x and out, with out
 * in place of x or of y, on every path, thread count and row length
 * (inline and parallel, tails of 1..15). */
static void test_rmsnorm(void)
{
	static const struct {
		int32_t T;
		int64_t n;
	} shapes[] = { { 1, 576 }, { 3, 7 }, { 2, 17 }, { 1, 2048 }, { 173, 576 }, { 60, 1543 } };
	const float eps = 1e-5f;

	for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		int32_t T = shapes[k].T;
		int64_t n = shapes[k].n, tn = (int64_t)T * n;
		float *x = malloc(tn * sizeof(float)), *y = malloc(tn * sizeof(float)), *g = malloc(n * sizeof(float));
		float *want = malloc(tn * sizeof(float)), *xa = malloc(tn * sizeof(float)), *out = malloc(tn * sizeof(float));
		float *xb = malloc(tn * sizeof(float)), *yb = malloc(tn * sizeof(float)), *ref = malloc(tn * sizeof(float));
		int bad = 0;

		for (int64_t i = 0; i < tn; i++) {
			/* rows of very different scales */
			x[i] = frand(i / n % 3 == 0 ? 1e-3f : i / n % 3 == 1 ? 3.0f : 200.0f);
			y[i] = frand(1.0f);
		}
		for (int64_t i = 0; i < n; i++)
			g[i] = frand(2.0f);
		for (int32_t t = 0; t < T; t++) {
			const float *r = x + (size_t)t * n;
			double sum = 0;
			for (int64_t i = 0; i < n; i++)
				sum += (double)(r[i] * r[i]);
			float scale = 1.0f / sqrtf((float)(sum / n) + eps);
			for (int64_t i = 0; i < n; i++)
				ref[(size_t)t * n + i] = (r[i] * scale) * g[i];
		}
		for (int threads = 1; threads <= 2; threads++)
			for (int path = 0; path < 2; path++) {
				struct backend *be = NULL;
				CHECK(cpu_backend_new(threads, &be) == 0);
				if (!be)
					break;
				quant_set_isa(path ? QUANT_ISA_SCALAR : quant_isa_best());
				CHECK(be->ops->rmsnorm(be, x, g, T, n, eps, out, NULL) == 0);
				for (int64_t i = 0; i < tn && !bad; i++) {
					float w = ref[i], d = fabsf(out[i] - w);
					if (d > 2 * fabsf(nextafterf(w, INFINITY) - w)) {
						fprintf(stderr, "rmsnorm T=%d n=%lld [%lld]: %.9g, ggml's order %.9g\n", T,
							(long long)n, (long long)i, out[i], w);
						bad = 1;
					}
				}
				/* add then rmsnorm, the reference for add_rmsnorm */
				memcpy(xa, x, tn * sizeof(float));
				CHECK(be->ops->add(be, xa, y, tn) == 0);
				for (int64_t i = 0; i < tn && !bad; i++)
					if (xa[i] != x[i] + y[i]) {
						fprintf(stderr, "add T=%d n=%lld [%lld]: %.9g, not x + y\n", T, (long long)n,
							(long long)i, xa[i]);
						bad = 1;
					}
				CHECK(be->ops->rmsnorm(be, xa, g, T, n, eps, want, NULL) == 0);
				for (int alias = 0; alias < 3; alias++) {
					memcpy(xb, x, tn * sizeof(float));
					memcpy(yb, y, tn * sizeof(float));
					float *o = alias == 0 ? out : alias == 1 ? xb : yb;
					CHECK(backend_add_rmsnorm(be, xb, yb, g, T, n, eps, o, NULL) == 0);
					if ((alias != 1 && memcmp(xb, xa, tn * sizeof(float))) ||
					    memcmp(o, want, tn * sizeof(float))) {
						fprintf(stderr, "add_rmsnorm T=%d n=%lld (out %s, %d threads): not add + rmsnorm's bits\n",
							T, (long long)n, alias == 0 ? "apart" : alias == 1 ? "= x" : "= y", threads);
						bad = 1;
					}
				}
				backend_free(be);
			}
		CHECK(!bad);
		quant_set_isa(quant_isa_best());
		free(x);
		free(y);
		free(g);
		free(want);
		free(xa);
		free(out);
		free(xb);
		free(yb);
		free(ref);
	}
}

int main(void)
{
	test_attention_matches_oracle();
	test_swiglu_matches_scalar();
	test_rope_reuse();
	test_rope_scaled();
	test_rmsnorm();
	report_speed();
	return test_result();
}
