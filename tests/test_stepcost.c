/* test_stepcost.c - the step-time model learns what steps cost:
 *  - from noisy synthetic steps it recovers the per-step, per-row,
 *    per-attended-position and per-context-position costs it was generated
 *    with (those measured on SmolLM2, 2 threads), and predicts unseen steps;
 *  - steps the OS delayed (10% of them, 1.5 to 20 times slower) barely move
 *    it;
 *  - a long run of decode-only steps (rows and positions that cannot tell
 *    the terms apart) keeps what earlier prefill steps taught;
 *  - when the machine becomes twice as slow it follows within 100 steps;
 *  - whatever it is fed (costs falling with rows, garbage) its coefficients
 *    and predictions stay finite and >= 0, and bad samples are refused;
 *  - a pinned model predicts exactly its coefficients.
 * No model file and no clock: the steps are made up.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "stepcost.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) /* (0, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((rng >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
	return sqrt(-2 * log(uniform())) * cos(2 * M_PI * uniform());
}

static const struct stepcost_coef truth = {
	.base_s = 0.005, .row_s = 9e-4, .pos_s = 1.05e-6, .ctx_s = 1.5e-6,
};

static double true_cost(const struct stepcost_coef *k, const struct stepcost_step *st)
{
	return k->base_s + k->row_s * st->rows + k->pos_s * (double)st->attended +
	       k->ctx_s * (double)st->context;
}

/* One decode row at position P. */
static struct stepcost_step decode_at(int64_t p)
{
	return (struct stepcost_step){ 1, p + 1, p + 1 };
}

/* A step like the scheduler's: 1 to 4 decodes at positions up to 4000,
 * and more often than not a prefill chunk of 16 to 511 rows from a
 * position up to 7500. */
static struct stepcost_step make_step(void)
{
	struct stepcost_step st = { 0 };
	int32_t d = 1 + (int32_t)(uniform() * 4);

	for (int32_t i = 0; i < d; i++) {
		int64_t p = 20 + (int64_t)(uniform() * 4000);
		st.rows++;
		st.attended += p + 1;
		st.context += p + 1;
	}
	if (uniform() < 0.6) {
		int32_t n = 16 + (int32_t)(uniform() * 496);
		int64_t p0 = (int64_t)(uniform() * 7500);
		st.rows += n;
		st.attended += n * p0 + (int64_t)n * (n + 1) / 2;
		st.context += p0 + n;
	}
	return st;
}

static double rel_err(double a, double b)
{
	return fabs(a - b) / b;
}

/* The mean relative error of the model's predictions over fresh steps. */
static double prediction_error(const struct stepcost *c, const struct stepcost_coef *k)
{
	double e = 0;
	for (int i = 0; i < 200; i++) {
		struct stepcost_step st = make_step();
		e += rel_err(stepcost_predict(c, &st), true_cost(k, &st));
	}
	return e / 200;
}

static void feed(struct stepcost *c, const struct stepcost_coef *k, int n, double noise,
		 double outliers)
{
	for (int i = 0; i < n; i++) {
		struct stepcost_step st = make_step();
		double t = true_cost(k, &st) * exp(noise * gauss());
		if (uniform() < outliers)
			t *= 1.5 + 18.5 * uniform();
		CHECK_INT_EQ(stepcost_add(c, &st, t), 0);
		stepcost_fit(c); /* as the scheduler does with a budget */
	}
}

static void test_recovers_coefficients(void)
{
	struct stepcost c;
	struct stepcost_step big = { 512, 1000000, 3000 };

	stepcost_init(&c);
	CHECK(!stepcost_ready(&c));
	CHECK(stepcost_predict(&c, &big) == 0);
	feed(&c, &truth, 300, 0.05, 0);
	CHECK(stepcost_ready(&c));
	printf("5%% noise: base %.4f s (true %.4f), row %.3g s (%.3g), position %.3g s (%.3g), "
	       "context %.3g s (%.3g); predictions off by %.1f%% on average\n", c.coef.base_s,
	       truth.base_s, c.coef.row_s, truth.row_s, c.coef.pos_s, truth.pos_s, c.coef.ctx_s,
	       truth.ctx_s, 100 * prediction_error(&c, &truth));
	CHECK(rel_err(c.coef.base_s, truth.base_s) < 0.25);
	CHECK(rel_err(c.coef.row_s, truth.row_s) < 0.15);
	CHECK(rel_err(c.coef.pos_s, truth.pos_s) < 0.12);
	CHECK(rel_err(c.coef.ctx_s, truth.ctx_s) < 0.15);
	CHECK(prediction_error(&c, &truth) < 0.03);
	CHECK(c.n > STEPCOST_PER_BUCKET && c.n <= STEPCOST_BUCKETS * STEPCOST_PER_BUCKET);
	CHECK_INT_EQ(c.samples, 300);
}

static void test_outliers(void)
{
	struct stepcost c;

	stepcost_init(&c);
	feed(&c, &truth, 300, 0.05, 0.10);
	printf("5%% noise and 10%% of steps 1.5-20x slower: row %.3g s, position %.3g s, "
	       "context %.3g s; predictions off by %.1f%%\n", c.coef.row_s, c.coef.pos_s,
	       c.coef.ctx_s, 100 * prediction_error(&c, &truth));
	CHECK(rel_err(c.coef.row_s, truth.row_s) < 0.25);
	CHECK(rel_err(c.coef.pos_s, truth.pos_s) < 0.25);
	CHECK(prediction_error(&c, &truth) < 0.05);
}

/* After mixed steps, 500 steps of one decode row at slowly growing
 * positions: the first two columns are the same, the last two too, and
 * nearly constant; a prefill chunk and a decode far along a long context
 * are still predicted well. */
static void test_collinear(void)
{
	struct stepcost c;

	stepcost_init(&c);
	feed(&c, &truth, 100, 0.05, 0);
	for (int i = 0; i < 500; i++) {
		struct stepcost_step st = decode_at(300 + i / 10);
		CHECK_INT_EQ(stepcost_add(&c, &st, true_cost(&truth, &st) * exp(0.05 * gauss())), 0);
		stepcost_fit(&c);
	}
	struct stepcost_step chunk = { 512, 512LL * 4000 + 512LL * 513 / 2, 4512 };
	struct stepcost_step near = decode_at(400), far = decode_at(6000);
	double want = true_cost(&truth, &chunk), got = stepcost_predict(&c, &chunk);
	printf("after 500 decode-only steps: a 512-row chunk at position 4000 predicted %.3f s "
	       "(true %.3f), a decode at 400 %.4f s (%.4f), at 6000 %.4f s (%.4f)\n", got, want,
	       stepcost_predict(&c, &near), true_cost(&truth, &near), stepcost_predict(&c, &far),
	       true_cost(&truth, &far));
	CHECK(rel_err(got, want) < 0.15);
	CHECK(rel_err(stepcost_predict(&c, &near), true_cost(&truth, &near)) < 0.05);
	CHECK(rel_err(stepcost_predict(&c, &far), true_cost(&truth, &far)) < 0.15);
	CHECK(c.coef.base_s >= 0 && c.coef.row_s >= 0 && c.coef.pos_s >= 0 && c.coef.ctx_s >= 0);

	/* from cold, nothing but identical steps: that step is still right */
	stepcost_init(&c);
	struct stepcost_step one = decode_at(0);
	for (int i = 0; i < 100; i++) {
		CHECK_INT_EQ(stepcost_add(&c, &one, 0.02), 0);
		stepcost_fit(&c);
	}
	CHECK(rel_err(stepcost_predict(&c, &one), 0.02) < 0.01);
	CHECK(c.coef.base_s >= 0 && c.coef.row_s >= 0 && c.coef.pos_s >= 0 && c.coef.ctx_s >= 0);
}

static void test_follows_a_slower_machine(void)
{
	struct stepcost c;
	struct stepcost_coef slow = { truth.base_s * 2, truth.row_s * 2, truth.pos_s * 2, truth.ctx_s * 2 };

	stepcost_init(&c);
	feed(&c, &truth, 200, 0.05, 0);
	feed(&c, &slow, 100, 0.05, 0);
	printf("machine twice as slow: predictions off by %.1f%% 100 steps later\n",
	       100 * prediction_error(&c, &slow));
	CHECK(prediction_error(&c, &slow) < 0.05);
}

/* Costs that fall as rows grow would want a negative coefficient: the fit
 * clamps at 0 and never predicts below 0; garbage is refused. */
static void test_never_negative(void)
{
	struct stepcost c;

	stepcost_init(&c);
	for (int i = 0; i < 300; i++) {
		struct stepcost_step st = make_step();
		double t = 1.0 - st.rows * 1.5e-3 - (double)st.attended * 5e-7 - (double)st.context * 1e-4;
		if (t < 1e-4)
			t = 1e-4 * (1 + uniform());
		CHECK_INT_EQ(stepcost_add(&c, &st, t), 0);
		stepcost_fit(&c);
	}
	CHECK(c.coef.base_s >= 0 && c.coef.row_s >= 0 && c.coef.pos_s >= 0 && c.coef.ctx_s >= 0);
	CHECK(isfinite(c.coef.base_s) && isfinite(c.coef.row_s) && isfinite(c.coef.pos_s) &&
	      isfinite(c.coef.ctx_s));
	for (int32_t rows = 0; rows <= 65536; rows = rows * 2 + 1)
		for (int64_t att = 0; att < (int64_t)1 << 40; att = att * 7 + 1) {
			struct stepcost_step st = { rows, att, att / 3 };
			double p = stepcost_predict(&c, &st);
			if (!(isfinite(p) && p >= 0)) {
				CHECK(isfinite(p) && p >= 0);
				return;
			}
		}
	int32_t kept = c.n;
	struct stepcost_step no_rows = { 0, 1, 1 }, few_ctx = { 4, 10, 3 }, much_ctx = { 4, 10, 11 };
	struct stepcost_step ok = { 4, 10, 5 };
	CHECK_INT_EQ(stepcost_add(&c, &no_rows, 0.1), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &few_ctx, 0.1), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &much_ctx, 0.1), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &ok, 0), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &ok, -1), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &ok, NAN), -EINVAL);
	CHECK_INT_EQ(stepcost_add(&c, &ok, INFINITY), -EINVAL);
	CHECK_INT_EQ(c.n, kept);
	CHECK_INT_EQ(c.samples, 300);
}

static void test_pinned(void)
{
	struct stepcost c;
	struct stepcost_coef k = { .base_s = 0.01, .row_s = -5, .pos_s = 1e-6, .ctx_s = NAN };
	struct stepcost_step st = { 100, 5000, 300 };

	stepcost_init(&c);
	stepcost_pin(&c, &k);
	CHECK(stepcost_ready(&c));
	CHECK(c.coef.row_s == 0 && c.coef.ctx_s == 0); /* negative and NaN taken as 0 */
	CHECK(stepcost_predict(&c, &st) == 0.01 + 1e-6 * 5000);
	feed(&c, &truth, 50, 0.05, 0); /* kept, not learned */
	CHECK(stepcost_predict(&c, &st) == 0.01 + 1e-6 * 5000);
	CHECK_INT_EQ(c.samples, 50);
	stepcost_pin(&c, NULL);
	CHECK(prediction_error(&c, &truth) < 0.05);
}

/* stepcost_seen counts the steps kept of a range of sizes: those the
 * rings hold, newer ones replacing older of the same bucket; a pinned model
 * knows every size. */
static void test_seen(void)
{
	struct stepcost c;
	struct stepcost_coef k = { .base_s = 0.01 };

	stepcost_init(&c);
	CHECK_INT_EQ(stepcost_seen(&c, 1, 1 << 20), 0);
	for (int i = 0; i < 20; i++) { /* one-row decode steps: a ring of 8 kept */
		struct stepcost_step d = { 1, 300 + i, 300 + i };
		CHECK_INT_EQ(stepcost_add(&c, &d, 0.04), 0);
	}
	struct stepcost_step p = { 300, 45150, 300 }, v = { 3, 903, 302 };
	CHECK_INT_EQ(stepcost_add(&c, &p, 0.5), 0);
	CHECK_INT_EQ(stepcost_seen(&c, 1, 1), 8);
	CHECK_INT_EQ(stepcost_seen(&c, 2, 17), 0);
	CHECK_INT_EQ(stepcost_add(&c, &v, 0.05), 0);
	CHECK_INT_EQ(stepcost_seen(&c, 2, 17), 1);
	CHECK_INT_EQ(stepcost_seen(&c, 3, 3), 1);
	CHECK_INT_EQ(stepcost_seen(&c, 4, 299), 0);
	CHECK_INT_EQ(stepcost_seen(&c, 1, 1 << 20), 10);
	stepcost_pin(&c, &k);
	CHECK(stepcost_seen(&c, 2, 17) == INT32_MAX);
}

int main(void)
{
	test_recovers_coefficients();
	test_outliers();
	test_collinear();
	test_follows_a_slower_machine();
	test_never_negative();
	test_pinned();
	test_seen();
	return test_result();
}
