/* test_engine.c - what the engine promises beyond matching llama.cpp:
 * batch invariance, chunked prefill equal to one-shot prefill, all-or-nothing
 * KV allocation, the automatic pool on the CPU, clean errors for bad batches,
 * a context too short for one request and bad model files, weight types mixed within a layer, packed weights'
 * file pages out of the resident set, a coherent greedy chat answer from the default model
 * (SmolLM2), what backend auto, cpu and cuda choose for every kind of
 * build and device count, and the per-op profile.
 */
#include <errno.h>
#include <math.h>
#include <time.h>

#include "backend.h"
#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"
#include "testseq.h"
#include "testutil.h"
#include "tokenizer.h"

static struct engine *new_engine(const struct model *m, int64_t kv_tokens, uint32_t kv_type,
				 int32_t max_batch)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.kv_type = kv_type;
	ep.kv_tokens = kv_tokens;
	ep.max_batch = max_batch;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0)
		fprintf(stderr, "engine_new: %s\n", err);
	return e;
}

static void test_chunked_prefill_and_batch_invariance(const struct model *m)
{
	const char *text = "Once upon a time there was a little girl who lived in a village near the forest.";
	int32_t ids[128], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, text, strlen(text), 1, 0, ids, 128);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	float *two = malloc((size_t)n_vocab * 2 * sizeof(float));
	struct engine *e = new_engine(m, 1024, QT_F32, 64);
	struct tseq s0 = { .len = 0 }, s1 = { .len = 0 }, s2 = { .len = 0 };

	CHECK(e != NULL && n > 15);
	/* one step vs chunks of 1, 3 and 7 rows: bit-identical logits */
	CHECK_INT_EQ(tseq_feed(e, &s0, ids, n, 64, a), 1);
	int chunks[] = { 1, 3, 7 };
	for (int c = 0; c < 3; c++) {
		CHECK_INT_EQ(tseq_feed(e, &s1, ids, n, chunks[c], b), 1);
		CHECK(memcmp(a, b, (size_t)n_vocab * sizeof(float)) == 0);
		tseq_free(e, &s1);
	}
	/* The same sequence decoded alongside another sequence's prefill in one
	 * step gives the same logits as when it runs alone. */
	CHECK_INT_EQ(tseq_feed(e, &s1, ids, n - 1, 64, b), 1);
	CHECK(tseq_reserve(e, &s1, 1) == 0 && tseq_reserve(e, &s2, 8) == 0);
	int32_t tok[9], pos[9];
	const int32_t *tab[9];
	uint8_t want[9] = { 0 };
	tok[0] = ids[n - 1];
	pos[0] = n - 1;
	tab[0] = s1.table;
	want[0] = 1;
	for (int i = 1; i < 9; i++) {
		tok[i] = ids[i + 3];
		pos[i] = i - 1;
		tab[i] = s2.table;
	}
	want[8] = 1;
	struct engine_batch mixed = { 9, tok, pos, tab, want };
	CHECK_INT_EQ(engine_step(e, &mixed, two), 2);
	CHECK(memcmp(a, two, (size_t)n_vocab * sizeof(float)) == 0);
	tseq_free(e, &s0);
	tseq_free(e, &s1);
	tseq_free(e, &s2);
	CHECK_INT_EQ(kv_pool_n_available(engine_kv_pool(e)), engine_kv_pool(e)->view.n_blocks);
	engine_free(e);
	free(a);
	free(b);
	free(two);
}

/* The profile counts each step by its rows, times every op it runs, adds
 * up to no more than the steps took, changes no logit, and starts over
 * when turned on again. */
static void test_profile(const struct model *m)
{
	const char *text = "Once upon a time there was a little girl.";
	int32_t ids[64], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, text, strlen(text), 1, 0, ids, 64);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	struct engine *e = new_engine(m, 256, QT_F32, 64);
	struct tseq s0 = { .len = 0 }, s1 = { .len = 0 };
	struct engine_profile p;

	CHECK(e != NULL && n > 4);
	if (!e)
		goto out;
	CHECK_INT_EQ(tseq_feed(e, &s0, ids, n, 64, a), 1);
	engine_get_profile(e, &p);
	CHECK(p.steps[0] == 0 && p.steps[1] == 0); /* off until asked */
	engine_set_profile(e, 1);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* a prefill of n - 1 rows, then the last token alone */
	CHECK_INT_EQ(tseq_feed(e, &s1, ids, n - 1, 64, b), 1);
	CHECK_INT_EQ(tseq_feed(e, &s1, ids + n - 1, 1, 64, b), 1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK(memcmp(a, b, (size_t)n_vocab * sizeof(float)) == 0);
	engine_get_profile(e, &p);
	CHECK(p.steps[1] == 1 && p.rows[1] == (uint64_t)n - 1);
	CHECK(p.steps[0] == 1 && p.rows[0] == 1);
	double total = 0;
	for (int k = 0; k < 2; k++)
		for (int op = 0; op < ENGINE_N_OPS; op++) {
			CHECK(p.op_s[k][op] > 0);
			CHECK(strcmp(engine_op_name((enum engine_op)op), "?") != 0);
			total += p.op_s[k][op];
		}
	CHECK(total <= (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	engine_set_profile(e, 1);
	engine_get_profile(e, &p);
	CHECK(p.steps[0] == 0 && p.rows[1] == 0 && p.op_s[1][ENGINE_OP_QKV] == 0);
	engine_set_profile(e, 0);
	tseq_free(e, &s0);
	tseq_free(e, &s1);
	engine_free(e);
out:
	free(a);
	free(b);
}

static void test_f16_kv_close_to_f32(const struct model *m)
{
	int32_t ids[64], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, "Once upon a time", 16, 1, 0, ids, 64);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	struct engine *e32 = new_engine(m, 64, QT_F32, 64), *e16 = new_engine(m, 64, QT_F16, 64);
	struct tseq s32 = { .len = 0 }, s16 = { .len = 0 };
	double worst = 0;

	CHECK(e32 && e16);
	CHECK_INT_EQ(tseq_feed(e32, &s32, ids, n, 64, a), 1);
	CHECK_INT_EQ(tseq_feed(e16, &s16, ids, n, 64, b), 1);
	for (int32_t i = 0; i < n_vocab; i++)
		worst = fmax(worst, fabs(a[i] - b[i]));
	printf("f16 vs f32 KV: max |logit diff| = %.3g\n", worst);
	CHECK(worst < 2e-2);
	engine_free(e32);
	engine_free(e16);
	free(a);
	free(b);
}

/* Greedy decoding of PROMPT with f32 KV, replayed with q8_0 KV on the same
 * tokens (so the two sequences stay equal up to the first disagreement):
 * returns the steps whose argmax agrees before the first that does not (at
 * most N_GEN) and the largest logit difference over those steps. */
static int q8_0_vs_f32(const struct model *m, const char *prompt, int n_gen, double *ret_worst)
{
	int32_t ids[64], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, prompt, strlen(prompt), 1, 0, ids, 64);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	struct engine *e32 = new_engine(m, 256, QT_F32, 64), *e8 = new_engine(m, 256, QT_Q8_0, 64);
	struct tseq s32 = { .len = 0 }, s8 = { .len = 0 };
	double worst = 0;
	int agree = 0;

	CHECK(e32 && e8 && a && b);
	if (!e32 || !e8 || tseq_feed(e32, &s32, ids, n, 64, a) != 1 || tseq_feed(e8, &s8, ids, n, 64, b) != 1) {
		test_failures++;
		goto out;
	}
	for (; agree < n_gen; agree++) {
		int32_t best32 = 0, best8 = 0;
		for (int32_t i = 0; i < n_vocab; i++) {
			worst = fmax(worst, fabs(a[i] - b[i]));
			best32 = a[i] > a[best32] ? i : best32;
			best8 = b[i] > b[best8] ? i : best8;
		}
		if (best32 != best8 || tseq_feed(e32, &s32, &best32, 1, 1, a) != 1 ||
		    tseq_feed(e8, &s8, &best32, 1, 1, b) != 1)
			break;
	}
out:
	*ret_worst = worst;
	engine_free(e32);
	engine_free(e8);
	free(a);
	free(b);
	return agree;
}

/* A q8_0 KV cache (int8 with a scale per 32 values) follows the f32 one:
 * greedy tokens the same for at least 6 steps of every prompt and for 32 of
 * at least three of the four, logits within TOL on the way.  Measured on
 * both small models: 64/64 steps on three prompts; the fourth meets a
 * near-tie at step 7 or 8 (where f16 KV also parts from f32 on
 * TinyStories); max |logit diff| 0.90 (stories260K, whose 8-wide heads
 * share a block's scale four by four) and 0.39 (TinyStories-656K, 16-wide
 * heads two by two), against 0.006 for f16. */
static void test_q8_0_kv_close_to_f32(const struct model *m, const char *name, double tol)
{
	static const char *prompts[] = { "Once upon a time", "I believe the meaning of life is",
					 "The little dog ran to the park and",
					 "Lily and Tom were best friends. One day" };
	int long_runs = 0;

	for (int i = 0; i < 4; i++) {
		double worst;
		int agree = q8_0_vs_f32(m, prompts[i], 64, &worst);
		printf("%s: q8_0 vs f32 KV, \"%s\": greedy tokens agree for %d of 64 steps, "
		       "max |logit diff| %.3g\n", name, prompts[i], agree, worst);
		CHECK(agree >= 6);
		CHECK(worst < tol);
		long_runs += agree >= 32;
	}
	CHECK(long_runs >= 3);
}

/* The q8_0 pool keeps each K/V row as ggml Q8_0 blocks (error at most half
 * a step of its block's scale, plus the scale's f16 rounding), and paged
 * attention over it gives exactly what it gives over an f32 pool holding
 * the dequantized rows: the int8 values times their block's scale, read in
 * place through the block table.  Heads of 32 (a block each) and of 8 (four
 * heads sharing a block). */
static void test_q8_0_attention_exact(void)
{
	enum { BT = 4, N = 11 };
	static const int32_t geo[2][3] = { { 4, 2, 32 }, { 8, 4, 8 } }; /* n_head, n_head_kv, head_dim */
	struct backend *be = NULL;
	unsigned seed = 7;

	CHECK(cpu_backend_new(2, &be) == 0);
	for (int g = 0; g < 2 && be; g++) {
		int32_t n_head = geo[g][0], n_kv = geo[g][1], hd = geo[g][2], kv_dim = n_kv * hd;
		struct kv_pool *p8 = NULL, *p32 = NULL;
		char err[256];
		float k[N * 64], v[N * 64], q[N * 128], o8[N * 128], o32[N * 128], row[64];
		int32_t pos[N], table[4] = { 2, 0, 1, 0 };
		const int32_t *tabs[N];
		double worst = 0, bound = 0;
		int exact = 0;

		CHECK(kv_pool_new(QT_Q8_0, BT, 1, kv_dim, 3, 1, &p8, err, sizeof err) == 0);
		CHECK(kv_pool_new(QT_F32, BT, 1, kv_dim, 3, 1, &p32, err, sizeof err) == 0);
		if (!p8 || !p32) {
			kv_pool_free(p8);
			kv_pool_free(p32);
			break;
		}
		CHECK(p8->view.row_bytes == (size_t)kv_dim / 32 * 34);
		for (int i = 0; i < N * kv_dim; i++) { /* heads of different magnitudes */
			float scale = 0.1f + (float)((i % kv_dim) / hd);
			k[i] = scale * ((float)rand_r(&seed) / RAND_MAX - 0.5f);
			v[i] = scale * ((float)rand_r(&seed) / RAND_MAX - 0.5f);
		}
		for (int i = 0; i < N * n_head * hd; i++)
			q[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
		for (int t = 0; t < N; t++) {
			pos[t] = t;
			tabs[t] = table;
		}
		struct bk_rows rows = { N, pos, tabs };
		struct bk_attn at = { n_head, n_kv, hd, 1.0f / sqrtf((float)hd), 0 };
		CHECK(be->ops->kv_store(be, &p8->view, 0, &rows, k, v) == 0);
		/* the f32 pool gets the q8_0 pool's rows, dequantized */
		for (int t = 0; t < N; t++)
			for (int w = 0; w < 2; w++) {
				const struct bk_kv *kv = &p8->view;
				const char *src = (const char *)kv->base + (size_t)table[t / BT] * kv->block_bytes +
						  ((size_t)w * BT + t % BT) * kv->row_bytes;
				const float *orig = (w ? v : k) + (size_t)t * kv_dim;
				quant_dequantize_row(QT_Q8_0, src, row, kv_dim);
				for (int c = 0; c < kv_dim; c++) {
					const struct block_q8_0 *blk = (const struct block_q8_0 *)src + c / 32;
					exact += row[c] == (float)blk->qs[c % 32] * qt_f16_to_f32(blk->d);
					worst = fmax(worst, fabs(row[c] - orig[c]));
					/* half a step, plus 127 times the f16 rounding of the step */
					bound = fmax(bound, fabs(row[c] - orig[c]) / ((0.5 + 127.0 / 2048) * qt_f16_to_f32(blk->d)));
				}
				memcpy(w ? v + (size_t)t * kv_dim : k + (size_t)t * kv_dim, row, sizeof(float) * kv_dim);
			}
		CHECK_INT_EQ(exact, 2 * N * kv_dim); /* int8 times scale, on every ISA */
		CHECK(be->ops->kv_store(be, &p32->view, 0, &rows, k, v) == 0);
		CHECK(be->ops->attention(be, &p8->view, 0, &rows, &at, q, o8, NULL) == 0);
		CHECK(be->ops->attention(be, &p32->view, 0, &rows, &at, q, o32, NULL) == 0);
		CHECK(memcmp(o8, o32, sizeof(float) * N * n_head * hd) == 0);
		printf("q8_0 KV rows, head_dim %d: max |error| %.3g, %.2f of the bound\n",
		       hd, worst, bound);
		CHECK(bound <= 1.0);
		kv_pool_free(p8);
		kv_pool_free(p32);
	}
	backend_free(be);
}

/* q8_0 is refused where a head would straddle two 32-element blocks. */
static void test_q8_0_kv_geometry(const struct model *m)
{
	struct model odd = *m; /* shallow: only its hparams are read */
	struct engine *e = NULL;
	struct engine_params ep;
	char err[256] = "";

	engine_params_default(&ep);
	ep.kv_type = QT_Q8_0;
	odd.hp.n_head_kv = 8;
	odd.hp.head_dim = 12; /* kv_dim 96: whole blocks, but heads across their edges */
	CHECK_INT_EQ(engine_new(&odd, &ep, &e, err, sizeof err), -EINVAL);
	CHECK(e == NULL && strstr(err, "q8_0") && strstr(err, "head_dim 12"));
	printf("q8_0 KV refused: %s\n", err);
}

/* The pool can be sized in MiB; the engine reports its capacity in tokens. */
static void test_kv_sizing(const struct model *m)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];
	size_t bb = kv_pool_block_bytes(QT_F16, 16, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim);

	engine_params_default(&ep);
	ep.kv_tokens = 0;
	ep.kv_mib = 1;
	CHECK(engine_new(m, &ep, &e, err, sizeof err) == 0);
	CHECK_INT_EQ(engine_kv_capacity(e), (int64_t)((1u << 20) / bb) * 16);
	engine_free(e);
	e = NULL;
	/* neither: automatic, ENGINE_KV_MIB_HOST on the CPU */
	ep.kv_mib = 0;
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), 0);
	CHECK_INT_EQ(engine_kv_capacity(e), (int64_t)(((size_t)ENGINE_KV_MIB_HOST << 20) / bb) * 16);
	engine_free(e);
	e = NULL;
	ep.kv_gpu_fraction = 1.5; /* a share of a device's memory is at most all of it */
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), -EINVAL);
	ep.kv_gpu_fraction = 0.9;
	ep.kv_tokens = 100;
	CHECK(engine_new(m, &ep, &e, err, sizeof err) == 0);
	CHECK_INT_EQ(engine_kv_capacity(e), 112); /* rounded up to whole blocks */
	engine_free(e);
	/* q8_0 rows take 34 bytes per 32 values: 1 MiB holds about 1.9 times
	 * the f16 tokens */
	e = NULL;
	ep.kv_tokens = 0;
	ep.kv_mib = 1;
	ep.kv_type = QT_Q8_0;
	size_t bq = kv_pool_block_bytes(QT_Q8_0, 16, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim);
	CHECK(bq == (size_t)2 * m->hp.n_layer * 16 * (m->hp.n_head_kv * m->hp.head_dim / 32) * 34);
	CHECK(engine_new(m, &ep, &e, err, sizeof err) == 0);
	CHECK_INT_EQ(engine_kv_capacity(e), (int64_t)((1u << 20) / bq) * 16);
	CHECK(engine_kv_capacity(e) * 10 > (int64_t)((1u << 20) / bb) * 16 * 18);
	engine_free(e);
}

/* What each backend name means, for every kind of build and device count
 * (made-up probes: the choice itself is pure). */
static void test_choose_backend(void)
{
	struct engine_cuda_probe none = { ENGINE_CUDA_NONE, 0, "this build has no CUDA backend" };
	struct engine_cuda_probe emu = { ENGINE_CUDA_EMULATED, 1, "" };
	struct engine_cuda_probe gpu0 = { ENGINE_CUDA_DEVICE, 0, "cudaGetDeviceCount: no driver" };
	struct engine_cuda_probe gpu2 = { ENGINE_CUDA_DEVICE, 2, "" };
	const struct {
		const char *want;
		int32_t index;
		const struct engine_cuda_probe *probe;
		int ret;
		int32_t backend;     /* when ret is 0 */
		const char *says;    /* in the message */
	} cases[] = {
		{ "cpu", 0, &gpu2, 0, ENGINE_BACKEND_CPU, "CPU" },
		{ "cpu", 9, &none, 0, ENGINE_BACKEND_CPU, "CPU" },
		{ "auto", 0, &none, 0, ENGINE_BACKEND_CPU, "no CUDA backend" },
		{ "auto", 0, &emu, 0, ENGINE_BACKEND_CPU, "emulator" },
		{ "auto", 0, &gpu0, 0, ENGINE_BACKEND_CPU, "no driver" },
		{ "auto", 0, &gpu2, 0, ENGINE_BACKEND_CUDA, "CUDA device 0 (of 2)" },
		{ "auto", 1, &gpu2, 0, ENGINE_BACKEND_CUDA, "CUDA device 1 (of 2)" },
		{ "auto", 2, &gpu2, -ENODEV, 0, "device 2 does not exist" },
		{ "cuda", 0, &none, -ENOTSUP, 0, "no CUDA backend" },
		{ "cuda", 0, &emu, 0, ENGINE_BACKEND_CUDA, "emulator" },
		{ "cuda", 1, &emu, -ENODEV, 0, "device 1 does not exist" },
		{ "cuda", 0, &gpu0, -ENODEV, 0, "no usable CUDA device: cudaGetDeviceCount: no driver" },
		{ "cuda", 1, &gpu2, 0, ENGINE_BACKEND_CUDA, "CUDA device 1" },
		{ "cuda", 5, &gpu2, -ENODEV, 0, "sees 2" },
		{ "gpu", 0, &gpu2, -EINVAL, 0, "not a backend" },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int32_t backend = -1;
		char msg[512] = "";
		int r = engine_choose_backend(cases[i].want, cases[i].index, cases[i].probe, &backend,
					      msg, sizeof msg);
		if (r != cases[i].ret || (r == 0 && backend != cases[i].backend) ||
		    !strstr(msg, cases[i].says)) {
			fprintf(stderr, "choose %s #%d (probe kind %d, %d devices): %d, backend %d, \"%s\"\n",
				cases[i].want, cases[i].index, cases[i].probe->kind,
				cases[i].probe->n_devices, r, backend, msg);
			test_failures++;
		}
	}
	printf("backend choice: %zu cases\n", sizeof cases / sizeof cases[0]);
}

/* Bad rows are refused before anything is written. */
/* K-quant files mix weight types within a layer (Q5_0 q/k beside a Q6_K
 * v).  Layer 0's v rewritten from Q4_0 into Q5_0, each code plus 8 (the
 * same values, the same integer dot products), keeps every logit's bits. */
static void test_mixed_weight_types(struct model *m)
{
	const char *text = "Once upon a time there was a little girl who lived in a village near the forest.";
	struct bk_weight *wv = &m->layers[0].wv, old = *wv;
	int32_t ids[128], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, text, strlen(text), 1, 0, ids, 128);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	const int64_t nb = old.n_in / QK;
	struct block_q5_0 *q5 = malloc((size_t)(nb * old.n_out) * sizeof *q5);

	CHECK_INT_EQ(old.type, QT_Q4_0);
	if (old.type != QT_Q4_0)
		goto out;
	for (int64_t r = 0; r < old.n_out; r++)
		for (int64_t k = 0; k < nb; k++) {
			const struct block_q4_0 *x = (const struct block_q4_0 *)((const char *)old.data + r * old.row_bytes) + k;
			struct block_q5_0 *y = q5 + r * nb + k;
			uint32_t qh = 0;
			y->d = x->d;
			for (int j = 0; j < QK / 2; j++) {
				int lo = (x->qs[j] & 0xf) + 8, hi = (x->qs[j] >> 4) + 8;
				y->qs[j] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
				qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
			}
			memcpy(y->qh, &qh, 4);
		}
	for (int pass = 0; pass < 2; pass++) {
		struct engine *e = new_engine(m, 256, QT_F32, 64);
		struct tseq sq = { .len = 0 };
		CHECK(e != NULL);
		if (!e)
			break;
		CHECK_INT_EQ(tseq_feed(e, &sq, ids, n, 64, pass ? b : a), 1);
		tseq_free(e, &sq);
		engine_free(e);
		*wv = (struct bk_weight){ QT_Q5_0, old.n_in, old.n_out, q5, (size_t)nb * sizeof *q5 };
	}
	CHECK(memcmp(a, b, (size_t)n_vocab * sizeof(float)) == 0);
out:
	*wv = old;
	free(q5);
	free(a);
	free(b);
}

/* An n_ctx under MODEL_MIN_CTX is refused with its reason; at 2 a
 * one-token prompt gets its one generated token, and position 2 is out. */
static void test_short_context(const struct model *m)
{
	struct engine_params ep;
	struct engine *e = NULL;
	struct tseq sq = { .len = 0 };
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	int32_t bos = 1;
	char err[256] = "";

	engine_params_default(&ep);
	ep.kv_tokens = 64;
	ep.n_ctx = 1;
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), -EINVAL);
	CHECK(e == NULL && strstr(err, "a context of 1 position is too short") != NULL);
	ep.n_ctx = 2;
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), 0);
	if (e && logits) {
		CHECK_INT_EQ(engine_n_ctx(e), 2);
		CHECK_INT_EQ(tseq_feed(e, &sq, &bos, 1, 1, logits), 1);
		int32_t next = tseq_argmax(logits, m->hp.n_vocab);
		CHECK_INT_EQ(tseq_feed(e, &sq, &next, 1, 1, logits), 1);
		CHECK_INT_EQ(tseq_feed(e, &sq, &next, 1, 1, logits), -EINVAL); /* position 2 */
		tseq_free(e, &sq);
	}
	engine_free(e);
	free(logits);
}

static void test_bad_batches(const struct model *m)
{
	struct engine *e = new_engine(m, 32, QT_F32, 48);
	struct tseq sq = { .len = 0 };
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	int32_t ids[48], pos[48];
	const int32_t *tab[48];

	CHECK(e != NULL);
	for (int i = 0; i < 48; i++) {
		ids[i] = 1 + i % 100;
		pos[i] = i;
		tab[i] = sq.table;
	}
	CHECK(tseq_reserve(e, &sq, 32) == 0);
	CHECK_INT_EQ(kv_pool_n_available(engine_kv_pool(e)), 0);
	struct engine_batch too_many = { 49, ids, pos, tab, NULL };
	CHECK_INT_EQ(engine_step(e, &too_many, logits), -EINVAL);
	int32_t bad_tok = m->hp.n_vocab, bad_pos = -1;
	struct engine_batch bad = { 1, &bad_tok, pos, tab, NULL };
	CHECK_INT_EQ(engine_step(e, &bad, logits), -EINVAL);
	struct engine_batch bad2 = { 1, ids, &bad_pos, tab, NULL };
	CHECK_INT_EQ(engine_step(e, &bad2, logits), -EINVAL);
	struct engine_batch ok = { 32, ids, pos, tab, NULL };
	CHECK_INT_EQ(engine_step(e, &ok, logits), 1);
	tseq_free(e, &sq);
	CHECK_INT_EQ(kv_pool_n_available(engine_kv_pool(e)), 2);
	engine_free(e);
	free(logits);
}

static void test_bad_model_files(const char *good)
{
	char err[512], tmp[] = "/tmp/llmd-test-XXXXXX";
	struct model *m = NULL;
	FILE *in, *out;
	int fd;

	CHECK(model_load("/nonexistent/model.gguf", &m, err, sizeof err) < 0);
	CHECK(m == NULL);
	printf("missing file: %s\n", err);

	/* the same file cut in half: a clear error, not a crash */
	fd = mkstemp(tmp);
	CHECK(fd >= 0);
	in = fopen(good, "rb");
	out = fdopen(fd, "wb");
	fseek(in, 0, SEEK_END);
	long size = ftell(in);
	fseek(in, 0, SEEK_SET);
	char *buf = malloc((size_t)size);
	CHECK(fread(buf, 1, (size_t)size, in) == (size_t)size);
	fwrite(buf, 1, (size_t)size / 2, out);
	fclose(in);
	fclose(out);
	CHECK(model_load(tmp, &m, err, sizeof err) < 0);
	printf("truncated file: %s\n", err);
	CHECK(strstr(err, "past end of file") != NULL);
	unlink(tmp);
	free(buf);
}

/* Greedy ids after PROMPT (already templated); returns how many were made. */
static int smol_greedy(const struct model *m, const char *prompt, uint32_t kv_type, int n_gen,
		       int32_t *gen, char *out, size_t cap)
{
	int32_t ids[256];
	struct tseq sq = { .len = 0 };
	int n = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids, 256);
	struct engine *e = new_engine(m, 512, kv_type, 256);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	size_t len = 0;
	int k = 0;

	CHECK(e && logits && tseq_feed(e, &sq, ids, n, 256, logits) == 1);
	while (e && logits && k < n_gen) {
		int32_t best = 0;
		for (int32_t v = 1; v < m->hp.n_vocab; v++)
			if (logits[v] > logits[best])
				best = v;
		gen[k++] = best;
		len += (size_t)tokenizer_piece(m->tok, best, 0, out + len, cap - len - 1);
		if (tokenizer_is_eog(m->tok, best) || tseq_feed(e, &sq, &best, 1, 1, logits) != 1)
			break;
	}
	out[len] = 0;
	free(logits);
	engine_free(e);
	return k;
}

/* The default model answers a simple question in coherent English, and its
 * raw greedy continuation is llama.cpp's. */
/* Resident bytes of the mapping that holds ADDR, from /proc/self/smaps;
 * -1 when unknown. */
static long long mapping_rss(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0;
	long long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
			continue;
		}
		if (in && sscanf(line, "Rss: %lld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

/* The CPU backend packs SmolLM2's weights (on AVX2) and the engine then
 * drops the file's pages of them: the mapping keeps little resident. */
static void test_weights_leave_the_mapping(struct model *m)
{
	struct engine *e;
	long long rss;

	if (quant_get_isa() != QUANT_ISA_AVX2) {
		printf("weights stay mapped on %s (nothing packed): that check is skipped\n",
		       quant_isa_name(quant_get_isa()));
		return;
	}
	e = new_engine(m, 256, QT_F16, 64);
	CHECK(e != NULL);
	rss = mapping_rss(m->tok_embd.data);
	printf("SmolLM2 mapping resident after engine_new: %lld KiB of %llu\n", rss / 1024,
	       (unsigned long long)(m->file_bytes / 1024));
	CHECK(rss >= 0 && (unsigned long long)rss < m->file_bytes / 10);
	engine_free(e);
}

static void test_smollm2(void)
{
	/* llama.cpp 0c1e57098 on the same file, f32 KV cache, greedy: the steps
	 * whose top-2 logit margin is at least 0.4.  SmolLM2 is sensitive: an
	 * f16 instead of f32 KV cache moves its logits by up to 0.9, and
	 * llama.cpp's own prefill and decode kernels round differently, so
	 * step 5 (margin 0.15 there, 0.04 here) is a coin toss. */
	static const int32_t once_llamacpp[4] = { 28, 260, 2240, 282 };
	/* "The capital of France is Paris." (checked by eye), then <|im_end|> */
	static const int32_t paris[8] = { 504, 3575, 282, 4649, 314, 7042, 30, 2 };
	const char *path = test_smollm2_path();
	struct model *m = NULL;
	char err[512], out[4096];
	int32_t gen[32];
	int n;

	if (!path) {
		printf("SmolLM2 not fetched: its checks are skipped\n");
		return;
	}
	CHECK(model_load(path, &m, err, sizeof err) == 0);
	if (!m)
		return;
	/* its own Jinja template runs; it is of the chatml family */
	CHECK(m->chat.kind == CHAT_TMPL_JINJA && m->chat.family == CHAT_TMPL_CHATML);
	CHECK(m->chat_note[0] == 0);
	test_weights_leave_the_mapping(m);
	struct chat_msg msgs[2] = { { "system", "You are a helpful assistant." },
				    { "user", "What is the capital of France?" } };
	char *text = NULL;
	CHECK(chat_render(&m->chat, msgs, 2, 1, &text) > 0);
	n = smol_greedy(m, text, QT_F16, 24, gen, out, sizeof out);
	printf("SmolLM2 chat: %s\n", out);
	CHECK_INT_EQ(n, 8);
	CHECK(memcmp(gen, paris, sizeof paris) == 0);
	CHECK(strstr(out, "Paris") != NULL);
	/* SmolLM2's 64-wide heads are two Q8_0 blocks each: the same answer */
	n = smol_greedy(m, text, QT_Q8_0, 24, gen, out, sizeof out);
	printf("SmolLM2 chat, q8_0 KV: %s\n", out);
	CHECK_INT_EQ(n, 8);
	CHECK(memcmp(gen, paris, sizeof paris) == 0);
	free(text);

	n = smol_greedy(m, "Once upon a time", QT_F32, 4, gen, out, sizeof out);
	printf("SmolLM2 raw: %s\n", out);
	CHECK_INT_EQ(n, 4);
	CHECK(memcmp(gen, once_llamacpp, sizeof once_llamacpp) == 0);
	model_free(m);
}

int main(void)
{
	char *p = test_model_path("stories260K.gguf") ? strdup(test_model_path("stories260K.gguf")) : NULL;
	char *q = test_model_path("derived/TinyStories-656K-q4_0.gguf") ?
		strdup(test_model_path("derived/TinyStories-656K-q4_0.gguf")) : NULL;
	struct model *m = NULL;
	char err[512];

	test_choose_backend();
	if (!p || !q) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	CHECK(model_load(p, &m, err, sizeof err) == 0);
	test_chunked_prefill_and_batch_invariance(m);
	test_f16_kv_close_to_f32(m);
	test_profile(m);
	test_bad_batches(m);
	test_short_context(m);
	test_kv_sizing(m);
	test_q8_0_attention_exact();
	test_q8_0_kv_geometry(m);
	test_q8_0_kv_close_to_f32(m, "stories260K", 1.25);
	model_free(m);
	/* quantized weights: the same promises */
	CHECK(model_load(q, &m, err, sizeof err) == 0);
	test_chunked_prefill_and_batch_invariance(m);
	test_q8_0_kv_close_to_f32(m, "TinyStories-656K-q4_0", 0.6);
	test_mixed_weight_types(m);
	model_free(m);
	test_bad_model_files(p);
	test_smollm2();
	free(p);
	free(q);
	return test_result();
}
