/* testbatch.h - checks of the whole engine shared by the tests of the CUDA
 * backend (the emulated one, nvcc's on a GPU):
 *  - batch invariance through the scheduler: request 0 alone, then beside
 *    three others, two of them started first so that its prefill shares
 *    steps with their decodes; greedy ids identical;
 *  - graphs: decode steps replayed from CUDA graphs give the very logits of
 *    launched ones;
 *  - the cuBLAS fp16 path for big matmuls (gemm_rows): a prompt's logits
 *    near the CPU's, and the same greedy tokens;
 *  - F16 and BF16 weights: the same. */
#ifndef LLMD_TESTBATCH_H
#define LLMD_TESTBATCH_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_pool.h"
#include "quant.h"
#include "testseq.h"
#include "model.h"
#include "sched.h"
#include "testutil.h"
#include "tokenizer.h"

#define TBATCH_MAX_GEN 64

struct tbatch_result {
	int32_t gen[TBATCH_MAX_GEN];
	int n_gen;
	int n_finish;
};

static struct tbatch_result tbatch_results[4];

/* The model at DIR/REL, or NULL with the error printed and a failure
 * counted. */
static struct model *tbatch_model(const char *dir, const char *rel)
{
	char path[4096], err[512];
	struct model *m = NULL;

	snprintf(path, sizeof path, "%s/%s", dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return NULL;
	}
	return m;
}

static void tbatch_on_event(void *ctx, const struct sched_event *ev)
{
	struct tbatch_result *r = &tbatch_results[ev->id];
	(void)ctx;
	if (ev->kind == SCHED_EV_FINISH)
		r->n_finish++;
	else if (ev->token >= 0 && r->n_gen < TBATCH_MAX_GEN)
		r->gen[r->n_gen++] = ev->token;
}

static void tbatch_run_to_idle(struct sched *s)
{
	for (int guard = 0; sched_live(s) > 0 && guard < 10000; guard++)
		CHECK(sched_step(s) >= 0);
	CHECK_INT_EQ(sched_live(s), 0);
}

/* The model REL under MODELS_DIR on the engine MAKE gives (a pool of 512
 * tokens, 64-row steps, a 256-token context). */
static void tbatch_invariance(const char *models_dir, const char *rel,
			      struct engine *(*make)(const struct model *m))
{
	static const char *prompts[4] = { "Once upon a time", "The little dog ran to the park and",
					  "Hello", "Lily and Tom were best friends. One day" };
	static const int max_tokens[4] = { 24, 16, 20, 12 };
	char err[512];
	struct model *m = NULL;
	struct engine *e = NULL;
	struct sched *s = NULL;
	struct sched_params sp;
	int32_t ids[4][64];
	int n_ids[4];
	struct tbatch_result alone;

	if (!(m = tbatch_model(models_dir, rel)))
		return;
	e = make(m);
	sched_params_default(&sp);
	sp.max_seqs = 4;
	sp.max_batched_tokens = 64;
	sp.prefix_cache = 0;
	if (!e || sched_new(e, m, &sp, tbatch_on_event, NULL, &s, err, sizeof err) < 0) {
		fprintf(stderr, "rig: %s\n", e ? err : "no engine");
		test_failures++;
		goto out;
	}
	for (int i = 0; i < 4; i++)
		n_ids[i] = tokenizer_encode(m->tok, prompts[i], strlen(prompts[i]),
					    tokenizer_add_bos(m->tok), 1, ids[i], 64);
	/* request 0 alone */
	struct sched_request r0 = { .id = 0, .prompt = ids[0], .n_prompt = n_ids[0],
				    .max_tokens = max_tokens[0] };
	sampler_params_default(&r0.sampling);
	r0.sampling.temperature = 0;
	memset(tbatch_results, 0, sizeof tbatch_results);
	CHECK_INT_EQ(sched_submit(s, &r0), 0);
	tbatch_run_to_idle(s);
	alone = tbatch_results[0];
	CHECK_INT_EQ(alone.n_gen, max_tokens[0]);
	/* then with 3 others, two of them started first so that request 0's
	 * prefill shares steps with their decodes */
	memset(tbatch_results, 0, sizeof tbatch_results);
	for (int i = 1; i < 4; i++) {
		struct sched_request r = { .id = (uint64_t)i, .prompt = ids[i], .n_prompt = n_ids[i],
					   .max_tokens = max_tokens[i] };
		sampler_params_default(&r.sampling);
		r.sampling.temperature = 0;
		CHECK_INT_EQ(sched_submit(s, &r), 0);
		if (i == 2)
			for (int st = 0; st < 3; st++)
				CHECK(sched_step(s) >= 0);
	}
	CHECK_INT_EQ(sched_submit(s, &r0), 0);
	tbatch_run_to_idle(s);
	CHECK_INT_EQ(tbatch_results[0].n_finish, 1);
	int same = tbatch_results[0].n_gen == alone.n_gen &&
		   !memcmp(tbatch_results[0].gen, alone.gen, sizeof(int32_t) * (size_t)alone.n_gen);
	CHECK(same);
	printf("%s: batch invariance on %s: %d tokens alone, %s beside 3 others\n", rel, engine_backend_name(e),
	       alone.n_gen, same ? "identical" : "DIFFERENT");
out:
	sched_free(s);
	engine_free(e);
	model_free(m);
}

static char tgraph_backend[32];

/* An engine on BACKEND (f16 KV pool of 512 tokens, 64-row steps) with
 * GRAPHS and GEMM_ROWS as given; NULL, a failure counted, when it cannot be
 * made. */
static struct engine *tbatch_engine(const struct model *m, int32_t backend, int32_t graphs,
				    int32_t gemm_rows)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.backend = backend;
	ep.kv_type = QT_F16;
	ep.kv_tokens = 1024; /* twide_check's 24 sequences take 38 blocks of 16 */
	ep.max_batch = 64;
	ep.graphs = graphs;
	ep.gemm_rows = gemm_rows;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "engine_new: %s\n", err);
		test_failures++;
		return NULL;
	}
	return e;
}

/* Runs the graph test's workload on an engine with GRAPHS on or off and
 * returns every decode step's logits, concatenated (NULL on failure):
 * three sequences prefilled at once, then 56 decode steps of all of them
 * (3 rows: a recorded step pads them to 4) until one stops (2 rows); the
 * longest crosses 64 positions (the table stride doubles).  The tokens fed
 * are fixed, not sampled, so both runs feed the same ones. */
static float *tgraph_run(const struct model *m, int graphs, size_t *n_floats, uint64_t *captures,
			uint64_t *replays)
{
	enum { N_SEQ = 3, N_DEC = 56 };
	static const int plen[N_SEQ] = { 5, 9, 30 };
	struct engine *e = tbatch_engine(m, ENGINE_BACKEND_CUDA, graphs, 0);
	struct tseq sq[N_SEQ];
	int32_t n_vocab, ids[64], pos[N_SEQ];
	const int32_t *tab[N_SEQ];
	uint8_t want[N_SEQ] = { 1, 1, 1 };
	float *all = NULL, *lg = NULL;
	size_t n = 0;
	int ok = 1;

	if (!e)
		return NULL;
	n_vocab = engine_n_vocab(e);
	memset(sq, 0, sizeof sq);
	all = malloc((size_t)N_DEC * N_SEQ * n_vocab * sizeof(float));
	lg = malloc((size_t)N_SEQ * n_vocab * sizeof(float));
	ok = all && lg;
	for (int i = 0; ok && i < N_SEQ; i++) {
		for (int k = 0; k < plen[i]; k++)
			ids[k] = (k * 37 + i * 11 + 5) % n_vocab;
		ok = tseq_feed(e, &sq[i], ids, plen[i], plen[i], lg) == 1;
	}
	for (int step = 0; ok && step < N_DEC; step++) {
		int T = step < N_DEC / 2 ? N_SEQ : N_SEQ - 1; /* sequence 2 stops halfway */
		for (int i = 0; ok && i < T; i++) {
			ok = tseq_reserve(e, &sq[i], 1) == 0;
			ids[i] = (step * 31 + i * 7 + 3) % n_vocab;
			pos[i] = sq[i].len;
			tab[i] = sq[i].table;
		}
		struct engine_batch b = { T, ids, pos, tab, want };
		ok = ok && engine_step(e, &b, all + n) == T;
		for (int i = 0; ok && i < T; i++)
			sq[i].len++;
		n += (size_t)T * n_vocab;
	}
	CHECK(ok);
	snprintf(tgraph_backend, sizeof tgraph_backend, "%s", engine_backend_name(e));
	uint64_t cap = 0, rep = 0;
	engine_graph_stats(e, &cap, &rep);
	*captures = cap;
	*replays = rep;
	for (int i = 0; i < N_SEQ; i++)
		tseq_free(e, &sq[i]);
	free(lg);
	engine_free(e);
	*n_floats = n;
	if (!ok) {
		free(all);
		return NULL;
	}
	return all;
}

/* Decode steps replayed from CUDA graphs give the very bits of launched
 * ones, and graphs are recorded once per shape and replayed. */
static void tgraph_check(const char *dir, const char *rel)
{
	struct model *m = NULL;
	size_t n_on = 0, n_off = 0;
	uint64_t cap_on, rep_on, cap_off, rep_off;

	if (!(m = tbatch_model(dir, rel)))
		return;
	float *on = tgraph_run(m, 1, &n_on, &cap_on, &rep_on);
	float *off = tgraph_run(m, 0, &n_off, &cap_off, &rep_off);
	CHECK(on && off && n_on == n_off && n_on > 0);
	int same = on && off && n_on == n_off && memcmp(on, off, n_on * sizeof(float)) == 0;
	CHECK(same);
	/* shapes (rows, table stride): (4, 4), (2, 4), (2, 8); every decode
	 * step is recorded or replayed (the prefills showed attention's shape) */
	CHECK_INT_EQ(cap_off, 0);
	CHECK_INT_EQ(rep_off, 0);
	CHECK_INT_EQ(cap_on, 3);
	CHECK_INT_EQ(rep_on + cap_on, 56);
	printf("%s: graphs on %s: %llu recorded, %llu replayed, logits %s\n", rel, tgraph_backend,
	       (unsigned long long)cap_on, (unsigned long long)rep_on,
	       same ? "identical to launched steps" : "DIFFER from launched steps");
	free(on);
	free(off);
	model_free(m);
}

/* Decode steps of many rows give each sequence the bits of its own
 * one-row steps; on CUDA the integer matmuls take the tensor-core kernels
 * with 1 tile of 8 rows a pass up to 8 rows, 2 up to 16, the K-quants' 4
 * beyond (or the dp4a kernels below LLMD_CUDA_MMA_MIN_T), and the steps
 * replay graphs.
 * NSEQ sequences (at most TWIDE_SEQS; prompts of 3..NSEQ+2 ids, each
 * prefilled alone), then TWIDE_STEPS steps of all of them with fixed ids,
 * against the same steps of each sequence alone on a fresh one. */
#define TWIDE_SEQS 24
#define TWIDE_STEPS 4
static void twide_check(const char *dir, const char *rel, int32_t backend, int nseq)
{
	struct model *m = tbatch_model(dir, rel);
	struct engine *e = m && nseq > 0 && nseq <= TWIDE_SEQS ? tbatch_engine(m, backend, 1, 0) : NULL;
	static struct tseq sq[TWIDE_SEQS];
	int32_t ids[TWIDE_SEQS], pos[TWIDE_SEQS], prompt[TWIDE_SEQS + 2];
	const int32_t *tab[TWIDE_SEQS];
	uint8_t want[TWIDE_SEQS];
	float *wide = NULL, *lg = NULL;
	int ok, bad = 0;

	CHECK(nseq > 0 && nseq <= TWIDE_SEQS);
	if (!e) {
		model_free(m);
		return;
	}
	const int32_t n_vocab = engine_n_vocab(e);
	const size_t step_floats = (size_t)nseq * n_vocab;
	memset(sq, 0, sizeof sq);
	memset(want, 1, sizeof want);
	wide = malloc(TWIDE_STEPS * step_floats * sizeof(float));
	lg = malloc((size_t)n_vocab * sizeof(float));
	ok = wide && lg;
	for (int i = 0; ok && i < nseq; i++) {
		for (int k = 0; k < 3 + i; k++)
			prompt[k] = (k * 37 + i * 11 + 5) % n_vocab;
		ok = tseq_feed(e, &sq[i], prompt, 3 + i, 3 + i, lg) == 1;
	}
	for (int step = 0; ok && step < TWIDE_STEPS; step++) {
		for (int i = 0; ok && i < nseq; i++) {
			ok = tseq_reserve(e, &sq[i], 1) == 0;
			ids[i] = (step * 31 + i * 7 + 3) % n_vocab;
			pos[i] = sq[i].len;
			tab[i] = sq[i].table;
		}
		struct engine_batch b = { nseq, ids, pos, tab, want };
		ok = ok && engine_step(e, &b, wide + step * step_floats) == nseq;
		for (int i = 0; ok && i < nseq; i++)
			sq[i].len++;
	}
	for (int i = 0; i < nseq; i++)
		tseq_free(e, &sq[i]);
	/* each alone, from its prompt again */
	for (int i = 0; ok && i < nseq; i++) {
		struct tseq one;
		memset(&one, 0, sizeof one);
		for (int k = 0; k < 3 + i; k++)
			prompt[k] = (k * 37 + i * 11 + 5) % n_vocab;
		ok = tseq_feed(e, &one, prompt, 3 + i, 3 + i, lg) == 1;
		for (int step = 0; ok && step < TWIDE_STEPS; step++) {
			int32_t id = (step * 31 + i * 7 + 3) % n_vocab;
			ok = tseq_feed(e, &one, &id, 1, 1, lg) == 1;
			bad += ok && memcmp(lg, wide + step * step_floats + (size_t)i * n_vocab,
					    (size_t)n_vocab * sizeof(float)) != 0;
		}
		tseq_free(e, &one);
	}
	CHECK(ok);
	CHECK_INT_EQ(bad, 0);
	printf("%s: %d-row decode steps on %s: %d of %d rows differ from one-row steps\n", rel, nseq,
	       engine_backend_name(e), bad, nseq * TWIDE_STEPS);
	free(wide);
	free(lg);
	engine_free(e);
	model_free(m);
}

/* A CUDA test program's command line: none (-1: run its own tests), or
 * `--wide DIR FILE NSEQ`, twide_check alone on a model tests/gguf_synth.sh
 * or .ci/gpu-run made (no model under ../shared/models has K-quants),
 * where the CUDA probe finds KIND with a device (else a skip); returns the
 * exit status.  Anything else is a usage error (2, said on stderr). */
static int twide_main(int argc, char **argv, int kind)
{
	struct engine_cuda_probe pr;

	if (argc == 1)
		return -1;
	if (argc != 5 || strcmp(argv[1], "--wide")) {
		fprintf(stderr, "usage: %s [--wide DIR FILE NSEQ]\n", argv[0]);
		return 2;
	}
	engine_cuda_probe(&pr);
	if (pr.kind != kind || pr.n_devices == 0) {
		printf("SKIP: %s\n", pr.kind == ENGINE_CUDA_NONE || pr.kind == kind ? pr.why :
		       "this build's CUDA backend is not the one this test runs");
		return TEST_SKIP;
	}
	twide_check(argv[2], argv[3], ENGINE_BACKEND_CUDA, atoi(argv[4]));
	return test_result();
}

/* The last row's logits after PROMPT (N ids, one step) and then N_GEN
 * greedy ids into GEN, on an engine with backend BACKEND and gemm_rows
 * GEMM_ROWS.  With FORCE, the ids fed are FORCE's (GEN still gets each
 * step's greedy pick) and *GAP the largest amount by which a step's top
 * logit exceeds that of FORCE's id.  Returns the logits (n_vocab floats,
 * malloc'd) or NULL. */
static float *tgemm_run(const struct model *m, int32_t backend, int32_t gemm_rows,
			const int32_t *prompt, int n, int n_gen, int32_t *gen, const int32_t *force,
			double *gap)
{
	struct engine *e = tbatch_engine(m, backend, 1, gemm_rows);
	struct tseq sq;
	float *first = NULL, *lg;
	int ok;

	if (!e)
		return NULL;
	const int32_t n_vocab = engine_n_vocab(e);
	memset(&sq, 0, sizeof sq);
	first = malloc((size_t)n_vocab * sizeof(float));
	lg = malloc((size_t)n_vocab * sizeof(float));
	ok = first && lg && tseq_feed(e, &sq, prompt, n, n, first) == 1;
	if (ok)
		memcpy(lg, first, (size_t)n_vocab * sizeof(float));
	if (force)
		*gap = 0;
	for (int i = 0; ok && i < n_gen; i++) {
		gen[i] = tseq_argmax(lg, n_vocab);
		if (force && !((double)lg[gen[i]] - lg[force[i]] <= *gap)) /* a NaN sticks */
			*gap = (double)lg[gen[i]] - lg[force[i]];
		ok = i + 1 == n_gen || tseq_feed(e, &sq, force ? &force[i] : &gen[i], 1, 1, lg) == 1;
	}
	CHECK(ok);
	tseq_free(e, &sq);
	engine_free(e);
	free(lg);
	if (!ok) {
		free(first);
		return NULL;
	}
	return first;
}

/* "every greedy pick the CPU's", or how many differ and by how much (GAP:
 * tgemm_run's) - for the messages below; a static buffer. */
static const char *tpicks(const int32_t *got, const int32_t *want, int n, double gap)
{
	static char buf[96];
	int d = 0;

	for (int i = 0; i < n; i++)
		d += got[i] != want[i];
	if (!d)
		snprintf(buf, sizeof buf, "every greedy pick the CPU's");
	else
		snprintf(buf, sizeof buf, "%d greedy picks differ, the CPU's within %.3g of the top", d, gap);
	return buf;
}

/* gemm_rows 8 sends the prompt's matmuls of the quantized model REL
 * through f16 weight tiles and cuBLAS: its logits leave the integer path's
 * (the switch happened) but stay within TOL of the CPU's, and fed the
 * CPU's greedy continuation, each step's CPU pick is within TOL of the top
 * logit (a near tie may flip: f16 is not the CPU's rounding).  The integer
 * path rounds activations to 8 bits as the CPU does (on the emulator it is
 * the CPU's to the bit); f16 keeps 11 bits of weights and activations, so
 * the logits move by the CPU's own rounding: 0.23 at most measured, on
 * the emulator and on an H200 alike. */
static void tgemm_check(const char *dir, const char *rel, float tol)
{
	enum { N = 40, N_GEN = 16 };
	struct model *m = NULL;
	int32_t prompt[N], g_cpu[N_GEN], g_q[N_GEN], g_h[N_GEN];
	double gap = 0;

	if (!(m = tbatch_model(dir, rel)))
		return;
	const char *text = "Once upon a time, there was a little girl named Lily. She loved to play "
			   "outside in the park with her friends and her dog.";
	int n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, prompt, N);
	CHECK(n >= 16 && n <= N);
	float *cpu = tgemm_run(m, ENGINE_BACKEND_CPU, 0, prompt, n, N_GEN, g_cpu, NULL, NULL);
	float *q = tgemm_run(m, ENGINE_BACKEND_CUDA, 0, prompt, n, N_GEN, g_q, NULL, NULL);
	float *h = cpu ? tgemm_run(m, ENGINE_BACKEND_CUDA, 8, prompt, n, N_GEN, g_h, g_cpu, &gap) : NULL;
	if (cpu && q && h) {
		double dq = 0, dh = 0;
		for (int32_t i = 0; i < m->hp.n_vocab; i++) { /* a NaN sticks */
			double a = fabs((double)q[i] - cpu[i]), b = fabs((double)h[i] - cpu[i]);
			dq = a <= dq ? dq : a;
			dh = b <= dh ? dh : b;
		}
		CHECK(memcmp(q, h, (size_t)m->hp.n_vocab * sizeof(float)) != 0);
		CHECK(dh <= tol);
		CHECK(gap <= tol);
		printf("%s: prompt of %d tokens, f16 cuBLAS matmuls: logits within %.3g of the CPU's "
		       "(integer kernels %.3g, tolerance %.3g); on the CPU's %d greedy tokens, %s\n", rel,
		       n, dh, dq, (double)tol, N_GEN, tpicks(g_h, g_cpu, N_GEN, gap));
	} else {
		test_failures++;
	}
	free(cpu);
	free(q);
	free(h);
	model_free(m);
}

/* The F32 TinyStories model with every matmul weight (layers and output)
 * converted to TYPE (F16 or BF16) in memory: the CUDA backend (cuBLAS on
 * half inputs, f32 accumulation) gives logits within TOL of the CPU's, and
 * fed the CPU's greedy tokens, picks each within TOL of its top.  Measured
 * on the emulator: F16 0.0053 (cuBLAS rounds the activations to f16 too),
 * BF16 2e-6 (its reference cuBLAS sums as the CPU does); on an H200 F16
 * 0.0053, BF16 8.4e-4 (the tensor cores' f32 sums, in their own order). */
static void thalf_check(const char *dir, uint32_t type, float tol)
{
	enum { N = 40, N_GEN = 16 };
	struct model *m = NULL;
	int32_t prompt[N], g_cpu[N_GEN], g_cuda[N_GEN];
	double gap = 0;
	void *bufs[512];
	int n_bufs = 0;

	if (!(m = tbatch_model(dir, "derived/TinyStories-656K-f32.gguf")))
		return;
	for (int32_t l = 0; l <= m->hp.n_layer; l++) {
		struct model_layer *L = &m->layers[l < m->hp.n_layer ? l : 0];
		struct bk_weight *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
					    &L->w_down };
		int nw = 7;
		if (l == m->hp.n_layer) { /* the output (tied or not: a copy of its own) */
			ws[0] = &m->output;
			nw = 1;
		}
		for (int k = 0; k < nw && n_bufs < 512; k++) {
			struct bk_weight *w = ws[k];
			CHECK_INT_EQ(w->type, QT_F32);
			uint16_t *h = malloc((size_t)(w->n_in * w->n_out) * 2);
			if (!h)
				continue;
			for (int64_t r = 0; r < w->n_out; r++)
				quant_quantize_row(type, (const float *)((const char *)w->data + r * w->row_bytes),
						   h + r * w->n_in, w->n_in);
			*w = (struct bk_weight){ type, w->n_in, w->n_out, h, (size_t)w->n_in * 2 };
			bufs[n_bufs++] = h;
		}
	}
	const char *text = "Once upon a time, there was a little girl named Lily.";
	int n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, prompt, N);
	float *cpu = tgemm_run(m, ENGINE_BACKEND_CPU, 0, prompt, n, N_GEN, g_cpu, NULL, NULL);
	float *cuda = cpu ? tgemm_run(m, ENGINE_BACKEND_CUDA, 0, prompt, n, N_GEN, g_cuda, g_cpu, &gap)
			  : NULL;
	if (cpu && cuda) {
		double d = 0;
		for (int32_t i = 0; i < m->hp.n_vocab; i++) {
			double a = fabs((double)cuda[i] - cpu[i]);
			d = a <= d ? d : a;
		}
		CHECK(d <= tol);
		CHECK(gap <= tol);
		printf("TinyStories-656K as %s: logits within %.3g of the CPU's (tolerance %.3g); on the "
		       "CPU's %d greedy tokens, %s\n", qtype_get(type)->name, d, (double)tol, N_GEN,
		       tpicks(g_cuda, g_cpu, N_GEN, gap));
	} else {
		test_failures++;
	}
	free(cpu);
	free(cuda);
	model_free(m);
	for (int i = 0; i < n_bufs; i++)
		free(bufs[i]);
}

#endif
