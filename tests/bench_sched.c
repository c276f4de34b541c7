/* bench_sched.c - how long a running stream waits between tokens while
 * another request's long prompt is prefilled, with and without the
 * scheduler's step-time budget.  A benchmark, not a test: it asserts no
 * speed, and fails only when the scheduler does.
 *
 * Request A (a short prompt, greedy) decodes alone for --warmup tokens;
 * then request B arrives with a --prompt-tokens prompt and asks for one
 * token.  The report: A's gaps between tokens while B is prefilled (from
 * B's arrival to B's token: worst, p99, p50), A's gap before B came, and
 * B's prefill time and speed (what the budget costs it), and a hash of
 * B's token and A's first OUT_TOKENS, which must not depend on the budget.
 *
 *   bench_sched --model PATH [--threads 2] [--prompt-tokens 4000]
 *               [--step-ms 0] [--batch 512] [--warmup 16] [--json] [--trace]
 *
 * --trace prints every step's rows and measured and predicted time.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "engine.h"
#include "model.h"
#include "quant.h"
#include "sched.h"
#include "tokenizer.h"

#define A_ID 0
#define B_ID 1
#define OUT_TOKENS 64 /* A's tokens in the output hash */

struct bench {
	double *t_a;       /* (cap_a) when each of A's tokens came, monotonic seconds */
	int n_a, cap_a;
	int32_t a_tok[OUT_TOKENS]; /* A's first tokens */
	int32_t b_tok;     /* B's token */
	double t_b;        /* when B's token came; 0 = not yet */
	int done[2];       /* FINISH seen */
	int failed;        /* a FINISH with an error */
};

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct bench *b = ctx;

	if (ev->kind == SCHED_EV_FINISH) {
		b->done[ev->id] = 1;
		b->failed |= ev->finish == SCHED_FIN_ERROR;
	} else if (ev->token >= 0 && ev->id == A_ID && b->n_a < b->cap_a) {
		if (b->n_a < OUT_TOKENS)
			b->a_tok[b->n_a] = ev->token;
		b->t_a[b->n_a++] = clock_s();
	} else if (ev->token >= 0 && ev->id == B_ID && !b->t_b) {
		b->b_tok = ev->token;
		b->t_b = clock_s();
	}
}

static int cmp_double(const void *pa, const void *pb)
{
	double a = *(const double *)pa, b = *(const double *)pb;
	return (a > b) - (a < b);
}

/* The Q-quantile of the N sorted values (nearest rank). */
static double quantile(const double *v, int n, double q)
{
	int i = (int)(q * n + 0.999999) - 1;
	return n ? v[i < 0 ? 0 : i >= n ? n - 1 : i] : 0;
}

/* N token ids of English text (the model's BOS first when it adds one). */
static int make_prompt(const struct model *m, int32_t *ids, int n)
{
	static const char para[] =
		"The old lighthouse keeper climbed the spiral stairs every evening, counting the "
		"steps as his father had taught him, and at the top he wiped the great lens clean "
		"before lighting the lamp. Ships passed in the dark, and some of them signalled "
		"their thanks with a short blast of the horn. ";
	size_t cap = (size_t)n * 8 + sizeof para, len = 0;
	char *text = malloc(cap);
	int got;

	if (!text)
		return -ENOMEM;
	while (len + sizeof para < cap) {
		memcpy(text + len, para, sizeof para - 1);
		len += sizeof para - 1;
	}
	text[len] = 0;
	got = tokenizer_encode(m->tok, text, len, tokenizer_add_bos(m->tok), 0, ids, n);
	free(text);
	return got < n ? -E2BIG : n;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "threads", required_argument, 0, 't' },
		{ "prompt-tokens", required_argument, 0, 'n' }, { "step-ms", required_argument, 0, 's' },
		{ "batch", required_argument, 0, 'b' }, { "warmup", required_argument, 0, 'w' },
		{ "json", no_argument, 0, 'j' }, { "trace", no_argument, 0, 'T' }, { 0, 0, 0, 0 },
	};
	const char *path = getenv("LLMD_SMOLLM2");
	int threads = 2, n_b = 4000, step_ms = 0, batch = 512, warmup = 16, json = 0, trace = 0;
	int c, rc = 1;
	struct model *m = NULL;
	struct engine *e = NULL;
	struct sched *s = NULL;
	struct bench b = { 0 };
	int32_t a_ids[64], *b_ids = NULL;
	double *gaps = NULL;
	char err[512];

	while ((c = getopt_long(argc, argv, "m:t:", lo, NULL)) != -1) {
		switch (c) {
		case 'm': path = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'n': n_b = atoi(optarg); break;
		case 's': step_ms = atoi(optarg); break;
		case 'b': batch = atoi(optarg); break;
		case 'w': warmup = atoi(optarg); break;
		case 'j': json = 1; break;
		case 'T': trace = 1; break;
		default:
			fprintf(stderr, "usage: bench_sched --model PATH [--threads N] [--prompt-tokens N] "
				"[--step-ms MS] [--batch N] [--warmup N] [--json] [--trace]\n");
			return 2;
		}
	}
	if (!path || threads < 1 || n_b < 1 || step_ms < 0 || batch < 1 || warmup < 2) {
		fprintf(stderr, "bench_sched: --model (or LLMD_SMOLLM2), and positive numbers\n");
		return 2;
	}
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "bench_sched: cannot load %s: %s\n", path, err);
		return 1;
	}
	b.cap_a = 1 << 16;
	b.t_a = calloc((size_t)b.cap_a, sizeof *b.t_a);
	b_ids = malloc((size_t)n_b * sizeof *b_ids);
	gaps = malloc((size_t)b.cap_a * sizeof *gaps);
	if (!b.t_a || !b_ids || !gaps)
		goto out;
	int n_a = tokenizer_encode(m->tok, "Once upon a time", 16, tokenizer_add_bos(m->tok), 0, a_ids, 64);
	if (n_a < 1 || make_prompt(m, b_ids, n_b) < 0) {
		fprintf(stderr, "bench_sched: cannot make the prompts\n");
		goto out;
	}

	struct engine_params ep;
	struct sched_params sp;
	engine_params_default(&ep);
	ep.n_threads = threads;
	ep.max_batch = batch;
	ep.kv_tokens = (int64_t)n_b + 2 * 4096 + 64;
	sched_params_default(&sp);
	sp.max_seqs = 2;
	sp.max_batched_tokens = batch;
	sp.step_ms = step_ms;
	sp.prefix_cache = 0;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0 ||
	    sched_new(e, m, &sp, on_event, &b, &s, err, sizeof err) < 0) {
		fprintf(stderr, "bench_sched: %s\n", err);
		goto out;
	}
	if (n_b + 1 > engine_n_ctx(e)) {
		fprintf(stderr, "bench_sched: %d prompt tokens do not fit the context (%d)\n", n_b,
			engine_n_ctx(e));
		goto out;
	}

	struct sched_request ra = { .id = A_ID, .prompt = a_ids, .n_prompt = n_a,
				    .max_tokens = engine_n_ctx(e) - n_a - 1, .ignore_eos = 1 };
	sampler_params_default(&ra.sampling);
	ra.sampling.temperature = 0;
	struct sched_request rb = ra;
	rb.id = B_ID;
	rb.prompt = b_ids;
	rb.n_prompt = n_b;
	rb.max_tokens = 1;
	if (sched_submit(s, &ra) < 0)
		goto out;
	while (b.n_a < warmup && !b.failed)
		if (sched_step(s) < 0)
			goto out;
	double before = (b.t_a[b.n_a - 1] - b.t_a[1]) / (b.n_a - 2); /* the first is prefill */
	int a_at_b = b.n_a;
	double t_submit = clock_s();
	if (sched_submit(s, &rb) < 0)
		goto out;
	struct sched_counters c0, c1;
	sched_counters(s, &c0);
	while (!b.done[B_ID] && !b.done[A_ID] && !b.failed) {
		struct sched_counters k;
		if (sched_step(s) < 0)
			goto out;
		sched_counters(s, &k);
		if (trace)
			fprintf(stderr, "step %llu: %d rows, %.1f ms (predicted %.1f)\n",
				(unsigned long long)k.steps, k.last_step_rows, k.last_step_s * 1e3,
				k.last_step_pred_s * 1e3);
	}
	sched_counters(s, &c1);
	while (b.n_a < OUT_TOKENS && !b.done[A_ID] && !b.failed)
		if (sched_step(s) < 0)
			goto out;
	if (b.failed || !b.t_b || b.n_a < OUT_TOKENS) {
		fprintf(stderr, "bench_sched: a request failed or A ran out of context first\n");
		goto out;
	}
	uint64_t hash = 14695981039346656037ull; /* FNV-1a over B's token and A's */
	for (int i = -1; i < OUT_TOKENS; i++) {
		hash ^= (uint32_t)(i < 0 ? b.b_tok : b.a_tok[i]);
		hash *= 1099511628211ull;
	}
	/* A's gaps from B's arrival to B's token: the first from A's last
	 * token before B came */
	int n_gaps = 0;
	double prev = b.t_a[a_at_b - 1];
	for (int i = a_at_b; i < b.n_a && b.t_a[i] <= b.t_b; i++) {
		gaps[n_gaps++] = b.t_a[i] - prev;
		prev = b.t_a[i];
	}
	gaps[n_gaps++] = b.t_b - prev; /* A waited at least this long for the next */
	qsort(gaps, (size_t)n_gaps, sizeof *gaps, cmp_double);
	double prefill = b.t_b - t_submit;
	double worst = gaps[n_gaps - 1], p99 = quantile(gaps, n_gaps, 0.99), p50 = quantile(gaps, n_gaps, 0.5);
	uint64_t steps = c1.steps - c0.steps, cuts = c1.budget_cuts - c0.budget_cuts;
	uint64_t over = c1.budget_overruns - c0.budget_overruns;
	if (json) {
		printf("{\"model\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"prompt_tokens\":%d,\"step_ms\":%d,"
		       "\"batch\":%d,\"gap_before_ms\":%.1f,\"gaps\":%d,\"gap_max_ms\":%.1f,"
		       "\"gap_p99_ms\":%.1f,\"gap_p50_ms\":%.1f,\"prefill_s\":%.3f,\"prefill_tok_s\":%.1f,"
		       "\"a_tokens_during\":%d,\"steps\":%llu,\"budget_cuts\":%llu,\"budget_overruns\":%llu,"
		       "\"cost_base_ms\":%.3f,\"cost_row_us\":%.3f,\"cost_pos_ns\":%.3f,\"cost_ctx_ns\":%.3f,"
		       "\"tokens_hash\":\"%016llx\"}\n",
		       m->name, threads, quant_isa_name(quant_get_isa()), n_b, step_ms, batch,
		       before * 1e3, n_gaps, worst * 1e3, p99 * 1e3, p50 * 1e3, prefill, n_b / prefill,
		       n_gaps - 1, (unsigned long long)steps, (unsigned long long)cuts,
		       (unsigned long long)over, c1.cost_base_s * 1e3, c1.cost_row_s * 1e6,
		       c1.cost_pos_s * 1e9, c1.cost_ctx_s * 1e9, (unsigned long long)hash);
	} else {
		printf("bench_sched: %s, %d threads (%s), step budget %d ms, %d-token prompt: stream "
		       "gap %.0f ms before; during prefill worst %.0f ms, p99 %.0f ms, p50 %.0f ms "
		       "over %d gaps; prefill %.2f s (%.0f tok/s) in %llu steps, %llu cut, %llu over "
		       "budget; model %.2f ms + %.1f us/row + %.0f ns/position attended + %.0f ns/position "
		       "read; tokens %016llx\n", m->name, threads,
		       quant_isa_name(quant_get_isa()), step_ms, n_b, before * 1e3, worst * 1e3,
		       p99 * 1e3, p50 * 1e3, n_gaps, prefill, n_b / prefill, (unsigned long long)steps,
		       (unsigned long long)cuts, (unsigned long long)over, c1.cost_base_s * 1e3,
		       c1.cost_row_s * 1e6, c1.cost_pos_s * 1e9, c1.cost_ctx_s * 1e9,
		       (unsigned long long)hash);
	}
	rc = 0;
out:
	if (rc && e && *engine_last_error(e))
		fprintf(stderr, "bench_sched: %s\n", engine_last_error(e));
	sched_free(s);
	engine_free(e);
	model_free(m);
	free(b.t_a);
	free(b_ids);
	free(gaps);
	return rc;
}
