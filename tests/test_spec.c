/* test_spec.c - speculative decoding (prompt lookup) is lossless:
 *  - greedy ids with speculation are those without, on every golden prompt
 *    of the shared models (stories260K, TinyStories f32/q8_0/q4_0, Gemma 3
 *    when fetched), with proposals forced on every step that has one;
 *  - seeded sampling gives the same tokens with and without it (each row's
 *    draw is the one a decode step would make, so the rejection rule keeps
 *    the target's distribution exactly);
 *  - sixteen requests at once in a pool too small for them (preemption
 *    forced), with lookups of one token that propose mostly garbage, end
 *    with the ids each had alone, every invariant holds after every step,
 *    and no block leaks;
 *  - the counters add up: proposed rows are the step rows that are neither
 *    prefill nor decode, each request's usage sums to the scheduler's;
 *  - on the CUDA backend (the emulator in CI) verifying steps give the
 *    CPU's ids, run as recorded graphs like decode steps;
 *  - a repeating text gains more than two tokens a verifying step where rows are
 *    cheap (a memory-bound step), and none proposed where a row costs as
 *    much as a step (compute-bound);
 *  - a draft model (TinyStories f32 with its q8_0): the goldens, the crowd,
 *    seeded sampling (its proposals drawn with the request's own random
 *    numbers: all stand with the model as its own draft), and a two-sample
 *    chi-square of the tokens verifying steps draw against the target's
 *    own draws over other seeds;
 *  - a draft is tried again where its catching up on a sequence's tokens
 *    pays, and not where it does not; a lone request proposes where the
 *    cost model cannot price a row yet.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <unistd.h>

#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"
#include "sched.h"
#include "testutil.h"
#include "testsched.h"
#include "tokenizer.h"

#define MAX_REQ 64
#define MAX_GEN 512

struct result {
	int32_t gen[MAX_GEN];
	int n_gen;
	int n_finish;
	enum sched_finish finish;
	struct sched_usage usage;
};

static struct result results[MAX_REQ];
static int32_t rig_backend = ENGINE_BACKEND_CPU; /* the backend rig_new's engines run on */

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct result *r = &results[ev->id];
	(void)ctx;
	if (ev->kind == SCHED_EV_FINISH) {
		r->n_finish++;
		r->finish = ev->finish;
		r->usage = ev->usage;
	} else if (ev->token >= 0 && r->n_gen < MAX_GEN) {
		r->gen[r->n_gen++] = ev->token;
	}
}

struct rig {
	struct engine *e, *de;
	struct sched *s;
};

/* A scheduler over M with a pool of KV_TOKENS, speculation MODE with lookups
 * of MIN_MATCH tokens.  FORCE: a cost model that prices rows at nothing, so
 * that every proposal is run. */
static int rig_new(struct rig *g, const struct model *m, int64_t kv_tokens, int max_seqs,
		   int32_t mode, int32_t min_match, int force)
{
	struct engine_params ep;
	struct sched_params sp;
	char err[256];

	engine_params_default(&ep);
	ep.kv_type = QT_F32;
	ep.kv_tokens = kv_tokens;
	ep.backend = rig_backend;
	ep.max_batch = 256;
	ep.n_ctx = 1024;
	sched_params_default(&sp);
	sp.max_seqs = max_seqs;
	sp.max_batched_tokens = 256;
	sp.spec_mode = mode;
	sp.spec_min_match = min_match;
	g->de = NULL;
	if (engine_new(m, &ep, &g->e, err, sizeof err) < 0 ||
	    sched_new(g->e, m, &sp, on_event, NULL, &g->s, err, sizeof err) < 0) {
		fprintf(stderr, "rig: %s\n", err);
		return -1;
	}
	if (force) {
		struct stepcost_coef free_rows = { .base_s = 1.0 }; /* rows and draft steps nearly free */
		sched_pin_cost(g->s, &free_rows);
	}
	return 0;
}

/* A rig whose requests may take DM as their draft (SCHED_SPEC_DRAFT by
 * default), with a draft pool of DKV_TOKENS on the model's threads. */
static int rig_new_draft(struct rig *g, const struct model *m, const struct model *dm,
			 int64_t kv_tokens, int64_t dkv_tokens, int max_seqs, int force)
{
	struct engine_params ep;
	char err[256];

	if (rig_new(g, m, kv_tokens, max_seqs, SCHED_SPEC_DRAFT, 2, force) < 0)
		return -1;
	engine_params_default(&ep);
	ep.kv_type = QT_F32;
	ep.kv_tokens = dkv_tokens;
	ep.max_batch = 64; /* a catch-up of a long prompt takes several steps */
	ep.n_ctx = 1024;
	ep.threads_of = g->e;
	if (engine_new(dm, &ep, &g->de, err, sizeof err) < 0 ||
	    sched_set_draft(g->s, g->de, dm, err, sizeof err) < 0) {
		fprintf(stderr, "rig: draft: %s\n", err);
		return -1;
	}
	return 0;
}

static void rig_free(struct rig *g)
{
	sched_free(g->s);
	engine_free(g->e);
	engine_free(g->de);
	g->de = NULL;
}

/* Runs one request alone on G; its result in RET. */
static void run_one(struct rig *g, const struct sched_request *r, struct result *ret)
{
	memset(&results[r->id], 0, sizeof results[r->id]);
	CHECK_INT_EQ(sched_submit(g->s, r), 0);
	test_run_idle(g->s);
	*ret = results[r->id];
}

static int same_ids(const struct result *a, const struct result *b)
{
	return a->n_gen == b->n_gen && !memcmp(a->gen, b->gen, sizeof(int32_t) * (size_t)a->n_gen);
}

static const char *prompts[] = {
	"Once upon a time", "Lily and Tom were best friends. One day",
	"The cat sat on the mat. The cat sat on the mat. The cat sat on the",
	"One, two, three. One, two, three. One, two,", "There was a big red ball",
	"Sam liked to play in the sand with his", "Tom had a dog. Tom had a cat. Tom had a",
	"The sun is hot. The sun is hot. The sun is",
};
#define N_PROMPTS (int)(sizeof prompts / sizeof prompts[0])

/* Sixteen requests of those prompts, each of its own length, every
 * other one seeded sampling, and what each gives alone (without
 * speculation). */
struct crowd {
	int32_t ids[16][64];       /* (16, n[i]) the prompts */
	int n[16];
	struct result alone[16];
};

/* Request I of crowd CR: a priority of I % 3 when CROWDED (alone: 0, which
 * changes nothing). */
static struct sched_request crowd_req(const struct crowd *cr, int i, int crowded)
{
	struct sched_request r = test_req((uint64_t)i, cr->ids[i], cr->n[i], 64 + 2 * i);
	r.ignore_eos = 1;
	r.priority = crowded ? i % 3 : 0;
	if (i % 2) {
		r.sampling.temperature = 0.8f;
		r.sampling.seed = (uint64_t)i;
	}
	return r;
}

/* CR's prompts under M, each request run alone on OFF. */
static void crowd_alone(struct crowd *cr, const struct model *m, struct rig *off)
{
	for (int i = 0; i < 16; i++) {
		cr->n[i] = test_tokenize(m, prompts[i % N_PROMPTS], cr->ids[i], 64);
		struct sched_request r = crowd_req(cr, i, 0);
		run_one(off, &r, &cr->alone[i]);
	}
}

/* Runs crowd CR at once on ON, request ODD with speculation ODD_SPEC, and
 * checks what holds whatever the mode: every request finishes once, no
 * block of either pool leaks, the counters add up (step rows are prefill,
 * decode and proposed rows; the requests' usage sums to the scheduler's
 * counts).  Returns how many requests gave their ids from alone, the
 * scheduler's counters in *C. */
static int crowd_run(struct rig *on, const struct crowd *cr, int odd, int32_t odd_spec,
		     struct sched_counters *c)
{
	int64_t proposed = 0, accepted = 0, steps = 0, gen = 0;
	int same = 0;

	memset(results, 0, sizeof results);
	for (int i = 0; i < 16; i++) {
		struct sched_request r = crowd_req(cr, i, 1);
		if (i == odd)
			r.spec = odd_spec;
		CHECK_INT_EQ(sched_submit(on->s, &r), 0);
	}
	test_run_idle(on->s);
	sched_counters(on->s, c);
	for (int i = 0; i < 16; i++) {
		CHECK_INT_EQ(results[i].n_finish, 1);
		same += same_ids(&results[i], &cr->alone[i]);
		proposed += results[i].usage.spec_proposed;
		accepted += results[i].usage.spec_accepted;
		steps += results[i].usage.spec_steps;
		gen += results[i].n_gen;
	}
	CHECK_INT_EQ(c->used_blocks, 0);
	CHECK_INT_EQ(c->draft_used_blocks, 0);
	CHECK_INT_EQ((int64_t)c->spec_proposed, proposed);
	CHECK_INT_EQ((int64_t)c->spec_accepted, accepted);
	CHECK_INT_EQ((int64_t)c->spec_steps, steps);
	CHECK_INT_EQ((int64_t)c->step_rows, (int64_t)(c->prefill_rows + c->decode_rows + c->spec_proposed));
	CHECK_INT_EQ((int64_t)c->generated_tokens, gen);
	return same;
}

/* Golden case CS of a llama.cpp-style file (prompt_ids, n_predict) when it
 * is of model file REL_MODEL (NULL: any): its prompt in PROMPT (at most
 * 512 ids, *N of them) and *N_PREDICT (at most MAX_GEN - 1).  1, or 0 for a
 * case of another model. */
static int golden_case(json_object *cs, const char *rel_model, int32_t prompt[512], int *n,
		       int *n_predict)
{
	json_object *v, *ids;

	if (rel_model && (!json_object_object_get_ex(cs, "model", &v) ||
			  strcmp(json_object_get_string(v), rel_model)))
		return 0;
	if (!json_object_object_get_ex(cs, "prompt_ids", &ids) || !json_object_object_get_ex(cs, "n_predict", &v))
		return 0;
	*n_predict = json_object_get_int(v) < MAX_GEN - 1 ? json_object_get_int(v) : MAX_GEN - 1;
	*n = 0;
	for (size_t k = 0; k < json_object_array_length(ids) && *n < 512; k++)
		prompt[(*n)++] = json_object_get_int(json_object_array_get_idx(ids, k));
	return 1;
}

/* The golden prompts of GOLDEN (a llama.cpp-style file: prompt_ids,
 * n_predict) for model file REL_MODEL (NULL: every case is of M): greedy,
 * without and with speculation (forced, and at its own pace), the same ids.
 * Returns proposals accepted in the forced runs. */
static uint64_t check_goldens(const struct model *m, const char *name, const char *golden,
			      const char *rel_model)
{
	json_object *root = json_object_from_file(golden);
	struct rig off, on, paced;
	struct result a, b, c;
	int cases = 0, same = 0;
	uint64_t accepted = 0;

	if (!root || !json_object_is_type(root, json_type_array)) {
		fprintf(stderr, "%s: cannot read\n", golden);
		test_failures++;
		return 0;
	}
	if (rig_new(&off, m, 4096, 4, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new(&on, m, 4096, 4, SCHED_SPEC_NGRAM, 2, 1) < 0 ||
	    rig_new(&paced, m, 4096, 4, SCHED_SPEC_NGRAM, 2, 0) < 0) {
		test_failures++;
		json_object_put(root);
		return 0;
	}
	for (size_t i = 0; i < json_object_array_length(root); i++) {
		int32_t prompt[512];
		int n, n_predict;

		if (!golden_case(json_object_array_get_idx(root, i), rel_model, prompt, &n, &n_predict))
			continue;
		struct sched_request r = test_req(0, prompt, n, n_predict);
		r.ignore_eos = 1;
		run_one(&off, &r, &a);
		run_one(&on, &r, &b);
		run_one(&paced, &r, &c);
		accepted += (uint64_t)b.usage.spec_accepted;
		cases++;
		if (same_ids(&a, &b) && same_ids(&a, &c))
			same++;
		else
			fprintf(stderr, "%s: golden case %zu differs with speculation\n", name, i);
	}
	printf("%s: %d/%d golden prompts give the same greedy ids with speculation (%llu proposals "
	       "accepted)\n", name, same, cases, (unsigned long long)accepted);
	CHECK(cases > 0);
	CHECK_INT_EQ(same, cases);
	rig_free(&off);
	rig_free(&on);
	rig_free(&paced);
	json_object_put(root);
	return accepted;
}


/* What seeded runs with and without speculation gave. */
struct seeded {
	int runs, same;              /* runs, and those that gave the same tokens */
	uint64_t proposed, accepted; /* with speculation */
};

/* Every prompt with N_SEEDS seeds (SAMPLING sets the sampler for each), N_GEN
 * tokens, on OFF and on ON. */
static struct seeded seeded_runs(struct rig *off, struct rig *on, const struct model *m, int n_seeds,
				 int n_gen, void (*sampling)(struct sampler_params *, int seed))
{
	struct seeded z = { 0 };
	int32_t ids[64];

	for (int i = 0; i < N_PROMPTS; i++) {
		int n = test_tokenize(m, prompts[i], ids, 64);
		for (int seed = 0; seed < n_seeds; seed++) {
			struct result a, b;
			struct sched_request r = test_req(1, ids, n, n_gen);
			sampling(&r.sampling, seed);
			r.ignore_eos = 1;
			run_one(off, &r, &a);
			run_one(on, &r, &b);
			z.runs++;
			z.same += same_ids(&a, &b);
			z.proposed += (uint64_t)b.usage.spec_proposed;
			z.accepted += (uint64_t)b.usage.spec_accepted;
		}
	}
	return z;
}

static void lookup_sampling(struct sampler_params *p, int seed)
{
	p->temperature = seed % 2 ? 0.7f : 1.0f;
	p->top_k = seed % 4 < 2 ? 40 : 0;
	p->repeat_penalty = seed == 5 ? 1.1f : 1.0f;
	p->seed = 77 + (uint64_t)seed;
}

/* Seeded sampling: each prompt with eight seeds, the same tokens with and
 * without speculation. */
static void test_seeded(const struct model *m)
{
	struct rig off, on;
	struct seeded z;

	if (rig_new(&off, m, 4096, 4, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new(&on, m, 4096, 4, SCHED_SPEC_NGRAM, 1, 1) < 0) {
		test_failures++;
		return;
	}
	z = seeded_runs(&off, &on, m, 8, 96, lookup_sampling);
	printf("seeded sampling: %d/%d runs give the same tokens with speculation (%llu of %llu "
	       "proposals accepted)\n", z.same, z.runs, (unsigned long long)z.accepted,
	       (unsigned long long)z.proposed);
	CHECK_INT_EQ(z.same, z.runs);
	CHECK(z.proposed > 0 && z.accepted > 0 && z.accepted < z.proposed);
	rig_free(&off);
	rig_free(&on);
}

/* Sixteen requests, a pool of 16 * 10 tokens for prompts that take ~90 each:
 * preemption, recomputation and speculation together. */
static void test_crowd(const struct model *m, int32_t min_match)
{
	static struct crowd cr;
	struct rig off, on;
	struct sched_counters c;
	int same;

	if (rig_new(&off, m, 4096, 16, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new(&on, m, 16 * 10, 16, SCHED_SPEC_NGRAM, min_match, 1) < 0) {
		test_failures++;
		return;
	}
	crowd_alone(&cr, m, &off);
	same = crowd_run(&on, &cr, 5, SCHED_SPEC_OFF, &c); /* request 5 opts out */
	printf("crowd of 16, lookups of %d, %d-block pool: %d/16 as alone, %llu preemptions, %llu of "
	       "%llu proposals accepted\n", min_match, c.pool_blocks, same,
	       (unsigned long long)c.preemptions, (unsigned long long)c.spec_accepted,
	       (unsigned long long)c.spec_proposed);
	CHECK_INT_EQ(same, 16);
	CHECK(c.preemptions > 0);
	CHECK(c.spec_proposed > 0);
	CHECK_INT_EQ(results[5].usage.spec_proposed, 0);
	rig_free(&off);
	rig_free(&on);
}

/* A text that repeats, under two pinned cost models: where a step costs
 * mostly its weights (memory-bound, rows nearly free) most proposals are
 * run and stand, and a decode step gains tokens; where every row costs as
 * much as the step (compute-bound) nothing is proposed, and the output is
 * the same. */
static void test_repetition(const struct model *m)
{
	static const struct stepcost_coef memory_bound = { .base_s = 10e-3, .row_s = 0.5e-3 };
	static const struct stepcost_coef compute_bound = { .row_s = 1e-3 };
	struct rig on;
	int32_t ids[256];
	char text[2048] = "";
	struct result r[2];
	int n;

	for (int i = 0; i < 8; i++)
		strcat(text, "The cat sat on the mat and the dog ran to the park. ");
	n = test_tokenize(m, text, ids, 256);
	for (int k = 0; k < 2; k++) {
		if (rig_new(&on, m, 4096, 4, SCHED_SPEC_NGRAM, 2, 0) < 0) {
			test_failures++;
			return;
		}
		sched_pin_cost(on.s, k ? &compute_bound : &memory_bound);
		struct sched_request q = test_req(2, ids, n, 120);
		q.ignore_eos = 1;
		run_one(&on, &q, &r[k]);
		printf("repeating text, %s: %d of %d proposals accepted in %d verifying steps, %d tokens\n",
		       k ? "compute-bound" : "memory-bound", r[k].usage.spec_accepted,
		       r[k].usage.spec_proposed, r[k].usage.spec_steps, r[k].n_gen);
		CHECK_INT_EQ(r[k].n_gen, 120);
		rig_free(&on);
	}
	CHECK(r[0].usage.spec_proposed > 0);
	CHECK(r[0].usage.spec_steps * 2 < r[0].usage.spec_accepted); /* > 2 tokens a verifying step */
	CHECK_INT_EQ(r[1].usage.spec_proposed, 0);
	CHECK(same_ids(&r[0], &r[1]));
}

/* The draft model: TARGET's golden prompts give the same greedy ids with
 * DRAFT proposing (forced) as without; the crowd of 16 in a small pool, with
 * a draft pool too small for all of them (their draft KV is dropped and
 * recomputed), seeded and greedy alike, as alone; and a draft of another
 * vocabulary is refused, naming the sizes. */
static void test_draft(const struct model *m, const struct model *dm, const char *name,
		       const char *golden, const char *rel_model)
{
	json_object *root = json_object_from_file(golden);
	struct rig off, on;
	struct result a, b;
	int cases = 0, same = 0;
	uint64_t proposed = 0, accepted = 0;

	if (!root || rig_new(&off, m, 4096, 16, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new_draft(&on, m, dm, 4096, 4096, 16, 1) < 0) {
		test_failures++;
		json_object_put(root);
		return;
	}
	for (size_t i = 0; i < json_object_array_length(root); i++) {
		int32_t prompt[512];
		int n, n_predict;

		if (!golden_case(json_object_array_get_idx(root, i), rel_model, prompt, &n, &n_predict))
			continue;
		struct sched_request r = test_req(0, prompt, n, n_predict);
		r.ignore_eos = 1;
		run_one(&off, &r, &a);
		run_one(&on, &r, &b);
		cases++;
		same += same_ids(&a, &b);
		proposed += (uint64_t)b.usage.spec_proposed;
		accepted += (uint64_t)b.usage.spec_accepted;
	}
	printf("%s with draft %s: %d/%d golden prompts give the same greedy ids (%llu of %llu "
	       "proposals accepted)\n", name, dm->name, same, cases, (unsigned long long)accepted,
	       (unsigned long long)proposed);
	CHECK(cases > 0);
	CHECK_INT_EQ(same, cases);
	CHECK(accepted > 0);
	json_object_put(root);
	rig_free(&on);

	/* the crowd: a 16 * 10-token pool, a draft pool of 6 blocks; request 3
	 * looks up beside the drafts */
	static struct crowd cr;
	struct sched_counters c;
	crowd_alone(&cr, m, &off);
	if (rig_new_draft(&on, m, dm, 16 * 10, 6 * 16, 16, 1) < 0) {
		test_failures++;
		rig_free(&off);
		return;
	}
	same = crowd_run(&on, &cr, 3, SCHED_SPEC_NGRAM, &c);
	printf("%s with draft %s, crowd of 16, %d-block pool, %d-block draft pool: %d/16 as alone, "
	       "%llu preemptions, %llu of %llu proposals accepted, %llu draft steps\n", name, dm->name,
	       c.pool_blocks, c.draft_pool_blocks, same, (unsigned long long)c.preemptions,
	       (unsigned long long)c.spec_accepted, (unsigned long long)c.spec_proposed,
	       (unsigned long long)c.draft_steps);
	CHECK_INT_EQ(same, 16);
	CHECK(c.preemptions > 0 && c.draft_steps > 0 && c.spec_accepted > 0);
	rig_free(&on);
	rig_free(&off);
}

/* What a draft's proposals must be worth, under pinned cost models.  A
 * lone decode step of 15 ms of which a row is 5 ms, so that a proposal
 * needs a rate above the 0.5 a sequence starts with and none is run at
 * first: a draft whose rows cost 0.2 ms is tried again after 16 tokens (its
 * catching up on them costs little), its proposals stand, and it goes on
 * proposing; one whose rows cost as much as the model's is not, as a
 * proposal sure to stand would not pay for its catching up on 14 tokens.
 * And a draft not measured yet is run where a row at the model's price
 * pays (a step of 13.5 ms, a row 3.5 ms), so that it is measured. */
static void test_draft_price(const struct model *m, const struct model *dm)
{
	static const struct stepcost_coef model = { .base_s = 10e-3, .row_s = 5e-3 };
	static const struct stepcost_coef model_cheaper = { .base_s = 10e-3, .row_s = 3.5e-3 };
	static const struct stepcost_coef cheap = { .row_s = 0.2e-3 }, costly = { .row_s = 5e-3 };
	static const struct { const struct stepcost_coef *model, *draft; const char *what; } cases[3] = {
		{ &model, &cheap, "whose rows cost 0.2 ms" },
		{ &model, &costly, "whose rows cost 5 ms" },
		{ &model_cheaper, NULL, "not measured yet" },
	};
	int32_t ids[64];
	struct result r[3];
	struct sched_counters c[3];
	struct rig on;
	int n = test_tokenize(m, "Once upon a time, there was a little girl", ids, 64);

	for (int k = 0; k < 3; k++) {
		if (rig_new_draft(&on, m, dm, 4096, 4096, 4, 0) < 0) {
			test_failures++;
			return;
		}
		sched_pin_cost(on.s, cases[k].model);
		if (cases[k].draft)
			sched_pin_draft_cost(on.s, cases[k].draft);
		struct sched_request q = test_req(1, ids, n, 64);
		q.ignore_eos = 1;
		run_one(&on, &q, &r[k]);
		sched_counters(on.s, &c[k]);
		printf("a draft %s: %d of %d proposals accepted, %llu draft rows\n", cases[k].what,
		       r[k].usage.spec_accepted, r[k].usage.spec_proposed,
		       (unsigned long long)c[k].draft_rows);
		CHECK_INT_EQ(r[k].n_gen, 64);
		rig_free(&on);
	}
	CHECK(r[0].usage.spec_proposed > 64 / 16); /* more than the tries: proposing on */
	CHECK(r[0].usage.spec_accepted > 0);
	CHECK_INT_EQ(r[1].usage.spec_proposed, 0);
	CHECK(c[1].draft_rows == 0);
	CHECK(r[2].usage.spec_proposed > 0 && c[2].draft_steps > 0);
	CHECK(same_ids(&r[0], &r[1]) && same_ids(&r[0], &r[2]));
}

/* The cost model learned from a request without speculation, one-row
 * decode steps after a 40-row prefill, cannot tell a row's cost from the
 * step's: the next request's proposals are run all the same, until steps
 * of a few rows have been measured. */
static void test_draft_explores(const struct model *m, const struct model *dm)
{
	struct result plain, explored;
	struct rig on;
	int32_t ids[128];
	char text[512] = "";
	int n;

	for (int i = 0; i < 4; i++)
		strcat(text, "The little dog ran to the park to play with a red ball. ");
	n = test_tokenize(m, text, ids, 128);
	if (rig_new_draft(&on, m, dm, 4096, 4096, 4, 0) < 0) {
		test_failures++;
		return;
	}
	struct sched_request q = test_req(2, ids, n, 64);
	q.ignore_eos = 1;
	q.spec = SCHED_SPEC_OFF;
	run_one(&on, &q, &plain);
	q.spec = SCHED_SPEC_DRAFT;
	q.id = 3;
	run_one(&on, &q, &explored);
	printf("a %d-token prompt after one without speculation: %d of %d proposals accepted\n", n,
	       explored.usage.spec_accepted, explored.usage.spec_proposed);
	CHECK(n > 1 + SCHED_SPEC_MAX_DRAFT);
	CHECK_INT_EQ(plain.usage.spec_proposed, 0);
	CHECK(explored.usage.spec_proposed > 0);
	CHECK(same_ids(&plain, &explored));
	rig_free(&on);
}

static void draft_sampling(struct sampler_params *p, int seed)
{
	p->temperature = seed % 2 ? 0.7f : 1.0f;
	p->top_k = seed % 3 ? 40 : 0;
	p->top_p = seed == 4 ? 0.9f : 1.0f;
	p->min_p = 0;
	p->seed = 300 + (uint64_t)seed;
}

/* Seeded sampling with DM proposing (forced): the same tokens as without.
 * The draft draws its proposals with the random numbers the target's draws
 * take: with the model itself as its draft every proposal stands, which
 * holds only when each proposal's draw is the target's, in step; with its
 * q8_0 copy about half (greedy proposals: 10%), as the two distributions
 * at temperatures 0.7 and 1 differ in their flat tails. */
static void test_draft_seeded(const struct model *m, const struct model *dm)
{
	struct rig off, on;
	struct seeded z;

	if (rig_new(&off, m, 4096, 4, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new_draft(&on, m, dm, 4096, 4096, 4, 1) < 0) {
		test_failures++;
		return;
	}
	z = seeded_runs(&off, &on, m, 6, 64, draft_sampling);
	printf("seeded sampling with draft %s: %d/%d runs give the same tokens (%llu of %llu "
	       "proposals accepted)\n", dm == m ? "itself" : dm->name, z.same, z.runs,
	       (unsigned long long)z.accepted, (unsigned long long)z.proposed);
	CHECK_INT_EQ(z.same, z.runs);
	CHECK(z.proposed > 0);
	if (dm == m)
		CHECK(z.accepted == z.proposed);
	else
		CHECK(z.accepted > 0.4 * (double)z.proposed);
	rig_free(&off);
	rig_free(&on);
}

/* Tokens at generated place POS of N seeded runs of PROMPT on G, seeds
 * from SEED0, at temperature TEMP with no truncation, 32 at a time; counted
 * into COUNT (n_vocab). */
static void sample_counts(struct rig *g, const struct model *m, const char *prompt, int n, uint64_t seed0,
			  float temp, int pos, int *count)
{
	int32_t ids[64];
	int np = test_tokenize(m, prompt, ids, 64);

	for (int done = 0; done < n; done += 32) {
		int k = n - done < 32 ? n - done : 32;
		for (int i = 0; i < k; i++) {
			struct sched_request r = test_req(i, ids, np, pos + 1);
			r.sampling.temperature = temp;
			r.sampling.top_k = 0;
			r.sampling.top_p = 1.0f;
			r.sampling.min_p = 0;
			r.sampling.seed = seed0 + (uint64_t)(done + i);
			r.ignore_eos = 1;
			memset(&results[i], 0, sizeof results[i]);
			CHECK_INT_EQ(sched_submit(g->s, &r), 0);
		}
		test_run_idle(g->s);
		for (int i = 0; i < k; i++)
			if (results[i].n_gen > pos)
				count[results[i].gen[pos]]++;
	}
}

/* The chi-square statistic of two samples of equal size being of one
 * distribution, over the tokens both saw at least 10 times between them
 * (the rest one bin), and its critical value at p = 0.001 (Wilson and
 * Hilferty's approximation) in *CRIT. */
static double chi_square(const int *a, const int *b, int n_vocab, double *crit)
{
	double x2 = 0;
	int bins = 0, ra = 0, rb = 0;

	for (int t = 0; t < n_vocab; t++) {
		if (a[t] + b[t] >= 10) {
			x2 += (double)(a[t] - b[t]) * (a[t] - b[t]) / (a[t] + b[t]);
			bins++;
		} else {
			ra += a[t];
			rb += b[t];
		}
	}
	if (ra + rb > 0) {
		x2 += (double)(ra - rb) * (ra - rb) / (ra + rb);
		bins++;
	}
	double df = bins - 1, h = 2.0 / (9 * df);
	*crit = df * pow(1 - h + 3.09 * sqrt(h), 3);
	return x2;
}

/* The distribution, not only the seeds: the tokens drawn in verifying
 * steps with DM proposing (forced), over 2000 seeds, against the target's
 * own draws without speculation over 2000 other seeds, at each of the
 * first three places that verifying steps draw (two-sample chi-square,
 * p = 0.001; the seeds are fixed, so it passes or fails the same every
 * time).  That it can fail: the target's draws at temperature 1.2 instead
 * of 1 are over the line.  (The q8_0 draft's own draws are not: at this
 * size the test cannot tell its distribution from the target's, which is
 * why its proposals mostly stand.) */
static void test_chi_square(const struct model *m, const struct model *dm)
{
	enum { N = 2000 };
	int32_t nv = m->hp.n_vocab;
	int *on = calloc((size_t)nv, sizeof *on), *off = calloc((size_t)nv, sizeof *off);
	int *hot = calloc((size_t)nv, sizeof *hot);
	struct rig r_on, r_off;
	const char *prompt = "Once upon a time";

	if (!on || !off || !hot || rig_new(&r_off, m, 4096, 32, SCHED_SPEC_OFF, 2, 0) < 0 ||
	    rig_new_draft(&r_on, m, dm, 8192, 8192, 32, 1) < 0) {
		test_failures++;
		return;
	}
	for (int pos = 1; pos <= 3; pos++) {
		double crit, x2, x2_hot, crit_hot;
		memset(on, 0, (size_t)nv * sizeof *on);
		memset(off, 0, (size_t)nv * sizeof *off);
		memset(hot, 0, (size_t)nv * sizeof *hot);
		sample_counts(&r_on, m, prompt, N, 1, 1.0f, pos, on);
		sample_counts(&r_off, m, prompt, N, 1000000, 1.0f, pos, off);
		sample_counts(&r_off, m, prompt, N, 2000000, 1.2f, pos, hot);
		x2 = chi_square(on, off, nv, &crit);
		x2_hot = chi_square(hot, off, nv, &crit_hot);
		printf("chi-square, place %d, %d runs each: speculative vs the target %.1f (p = 0.001 at %.1f); "
		       "the target at temperature 1.2 vs 1 %.1f (at %.1f)\n", pos, N, x2, crit, x2_hot, crit_hot);
		CHECK(x2 < crit);
		CHECK(x2_hot > crit_hot);
	}
	struct sched_counters c;
	sched_counters(r_on.s, &c);
	printf("chi-square runs with the draft: %llu of %llu proposals accepted\n",
	       (unsigned long long)c.spec_accepted, (unsigned long long)c.spec_proposed);
	CHECK(c.spec_accepted > 0 && c.spec_accepted < c.spec_proposed);
	free(on);
	free(off);
	free(hot);
	rig_free(&r_on);
	rig_free(&r_off);
}

/* A draft of another vocabulary is refused with the sizes; a request for
 * a draft where there is none is refused. */
static void test_draft_refusals(const struct model *m, const struct model *other)
{
	struct rig g;
	struct engine_params ep;
	struct engine *de = NULL;
	char err[256] = "";
	int32_t ids[8] = { 1, 2, 3 };

	if (rig_new(&g, m, 1024, 4, SCHED_SPEC_OFF, 2, 0) < 0) {
		test_failures++;
		return;
	}
	struct sched_request r = test_req(1, ids, 3, 4);
	r.spec = SCHED_SPEC_DRAFT;
	CHECK_INT_EQ(sched_submit(g.s, &r), -EINVAL);
	engine_params_default(&ep);
	ep.kv_tokens = 256;
	ep.n_ctx = 1024;
	CHECK(engine_new(other, &ep, &de, err, sizeof err) == 0);
	CHECK_INT_EQ(sched_set_draft(g.s, de, other, err, sizeof err), -EINVAL);
	printf("a draft of another vocabulary: %s\n", err);
	CHECK(strstr(err, "vocabulary") != NULL);
	engine_free(de);
	rig_free(&g);
}

/* On the CUDA backend (the emulator in CI): a step verifying proposals is
 * a wide step of several rows per sequence; with the graphs on, recorded
 * like any other.  The ids are the CPU's without speculation. */
static void test_cuda(const struct model *m)
{
	struct engine_cuda_probe probe;
	struct rig cpu, cuda;
	int32_t ids[3][64];
	int n[3], same = 0;
	uint64_t accepted = 0;

	engine_cuda_probe(&probe);
	if (probe.kind == ENGINE_CUDA_NONE || (probe.kind == ENGINE_CUDA_DEVICE && !probe.n_devices)) {
		printf("cuda: left out (%s)\n", probe.why);
		return;
	}
	if (rig_new(&cpu, m, 2048, 4, SCHED_SPEC_OFF, 1, 0) < 0) {
		test_failures++;
		return;
	}
	rig_backend = ENGINE_BACKEND_CUDA;
	int r = rig_new(&cuda, m, 2048, 4, SCHED_SPEC_NGRAM, 1, 1);
	rig_backend = ENGINE_BACKEND_CPU;
	if (r < 0) {
		test_failures++;
		rig_free(&cpu);
		return;
	}
	for (int i = 0; i < 3; i++) {
		struct result a, b;
		n[i] = test_tokenize(m, prompts[2 + i], ids[i], 64);
		struct sched_request q = test_req(1, ids[i], n[i], 48);
		q.ignore_eos = 1;
		run_one(&cpu, &q, &a);
		run_one(&cuda, &q, &b);
		same += same_ids(&a, &b);
		accepted += (uint64_t)b.usage.spec_accepted;
	}
	uint64_t rec, rep;
	engine_graph_stats(cuda.e, &rec, &rep);
	printf("cuda (%s): %d/3 prompts give the CPU's ids with speculation (%llu proposals "
	       "accepted); %llu steps recorded as graphs, %llu replayed\n", engine_backend_name(cuda.e), same,
	       (unsigned long long)accepted, (unsigned long long)rec, (unsigned long long)rep);
	CHECK_INT_EQ(same, 3);
	CHECK(accepted > 0);
	/* a verifying step wants every row's logits: recorded and replayed as a
	 * graph of its shape (rows padded to 1, 2, 4, 8, ...) like a decode step */
	CHECK(rec > 1 && rep > 0);
	rig_free(&cuda);
	rig_free(&cpu);
}

int main(void)
{
	/* test_model_path answers in one static buffer: copies */
	char *p = test_model_path("stories260K.gguf") ? strdup(test_model_path("stories260K.gguf")) : NULL;
	char *golden = test_model_path("golden/greedy.json") ? strdup(test_model_path("golden/greedy.json")) : NULL;
	char *golden_lc = test_model_path("golden/greedy-llamacpp.json") ?
			  strdup(test_model_path("golden/greedy-llamacpp.json")) : NULL;
	static const char *const tiny[] = { "derived/TinyStories-656K-f32.gguf",
					    "derived/TinyStories-656K-q8_0.gguf",
					    "derived/TinyStories-656K-q4_0.gguf" };
	struct model *m = NULL;
	char err[512];

	if (!p || !golden) {
		printf("SKIP: ../shared/models is absent\n");
		free(p);
		free(golden);
		free(golden_lc);
		return TEST_SKIP;
	}
	CHECK(model_load(p, &m, err, sizeof err) == 0);
	check_goldens(m, "stories260K", golden, "stories260K.gguf");
	test_seeded(m);
	test_crowd(m, 2);
	test_crowd(m, 1);
	test_repetition(m);
	test_cuda(m);
	model_free(m);
	for (int i = 0; i < 3 && golden_lc; i++) {
		const char *q = test_model_path(tiny[i]);
		if (q && model_load(q, &m, err, sizeof err) == 0) {
			check_goldens(m, tiny[i], golden_lc, tiny[i]);
			model_free(m);
		}
	}
	/* TinyStories f32 with its q8_0 quantization as the draft, and with
	 * stories260K (another vocabulary) refused */
	char *tf = test_model_path(tiny[0]) ? strdup(test_model_path(tiny[0])) : NULL;
	char *tq = test_model_path(tiny[1]) ? strdup(test_model_path(tiny[1])) : NULL;
	struct model *dm = NULL, *small = NULL;
	if (tf && tq && golden_lc && model_load(tf, &m, err, sizeof err) == 0 &&
	    model_load(tq, &dm, err, sizeof err) == 0 && model_load(p, &small, err, sizeof err) == 0) {
		test_draft(m, dm, tiny[0], golden_lc, tiny[0]);
		test_draft_price(m, dm);
		test_draft_explores(m, dm);
		test_draft_seeded(m, m);
		test_draft_seeded(m, dm);
		test_chi_square(m, dm);
		test_draft_refusals(m, small);
	} else {
		printf("draft: left out (no TinyStories-656K f32 and q8_0)\n");
	}
	model_free(m);
	model_free(dm);
	model_free(small);
	m = NULL;
	free(tf);
	free(tq);
	const char *g = getenv("LLMD_GEMMA3");
	const char *gg = test_model_path("golden/gemma-3-270m-q4_k_m.greedy-llamacpp.json");
	if (g && gg && access(g, R_OK) == 0 && model_load(g, &m, err, sizeof err) == 0) {
		check_goldens(m, "gemma-3-270m-q4_k_m", gg, NULL);
		model_free(m);
	} else {
		printf("gemma 3: left out (no model file; make fetch-models)\n");
	}
	free(p);
	free(golden);
	free(golden_lc);
	return test_result();
}
