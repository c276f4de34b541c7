/* sampler.c - turns one logit vector into one token: penalties, then greedy
 * or top-k -> top-p -> min-p -> temperature -> a seeded draw (llama.cpp's
 * default chain), plus the token's log-probability.
 * A token mask (a grammar's) sets the logits it excludes to -inf first.
 * Not a configurable sampler chain: no DRY, mirostat or typical-p.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

/* Histogram that locates the top-p boundary without sorting the vocabulary:
 * bucket b holds the tokens with (max - logit) in [b, b + 1) * width. */
#define TOP_P_BUCKETS 256
#define TOP_P_RANGE 32.0f /* logits below max - 32 weigh < 1.3e-14 each: ignored */

struct cand {
	float logit; /* penalized logit */
	int32_t id;  /* token id */
};

struct sampler {
	struct sampler_params p; /* validated copy */
	int32_t n_vocab;         /* length of every logit vector */
	int penalize;            /* penalty_last_n > 0 and some penalty not neutral */
	uint64_t rng[4];         /* xoshiro256** state, seeded from p.seed */
	int32_t *recent;         /* (p.penalty_last_n) ring of accepted tokens; NULL if !penalize */
	int32_t n_recent;        /* valid entries in recent, <= p.penalty_last_n */
	int32_t recent_pos;      /* next slot of recent to overwrite */
	int32_t *count;          /* (n_vocab) occurrences in recent; all zero between calls */
	float *pen;              /* (n_vocab) penalized copy of the logits; NULL if !penalize */
	float *masked;           /* (n_vocab) the logits a mask left; NULL until one is used */
	float *w;                /* (n_vocab) scratch: unnormalized probabilities */
	struct cand *cand;       /* (n_vocab) scratch: surviving candidates */
};

/* ---- random numbers ---- */

/* splitmix64 expands the 64-bit seed into xoshiro's 256-bit state; both are
 * the public-domain generators of Blackman and Vigna, written out here so the
 * stream is the same on every machine and libc. */
static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
	uint64_t r = rotl64(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl64(s[3], 45);
	return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
	return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ---- vector helpers ---- */

/* The full-vocabulary passes use GCC/Clang generic vectors: 4 floats (one
 * SSE2 or NEON register) everywhere, 8 floats in the AVX2 build of the
 * exponential pass, picked at run time.  The auto-vectorizer cannot be relied
 * on for these reductions without -ffast-math.  Both builds perform the same
 * IEEE operations lane for lane, and sum in the same order, so the sums and
 * hence the draws do not depend on the machine. */
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
typedef uint32_t vu4 __attribute__((vector_size(16)));
typedef uint64_t vq2 __attribute__((vector_size(16)));
#define VINLINE static inline __attribute__((always_inline))

/* L[i..i+4), with lanes at or past N read as -inf. */
VINLINE vf4 load4(const float *l, int32_t i, int32_t n)
{
	vf4 v;
	if (i + 4 <= n) {
		memcpy(&v, l + i, sizeof v);
	} else {
		float t[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
		if (n > i)
			memcpy(t, l + i, (size_t)(n - i) * sizeof *t);
		memcpy(&v, t, sizeof v);
	}
	return v;
}

VINLINE int any4(vi4 mask)
{
	vq2 q = (vq2)mask;
	return (q[0] | q[1]) != 0;
}

/* e^x for x <= 0, within ~2 ulp of expf; 0 below -87 and for NaN.  Our own
 * polynomial rather than libm's expf so that it vectorizes and does not
 * depend on the libc.  Range reduction x = n ln2 + r, |r| <= ln2/2, a
 * degree-6 minimax polynomial for e^r evaluated by Estrin's scheme (short
 * dependency chains), then n added straight into the exponent bits (n >= -126
 * above -87: no denormals).  Written once for both vector widths. */
#define DEFINE_EXP_NEG(NAME, VF, VI, VU, ATTR)                                  \
	static inline __attribute__((always_inline)) ATTR VF NAME(VF x)         \
	{                                                                       \
		const float round_magic = 12582912.0f; /* 1.5 * 2^23 */         \
		VF t = x * 1.44269504088896341f + round_magic;                  \
		VF n = t - round_magic; /* x / ln2 rounded */                   \
		VF r = x - n * 0.693145751953125f - n * 1.428606765330187e-6f;  \
		VF r2 = r * r, r4 = r2 * r2;                                    \
		VF c01 = r * 1.6666665459e-1f + 5.0000001201e-1f;               \
		VF c23 = r * 8.3334519073e-3f + 4.1665795894e-2f;               \
		VF c45 = r * 1.9875691500e-4f + 1.3981999507e-3f;               \
		VF q = c01 + r2 * c23 + r4 * c45;                               \
		q = q * r2 + r + 1.0f;                                          \
		VU qb = (VU)q + (((VU)t - 0x4B400000u) << 23);                  \
		VI keep = x >= -87.0f;                                          \
		return (VF)((VI)qb & keep);                                     \
	}

DEFINE_EXP_NEG(exp_neg4, vf4, vi4, vu4, )

/* The same function for one value (lane 0 of the vector code). */
VINLINE float exp_neg(float x)
{
	vf4 v = { x };
	return exp_neg4(v)[0];
}

/* Largest logit, ignoring NaN; -INFINITY when there is none. */
static float max_logit(const float *l, int32_t n)
{
	vf4 m0 = load4(l, 0, 0), m1 = m0; /* all -inf; two chains for ILP */
	int32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		vf4 a, b;
		memcpy(&a, l + i, sizeof a);
		memcpy(&b, l + i + 4, sizeof b);
		vi4 ga = a > m0, gb = b > m1;
		m0 = (vf4)(((vi4)a & ga) | ((vi4)m0 & ~ga));
		m1 = (vf4)(((vi4)b & gb) | ((vi4)m1 & ~gb));
	}
	for (; i < n; i += 4) {
		vf4 a = load4(l, i, n);
		vi4 ga = a > m0;
		m0 = (vf4)(((vi4)a & ga) | ((vi4)m0 & ~ga));
	}
	float r = -INFINITY;
	for (int j = 0; j < 4; j++) {
		r = m0[j] > r ? m0[j] : r;
		r = m1[j] > r ? m1[j] : r;
	}
	return r;
}

/* The first i with L[i] == V, or N. */
static int32_t find_first(const float *l, int32_t n, float v)
{
	for (int32_t i = 0; i < n; i += 4) {
		if (!any4(load4(l, i, n) == v))
			continue;
		for (int32_t j = i; j < n; j++)
			if (l[j] == v)
				return j;
	}
	return n;
}

/* From I (a multiple of 16), the start of the first block of 16 logits that
 * holds one >= LOWER, or N; a partial last block is never skipped.  Lets the
 * scans below test 16 logits with a few vector compares when, as usual,
 * almost none pass. */
static int32_t skip_blocks(const float *l, int32_t n, float lower, int32_t i)
{
	for (; i + 16 <= n; i += 16) {
		vf4 a, b, c, d;
		memcpy(&a, l + i, sizeof a);
		memcpy(&b, l + i + 4, sizeof b);
		memcpy(&c, l + i + 8, sizeof c);
		memcpy(&d, l + i + 12, sizeof d);
		if (any4((a >= lower) | (b >= lower) | (c >= lower) | (d >= lower)))
			break;
	}
	return i;
}

/* sum over i of e^((l[i] - top) * scale), each term also stored in W unless
 * NULL.  Lane j of the eight partial sums takes the elements i = j mod 8
 * (the tail block padded with -inf, i.e. zeros); they are added in double
 * precision in lane order. */
static double sum_exp_vec4(const float *l, int32_t n, float top, float scale, float *w)
{
	vf4 lo = { 0 }, hi = { 0 }; /* lanes 0-3 and 4-7 */
	for (int32_t i = 0; i < n; i += 8) {
		vf4 a = exp_neg4((load4(l, i, n) - top) * scale);
		vf4 b = exp_neg4((load4(l, i + 4, n) - top) * scale);
		lo += a;
		hi += b;
		if (w && i + 8 <= n) {
			memcpy(w + i, &a, sizeof a);
			memcpy(w + i + 4, &b, sizeof b);
		} else if (w) {
			float t[8];
			memcpy(t, &a, sizeof a);
			memcpy(t + 4, &b, sizeof b);
			memcpy(w + i, t, (size_t)(n - i) * sizeof *w);
		}
	}
	double s = 0;
	for (int j = 0; j < 4; j++)
		s += lo[j];
	for (int j = 0; j < 4; j++)
		s += hi[j];
	return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define SAMPLER_AVX2 1
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint32_t vu8 __attribute__((vector_size(32)));

DEFINE_EXP_NEG(exp_neg8, vf8, vi8, vu8, __attribute__((target("avx2"))))

/* sum_exp_vec4 with one 8-lane register: the same lanes, the same sums.
 * No FMA on purpose: fused products would round differently. */
__attribute__((target("avx2")))
static double sum_exp_vec8(const float *l, int32_t n, float top, float scale, float *w)
{
	vf8 acc = { 0 };
	for (int32_t i = 0; i < n; i += 8) {
		vf8 v;
		if (i + 8 <= n) {
			memcpy(&v, l + i, sizeof v);
		} else {
			float t[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
				       -INFINITY, -INFINITY, -INFINITY, -INFINITY };
			memcpy(t, l + i, (size_t)(n - i) * sizeof *t);
			memcpy(&v, t, sizeof v);
		}
		vf8 e = exp_neg8((v - top) * scale);
		acc += e;
		if (w)
			memcpy(w + i, &e, (size_t)(n - i < 8 ? n - i : 8) * sizeof *w);
	}
	double s = 0;
	for (int j = 0; j < 8; j++)
		s += acc[j];
	return s;
}
#endif

static double sum_exp(const float *l, int32_t n, float top, float scale, float *w)
{
#ifdef SAMPLER_AVX2
	if (__builtin_cpu_supports("avx2"))
		return sum_exp_vec8(l, n, top, scale, w);
#endif
	return sum_exp_vec4(l, n, top, scale, w);
}

/* ---- candidates ---- */

/* A ranks below B: lower logit, or the same logit and a higher id. */
static inline int cand_below(const struct cand *a, const struct cand *b)
{
	return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

/* Best first: logit descending, id ascending. */
static int cand_cmp(const void *pa, const void *pb)
{
	const struct cand *a = pa, *b = pb;
	if (cand_below(a, b))
		return 1;
	if (cand_below(b, a))
		return -1;
	return 0;
}

/* H is a min-heap of size M with the lowest-ranked candidate at the root. */
static void heap_up(struct cand *h, int32_t i)
{
	while (i > 0) {
		int32_t parent = (i - 1) / 2;
		if (!cand_below(&h[i], &h[parent]))
			break;
		struct cand t = h[i];
		h[i] = h[parent];
		h[parent] = t;
		i = parent;
	}
}

static void heap_down(struct cand *h, int32_t m)
{
	int32_t i = 0;
	for (;;) {
		int32_t c = 2 * i + 1;
		if (c >= m)
			break;
		if (c + 1 < m && cand_below(&h[c + 1], &h[c]))
			c++;
		if (!cand_below(&h[c], &h[i]))
			break;
		struct cand t = h[i];
		h[i] = h[c];
		h[c] = t;
		i = c;
	}
}

/* The K best tokens into OUT, sorted best first, in one pass over the logits
 * and O(K) memory: a candidate enters the heap only when it beats the current
 * K-th best, which for K << n happens O(K log(n/K)) times.  Returns how many
 * (fewer than K only when there are fewer non-NaN logits). */
static int32_t select_top_k(const float *l, int32_t n, int32_t k, struct cand *out)
{
	int32_t m = 0, i = 0;
	for (; i < n && m < k; i++) {
		if (isnan(l[i]))
			continue;
		out[m] = (struct cand){ .logit = l[i], .id = i };
		heap_up(out, m);
		m++;
	}
	if (m == k) {
		float worst = out[0].logit;
		/* finish the partial block, then whole blocks of 16; once the
		 * heap is warm almost no block holds a better token */
		for (; i < n && i % 16; i++)
			if (l[i] > worst) {
				out[0] = (struct cand){ .logit = l[i], .id = i };
				heap_down(out, k);
				worst = out[0].logit;
			}
		/* >= in skip_blocks, > here: an equal logit has a higher id,
		 * so it ranks lower */
		while ((i = skip_blocks(l, n, nextafterf(worst, INFINITY), i)) < n)
			for (int32_t end = i + 16 < n ? i + 16 : n; i < end; i++)
				if (l[i] > worst) {
					out[0] = (struct cand){ .logit = l[i], .id = i };
					heap_down(out, k);
					worst = out[0].logit;
				}
	}
	qsort(out, (size_t)m, sizeof *out, cand_cmp);
	return m;
}

/* Bucket of a logit for top_p_full: its distance from the max in steps of
 * TOP_P_RANGE / TOP_P_BUCKETS, clamped to the last bucket. */
static inline int top_p_bucket(float top, float logit)
{
	float fb = (top - logit) * (TOP_P_BUCKETS / TOP_P_RANGE);
	return fb < TOP_P_BUCKETS - 1 ? (int)fb : TOP_P_BUCKETS - 1;
}

/* Top-p over the whole vocabulary without sorting it.  Only tokens within
 * TOP_P_RANGE of the max and above MIN_LOGIT (the min-p cut) count: both
 * filters keep a prefix of the sorted order, so cutting early changes
 * nothing, and the mass below max - 32 is < 2e-14 * n.  A histogram of
 * probability mass by distance from the max finds the bucket where the
 * cumulative mass reaches TOP_P * Z; only that bucket is sorted.  Leaves the
 * kept set in s->cand[0..*RET_M) (in no particular order) and the softmax
 * normalizer sum e^(l - top) in *RET_Z. */
static void top_p_full(struct sampler *s, const float *l, float top, float min_logit,
		       int32_t *ret_m, double *ret_z)
{
	double hist[TOP_P_BUCKETS] = { 0 };
	struct cand *c = s->cand;
	const float *w = s->w;
	int32_t n = s->n_vocab, m = 0, nb = 0;
	double z = sum_exp(l, n, top, 1.0f, s->w);
	float lower = top - TOP_P_RANGE;
	if (min_logit > lower)
		lower = min_logit;

	for (int32_t i = 0; (i = skip_blocks(l, n, lower, i)) < n;)
		for (int32_t end = i + 16 < n ? i + 16 : n; i < end; i++)
			if (l[i] >= lower)
				hist[top_p_bucket(top, l[i])] += w[i];

	double target = s->p.top_p * z, cum = 0;
	int edge = TOP_P_BUCKETS;
	for (int b = 0; b < TOP_P_BUCKETS; b++) {
		if (cum + hist[b] >= target) {
			edge = b;
			break;
		}
		cum += hist[b];
	}
	/* above the edge bucket: kept, to the front; in it: to the back.
	 * edge == TOP_P_BUCKETS: never reached top_p, keep all */
	if (edge < TOP_P_BUCKETS)
		lower = fmaxf(lower, top - (edge + 1) * (TOP_P_RANGE / TOP_P_BUCKETS));
	for (int32_t i = 0; (i = skip_blocks(l, n, lower, i)) < n;) {
		for (int32_t end = i + 16 < n ? i + 16 : n; i < end; i++) {
			/* branch-free: which tokens pass is unpredictable; both
			 * slots are free, as m + nb never exceeds the tokens seen */
			int b = top_p_bucket(top, l[i]), in = l[i] >= lower;
			struct cand t = { .logit = l[i], .id = i };
			c[m] = t;
			c[n - 1 - nb] = t;
			m += in & (b < edge);
			nb += in & (b == edge);
		}
	}
	struct cand *eb = c + n - nb;
	qsort(eb, (size_t)nb, sizeof *eb, cand_cmp);
	for (int32_t j = 0; j < nb; j++) {
		cum += w[eb[j].id];
		c[m++] = eb[j]; /* m <= n - nb + j: never overwrites unread eb */
		if (cum >= target)
			break;
	}
	*ret_m = m;
	*ret_z = z;
}

/* Draws one of C[0..M) with weights e^((logit - top) / T). */
static int32_t draw_cands(struct sampler *s, const struct cand *c, int32_t m, float top)
{
	float inv_t = 1.0f / s->p.temperature;
	float *w = s->w;
	int32_t i = 0;
	for (; i + 4 <= m; i += 4) {
		vf4 v = { c[i].logit, c[i + 1].logit, c[i + 2].logit, c[i + 3].logit };
		v = exp_neg4((v - top) * inv_t);
		memcpy(w + i, &v, sizeof v);
	}
	for (; i < m; i++)
		w[i] = exp_neg((c[i].logit - top) * inv_t);
	double sum = 0;
	for (i = 0; i < m; i++)
		sum += w[i];
	double target = rng_uniform(s->rng) * sum, cum = 0;
	for (i = 0; i < m; i++) {
		cum += w[i];
		if (cum > target)
			return c[i].id;
	}
	for (i = m - 1; i > 0; i--) /* rounding left target unreached */
		if (w[i] > 0)
			return c[i].id;
	return c[0].id;
}

/* Draws from the whole vocabulary with weights e^((l - top) / T). */
static int32_t draw_dense(struct sampler *s, const float *l, float top)
{
	int32_t n = s->n_vocab;
	double sum = sum_exp(l, n, top, 1.0f / s->p.temperature, s->w);
	double target = rng_uniform(s->rng) * sum, cum = 0;
	int32_t last = -1;
	for (int32_t i = 0; i < n; i++) {
		if (!(s->w[i] > 0))
			continue;
		cum += s->w[i];
		last = i;
		if (cum > target)
			return i;
	}
	return last >= 0 ? last : 0;
}

/* ---- penalties ---- */

/* Returns the logits to sample from: LOGITS itself, or s->pen with the
 * repeat / frequency / presence penalties applied to every token seen in the
 * last penalty_last_n accepted ones (llama.cpp's order and formulas). */
static const float *apply_penalties(struct sampler *s, const float *logits)
{
	if (!s->penalize || s->n_recent == 0)
		return logits;
	memcpy(s->pen, logits, (size_t)s->n_vocab * sizeof *s->pen);
	for (int32_t i = 0; i < s->n_recent; i++)
		s->count[s->recent[i]]++;
	for (int32_t i = 0; i < s->n_recent; i++) {
		int32_t t = s->recent[i];
		int32_t cnt = s->count[t];
		if (cnt == 0)
			continue; /* already done */
		float v = s->pen[t];
		v = v > 0 ? v / s->p.repeat_penalty : v * s->p.repeat_penalty;
		v -= (float)cnt * s->p.frequency_penalty + s->p.presence_penalty;
		s->pen[t] = v;
		s->count[t] = 0;
	}
	return s->pen;
}

/* Returns L with the tokens ALLOWED excludes at -inf, in s->masked.  Whole
 * words at once: a grammar's masks are mostly runs of all or nothing. */
static const float *apply_mask(struct sampler *s, const float *l, const uint32_t *allowed)
{
	float *o = s->masked;
	int32_t n = s->n_vocab;

	for (int32_t w = 0; w * 32 < n; w++) {
		int32_t base = w * 32, cnt = n - base < 32 ? n - base : 32;
		uint32_t bits = allowed[w];
		if (bits == 0xffffffffu && cnt == 32) {
			memcpy(o + base, l + base, 32 * sizeof *o);
		} else if (bits == 0) {
			for (int32_t i = 0; i < cnt; i++)
				o[base + i] = -INFINITY;
		} else {
			for (int32_t i = 0; i < cnt; i++)
				o[base + i] = bits >> i & 1 ? l[base + i] : -INFINITY;
		}
	}
	return o;
}

/* ---- the chain ---- */

/* s->cand[0..m) holds the top-k, best first; TOP is the best logit.  Top-p
 * renormalizes over these k (as llama.cpp does), min-p cuts relative to the
 * best, then one draw at the temperature. */
static int32_t sample_top_k(struct sampler *s, int32_t m, float top)
{
	const struct sampler_params *p = &s->p;
	struct cand *c = s->cand;
	if (p->top_p < 1) {
		double zk = 0, cum = 0;
		for (int32_t i = 0; i < m; i++) {
			s->w[i] = exp_neg(c[i].logit - top);
			zk += s->w[i];
		}
		for (int32_t i = 0; i < m; i++) {
			cum += s->w[i];
			if (cum >= p->top_p * zk) {
				m = i + 1;
				break;
			}
		}
	}
	if (p->min_p > 0) {
		float min_logit = top + logf(p->min_p);
		int32_t keep = 1;
		while (keep < m && c[keep].logit >= min_logit)
			keep++;
		m = keep;
	}
	return draw_cands(s, c, m, top);
}

/* No top-k: top-p and min-p over the whole vocabulary, then one draw.  Sets
 * *RET_Z to the softmax normalizer when it had to compute it anyway. */
static int32_t sample_full(struct sampler *s, const float *l, float top, double *ret_z)
{
	const struct sampler_params *p = &s->p;
	float min_logit = p->min_p > 0 ? top + logf(p->min_p) : -INFINITY;
	int32_t m = 0;
	if (p->top_p < 1) {
		top_p_full(s, l, top, min_logit, &m, ret_z);
	} else if (p->min_p > 0) {
		for (int32_t i = 0; i < s->n_vocab; i++)
			if (l[i] >= min_logit)
				s->cand[m++] = (struct cand){ .logit = l[i], .id = i };
	} else {
		return draw_dense(s, l, top);
	}
	return draw_cands(s, s->cand, m, top);
}

/* ---- public ---- */

void sampler_params_default(struct sampler_params *p)
{
	*p = (struct sampler_params){
		.temperature = 0.8f,
		.top_k = 40,
		.top_p = 0.95f,
		.min_p = 0.05f,
		.repeat_penalty = 1.0f,
		.presence_penalty = 0.0f,
		.frequency_penalty = 0.0f,
		.penalty_last_n = 64,
		.seed = 0,
	};
}

int sampler_params_check(const struct sampler_params *p, char *err, size_t errlen)
{
	const char *bad = NULL;

	if (!isfinite(p->temperature))
		bad = "temperature must be a finite number";
	else if (!(p->top_p > 0))
		bad = "top_p must be over 0";
	else if (!(p->min_p >= 0 && p->min_p <= 1))
		bad = "min_p must be in [0, 1]";
	else if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0))
		bad = "repeat_penalty must be a finite number over 0";
	else if (!isfinite(p->presence_penalty))
		bad = "presence_penalty must be a finite number";
	else if (!isfinite(p->frequency_penalty))
		bad = "frequency_penalty must be a finite number";
	if (bad) {
		snprintf(err, errlen, "%s", bad);
		return -EINVAL;
	}
	if (p->penalty_last_n < 0 || p->penalty_last_n > SAMPLER_MAX_LAST_N) {
		snprintf(err, errlen, "repeat_last_n %d is not in 0..%d", (int)p->penalty_last_n,
			 SAMPLER_MAX_LAST_N);
		return -EINVAL;
	}
	return 0;
}

int sampler_new(const struct sampler_params *p, int32_t n_vocab, struct sampler **ret)
{
	if (!p || !ret || n_vocab <= 0 || sampler_params_check(p, NULL, 0) < 0)
		return -EINVAL;
	struct sampler *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->p = *p;
	s->n_vocab = n_vocab;
	s->penalize = p->penalty_last_n > 0 &&
		(p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
		 p->frequency_penalty != 0.0f);
	uint64_t x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	s->w = malloc((size_t)n_vocab * sizeof *s->w);
	s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
	if (!s->w || !s->cand)
		goto fail;
	if (s->penalize) {
		s->recent = malloc((size_t)p->penalty_last_n * sizeof *s->recent);
		s->count = calloc((size_t)n_vocab, sizeof *s->count);
		s->pen = malloc((size_t)n_vocab * sizeof *s->pen);
		if (!s->recent || !s->count || !s->pen)
			goto fail;
	}
	*ret = s;
	return 0;
fail:
	sampler_free(s);
	return -ENOMEM;
}

void sampler_free(struct sampler *s)
{
	if (!s)
		return;
	free(s->recent);
	free(s->count);
	free(s->pen);
	free(s->masked);
	free(s->w);
	free(s->cand);
	free(s);
}

int sampler_dup(const struct sampler *src, struct sampler **ret)
{
	int r = sampler_new(&src->p, src->n_vocab, ret);

	if (r == 0)
		sampler_copy_state(*ret, src);
	return r;
}

int sampler_copy_state(struct sampler *dst, const struct sampler *src)
{
	if (!dst || !src || dst->n_vocab != src->n_vocab || dst->penalize != src->penalize ||
	    dst->p.penalty_last_n != src->p.penalty_last_n)
		return -EINVAL;
	memcpy(dst->rng, src->rng, sizeof dst->rng);
	if (src->penalize)
		memcpy(dst->recent, src->recent, (size_t)src->n_recent * sizeof *dst->recent);
	dst->n_recent = src->n_recent;
	dst->recent_pos = src->recent_pos;
	return 0;
}

int sampler_draws(const struct sampler *s)
{
	return s && s->p.temperature > 0;
}

void sampler_accept(struct sampler *s, int32_t token)
{
	if (!s || !s->penalize || token < 0 || token >= s->n_vocab)
		return;
	s->recent[s->recent_pos] = token;
	s->recent_pos = (s->recent_pos + 1) % s->p.penalty_last_n;
	if (s->n_recent < s->p.penalty_last_n)
		s->n_recent++;
}

int32_t sampler_sample_masked(struct sampler *s, const float *logits, const uint32_t *allowed,
			      float *ret_logprob, int32_t k, int32_t *top_ids, float *top_logprobs,
			      int32_t *ret_n_top)
{
	if (ret_n_top)
		*ret_n_top = 0;
	if (!s || !logits || k < 0 || k > SAMPLER_MAX_TOP || (k && (!top_ids || !top_logprobs || !ret_n_top)))
		return -EINVAL;
	if (allowed && !s->masked && !(s->masked = malloc((size_t)s->n_vocab * sizeof *s->masked)))
		return -ENOMEM;
	const struct sampler_params *p = &s->p;
	int32_t n = s->n_vocab;
	const float *l = apply_penalties(s, logits);
	if (allowed)
		l = apply_mask(s, l, allowed);
	int use_top_k = p->temperature > 0 && p->top_k > 0 && p->top_k < n;
	int32_t m = 0;
	double z = -1; /* softmax normalizer, when already known */
	int32_t tok;
	float top;

	if (use_top_k) {
		m = select_top_k(l, n, p->top_k, s->cand);
		top = m > 0 ? s->cand[0].logit : -INFINITY; /* the max, for free */
	} else {
		top = max_logit(l, n);
	}
	if (!isfinite(top)) {
		/* no usable logit (all NaN / -inf) or an infinite one: the first
		 * maximal token, without drawing */
		tok = find_first(l, n, top);
		if (tok == n)
			tok = 0;
		if (ret_logprob)
			*ret_logprob = top > 0 ? 0.0f : -INFINITY;
		if (k) { /* the chosen token alone is what there is to say */
			top_ids[0] = tok;
			top_logprobs[0] = top > 0 ? 0.0f : -INFINITY;
			*ret_n_top = 1;
		}
		return tok;
	}

	if (p->temperature <= 0)
		tok = find_first(l, n, top);
	else if (use_top_k)
		tok = sample_top_k(s, m, top);
	else
		tok = sample_full(s, l, top, &z);

	if (ret_logprob || k) {
		if (z < 0)
			z = sum_exp(l, n, top, 1.0f, NULL);
		if (ret_logprob)
			*ret_logprob = (float)((double)(l[tok] - top) - log(z));
	}
	if (k) {
		/* the sampling is done with s->cand: reuse it */
		int32_t m2 = select_top_k(l, n, k, s->cand);
		for (int32_t i = 0; i < m2; i++) {
			top_ids[i] = s->cand[i].id;
			top_logprobs[i] = (float)((double)(s->cand[i].logit - top) - log(z));
		}
		*ret_n_top = m2;
	}
	return tok;
}

int32_t sampler_sample_top(struct sampler *s, const float *logits, float *ret_logprob, int32_t k,
			   int32_t *top_ids, float *top_logprobs, int32_t *ret_n_top)
{
	return sampler_sample_masked(s, logits, NULL, ret_logprob, k, top_ids, top_logprobs, ret_n_top);
}

int32_t sampler_sample(struct sampler *s, const float *logits, float *ret_logprob)
{
	return sampler_sample_top(s, logits, ret_logprob, 0, NULL, NULL, NULL);
}
