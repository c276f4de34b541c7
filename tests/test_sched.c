/* test_sched.c - continuous batching keeps its promises:
 *  - batch invariance: a request's tokens do not depend on who else runs
 *    (31 others of different lengths, started at different steps), greedy
 *    and seeded sampling alike, with an f32 and a q8_0 KV cache;
 *  - the prefix cache prefills a shared 200-token prefix once for 16
 *    requests, whether the first ran before the others or all 16 arrive
 *    together, and changes no output;
 *  - with a pool too small for the load every request still completes with
 *    its tokens from running alone, and no block leaks;
 *  - a randomized schedule (arrivals, lengths, priorities, clients,
 *    cancellations) keeps every invariant after every step;
 *  - allocated-but-unfilled KV slots stay under 4% in a mixed workload;
 *  - refused requests get clear errors;
 *  - a held request makes no progress, reports its state, and resumes with
 *    the tokens it would have had;
 *  - with a step-time budget, a step that carries decode tokens takes only
 *    the prefill rows the cost model says fit it (at least a block's
 *    worth, so a long prompt still finishes), a step without decodes takes
 *    full chunks, the outputs are those without the budget, and every
 *    step is timed for the model.
 */
#include <errno.h>

#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"
#include "sched.h"
#include "testutil.h"
#include "testsched.h"
#include "tokenizer.h"

#define MAX_REQ 128
#define MAX_GEN 256

struct result {
	int32_t gen[MAX_GEN];
	int n_gen;
	int n_finish;             /* FINISH events seen (must end at 1) */
	enum sched_finish finish;
	struct sched_usage usage;
};

static struct result results[MAX_REQ];

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct result *r = &results[ev->id];
	if (ev->kind == SCHED_EV_FINISH) {
		r->n_finish++;
		r->finish = ev->finish;
		r->usage = ev->usage;
	} else if (ev->token >= 0 && r->n_gen < MAX_GEN) {
		r->gen[r->n_gen++] = ev->token;
	}
}

struct rig {
	struct engine *e;
	struct sched *s;
};

static int rig_new_full(struct rig *g, const struct model *m, uint32_t kv_type, int64_t kv_tokens,
			int max_seqs, int budget, int prefix_cache, int32_t step_ms)
{
	struct engine_params ep;
	struct sched_params sp;
	char err[256];

	engine_params_default(&ep);
	ep.kv_type = kv_type;
	ep.kv_tokens = kv_tokens;
	ep.max_batch = budget;
	ep.n_ctx = 512;
	sched_params_default(&sp);
	sp.max_seqs = max_seqs;
	sp.max_batched_tokens = budget;
	sp.prefix_cache = prefix_cache;
	sp.step_ms = step_ms;
	if (engine_new(m, &ep, &g->e, err, sizeof err) < 0 ||
	    sched_new(g->e, m, &sp, on_event, NULL, &g->s, err, sizeof err) < 0) {
		fprintf(stderr, "rig: %s\n", err);
		return -1;
	}
	return 0;
}

static int rig_new_kv(struct rig *g, const struct model *m, uint32_t kv_type, int64_t kv_tokens,
		      int max_seqs, int budget, int prefix_cache)
{
	return rig_new_full(g, m, kv_type, kv_tokens, max_seqs, budget, prefix_cache, 0);
}

/* An f32 KV cache unless a test says otherwise. */
static int rig_new(struct rig *g, const struct model *m, int64_t kv_tokens, int max_seqs,
		   int budget, int prefix_cache)
{
	return rig_new_kv(g, m, QT_F32, kv_tokens, max_seqs, budget, prefix_cache);
}

static void rig_free(struct rig *g)
{
	sched_free(g->s);
	engine_free(g->e);
}

static const char *prompts[] = {
	"Once upon a time", "", "I believe the meaning of life is", "Hello, world!", "Hello",
	"The little dog ran to the park and", "Lily and Tom were best friends. One day",
	"There was a big red ball", "Sam liked to play in the sand with his",
};
#define N_PROMPTS (int)(sizeof prompts / sizeof prompts[0])

/* Every prompt alone, then each inside a crowd of 32 started at different
 * steps, greedy and seeded: the tokens are the same, whatever the KV type. */
static void test_batch_invariance(const struct model *m, const char *name, uint32_t kv_type)
{
	struct rig g;
	int32_t ids[N_PROMPTS][64];
	int n_ids[N_PROMPTS];
	struct result alone[2][N_PROMPTS];

	for (int i = 0; i < N_PROMPTS; i++)
		n_ids[i] = test_tokenize(m, prompts[i], ids[i], 64);
	if (rig_new_kv(&g, m, kv_type, 32 * 128, 32, 256, 0) < 0) {
		test_failures++;
		return;
	}
	for (int seeded = 0; seeded < 2; seeded++)
		for (int i = 0; i < N_PROMPTS; i++) {
			struct sched_request r = test_req((uint64_t)i, ids[i], n_ids[i], 48);
			if (seeded) {
				r.sampling.temperature = 0.9f;
				r.sampling.seed = 1000 + (uint64_t)i;
			}
			memset(&results[i], 0, sizeof results[i]);
			CHECK_INT_EQ(sched_submit(g.s, &r), 0);
			test_run_idle(g.s);
			alone[seeded][i] = results[i];
		}
	/* 32 requests: prompt i % N_PROMPTS, different max_tokens, a third of
	 * them submitted only after some steps have run */
	memset(results, 0, sizeof results);
	for (int phase = 0; phase < 3; phase++) {
		for (int k = phase; k < 32; k += 3) {
			int i = k % N_PROMPTS, seeded = (k / N_PROMPTS) % 2;
			struct sched_request r = test_req((uint64_t)k, ids[i], n_ids[i], 48);
			if (seeded) {
				r.sampling.temperature = 0.9f;
				r.sampling.seed = 1000 + (uint64_t)i;
			}
			CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		}
		for (int st = 0; st < 5 + 3 * phase; st++)
			CHECK(sched_step(g.s) >= 0);
	}
	test_run_idle(g.s);
	int same = 0;
	for (int k = 0; k < 32; k++) {
		const struct result *a = &alone[(k / N_PROMPTS) % 2][k % N_PROMPTS];
		CHECK_INT_EQ(results[k].n_finish, 1);
		if (results[k].n_gen == a->n_gen && !memcmp(results[k].gen, a->gen, sizeof(int32_t) * (size_t)a->n_gen))
			same++;
		else
			fprintf(stderr, "%s, %s KV: request %d (prompt %d) differs in a crowd\n", name,
				qtype_get(kv_type)->name, k, k % N_PROMPTS);
	}
	printf("%s, %s KV: %d/32 requests identical alone and in a crowd of 32\n", name,
	       qtype_get(kv_type)->name, same);
	CHECK_INT_EQ(same, 32);
	struct sched_counters c;
	sched_counters(g.s, &c);
	CHECK_INT_EQ(c.used_blocks, 0);
	rig_free(&g);
}

/* 16 prompts: the same 200 tokens (a story sentence repeated), then a
 * different short tail each. */
static void shared_prompts(const struct model *m, int32_t prompt[16][260], int n[16])
{
	char text[4096] = "";

	for (int i = 0; i < 4; i++)
		strcat(text, "Once upon a time, in a small village by the sea, there lived an old "
			     "fisherman and his cat. Every morning they went out on the boat. ");
	CHECK(test_tokenize(m, text, prompt[0], 260) >= 200);
	for (int i = 0; i < 16; i++) {
		char tail[64];
		memcpy(prompt[i], prompt[0], sizeof(int32_t) * 200);
		snprintf(tail, sizeof tail, " Day %d they saw", i + 1);
		int32_t t[32];
		int nt = tokenizer_encode(m->tok, tail, strlen(tail), 0, 0, t, 32);
		memcpy(prompt[i] + 200, t, sizeof(int32_t) * (size_t)nt);
		n[i] = 200 + nt;
	}
}

/* 16 requests sharing a 200-token prefix: prefilled once, same outputs. */
static void test_prefix_cache(const struct model *m)
{
	int32_t prompt[16][260];
	int n[16];
	struct result without[16];

	shared_prompts(m, prompt, n);
	for (int cache = 0; cache < 2; cache++) {
		struct rig g;
		struct sched_counters c;
		if (rig_new(&g, m, 16 * 300, 16, 512, cache) < 0) {
			test_failures++;
			return;
		}
		memset(results, 0, sizeof results);
		/* the first request alone first, then the 15 others together */
		struct sched_request r0 = test_req(0, prompt[0], n[0], 16);
		CHECK_INT_EQ(sched_submit(g.s, &r0), 0);
		test_run_idle(g.s);
		for (int i = 1; i < 16; i++) {
			struct sched_request r = test_req((uint64_t)i, prompt[i], n[i], 16);
			CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		}
		test_run_idle(g.s);
		sched_counters(g.s, &c);
		if (!cache) {
			memcpy(without, results, sizeof without);
			CHECK_INT_EQ(c.prefix_hit_tokens, 0);
		} else {
			int32_t bt = c.block_tokens, shared = (200 / bt) * bt;
			printf("prefix cache: %llu prompt tokens served from cache over 16 requests "
			       "(%d shared per later request), %llu rows prefilled\n",
			       (unsigned long long)c.prefix_hit_tokens, shared,
			       (unsigned long long)c.prefill_rows);
			CHECK(c.prefix_hit_tokens >= (uint64_t)(15 * shared));
			for (int i = 1; i < 16; i++)
				CHECK(results[i].usage.cached_tokens >= shared);
			for (int i = 0; i < 16; i++)
				CHECK(results[i].n_gen == without[i].n_gen &&
				      !memcmp(results[i].gen, without[i].gen, sizeof(int32_t) * (size_t)without[i].n_gen));
		}
		CHECK_INT_EQ(c.used_blocks, 0);
		rig_free(&g);
	}
}

/* The same 16 requests submitted together before the first step: the first
 * one admitted computes the shared blocks, the 15 others wait one step for
 * them instead of computing them too, and take them from the cache.  The
 * prompt rows computed are 200 + 16 tails, not 16 * 200, and the outputs
 * are those without the cache. */
static void test_prefix_cache_same_step(const struct model *m)
{
	int32_t prompt[16][260];
	int n[16];
	uint64_t all = 0;
	struct result without[16];

	shared_prompts(m, prompt, n);
	for (int i = 0; i < 16; i++)
		all += (uint64_t)n[i];
	for (int cache = 0; cache < 2; cache++) {
		struct rig g;
		struct sched_counters c;
		if (rig_new(&g, m, 16 * 300, 16, 512, cache) < 0) {
			test_failures++;
			return;
		}
		memset(results, 0, sizeof results);
		for (int i = 0; i < 16; i++) {
			struct sched_request r = test_req((uint64_t)i, prompt[i], n[i], 16);
			CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		}
		test_run_idle(g.s);
		sched_counters(g.s, &c);
		if (!cache) {
			memcpy(without, results, sizeof without);
			CHECK_INT_EQ(c.prefill_rows, all);
			CHECK_INT_EQ(c.prefix_hit_tokens, 0);
			CHECK_INT_EQ(c.prefix_waits, 0);
		} else {
			int32_t shared = (200 / c.block_tokens) * c.block_tokens;
			printf("prefix cache, 16 submitted at once: %llu prompt rows computed for %llu "
			       "prompt tokens (%llu without the cache), %llu served from the cache, "
			       "%llu admissions put off a step\n", (unsigned long long)c.prefill_rows,
			       (unsigned long long)all, (unsigned long long)all,
			       (unsigned long long)c.prefix_hit_tokens, (unsigned long long)c.prefix_waits);
			CHECK_INT_EQ(c.prefill_rows, all - 15 * (uint64_t)shared);
			CHECK_INT_EQ(c.prefix_hit_tokens, 15 * (uint64_t)shared);
			CHECK(c.prefix_waits >= 15);
			CHECK_INT_EQ(results[0].usage.cached_tokens, 0);
			for (int i = 1; i < 16; i++)
				CHECK_INT_EQ(results[i].usage.cached_tokens, shared);
			for (int i = 0; i < 16; i++) {
				CHECK_INT_EQ(results[i].n_finish, 1);
				CHECK(results[i].n_gen == without[i].n_gen &&
				      !memcmp(results[i].gen, without[i].gen, sizeof(int32_t) * (size_t)without[i].n_gen));
			}
		}
		CHECK_INT_EQ(c.used_blocks, 0);
		rig_free(&g);
	}
}

/* A pool far too small for 16 concurrent requests: preemption, same tokens. */
static void test_preemption(const struct model *m)
{
	struct rig g;
	struct result alone[16];
	int32_t ids[16][64];
	int n[16];
	struct sched_counters c;

	for (int i = 0; i < 16; i++)
		n[i] = test_tokenize(m, prompts[i % N_PROMPTS], ids[i], 64);
	if (rig_new(&g, m, 16 * 12, 16, 64, 1) < 0) {
		test_failures++;
		return;
	}
	for (int i = 0; i < 16; i++) {
		struct sched_request r = test_req((uint64_t)i, ids[i], n[i], 64 + i);
		r.ignore_eos = 1;
		memset(&results[i], 0, sizeof results[i]);
		CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		test_run_idle(g.s);
		alone[i] = results[i];
	}
	memset(results, 0, sizeof results);
	for (int i = 0; i < 16; i++) {
		struct sched_request r = test_req((uint64_t)i, ids[i], n[i], 64 + i);
		r.ignore_eos = 1;
		r.priority = i % 3;
		CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	}
	test_run_idle(g.s);
	sched_counters(g.s, &c);
	printf("preemption: %llu preemptions, %llu evictions with a %d-block pool\n",
	       (unsigned long long)c.preemptions, (unsigned long long)c.evictions, c.pool_blocks);
	CHECK(c.preemptions > 0);
	for (int i = 0; i < 16; i++) {
		CHECK_INT_EQ(results[i].n_finish, 1);
		CHECK_INT_EQ(results[i].finish, SCHED_FIN_LENGTH);
		CHECK(results[i].n_gen == alone[i].n_gen &&
		      !memcmp(results[i].gen, alone[i].gen, sizeof(int32_t) * (size_t)alone[i].n_gen));
	}
	CHECK_INT_EQ(c.used_blocks, 0);
	rig_free(&g);
}

/* Random arrivals, lengths, priorities, clients and cancellations. */
static void test_random_schedule(const struct model *m)
{
	struct rig g;
	int32_t prompt[MAX_REQ][120];
	int n[MAX_REQ], cancelled[MAX_REQ] = { 0 }, submitted = 0, waste_samples = 0;
	unsigned seed = 4242;
	double waste = 0;
	char err[256];

	if (rig_new(&g, m, 40 * 16, 12, 96, 1) < 0) {
		test_failures++;
		return;
	}
	memset(results, 0, sizeof results);
	for (int i = 0; i < MAX_REQ; i++) {
		n[i] = 1 + rand_r(&seed) % 110;
		prompt[i][0] = 1;
		for (int k = 1; k < n[i]; k++) /* shared beginnings now and then */
			prompt[i][k] = (i % 4 == 0 && k < 40) ? 300 + k : 3 + rand_r(&seed) % 500;
	}
	for (int step = 0; step < 20000 && (submitted < MAX_REQ || sched_live(g.s) > 0); step++) {
		int arrivals = rand_r(&seed) % 3;
		for (int a = 0; a < arrivals && submitted < MAX_REQ; a++, submitted++) {
			struct sched_request r = test_req((uint64_t)submitted, prompt[submitted], n[submitted],
						     1 + rand_r(&seed) % 60);
			r.priority = rand_r(&seed) % 3;
			r.client = rand_r(&seed) % 4;
			r.sampling.temperature = (rand_r(&seed) % 2) ? 0.8f : 0;
			r.sampling.seed = (uint64_t)submitted;
			CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		}
		if (submitted > 0 && rand_r(&seed) % 10 == 0) {
			int victim = rand_r(&seed) % submitted;
			if (!results[victim].n_finish && sched_cancel(g.s, (uint64_t)victim) == 0)
				cancelled[victim] = 1;
		}
		CHECK(sched_step(g.s) >= 0);
		if (sched_check(g.s, err, sizeof err) < 0) {
			fprintf(stderr, "step %d: invariant: %s\n", step, err);
			test_failures++;
			break;
		}
		struct sched_counters c;
		sched_counters(g.s, &c);
		if (c.used_blocks > 0) {
			waste += (double)c.wasted_slots / (c.used_blocks * c.block_tokens);
			waste_samples++;
		}
	}
	struct sched_counters c;
	sched_counters(g.s, &c);
	int n_cancelled = 0;
	for (int i = 0; i < MAX_REQ; i++) {
		CHECK_INT_EQ(results[i].n_finish, 1);
		if (cancelled[i]) {
			CHECK_INT_EQ(results[i].finish, SCHED_FIN_CANCELLED);
			n_cancelled++;
		} else {
			CHECK(results[i].finish == SCHED_FIN_STOP || results[i].finish == SCHED_FIN_LENGTH);
		}
	}
	printf("random schedule: %d requests, %d cancelled, %llu preemptions, %llu steps, "
	       "mean unfilled KV slots %.1f%% of used blocks\n", MAX_REQ, n_cancelled,
	       (unsigned long long)c.preemptions, (unsigned long long)c.steps,
	       waste_samples ? 100 * waste / waste_samples : 0.0);
	CHECK_INT_EQ(c.used_blocks, 0);
	CHECK_INT_EQ(c.running + c.waiting, 0);
	rig_free(&g);
}

/* Long requests of mixed lengths: the unfilled tails of last blocks. */
static void test_memory_waste(const struct model *m)
{
	struct rig g;
	int32_t prompt[24][400];
	unsigned seed = 99;
	double waste = 0;
	int samples = 0;

	if (rig_new(&g, m, 24 * 512, 24, 256, 0) < 0) {
		test_failures++;
		return;
	}
	memset(results, 0, sizeof results);
	for (int i = 0; i < 24; i++) {
		int len = 100 + rand_r(&seed) % 290;
		prompt[i][0] = 1;
		for (int k = 1; k < len; k++)
			prompt[i][k] = 3 + rand_r(&seed) % 500;
		struct sched_request r = test_req((uint64_t)i, prompt[i], len, 20 + rand_r(&seed) % 100);
		r.ignore_eos = 1;
		CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	}
	while (sched_live(g.s) > 0) {
		struct sched_counters c;
		CHECK(sched_step(g.s) >= 0);
		sched_counters(g.s, &c);
		if (c.used_blocks > 0) {
			waste += (double)c.wasted_slots / (c.used_blocks * c.block_tokens);
			samples++;
		}
	}
	printf("memory waste: allocated but unfilled KV slots average %.2f%% of used blocks\n",
	       100 * waste / samples);
	CHECK(waste / samples < 0.04);
	rig_free(&g);
}

static void test_refusals(const struct model *m)
{
	struct rig g;
	int32_t big[600], ids[8] = { 1, 2, 3 };

	if (rig_new(&g, m, 64, 2, 64, 1) < 0) {
		test_failures++;
		return;
	}
	for (int i = 0; i < 600; i++)
		big[i] = 5;
	struct sched_request r = test_req(1, big, 100, 4);
	CHECK_INT_EQ(sched_submit(g.s, &r), -E2BIG); /* more than the 64-token pool */
	r = test_req(1, big, 600, 4);
	CHECK_INT_EQ(sched_submit(g.s, &r), -E2BIG); /* past n_ctx 512 */
	r = test_req(1, ids, 0, 4);
	CHECK_INT_EQ(sched_submit(g.s, &r), -EINVAL);
	ids[1] = m->hp.n_vocab;
	r = test_req(1, ids, 3, 4);
	CHECK_INT_EQ(sched_submit(g.s, &r), -EINVAL);
	ids[1] = 2;
	r = test_req(1, ids, 3, 4);
	CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	CHECK_INT_EQ(sched_submit(g.s, &r), -EEXIST);
	CHECK_INT_EQ(sched_cancel(g.s, 77), -ENOENT);
	memset(results, 0, sizeof results);
	CHECK_INT_EQ(sched_cancel(g.s, 1), 0);
	test_run_idle(g.s);
	CHECK_INT_EQ(results[1].n_finish, 1);
	CHECK_INT_EQ(results[1].finish, SCHED_FIN_CANCELLED);
	rig_free(&g);
}

/* A held request (its client's ring is full) gets no rows while the others
 * run, and once released ends with its tokens from running unheld. */
static void test_hold(const struct model *m)
{
	struct rig g;
	int32_t ids[2][64];
	int n[2];
	struct result alone;
	struct sched_info in;

	n[0] = test_tokenize(m, prompts[0], ids[0], 64);
	n[1] = test_tokenize(m, prompts[2], ids[1], 64);
	if (rig_new(&g, m, 512, 4, 64, 1) < 0) {
		test_failures++;
		return;
	}
	memset(results, 0, sizeof results);
	struct sched_request r = test_req(1, ids[0], n[0], 20);
	r.ignore_eos = 1;
	CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	test_run_idle(g.s);
	alone = results[1];

	memset(results, 0, sizeof results);
	CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	struct sched_request o = test_req(2, ids[1], n[1], 30);
	o.ignore_eos = 1;
	CHECK_INT_EQ(sched_submit(g.s, &o), 0);
	CHECK_INT_EQ(sched_info(g.s, 1, &in), 0);
	CHECK_INT_EQ(in.state, SCHED_ST_QUEUED);
	CHECK_INT_EQ(in.queue_pos, 1);
	CHECK_INT_EQ(sched_info(g.s, 2, &in), 0);
	CHECK_INT_EQ(in.queue_pos, 2);
	for (int i = 0; i < 3; i++)
		CHECK(sched_step(g.s) > 0);
	int got = results[1].n_gen;
	CHECK(got >= 2);
	CHECK_INT_EQ(sched_hold(g.s, 1, 1), 0);
	CHECK_INT_EQ(sched_hold(g.s, 9, 1), -ENOENT);
	for (int i = 0; i < 40 && sched_live(g.s) > 1; i++)
		CHECK(sched_step(g.s) >= 0);
	CHECK_INT_EQ(results[1].n_gen, got);      /* no progress while held */
	CHECK_INT_EQ(results[2].n_finish, 1);     /* the other one ran to the end */
	CHECK_INT_EQ(sched_info(g.s, 1, &in), 0);
	CHECK(in.held && in.state == SCHED_ST_DECODE && in.generated_tokens == got);
	CHECK_INT_EQ(sched_step(g.s), 0);         /* only held work: an idle step */
	CHECK_INT_EQ(sched_hold(g.s, 1, 0), 0);
	test_run_idle(g.s);
	CHECK_INT_EQ(results[1].n_finish, 1);
	CHECK(results[1].n_gen == alone.n_gen &&
	      !memcmp(results[1].gen, alone.gen, sizeof(int32_t) * (size_t)alone.n_gen));
	CHECK_INT_EQ(sched_info(g.s, 1, &in), -ENOENT);
	rig_free(&g);
}

/* ---- the step-time budget ---- */

/* A prompt of N made-up token ids (the model does not care). */
static void long_prompt(int32_t *ids, int n, unsigned seed)
{
	ids[0] = 1;
	for (int k = 1; k < n; k++)
		ids[k] = 3 + rand_r(&seed) % 500;
}

/* What a step of one decode row at position DPOS plus M prompt rows from
 * position P0 costs under K: the scheduler's prediction, spelled out. */
static double step_cost(const struct stepcost_coef *k, int32_t dpos, int32_t p0, int32_t m)
{
	double att = dpos + 1, ctx = dpos + 1 + (m ? p0 + m : 0);
	for (int32_t i = 0; i < m; i++)
		att += p0 + i + 1;
	return k->base_s + k->row_s * (1 + m) + k->pos_s * att + k->ctx_s * ctx;
}

/* One request decoding (its prompt is in), then a 400-token prompt
 * arrives.  Under a pinned model with a 50 ms budget the next steps take
 * exactly the prompt rows that keep the prediction within 50 ms (fewer as
 * the prompt's positions grow); without the budget they take the whole
 * token budget. */
static void test_budget_limits_prefill(const struct model *m)
{
	static const struct stepcost_coef k = {
		.base_s = 0.005, .row_s = 4e-4, .pos_s = 2e-6, .ctx_s = 1e-5,
	};
	int32_t a[64], big[400];
	int na = test_tokenize(m, prompts[0], a, 64);

	long_prompt(big, 400, 7);
	for (int on = 0; on < 2; on++) {
		struct rig g;
		struct sched_counters c;
		if (rig_new_full(&g, m, QT_F32, 1024, 4, 256, 0, on ? 50 : 0) < 0) {
			test_failures++;
			return;
		}
		sched_pin_cost(g.s, &k);
		memset(results, 0, sizeof results);
		struct sched_request r = test_req(1, a, na, 200);
		r.ignore_eos = 1;
		CHECK_INT_EQ(sched_submit(g.s, &r), 0);
		CHECK_INT_EQ(sched_step(g.s), na); /* its prompt, alone: not timed */
		CHECK_INT_EQ(results[1].n_gen, 1);
		struct sched_request b = test_req(2, big, 400, 4);
		CHECK_INT_EQ(sched_submit(g.s, &b), 0);
		int32_t p0 = 0, steps = 0;
		while (p0 < 400 && steps < 100) {
			int32_t dpos = na + results[1].n_gen - 1, want = 255;
			if (on)
				for (want = 0; want < 400 - p0 && step_cost(&k, dpos, p0, want + 1) <= 0.050;)
					want++;
			if (want > 400 - p0)
				want = 400 - p0;
			CHECK_INT_EQ(sched_step(g.s), 1 + want);
			sched_counters(g.s, &c);
			if (on && steps == 0)
				printf("step-time budget 50 ms, a decode at %d and a prompt from 0: %d prompt "
				       "rows, predicted %.1f ms\n", dpos, want, c.last_step_pred_s * 1e3);
			if (on) /* within the budget, and near it unless the prompt ran out */
				CHECK(c.last_step_pred_s <= 0.050 &&
				      (want == 400 - p0 || c.last_step_pred_s > 0.045));
			p0 += want;
			steps++;
		}
		sched_counters(g.s, &c);
		printf("a 400-token prompt beside a decoding stream: %d steps to prefill with the "
		       "budget %s, %llu cut by it\n", steps, on ? "on" : "off",
		       (unsigned long long)c.budget_cuts);
		CHECK_INT_EQ(c.step_ms, on ? 50 : 0);
		CHECK(on ? c.budget_cuts >= 4 : c.budget_cuts == 0);
		CHECK(on ? steps > 5 : steps == 2);
		CHECK(c.cost_row_s == k.row_s && c.cost_pos_s == k.pos_s && c.cost_base_s == k.base_s &&
		      c.cost_ctx_s == k.ctx_s);
		/* alone, the rest of a prompt is not held back */
		CHECK_INT_EQ(sched_cancel(g.s, 1), 0);
		test_run_idle(g.s);
		CHECK_INT_EQ(results[1].finish, SCHED_FIN_CANCELLED);
		CHECK_INT_EQ(results[2].n_finish, 1);
		struct sched_request d = test_req(3, big, 400, 1);
		CHECK_INT_EQ(sched_submit(g.s, &d), 0);
		CHECK_INT_EQ(sched_step(g.s), 256);
		test_run_idle(g.s);
		rig_free(&g);
	}
}

/* A model that says a step of decodes alone already overruns: prefill
 * still gets one block (16 rows) a step, and the prompt finishes. */
static void test_budget_never_starves(const struct model *m)
{
	static const struct stepcost_coef k = { .base_s = 1.0, .row_s = 0, .pos_s = 0 };
	int32_t a[64], big[300];
	int na = test_tokenize(m, prompts[2], a, 64); /* the count, even past the cap */
	struct rig g;
	struct sched_counters c;

	long_prompt(big, 300, 11);
	if (rig_new_full(&g, m, QT_F32, 1024, 4, 256, 0, 100) < 0) {
		test_failures++;
		return;
	}
	sched_pin_cost(g.s, &k);
	sched_counters(g.s, &c);
	int32_t bt = c.block_tokens;
	memset(results, 0, sizeof results);
	struct sched_request r = test_req(1, a, na, 100);
	r.ignore_eos = 1;
	CHECK_INT_EQ(sched_submit(g.s, &r), 0);
	CHECK(sched_step(g.s) > 0);
	struct sched_request b = test_req(2, big, 300, 8);
	b.ignore_eos = 1;
	CHECK_INT_EQ(sched_submit(g.s, &b), 0);
	for (int i = 0; i < 300 / bt; i++)
		CHECK_INT_EQ(sched_step(g.s), 1 + bt);
	test_run_idle(g.s);
	CHECK_INT_EQ(results[2].n_finish, 1);
	CHECK_INT_EQ(results[2].finish, SCHED_FIN_LENGTH);
	CHECK_INT_EQ(results[2].n_gen, 8);
	sched_counters(g.s, &c);
	CHECK(c.budget_overruns == 0); /* the clock says microseconds: no real overrun */
	rig_free(&g);
}

/* Long prompts arriving while others decode, greedy and seeded: the same
 * tokens with no budget, with budgets a pinned model makes cut every
 * prefill into different chunks, and with the model learned from the
 * clock. */
static void test_budget_batch_invariance(const struct model *m)
{
	static const struct stepcost_coef tight = { .base_s = 0.001, .row_s = 1e-3, .pos_s = 3e-6 };
	static const struct stepcost_coef floor_only = { .base_s = 1.0 };
	const struct stepcost_coef *pins[4] = { NULL, &tight, &floor_only, NULL };
	const int32_t step_ms[4] = { 0, 60, 100, 1 };
	static int32_t prompt[12][450];
	int n[12];
	static struct result base[12];
	unsigned seed = 5;

	for (int i = 0; i < 12; i++) {
		n[i] = i % 3 == 0 ? 200 + rand_r(&seed) % 250 : 1 + rand_r(&seed) % 40;
		long_prompt(prompt[i], n[i], 100 + (unsigned)i);
	}
	for (int v = 0; v < 4; v++) {
		struct rig g;
		struct sched_counters c;
		if (rig_new_full(&g, m, QT_F32, 12 * 512, 12, 128, 1, step_ms[v]) < 0) {
			test_failures++;
			return;
		}
		if (pins[v])
			sched_pin_cost(g.s, pins[v]);
		memset(results, 0, sizeof results);
		for (int phase = 0; phase < 4; phase++) {
			for (int i = phase; i < 12; i += 4) {
				struct sched_request r = test_req((uint64_t)i, prompt[i], n[i], 24 + i);
				r.ignore_eos = 1;
				if (i % 2) {
					r.sampling.temperature = 0.8f;
					r.sampling.seed = 77 + (uint64_t)i;
				}
				CHECK_INT_EQ(sched_submit(g.s, &r), 0);
			}
			for (int st = 0; st < 6; st++)
				CHECK(sched_step(g.s) >= 0);
		}
		test_run_idle(g.s);
		sched_counters(g.s, &c);
		int same = 0;
		for (int i = 0; i < 12; i++) {
			CHECK_INT_EQ(results[i].n_finish, 1);
			if (v == 0)
				base[i] = results[i];
			else if (results[i].n_gen == base[i].n_gen &&
				 !memcmp(results[i].gen, base[i].gen, sizeof(int32_t) * (size_t)base[i].n_gen))
				same++;
		}
		printf("step budget %d ms (%s model): %llu steps, %llu cut by the budget%s%d/12 "
		       "identical to no budget\n", step_ms[v], pins[v] ? "pinned" : "learned",
		       (unsigned long long)c.steps, (unsigned long long)c.budget_cuts,
		       v ? ", " : "; ", v ? same : 12);
		/* every step timed and learned from */
		CHECK_INT_EQ(c.cost_samples, c.steps);
		CHECK(c.last_step_s > 0);
		CHECK(c.cost_base_s >= 0 && c.cost_row_s >= 0 && c.cost_pos_s >= 0 && c.cost_ctx_s >= 0);
		if (!pins[v])
			printf("  learned: %.1f us a step + %.2f us a row + %.4f us a position attended + "
			       "%.4f us a position read; last step %.0f us, predicted %.0f us; %llu over "
			       "budget\n", c.cost_base_s * 1e6, c.cost_row_s * 1e6, c.cost_pos_s * 1e6,
			       c.cost_ctx_s * 1e6, c.last_step_s * 1e6, c.last_step_pred_s * 1e6,
			       (unsigned long long)c.budget_overruns);
		if (v > 0)
			CHECK_INT_EQ(same, 12);
		if (pins[v])
			CHECK(c.budget_cuts >= 10);
		if (v == 0)
			CHECK_INT_EQ(c.budget_cuts, 0);
		CHECK_INT_EQ(c.used_blocks, 0);
		rig_free(&g);
	}
}

int main(void)
{
	const char *p = test_model_path("stories260K.gguf");
	struct model *m = NULL;
	char err[512];

	if (!p) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	CHECK(model_load(p, &m, err, sizeof err) == 0);
	test_refusals(m);
	test_hold(m);
	test_batch_invariance(m, "stories260K", QT_F32);
	test_batch_invariance(m, "stories260K", QT_Q8_0);
	test_prefix_cache(m);
	test_prefix_cache_same_step(m);
	test_preemption(m);
	test_random_schedule(m);
	test_memory_waste(m);
	test_budget_limits_prefill(m);
	test_budget_never_starves(m);
	test_budget_batch_invariance(m);
	model_free(m);
	const char *q = test_model_path("derived/TinyStories-656K-q8_0.gguf");
	if (q && model_load(q, &m, err, sizeof err) == 0) {
		test_batch_invariance(m, "TinyStories-656K-q8_0", QT_F32);
		test_batch_invariance(m, "TinyStories-656K-q8_0", QT_Q8_0);
		model_free(m);
	}
	return test_result();
}
