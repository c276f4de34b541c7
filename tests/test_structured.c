/* test_structured.c - structured output end to end on SmolLM2-135M-Instruct:
 * the scheduler drawing every token from a grammar's mask (constrain.c's
 * compiled grammars, grammar.c's states).
 *
 *   test_structured              the checks below (make check)
 *   test_structured --gen SCHEMA N [MAX_TOKENS]
 *                                N outputs for the JSON Schema file SCHEMA
 *                                (temperature 1 with top-k 40, top-p 0.95 and
 *                                min-p 0.05, seeds 1..N, 32 at a time),
 *                                one JSON line each: {"seed", "finish",
 *                                "text"} (structured_check.py validates them)
 *
 * Checks: a seeded constrained request gives the same tokens alone and
 * among 16 others (constrained by other schemas, or not at all), greedy and
 * sampled; every output is complete (finish stop) and JSON; a grammar that
 * cannot end within max_tokens finishes with length and says so; a grammar
 * whose end comes early stops there; the cache serves a schema compiled
 * once; errors name the place.  Prints the mask's cost per token.
 */
#include <errno.h>
#include <math.h>

#include <json-c/json.h>

#include "chat.h"
#include "clock.h"
#include "constrain.h"
#include "engine.h"
#include "grammar.h"
#include "model.h"
#include "sched.h"
#include "testutil.h"
#include "tokenizer.h"

#define MAX_REQ 64
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_TEXT 16384

struct result {
	int32_t gen[1024];
	int n_gen;
	char text[MAX_TEXT];
	size_t len;
	int n_finish;
	enum sched_finish finish;
	char message[256];
};

static struct result results[MAX_REQ];

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct result *r = &results[ev->id];
	(void)ctx;
	if (ev->kind == SCHED_EV_FINISH) {
		r->n_finish++;
		r->finish = ev->finish;
		snprintf(r->message, sizeof r->message, "%s", ev->message ? ev->message : "");
		return;
	}
	if (ev->token >= 0 && r->n_gen < (int)ARRAY_LEN(r->gen))
		r->gen[r->n_gen++] = ev->token;
	if (r->len + ev->text_len < MAX_TEXT) {
		memcpy(r->text + r->len, ev->text, ev->text_len);
		r->len += ev->text_len;
		r->text[r->len] = 0;
	}
}

struct rig {
	const struct model *m;
	struct engine *e;
	struct sched *s;
	struct constrain *c;
	struct constrain_req *creq[MAX_REQ]; /* per request id */
};

static int rig_new(struct rig *g, const struct model *m)
{
	struct engine_params ep;
	struct sched_params sp;
	char err[256];

	memset(g, 0, sizeof *g);
	g->m = m;
	engine_params_default(&ep);
	ep.kv_tokens = 64 * 1024;
	ep.n_ctx = 2048;
	ep.max_batch = 512;
	sched_params_default(&sp);
	sp.max_seqs = 32;
	sp.max_batched_tokens = 512;
	if (engine_new(m, &ep, &g->e, err, sizeof err) < 0 ||
	    sched_new(g->e, m, &sp, on_event, NULL, &g->s, err, sizeof err) < 0 ||
	    constrain_new(m->tok, &g->c) < 0) {
		fprintf(stderr, "rig: %s\n", err);
		return -1;
	}
	return 0;
}

static void rig_free(struct rig *g)
{
	sched_free(g->s);
	engine_free(g->e);
	for (int i = 0; i < MAX_REQ; i++)
		constrain_req_free(g->creq[i]);
	constrain_free(g->c);
}

static void run_to_idle(struct rig *g)
{
	for (int guard = 0; sched_live(g->s) > 0 && guard < 200000; guard++)
		CHECK(sched_step(g->s) >= 0);
	CHECK_INT_EQ(sched_live(g->s), 0);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "re");
	char *p = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (p = malloc((size_t)n + 1)) && fread(p, 1, (size_t)n, f) == (size_t)n)
		p[n] = 0;
	else
		p = (free(p), NULL);
	fclose(f);
	return p;
}

/* The chat prompt asking for an instance of SCHEMA (its text). */
static int prompt_for(const struct model *m, const char *schema, int32_t *ids, int cap)
{
	char user[8192];
	char *text = NULL;
	int n;

	snprintf(user, sizeof user, "Write one JSON value that is valid under this JSON Schema:\n%s",
		 schema);
	struct chat_msg msgs[] = { { "system", "You answer with JSON only." }, { "user", user } };
	if (chat_render(&m->chat, msgs, 2, 1, &text) < 0)
		return -1;
	n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, cap);
	free(text);
	return n;
}

/* Submits request ID: PROMPT, constrained by KIND/SRC unless KIND is 0. */
static int submit(struct rig *g, uint64_t id, const int32_t *prompt, int n, int max_tokens,
		  float temp, uint64_t seed, enum constrain_kind kind, const char *src)
{
	struct sched_request r = { .id = id, .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens };
	char err[400] = "";
	int rc;

	sampler_params_default(&r.sampling);
	r.sampling.temperature = temp < 0 ? -temp : temp;
	if (temp >= 0) { /* a negative TEMP keeps llama.cpp's truncations */
		r.sampling.top_k = 0;
		r.sampling.top_p = 1;
		r.sampling.min_p = 0;
	} else if (getenv("STRUCTURED_REPEAT_PENALTY")) {
		r.sampling.repeat_penalty = (float)atof(getenv("STRUCTURED_REPEAT_PENALTY"));
	}
	r.sampling.seed = seed;
	memset(&results[id], 0, sizeof results[id]);
	constrain_req_free(g->creq[id]);
	g->creq[id] = NULL;
	if (kind) {
		rc = constrain_start(g->c, kind, 0, src, src ? strlen(src) : 0, &g->creq[id], err,
				     sizeof err);
		if (rc < 0) {
			fprintf(stderr, "constrain_start: %s\n", err);
			return rc;
		}
		r.grammar = constrain_req_state(g->creq[id]);
	}
	return sched_submit(g->s, &r);
}

/* ---- generation for structured_check.py ---- */

static int gen_main(const struct model *m, const char *path, int n, int max_tokens)
{
	struct rig g;
	int32_t ids[4096];
	char *schema = slurp(path);
	int np;

	if (!schema || rig_new(&g, m) < 0) {
		fprintf(stderr, "%s: cannot read\n", path);
		return 1;
	}
	np = prompt_for(m, schema, ids, (int)ARRAY_LEN(ids));
	if (np <= 0) {
		fprintf(stderr, "cannot make the prompt\n");
		return 1;
	}
	/* 32 in flight; a finished one's slot takes the next seed */
	int next = 0, out = 0, seed_of[32];
	for (int slot = 0; slot < 32 && next < n; slot++, next++) {
		seed_of[slot] = next + 1;
		if (submit(&g, (uint64_t)slot, ids, np, max_tokens, -1.0f, (uint64_t)seed_of[slot],
			   CONSTRAIN_JSON_SCHEMA, schema) < 0)
			return 1;
	}
	while (out < n) {
		if (sched_step(g.s) < 0)
			return 1;
		for (int slot = 0; slot < 32; slot++) {
			struct result *r = &results[slot];
			if (r->n_finish != 1)
				continue;
			json_object *o = json_object_new_object();
			json_object_object_add(o, "seed", json_object_new_int(seed_of[slot]));
			json_object_object_add(o, "finish", json_object_new_string(
				r->finish == SCHED_FIN_STOP ? "stop" :
				r->finish == SCHED_FIN_LENGTH ? "length" : "error"));
			json_object_object_add(o, "message", json_object_new_string(r->message));
			json_object_object_add(o, "tokens", json_object_new_int(r->n_gen));
			json_object_object_add(o, "text", json_object_new_string_len(r->text, (int)r->len));
			printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
			json_object_put(o);
			out++;
			r->n_finish = 2; /* printed */
			if (next < n) {
				seed_of[slot] = ++next;
				if (submit(&g, (uint64_t)slot, ids, np, max_tokens, -1.0f,
					   (uint64_t)seed_of[slot], CONSTRAIN_JSON_SCHEMA, schema) < 0)
					return 1;
			}
		}
	}
	fflush(stdout);
	rig_free(&g);
	free(schema);
	return test_result();
}

/* ---- checks ---- */

static const char *const person =
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
	"\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"tags\":{\"type\":\"array\","
	"\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3}},"
	"\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
static const char *const point =
	"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},"
	"\"required\":[\"x\",\"y\"],\"additionalProperties\":false}";

/* The same seeded constrained requests alone, then each among 16 others
 * started at different steps: the same tokens. */
static void test_batch_invariance(const struct model *m)
{
	struct rig g;
	int32_t ids[3][1024];
	int n[3];
	static struct result alone[4];
	static const char *const user[3] = { "Tell me about Ann.", "Where is the treasure?",
					     "Once upon a time" };
	const char *src[4] = { person, point, NULL, person };
	const enum constrain_kind kind[4] = { CONSTRAIN_JSON_SCHEMA, CONSTRAIN_JSON_SCHEMA,
					      CONSTRAIN_JSON_OBJECT, CONSTRAIN_JSON_SCHEMA };
	const float temp[4] = { 1.0f, 0.8f, 1.0f, 0.0f };

	if (rig_new(&g, m) < 0) {
		test_failures++;
		return;
	}
	for (int i = 0; i < 3; i++) {
		char *text = NULL;
		struct chat_msg msgs[] = { { "user", user[i] } };
		CHECK(chat_render(&m->chat, msgs, 1, 1, &text) >= 0);
		n[i] = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids[i], 1024);
		free(text);
	}
	for (int i = 0; i < 4; i++) {
		CHECK_INT_EQ(submit(&g, 0, ids[i % 3], n[i % 3], 160, temp[i], 7 + (uint64_t)i, kind[i],
				    src[i]), 0);
		run_to_idle(&g);
		alone[i] = results[0];
		CHECK_INT_EQ(alone[i].finish, SCHED_FIN_STOP);
		json_object *o = json_tokener_parse(alone[i].text);
		if (!o)
			fprintf(stderr, "not JSON: %s\n", alone[i].text);
		CHECK(o && json_object_is_type(o, json_type_object));
		json_object_put(o);
	}
	printf("alone: %s | %s | %s | %s\n", alone[0].text, alone[1].text, alone[2].text, alone[3].text);
	/* 17 requests: the four again (ids 0..3) among 13 others (unconstrained
	 * or constrained differently), in three waves */
	for (int wave = 0; wave < 3; wave++) {
		for (int k = wave; k < 17; k += 3) {
			if (k < 4)
				CHECK_INT_EQ(submit(&g, (uint64_t)k, ids[k % 3], n[k % 3], 160, temp[k],
						    7 + (uint64_t)k, kind[k], src[k]), 0);
			else
				CHECK_INT_EQ(submit(&g, (uint64_t)k, ids[k % 3], n[k % 3], 20 + 7 * k,
						    0.9f, 100 + (uint64_t)k, k % 2 ? 0 : kind[k % 4],
						    src[k % 4]), 0);
		}
		for (int st = 0; st < 4 + wave; st++)
			CHECK(sched_step(g.s) >= 0);
	}
	run_to_idle(&g);
	int same = 0;
	for (int k = 0; k < 4; k++) {
		if (results[k].n_gen == alone[k].n_gen &&
		    !memcmp(results[k].gen, alone[k].gen, sizeof(int32_t) * (size_t)alone[k].n_gen))
			same++;
		else
			fprintf(stderr, "request %d differs in a crowd: %s\n", k, results[k].text);
	}
	for (int k = 4; k < 17; k++)
		CHECK_INT_EQ(results[k].n_finish, 1);
	printf("constrained requests identical alone and among 16 others: %d/4\n", same);
	CHECK_INT_EQ(same, 4);
	uint64_t compiled, reused;
	constrain_stats(g.c, &compiled, &reused);
	printf("grammars compiled %llu, served from the cache %llu\n", (unsigned long long)compiled,
	       (unsigned long long)reused);
	CHECK_INT_EQ(compiled, 3);
	CHECK(reused >= 10);
	struct sched_counters c;
	sched_counters(g.s, &c);
	CHECK_INT_EQ(c.used_blocks, 0);
	rig_free(&g);
}

/* A grammar that cannot end within max_tokens: length, with a notice; one
 * whose end comes first stops there, without an end-of-generation token. */
static void test_ends(const struct model *m)
{
	struct rig g;
	int32_t ids[1024];
	const char *text = "Count to twenty:";
	int n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, 1024);

	if (rig_new(&g, m) < 0) {
		test_failures++;
		return;
	}
	CHECK_INT_EQ(submit(&g, 0, ids, n, 8, 0, 1, CONSTRAIN_GBNF, "root ::= (\"ab\" [0-9]){40}\n"), 0);
	run_to_idle(&g);
	CHECK_INT_EQ(results[0].finish, SCHED_FIN_LENGTH);
	CHECK_INT_EQ(results[0].n_gen, 8);
	CHECK(strstr(results[0].message, "grammar") != NULL);
	printf("unreachable end: finish %d after %d tokens, \"%s\": %s\n", results[0].finish,
	       results[0].n_gen, results[0].text, results[0].message);

	CHECK_INT_EQ(submit(&g, 1, ids, n, 50, 0.9f, 3, CONSTRAIN_GBNF,
			    "root ::= \" \"? (\"one\" | \"two\" | \"three\") \", done\"\n"), 0);
	run_to_idle(&g);
	CHECK_INT_EQ(results[1].finish, SCHED_FIN_STOP);
	CHECK(strstr(results[1].text, ", done") != NULL);
	CHECK(!tokenizer_is_eog(m->tok, results[1].gen[results[1].n_gen - 1]));
	printf("early end: \"%s\" in %d tokens\n", results[1].text, results[1].n_gen);

	/* Ending in time: at temperature 1 with every token of the vocabulary
	 * in play, a 135M model rambles on inside a string; with max_tokens a
	 * little over the shortest JSON the schema allows (about 20 tokens),
	 * each output still closes its strings and brackets in time. */
	n = prompt_for(m, person, ids, 1024);
	for (int k = 0; k < 8; k++)
		CHECK_INT_EQ(submit(&g, (uint64_t)(2 + k), ids, n, 24 + 4 * k, 1.0f, (uint64_t)(40 + k),
				    CONSTRAIN_JSON_SCHEMA, person), 0);
	run_to_idle(&g);
	for (int k = 0; k < 8; k++) {
		const struct result *r = &results[2 + k];
		json_object *o = json_tokener_parse(r->text);
		CHECK_INT_EQ(r->finish, SCHED_FIN_STOP);
		CHECK(r->n_gen <= 24 + 4 * k);
		CHECK(o && json_object_is_type(o, json_type_object) &&
		      json_object_object_get_ex(o, "name", NULL) &&
		      json_object_object_get_ex(o, "tags", NULL));
		if (k < 2 || !o)
			printf("in time, max_tokens %d: %d tokens, %s\n", 24 + 4 * k, r->n_gen, r->text);
		json_object_put(o);
	}
	rig_free(&g);
}

/* Errors name what and where. */
static void test_errors(const struct model *m)
{
	static const struct {
		enum constrain_kind kind;
		const char *src;
		int rc;
		const char *says;
	} cases[] = {
		{ CONSTRAIN_GBNF, "root ::= \"a\" | foo\n", -EINVAL, "line 1, column 16" },
		{ CONSTRAIN_GBNF, "start ::= \"a\"\n", -EINVAL, "root" },
		{ CONSTRAIN_JSON_SCHEMA, "{\"type\": \"object\", ", -EINVAL, "not JSON at byte" },
		{ CONSTRAIN_JSON_SCHEMA, "{\"type\": \"object\"} x", -EINVAL, "not JSON at byte 19" },
		{ CONSTRAIN_JSON_SCHEMA, "{\"properties\": {\"a\": {\"not\": {}}}}", -ENOTSUP,
		  "not at #/properties/a" },
		{ CONSTRAIN_JSON_SCHEMA, "{\"type\": \"nothing\"}", -EINVAL, "json_schema: " },
	};
	struct constrain *c;
	struct constrain_req *r = NULL;
	char err[400];

	CHECK_INT_EQ(constrain_new(m->tok, &c), 0);
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		err[0] = 0;
		int rc = constrain_start(c, cases[i].kind, 0, cases[i].src, strlen(cases[i].src), &r, err,
					 sizeof err);
		printf("error %zu: %d %s\n", i, rc, err);
		CHECK_INT_EQ(rc, cases[i].rc);
		CHECK(strstr(err, cases[i].says) != NULL);
		CHECK(r == NULL);
	}
	/* a grammar evicted from the cache lives on with its request */
	CHECK_INT_EQ(constrain_start(c, CONSTRAIN_GBNF, 0, "root ::= \"x\"", 12, &r, err, sizeof err), 0);
	for (int i = 0; i < CONSTRAIN_CACHE + 2; i++) {
		char src[64];
		struct constrain_req *t = NULL;
		snprintf(src, sizeof src, "root ::= \"%d\"", i);
		CHECK_INT_EQ(constrain_start(c, CONSTRAIN_GBNF, 0, src, strlen(src), &t, err, sizeof err), 0);
		constrain_req_free(t);
	}
	uint32_t *mask = calloc(((size_t)tokenizer_n_vocab(m->tok) + 31) / 32, sizeof *mask);
	CHECK(mask && grammar_state_mask(constrain_req_state(r), mask) >= 1);
	free(mask);
	constrain_req_free(r);
	constrain_free(c);
}

/* What a mask costs per token: JSON and a nested schema, SmolLM2's vocabulary. */
static void test_mask_cost(const struct model *m)
{
	struct rig g;
	int32_t ids[1024];
	const char *text = "Here is some JSON:";
	int n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, 1024);

	if (rig_new(&g, m) < 0) {
		test_failures++;
		return;
	}
	for (int pass = 0; pass < 2; pass++) {
		CHECK_INT_EQ(submit(&g, 0, ids, n, 200, 1.0f, 11 + (uint64_t)pass,
				    pass ? CONSTRAIN_JSON_SCHEMA : CONSTRAIN_JSON_OBJECT, pass ? person : NULL),
			     0);
		/* time the masks of those tokens on a fresh cache (what a new
		 * schema costs), then again on a clone (what a cached one does) */
		run_to_idle(&g);
		struct constrain *c2 = NULL;
		CHECK_INT_EQ(constrain_new(m->tok, &c2), 0);
		for (int round = 0; round < 2; round++) {
			struct constrain_req *cr = NULL;
			char err[200];
			CHECK_INT_EQ(constrain_start(c2, pass ? CONSTRAIN_JSON_SCHEMA : CONSTRAIN_JSON_OBJECT, 0,
						     pass ? person : NULL, pass ? strlen(person) : 0, &cr, err,
						     sizeof err), 0);
			struct grammar_state *s = constrain_req_state(cr);
			static uint32_t mask[(262144 + 31) / 32];
			double t[1024];
			int k = 0;
			for (int i = 0; i < results[0].n_gen && k < 1024; i++) {
				double t0 = clock_s();
				CHECK(grammar_state_mask(s, mask) > 0);
				t[k++] = clock_s() - t0;
				if (grammar_state_accept(s, results[0].gen[i]) < 0)
					break;
			}
			for (int i = 1; i < k; i++)
				for (int j = i; j > 1 && t[j] < t[j - 1]; j--) {
					double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x;
				}
			printf("%s, %d tokens, %s cache: mask median %.1f us after the first, max %.1f us "
			       "(first %.1f us)\n", pass ? "nested schema" : "json_object", k,
			       round ? "warm" : "cold", k > 1 ? t[1 + (k - 1) / 2] * 1e6 : 0,
			       k > 1 ? t[k - 1] * 1e6 : 0, t[0] * 1e6);
			constrain_req_free(cr);
		}
		constrain_free(c2);
	}
	rig_free(&g);
}

int main(int argc, char **argv)
{
	const char *p = test_smollm2_path();
	struct model *m = NULL;
	char err[512];

	if (!p) {
		printf("SKIP: SmolLM2-135M-Instruct is absent (make fetch-models)\n");
		return TEST_SKIP;
	}
	if (model_load(p, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", p, err);
		return 1;
	}
	if (argc >= 4 && !strcmp(argv[1], "--gen")) {
		int rc = gen_main(m, argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 400);
		model_free(m);
		return rc;
	}
	test_errors(m);
	test_ends(m);
	test_batch_invariance(m);
	test_mask_cost(m);
	model_free(m);
	return test_result();
}
