/* test_sampler.c - pins the sampler's behaviour: greedy ties, top-k/p and
 * min-p exclusions, temperature-scaled frequencies, penalties, seeds,
 * log-probabilities, parameter checks; and prints the time per sample for a
 * 49152-token vocabulary.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "sampler.h"
#include "testutil.h"

/* A test-local generator, so the test data do not depend on libc's rand(). */
static uint64_t test_rng = 0x1234567887654321ull;

static double test_uniform(void)
{
	test_rng ^= test_rng << 13;
	test_rng ^= test_rng >> 7;
	test_rng ^= test_rng << 17;
	return (double)(test_rng >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int n, float scale)
{
	for (int i = 0; i < n; i++)
		l[i] = (float)((test_uniform() * 2 - 1) * scale);
}

static struct sampler_params params_plain(float temperature)
{
	struct sampler_params p;
	sampler_params_default(&p);
	p.temperature = temperature;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	return p;
}

static struct sampler *new_sampler(const struct sampler_params *p, int n)
{
	struct sampler *s = NULL;
	int rc = sampler_new(p, n, &s);
	CHECK_INT_EQ(rc, 0);
	return s;
}

/* log softmax of L at TOK, in double precision */
static double log_softmax(const float *l, int n, int tok)
{
	double m = -INFINITY, z = 0;
	for (int i = 0; i < n; i++)
		m = l[i] > m ? l[i] : m;
	for (int i = 0; i < n; i++)
		z += exp(l[i] - m);
	return l[tok] - m - log(z);
}

static void test_bad_params(void)
{
	struct sampler_params p;
	struct sampler *s = (struct sampler *)&p; /* must stay untouched */

	sampler_params_default(&p);
	p.temperature = NAN;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);
	CHECK(s == (struct sampler *)&p);

	sampler_params_default(&p);
	p.top_p = 0.0f;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);
	p.top_p = -0.5f;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);
	p.top_p = NAN;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);

	sampler_params_default(&p);
	p.min_p = -0.01f;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);
	p.min_p = NAN;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);

	sampler_params_default(&p);
	p.repeat_penalty = NAN;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);
	p.repeat_penalty = 0.0f;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);

	sampler_params_default(&p);
	p.penalty_last_n = -1;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), -EINVAL);

	sampler_params_default(&p);
	CHECK_INT_EQ(sampler_new(&p, 0, &s), -EINVAL);
	CHECK_INT_EQ(sampler_new(&p, -5, &s), -EINVAL);
	CHECK_INT_EQ(sampler_new(NULL, 100, &s), -EINVAL);
	CHECK_INT_EQ(sampler_new(&p, 100, NULL), -EINVAL);
	CHECK(s == (struct sampler *)&p);

	/* top_p above 1 and top_k below 0 just mean "off" */
	p.top_p = 1.5f;
	p.top_k = -3;
	s = NULL;
	CHECK_INT_EQ(sampler_new(&p, 100, &s), 0);
	sampler_free(s);
	sampler_free(NULL);
}

static void test_greedy_argmax_lowest_id_on_ties(void)
{
	struct sampler_params p = params_plain(0.0f);
	float l[8] = { 0.5f, 3.0f, -1.0f, 3.0f, 2.9f, 3.0f, -7.0f, 1.0f };
	struct sampler *s = new_sampler(&p, 8);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 1);
	sampler_free(s);

	p.temperature = -1.0f; /* any temperature <= 0 is greedy */
	s = new_sampler(&p, 8);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 1);
	l[1] = 2.0f;
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 3);
	sampler_free(s);

	/* random vectors, compared with a plain scan */
	enum { N = 5000 };
	static float big[N];
	p = params_plain(0.0f);
	s = new_sampler(&p, N);
	for (int rep = 0; rep < 50; rep++) {
		random_logits(big, N, 10.0f);
		int want = 0;
		for (int i = 1; i < N; i++)
			if (big[i] > big[want])
				want = i;
		CHECK_INT_EQ(sampler_sample(s, big, NULL), want);
	}
	sampler_free(s);
}

static void test_top_k_1_is_greedy(void)
{
	enum { N = 3000 };
	static float l[N];
	const float temps[] = { 0.05f, 0.8f, 1.0f, 5.0f, 100.0f };
	for (int t = 0; t < 5; t++) {
		struct sampler_params p = params_plain(temps[t]);
		p.top_k = 1;
		p.seed = (uint64_t)t;
		struct sampler *s = new_sampler(&p, N);
		for (int rep = 0; rep < 40; rep++) {
			random_logits(l, N, 4.0f);
			if (rep % 4 == 0) { /* a tie at the top */
				l[2000] = 9.0f;
				l[700] = 9.0f;
			}
			int want = 0;
			for (int i = 1; i < N; i++)
				if (l[i] > l[want])
					want = i;
			CHECK_INT_EQ(sampler_sample(s, l, NULL), want);
		}
		sampler_free(s);
	}
}

static void test_seed_reproducible_and_distinct(void)
{
	enum { N = 1000, DRAWS = 500 };
	static float l[N];
	static int32_t a[DRAWS], b[DRAWS], c[DRAWS];
	random_logits(l, N, 1.0f);

	struct sampler_params p;
	sampler_params_default(&p);
	p.top_k = 0; /* a wide distribution so sequences diverge */
	p.seed = 42;
	struct sampler *s1 = new_sampler(&p, N), *s2 = new_sampler(&p, N);
	p.seed = 43;
	struct sampler *s3 = new_sampler(&p, N);
	for (int i = 0; i < DRAWS; i++) {
		a[i] = sampler_sample(s1, l, NULL);
		c[i] = sampler_sample(s3, l, NULL);
	}
	for (int i = 0; i < DRAWS; i++) /* interleaving does not matter */
		b[i] = sampler_sample(s2, l, NULL);
	CHECK(memcmp(a, b, sizeof a) == 0);
	int same = 0;
	for (int i = 0; i < DRAWS; i++)
		same += a[i] == c[i];
	CHECK(same < DRAWS / 2);
	sampler_free(s1);
	sampler_free(s2);
	sampler_free(s3);

	/* pinned: the generator is ours, so these ids hold on every machine */
	float four[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
	p = params_plain(1.0f);
	p.seed = 7;
	s1 = new_sampler(&p, 4);
	int32_t got[8];
	for (int i = 0; i < 8; i++)
		got[i] = sampler_sample(s1, four, NULL);
	sampler_free(s1);
	p.seed = 7;
	s1 = new_sampler(&p, 4);
	for (int i = 0; i < 8; i++)
		CHECK_INT_EQ(sampler_sample(s1, four, NULL), got[i]);
	sampler_free(s1);
}

/* A copy (sampler_dup, sampler_copy_state) draws what the original draws
 * from then on, penalties included, however far the original had gone; a
 * copy of other parameters is refused. */
static void test_copy_state(void)
{
	enum { N = 1000, DRAWS = 200 };
	static float l[N];
	random_logits(l, N, 1.0f);

	struct sampler_params p;
	sampler_params_default(&p);
	p.top_k = 0;
	p.repeat_penalty = 1.3f;
	p.penalty_last_n = 8;
	p.seed = 9;
	struct sampler *a = new_sampler(&p, N), *b = NULL, *plain;
	for (int i = 0; i < 13; i++) /* the ring of history wrapped */
		sampler_accept(a, sampler_sample(a, l, NULL));
	CHECK_INT_EQ(sampler_dup(a, &b), 0);
	int same = 0;
	for (int i = 0; i < DRAWS; i++) {
		int32_t x = sampler_sample(a, l, NULL), y = sampler_sample(b, l, NULL);
		same += x == y;
		sampler_accept(a, x);
		sampler_accept(b, y);
	}
	CHECK_INT_EQ(same, DRAWS);
	/* b ran on: copied back to where a is, it draws a's next tokens again */
	for (int i = 0; i < 5; i++)
		sampler_accept(b, sampler_sample(b, l, NULL));
	CHECK_INT_EQ(sampler_copy_state(b, a), 0);
	for (int i = 0; i < 20; i++)
		CHECK_INT_EQ(sampler_sample(b, l, NULL), sampler_sample(a, l, NULL));
	CHECK(sampler_draws(a));
	p.repeat_penalty = 1.0f;
	plain = new_sampler(&p, N);
	CHECK_INT_EQ(sampler_copy_state(plain, a), -EINVAL);
	p.temperature = 0;
	sampler_free(plain);
	plain = new_sampler(&p, N);
	CHECK(!sampler_draws(plain));
	sampler_free(plain);
	sampler_free(a);
	sampler_free(b);
}

/* Frequencies of DRAWS samples of L[0..n) against softmax(L / T), renormalized
 * over the tokens in KEEP (a bitmask), 0 elsewhere. */
static void check_frequencies(const struct sampler_params *p, const float *l, int n,
			      unsigned keep, int draws, double tol)
{
	double want[16], z = 0;
	int counts[16] = { 0 };
	for (int i = 0; i < n; i++) {
		want[i] = (keep >> i) & 1 ? exp(l[i] / p->temperature) : 0.0;
		z += want[i];
	}
	struct sampler *s = new_sampler(p, n);
	for (int d = 0; d < draws; d++) {
		int32_t t = sampler_sample(s, l, NULL);
		CHECK(t >= 0 && t < n);
		if (t >= 0 && t < n)
			counts[t]++;
	}
	sampler_free(s);
	for (int i = 0; i < n; i++) {
		double f = (double)counts[i] / draws, e = want[i] / z;
		if (fabs(f - e) > tol)
			fprintf(stderr, "token %d: frequency %.4f, expected %.4f\n", i, f, e);
		CHECK(fabs(f - e) <= tol);
		if (e == 0)
			CHECK_INT_EQ(counts[i], 0);
	}
}

static void test_frequencies_match_softmax(void)
{
	const float l[4] = { 1.0f, 2.0f, 0.5f, -1.0f };
	/* 200k draws: one standard deviation is <= 0.0012, allow ~5 */
	const double tol = 0.006;
	struct sampler_params p = params_plain(0.7f);
	p.seed = 1;
	check_frequencies(&p, l, 4, 0xf, 200000, tol); /* whole-vocabulary draw */
	p = params_plain(1.6f);
	p.seed = 2;
	check_frequencies(&p, l, 4, 0xf, 200000, tol);
	p = params_plain(0.7f); /* top-k path: drops the worst token */
	p.top_k = 3;
	p.seed = 3;
	check_frequencies(&p, l, 4, 0x7, 200000, tol);
	p = params_plain(1.3f); /* top-p path that keeps everything */
	p.top_p = 0.9999f;
	p.seed = 4;
	check_frequencies(&p, l, 4, 0xf, 200000, tol);
}

/* Draws many times and checks that exactly the tokens in KEEP come out. */
static void check_support(const struct sampler_params *p, const float *l, int n, unsigned keep)
{
	int seen[16] = { 0 };
	struct sampler *s = new_sampler(p, n);
	for (int d = 0; d < 20000; d++) {
		int32_t t = sampler_sample(s, l, NULL);
		if (t >= 0 && t < n)
			seen[t] = 1;
	}
	sampler_free(s);
	for (int i = 0; i < n; i++) {
		if (seen[i] != (int)((keep >> i) & 1))
			fprintf(stderr, "token %d: drawn %d, expected %u\n", i, seen[i], (keep >> i) & 1);
		CHECK_INT_EQ(seen[i], (keep >> i) & 1);
	}
}

static void test_top_p_and_min_p_exclusions(void)
{
	/* probabilities 0.40 0.30 0.20 0.06 0.03 0.01, shuffled over ids */
	const double prob[6] = { 0.06, 0.40, 0.01, 0.20, 0.03, 0.30 };
	float l[6];
	for (int i = 0; i < 6; i++)
		l[i] = (float)log(prob[i]);
	for (int path = 0; path < 2; path++) {
		struct sampler_params p = params_plain(1.0f);
		p.top_k = path ? 6 : 0; /* k == n: whole-vocabulary path */
		p.top_p = 0.65f;        /* 0.40 + 0.30 = 0.70 >= 0.65 */
		check_support(&p, l, 6, 0x22);
		p.top_p = 0.75f;        /* needs 0.20 too */
		check_support(&p, l, 6, 0x2a);
		p.top_p = 0.93f;        /* 0.96 */
		check_support(&p, l, 6, 0x2b);
		p.top_p = 1.0f;
		p.min_p = 0.1f;         /* >= 0.04: drops 0.03 and 0.01 */
		check_support(&p, l, 6, 0x2b);
		p.min_p = 0.6f;         /* >= 0.24 */
		check_support(&p, l, 6, 0x22);
		p.min_p = 0.1f;         /* >= 0.04 */
		p.top_p = 0.97f;        /* would keep 0.03, min-p drops it */
		check_support(&p, l, 6, 0x2b);
		p.temperature = 5.0f;   /* filters act before temperature */
		check_support(&p, l, 6, 0x2b);
	}
	/* the top-k path: top-p renormalizes over the k survivors */
	struct sampler_params p = params_plain(1.0f);
	p.top_k = 3;       /* 0.40 0.30 0.20 -> 0.444 0.333 0.222 */
	p.top_p = 0.76f;   /* 0.777 >= 0.76; over the full vocabulary 0.70 < 0.76 */
	check_support(&p, l, 6, 0x22);
	p.top_k = 5;
	p.top_p = 1.0f;
	p.min_p = 0.1f;
	check_support(&p, l, 6, 0x2b);
}

static const float *sort_l;

static int by_logit_desc(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;
	if (sort_l[a] != sort_l[b])
		return sort_l[a] < sort_l[b] ? 1 : -1;
	return a < b ? -1 : a > b;
}

/* The top-p cut inside a cluster of near-equal logits (one histogram bucket
 * on the whole-vocabulary path), and among exactly equal ones, where the
 * lower ids are kept. */
static void test_top_p_cut_inside_a_cluster(void)
{
	float l[10] = { 1.0f, 0.0f, -0.01f, -0.02f, -0.03f, -0.04f, -0.05f, -0.06f, -0.07f, -5.0f };
	double z = 0, cum[10];
	for (int i = 0; i < 10; i++)
		z += exp(l[i]);
	for (int i = 0; i < 10; i++)
		cum[i] = (i ? cum[i - 1] : 0) + exp(l[i]) / z;
	for (int path = 0; path < 2; path++) {
		struct sampler_params p = params_plain(1.0f);
		p.top_k = path ? 9 : 0;
		p.top_p = (float)((cum[3] + cum[4]) / 2); /* cut after id 4 */
		check_support(&p, l, 10, 0x1f);
		p.top_p = (float)((cum[6] + cum[7]) / 2); /* after id 7 */
		check_support(&p, l, 10, 0xff);
	}

	float tie[6] = { -1.0f, 1.0f, 1.0f, 1.0f, 1.0f, -5.0f };
	for (int path = 0; path < 2; path++) {
		struct sampler_params p = params_plain(1.0f);
		p.top_k = path ? 5 : 0;
		p.top_p = 0.45f; /* two of the four tied tokens (0.24 each) */
		check_support(&p, tie, 6, 0x06);
		p.top_p = 0.7f;  /* three */
		check_support(&p, tie, 6, 0x0e);
	}
	/* top-k among equals keeps the lower ids too */
	struct sampler_params p = params_plain(1.0f);
	p.top_k = 3;
	check_support(&p, tie, 6, 0x0e);
}

/* Top-p over a big vocabulary (the histogram path) keeps exactly the tokens
 * a full sort keeps.  A huge temperature makes the kept set near-uniform, so
 * every kept token shows up in the draws. */
static void test_top_p_large_vocab_matches_sort(void)
{
	enum { N = 49152 };
	static float l[N];
	static int idx[N];
	static char seen[N], want[N];
	for (int attempt = 0; attempt < 3; attempt++) {
		for (int i = 0; i < N; i++)
			l[i] = (float)(test_uniform() * 8 - 12);
		for (int j = 0; j < 300; j++)
			l[(int)(test_uniform() * N)] = (float)(test_uniform() * 3 + 3);
		/* reference: sort by logit desc, id asc */
		double m = -INFINITY, z = 0;
		for (int i = 0; i < N; i++)
			m = l[i] > m ? l[i] : m;
		for (int i = 0; i < N; i++) {
			idx[i] = i;
			z += exp(l[i] - m);
		}
		sort_l = l;
		qsort(idx, N, sizeof *idx, by_logit_desc);
		const float top_p = 0.9f;
		double cum = 0;
		int kept = 0;
		memset(want, 0, sizeof want);
		for (int i = 0; i < N; i++) {
			cum += exp(l[idx[i]] - m) / z;
			want[idx[i]] = 1;
			kept++;
			if (cum >= top_p)
				break;
		}
		if (fabs(cum - top_p) < 1e-4 || cum - exp(l[idx[kept - 1]] - m) / z > top_p - 1e-4)
			continue; /* too close to the cut for float sums: try other data */

		struct sampler_params p = params_plain(1000.0f);
		p.top_p = top_p;
		p.seed = (uint64_t)attempt;
		struct sampler *s = new_sampler(&p, N);
		memset(seen, 0, sizeof seen);
		for (int d = 0; d < 40 * kept; d++) {
			int32_t t = sampler_sample(s, l, NULL);
			if (t >= 0 && t < N)
				seen[t] = 1;
		}
		sampler_free(s);
		CHECK(memcmp(seen, want, sizeof seen) == 0);
		CHECK(kept > 10);
		return;
	}
	CHECK(!"no usable random data");
}

static void test_penalties(void)
{
	/* repeat penalty divides a positive logit: 2.0 / 1.2 = 1.667 < 1.8 */
	float l[4] = { 2.0f, 1.8f, -1.0f, -3.0f };
	float pen[4], lp;
	struct sampler_params p = params_plain(0.0f);
	p.repeat_penalty = 1.2f;
	struct sampler *s = new_sampler(&p, 4);
	CHECK_INT_EQ(sampler_sample(s, l, &lp), 0); /* nothing accepted yet */
	sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, l, &lp), 1);
	memcpy(pen, l, sizeof pen);
	pen[0] = 2.0f / 1.2f;
	CHECK(fabs(lp - log_softmax(pen, 4, 1)) < 1e-5);
	sampler_free(s);

	/* ... and multiplies a negative one: -1.0 * 1.2 = -1.2 < -1.1 */
	float neg[3] = { -1.0f, -1.1f, -5.0f };
	s = new_sampler(&p, 3);
	sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, neg, &lp), 1);
	float negp[3] = { -1.2f, -1.1f, -5.0f };
	CHECK(fabs(lp - log_softmax(negp, 3, 1)) < 1e-5);
	sampler_free(s);

	/* frequency: count * f = 3 * 0.1 = 0.3 -> 1.7 < 1.8; at 0.05 -> 1.85 */
	p = params_plain(0.0f);
	p.frequency_penalty = 0.1f;
	s = new_sampler(&p, 4);
	for (int i = 0; i < 3; i++)
		sampler_accept(s, 0);
	sampler_accept(s, 3);
	CHECK_INT_EQ(sampler_sample(s, l, &lp), 1);
	float fp[4] = { 1.7f, 1.8f, -1.0f, -3.1f };
	CHECK(fabs(lp - log_softmax(fp, 4, 1)) < 1e-5);
	sampler_free(s);
	p.frequency_penalty = 0.05f;
	s = new_sampler(&p, 4);
	for (int i = 0; i < 3; i++)
		sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 0);
	sampler_free(s);

	/* presence: once, whatever the count: 0.25 -> 1.75; 0.15 -> 1.85 */
	p = params_plain(0.0f);
	p.presence_penalty = 0.25f;
	s = new_sampler(&p, 4);
	sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 1);
	sampler_free(s);
	p.presence_penalty = 0.15f;
	s = new_sampler(&p, 4);
	for (int i = 0; i < 5; i++)
		sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, l, &lp), 0);
	float pp[4] = { 1.85f, 1.8f, -1.0f, -3.0f };
	CHECK(fabs(lp - log_softmax(pp, 4, 0)) < 1e-5);
	sampler_free(s);

	/* only the last penalty_last_n accepted tokens count */
	p = params_plain(0.0f);
	p.repeat_penalty = 1.2f;
	p.penalty_last_n = 3;
	s = new_sampler(&p, 4);
	sampler_accept(s, 0);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 1);
	sampler_accept(s, 2);
	sampler_accept(s, 3);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 1); /* 0 still in the window */
	sampler_accept(s, 3);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 0); /* 0 has left it */
	sampler_free(s);

	/* penalty_last_n = 0 turns penalties off; out-of-range ids are ignored */
	p.penalty_last_n = 0;
	s = new_sampler(&p, 4);
	sampler_accept(s, 0);
	sampler_accept(s, 99);
	sampler_accept(s, -1);
	CHECK_INT_EQ(sampler_sample(s, l, NULL), 0);
	sampler_free(s);

	/* the logits passed in are not modified */
	p.penalty_last_n = 64;
	s = new_sampler(&p, 4);
	sampler_accept(s, 0);
	sampler_sample(s, l, NULL);
	CHECK(l[0] == 2.0f);
	sampler_free(s);
}

static void test_logprob_is_log_softmax(void)
{
	enum { N = 1000 };
	static float l[N];
	const float temps[] = { 0.0f, 0.3f, 0.8f, 2.0f };
	for (int t = 0; t < 4; t++) {
		for (int path = 0; path < 3; path++) {
			struct sampler_params p;
			sampler_params_default(&p);
			p.temperature = temps[t];
			p.top_k = path == 0 ? 40 : 0;
			p.top_p = path == 2 ? 1.0f : 0.95f;
			p.min_p = path == 2 ? 0.0f : 0.05f;
			struct sampler *s = new_sampler(&p, N);
			for (int rep = 0; rep < 20; rep++) {
				random_logits(l, N, 6.0f);
				float lp = 1.0f;
				int32_t tok = sampler_sample(s, l, &lp);
				CHECK(tok >= 0 && tok < N);
				if (tok >= 0 && tok < N)
					CHECK(fabs(lp - log_softmax(l, N, tok)) < 1e-4);
			}
			sampler_free(s);
		}
	}
}

/* sampler_sample_masked: only allowed tokens come, whatever the settings
 * (greedy, top-k, top-p, min-p, penalties); the draw and the logprob are
 * those of the logits with the others at -inf; and a mask allowing all is
 * the unmasked sampler, draw for draw. */
static void test_masked(void)
{
	enum { N = 1037 }; /* not a multiple of 32: the last word is partial */
	static float l[N], lm[N];
	static uint32_t allow[(N + 31) / 32], all[(N + 31) / 32];
	for (int path = 0; path < 5; path++) {
		struct sampler_params p;
		sampler_params_default(&p);
		p.temperature = path == 0 ? 0.0f : 1.0f;
		p.top_k = path == 1 ? 40 : 0;
		p.top_p = path == 2 ? 0.9f : 1.0f;
		p.min_p = path == 3 ? 0.05f : 0.0f;
		p.repeat_penalty = path == 4 ? 1.3f : 1.0f;
		p.seed = 77;
		struct sampler *s = new_sampler(&p, N), *a = new_sampler(&p, N), *b = new_sampler(&p, N);
		for (int rep = 0; rep < 200; rep++) {
			random_logits(l, N, 8.0f);
			memset(allow, 0, sizeof allow);
			memset(all, 0xff, sizeof all);
			/* a few allowed tokens, never the best: runs of words too */
			int n_allowed = 0;
			for (int t = 0; t < N; t++)
				if ((rep % 3 == 0 && t / 32 == rep % 20) || test_uniform() < 0.01) {
					allow[t / 32] |= 1u << (t % 32);
					n_allowed++;
				}
			if (!n_allowed) {
				allow[0] |= 1;
				n_allowed++;
			}
			for (int t = 0; t < N; t++)
				lm[t] = allow[t / 32] >> (t % 32) & 1 ? l[t] : -INFINITY;
			float lp = 1, top_lp[5];
			int32_t top_ids[5], n_top = 0;
			int32_t tok = sampler_sample_masked(s, l, allow, &lp, 5, top_ids, top_lp, &n_top);
			CHECK(tok >= 0 && tok < N && (allow[tok / 32] >> (tok % 32) & 1));
			if (path != 4 && tok >= 0 && tok < N)
				CHECK(fabs(lp - log_softmax(lm, N, tok)) < 1e-4);
			for (int i = 0; i < n_top && i < n_allowed; i++)
				CHECK(allow[top_ids[i] / 32] >> (top_ids[i] % 32) & 1);
			sampler_accept(s, tok);
			/* all allowed: the same draws as no mask */
			float lpa = 0, lpb = 0;
			int32_t ta = sampler_sample_masked(a, l, all, &lpa, 0, NULL, NULL, NULL);
			int32_t tb = sampler_sample(b, l, &lpb);
			CHECK_INT_EQ(ta, tb);
			CHECK(lpa == lpb);
			sampler_accept(a, ta);
			sampler_accept(b, tb);
		}
		sampler_free(s);
		sampler_free(a);
		sampler_free(b);
	}
}

/* sampler_sample_top: the K best tokens, best first (a tie: the lower id
 * first), each with its log-softmax, whatever the sampling settings; the
 * chosen token and its logprob as sampler_sample gives them. */
static void test_top_logprobs(void)
{
	enum { N = 5000 };
	static float l[N];
	int32_t ids[SAMPLER_MAX_TOP];
	float lps[SAMPLER_MAX_TOP];
	int32_t n_top = -1;

	for (int path = 0; path < 3; path++) {
		struct sampler_params p;
		sampler_params_default(&p);
		p.temperature = path == 0 ? 0.0f : 0.8f;
		p.top_k = path == 1 ? 40 : 0;
		struct sampler *s = new_sampler(&p, N), *s2 = new_sampler(&p, N);
		for (int rep = 0; rep < 10; rep++) {
			random_logits(l, N, 6.0f);
			l[17] = l[4000] = 30.0f; /* a tie at the top */
			float lp = 1.0f, lp2 = 1.0f;
			int32_t k = rep % 2 ? SAMPLER_MAX_TOP : 3;
			int32_t tok = sampler_sample_top(s, l, &lp, k, ids, lps, &n_top);
			int32_t tok2 = sampler_sample(s2, l, &lp2);
			CHECK_INT_EQ(tok, tok2);
			CHECK(lp == lp2);
			CHECK_INT_EQ(n_top, k);
			CHECK_INT_EQ(ids[0], 17);
			CHECK_INT_EQ(ids[1], 4000);
			for (int32_t i = 0; i < n_top; i++) {
				CHECK(fabs(lps[i] - log_softmax(l, N, ids[i])) < 1e-4);
				if (i > 0)
					CHECK(l[ids[i]] <= l[ids[i - 1]]);
			}
			/* nothing outside the list beats its last */
			int beats = 0;
			for (int i = 0; i < N; i++)
				beats += l[i] > l[ids[n_top - 1]];
			CHECK(beats <= n_top - 1);
			if (p.temperature == 0)
				CHECK(tok == ids[0] && fabs(lp - lps[0]) < 1e-6);
		}
		sampler_free(s);
		sampler_free(s2);
	}
	struct sampler_params p;
	sampler_params_default(&p);
	struct sampler *s = new_sampler(&p, N);
	CHECK_INT_EQ(sampler_sample_top(s, l, NULL, SAMPLER_MAX_TOP + 1, ids, lps, &n_top), -EINVAL);
	CHECK_INT_EQ(sampler_sample_top(s, l, NULL, 2, NULL, lps, &n_top), -EINVAL);
	sampler_free(s);
}

/* Not a pass/fail check (sanitizer builds are slow): prints the cost, the
 * best batch and the mean over all, since shared machines are noisy.  Every
 * line asks for the log-probability (a full softmax) unless it says not. */
static void bench(const char *what, struct sampler_params *p, int with_penalty_history,
		  int want_logprob)
{
	enum { N = 49152, BATCHES = 40, PER = 50 };
	static float l[N];
	/* roughly the shape of real logits: a few strong tokens over a wide tail */
	for (int i = 0; i < N; i++)
		l[i] = (float)((test_uniform() + test_uniform() + test_uniform() - 1.5) * 6);
	struct sampler *s = new_sampler(p, N);
	if (with_penalty_history)
		for (int i = 0; i < 64; i++)
			sampler_accept(s, (int32_t)(test_uniform() * N));
	float lp;
	int64_t sink = 0;
	double best = 1e9, total = 0;
	for (int b = 0; b < BATCHES; b++) {
		double t0 = clock_s();
		for (int r = 0; r < PER; r++) {
			l[(b * PER + r) % N] += 0.001f; /* keep the compiler honest */
			sink += sampler_sample(s, l, want_logprob ? &lp : NULL);
		}
		double dt = (clock_s() - t0) / PER;
		best = dt < best ? dt : best;
		total += dt;
	}
	printf("sampler: n_vocab %d, %-38s best %7.1f us, mean %7.1f us/sample%s\n", N, what,
	       best * 1e6, total / BATCHES * 1e6, sink < 0 ? " (!)" : "");
	sampler_free(s);
}

int main(void)
{
	test_bad_params();
	test_greedy_argmax_lowest_id_on_ties();
	test_top_k_1_is_greedy();
	test_seed_reproducible_and_distinct();
	test_copy_state();
	test_frequencies_match_softmax();
	test_top_p_and_min_p_exclusions();
	test_top_p_cut_inside_a_cluster();
	test_top_p_large_vocab_matches_sort();
	test_penalties();
	test_logprob_is_log_softmax();
	test_top_logprobs();
	test_masked();

	struct sampler_params p;
	sampler_params_default(&p);
	bench("defaults (k40 p0.95 m0.05 T0.8)", &p, 0, 1);
	bench("defaults, no logprob", &p, 0, 0);
	p.repeat_penalty = 1.1f;
	bench("defaults + repeat penalty, 64 history", &p, 1, 1);
	sampler_params_default(&p);
	p.top_k = 0;
	bench("top_k off (p0.95 m0.05)", &p, 0, 1);
	p.min_p = 0;
	bench("top_k off, min_p off (p0.95)", &p, 0, 1);
	p.top_p = 1;
	bench("all filters off (T0.8)", &p, 0, 1);
	p.temperature = 0;
	bench("greedy", &p, 0, 1);
	bench("greedy, no logprob", &p, 0, 0);
	return test_result();
}
