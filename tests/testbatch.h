/* testbatch.h - batch invariance through the scheduler, for the tests of a
 * backend other than the CPU's (the emulated CUDA one, nvcc's on a GPU):
 * request 0 alone, then beside three others, two of them started first so
 * that its prefill shares steps with their decodes; greedy ids identical. */
#ifndef LLMD_TESTBATCH_H
#define LLMD_TESTBATCH_H

#include <stdio.h>
#include <string.h>

#include "engine.h"
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
	char path[4096], err[512];
	struct model *m = NULL;
	struct engine *e = NULL;
	struct sched *s = NULL;
	struct sched_params sp;
	int32_t ids[4][64];
	int n_ids[4];
	struct tbatch_result alone;

	snprintf(path, sizeof path, "%s/%s", models_dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
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

#endif
