/* testsched.h - what the scheduler's tests share: stepping a scheduler
 * until it is idle with its invariants checked after every step, a greedy
 * request, a prompt's ids.  Include after testutil.h. */
#ifndef LLMD_TESTSCHED_H
#define LLMD_TESTSCHED_H

#include "model.h"
#include "sched.h"
#include "tokenizer.h"

/* Steps S until no request is live, checking sched_check after every step
 * (a failed invariant is a failure, named, and ends the run). */
static inline void test_run_idle(struct sched *s)
{
	char err[256];
	for (int guard = 0; sched_live(s) > 0 && guard < 100000; guard++) {
		CHECK(sched_step(s) >= 0);
		if (sched_check(s, err, sizeof err) < 0) {
			fprintf(stderr, "invariant: %s\n", err);
			test_failures++;
			return;
		}
	}
	CHECK_INT_EQ(sched_live(s), 0);
}

/* A greedy request ID of the N ids at PROMPT for MAX_TOKENS tokens, the
 * sampler's other defaults. */
static inline struct sched_request test_req(uint64_t id, const int32_t *prompt, int n, int max_tokens)
{
	struct sched_request r = { .id = id, .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens };
	sampler_params_default(&r.sampling);
	r.sampling.temperature = 0;
	return r;
}

/* TEXT's ids under M's tokenizer (with its BOS, special tokens parsed),
 * at most CAP of them: the count, or a negative errno. */
static inline int test_tokenize(const struct model *m, const char *text, int32_t *ids, int cap)
{
	return tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, cap);
}

#endif
