/* stepcost.c - the step-time model: a small robust least-squares fit over a
 * window of measured steps.  It only measures and predicts; what a
 * prediction should change is the scheduler's business (sched.c).
 *
 * The fit works on relative errors: with x = (1, rows, attended, context)
 * and y the measured seconds, it fits c to x / y . c = 1, each column
 * scaled to unit mean square so the ridge and the conditioning do not
 * depend on units.
 */
#include "stepcost.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define N_COEF 4
#define RIDGE 1e-3     /* pull towards the previous fit, against unit-scaled data */
#define HUBER_K 1.345  /* residuals past this many robust sigmas weigh less */
#define SIGMA_MIN 0.02 /* relative noise assumed at least: a near-exact fit
                          must not turn ordinary jitter into outliers */
#define IRLS_PASSES 3  /* least squares, then twice with Huber weights */
#define SECS_MIN 1e-6   /* a step measured faster is taken as this (clock granularity) */
#define AGE_FLOOR 0.01 /* the least weight age leaves a step: old prefill steps
                          still tell the terms apart among many decode steps */

void stepcost_init(struct stepcost *c)
{
	memset(c, 0, sizeof *c);
}

static void coef_get(const struct stepcost_coef *k, double v[N_COEF])
{
	v[0] = k->base_s;
	v[1] = k->row_s;
	v[2] = k->pos_s;
	v[3] = k->ctx_s;
}

static double clean(double x)
{
	return isfinite(x) && x > 0 ? x : 0;
}

/* ---- a bound-constrained 4-variable quadratic ---- */

/* Solves the K x K system M z = q in place (Gaussian elimination with
 * partial pivoting).  0, or -1 when M is singular. */
static int solve(int k, double m[N_COEF][N_COEF], double q[N_COEF], double z[N_COEF])
{
	for (int col = 0; col < k; col++) {
		int p = col;
		for (int r = col + 1; r < k; r++)
			if (fabs(m[r][col]) > fabs(m[p][col]))
				p = r;
		if (!(fabs(m[p][col]) > 1e-300))
			return -1;
		if (p != col) {
			for (int j = 0; j < k; j++) {
				double t = m[col][j];
				m[col][j] = m[p][j];
				m[p][j] = t;
			}
			double t = q[col];
			q[col] = q[p];
			q[p] = t;
		}
		for (int r = col + 1; r < k; r++) {
			double f = m[r][col] / m[col][col];
			for (int j = col; j < k; j++)
				m[r][j] -= f * m[col][j];
			q[r] -= f * q[col];
		}
	}
	for (int r = k - 1; r >= 0; r--) {
		double s = q[r];
		for (int j = r + 1; j < k; j++)
			s -= m[r][j] * z[j];
		z[r] = s / m[r][r];
	}
	return 0;
}

/* Minimizes z'Mz - 2q'z over z >= 0 for a positive definite M: the
 * minimum is the unconstrained minimum over some set of free coordinates
 * (the others 0) that lands in z >= 0, so try all 16 sets and keep the best
 * feasible one (z = 0, objective 0, always is). */
static void nnls(const double mm[N_COEF][N_COEF], const double q[N_COEF], double ret[N_COEF])
{
	double best = 0;

	memset(ret, 0, N_COEF * sizeof *ret);
	for (int set = 1; set < 1 << N_COEF; set++) {
		int idx[N_COEF], k = 0, ok = 1;
		double m[N_COEF][N_COEF], qq[N_COEF], zk[N_COEF], z[N_COEF] = { 0 }, f = 0;

		for (int j = 0; j < N_COEF; j++)
			if (set & 1 << j)
				idx[k++] = j;
		for (int a = 0; a < k; a++) {
			qq[a] = q[idx[a]];
			for (int b = 0; b < k; b++)
				m[a][b] = mm[idx[a]][idx[b]];
		}
		if (solve(k, m, qq, zk) < 0)
			continue;
		for (int a = 0; a < k; a++) {
			if (!isfinite(zk[a]) || zk[a] < 0)
				ok = 0;
			z[idx[a]] = zk[a];
		}
		if (!ok)
			continue;
		for (int a = 0; a < N_COEF; a++) {
			double mz = 0;
			for (int b = 0; b < N_COEF; b++)
				mz += mm[a][b] * z[b];
			f += z[a] * mz - 2 * q[a] * z[a];
		}
		if (f < best) {
			best = f;
			memcpy(ret, z, sizeof z);
		}
	}
}

/* ---- the fit ---- */

/* The K-th smallest of V[0..N-1] (reordering V), by quickselect. */
static double select_kth(double *v, int n, int k)
{
	int lo = 0, hi = n - 1;

	while (lo < hi) {
		double pivot = v[(lo + hi) / 2];
		int i = lo, j = hi;
		while (i <= j) {
			while (v[i] < pivot)
				i++;
			while (v[j] > pivot)
				j--;
			if (i <= j) {
				double t = v[i];
				v[i++] = v[j];
				v[j--] = t;
			}
		}
		if (k <= j)
			hi = j;
		else if (k >= i)
			lo = i;
		else
			break;
	}
	return v[k];
}

#define MAX_KEPT (STEPCOST_BUCKETS * STEPCOST_PER_BUCKET)

static void refit(struct stepcost *c)
{
	double v[MAX_KEPT][N_COEF], age[MAX_KEPT], h[MAX_KEPT], res[MAX_KEPT], scratch[MAX_KEPT];
	double prev[N_COEF], coef[N_COEF];
	int n = 0;

	coef_get(&c->coef, prev);
	for (int k = 0; k < STEPCOST_BUCKETS; k++)
		for (int e = 0; e < c->fill[k]; e++, n++) {
			const struct stepcost_sample *p = &c->s[k][e];
			for (int j = 0; j < N_COEF; j++)
				v[n][j] = p->x[j] / p->secs;
			age[n] = exp2(-(double)(c->samples - p->seq) / STEPCOST_HALF_LIFE);
			if (age[n] < AGE_FLOOR)
				age[n] = AGE_FLOOR;
			h[n] = age[n];
		}
	if (n == 0)
		return;
	for (int pass = 0; pass < IRLS_PASSES; pass++) {
		double scale[N_COEF], inv[N_COEF], m[N_COEF][N_COEF] = { { 0 } }, q[N_COEF] = { 0 };
		double z[N_COEF];
		double hs = 0;

		for (int i = 0; i < n; i++)
			hs += h[i];
		for (int j = 0; j < N_COEF; j++) {
			double ss = 0;
			for (int i = 0; i < n; i++)
				ss += h[i] * v[i][j] * v[i][j];
			scale[j] = sqrt(ss / hs);
			if (!(scale[j] > 0) || !isfinite(scale[j]))
				scale[j] = 1;
			inv[j] = 1 / scale[j];
		}
		for (int i = 0; i < n; i++) {
			double u[N_COEF];
			for (int a = 0; a < N_COEF; a++)
				u[a] = v[i][a] * inv[a];
			for (int a = 0; a < N_COEF; a++) {
				q[a] += h[i] * u[a];
				for (int b = a; b < N_COEF; b++)
					m[a][b] += h[i] * u[a] * u[b];
			}
		}
		for (int a = 0; a < N_COEF; a++)
			for (int b = 0; b < a; b++)
				m[a][b] = m[b][a];
		for (int a = 0; a < N_COEF; a++) {
			q[a] = q[a] / hs + RIDGE * prev[a] * scale[a];
			for (int b = 0; b < N_COEF; b++)
				m[a][b] /= hs;
			m[a][a] += RIDGE;
		}
		nnls(m, q, z);
		for (int j = 0; j < N_COEF; j++)
			coef[j] = z[j] / scale[j];
		if (pass == IRLS_PASSES - 1)
			break;
		/* Huber weights from the relative residuals and their robust
		 * spread (1.4826 * the median absolute residual) */
		for (int i = 0; i < n; i++) {
			double fit = 0;
			for (int j = 0; j < N_COEF; j++)
				fit += v[i][j] * coef[j];
			res[i] = fabs(1 - fit);
		}
		memcpy(scratch, res, (size_t)n * sizeof *res);
		double sigma = 1.4826 * select_kth(scratch, n, n / 2); /* the upper median */
		if (!(sigma > SIGMA_MIN))
			sigma = SIGMA_MIN;
		for (int i = 0; i < n; i++)
			h[i] = age[i] * (res[i] <= HUBER_K * sigma ? 1 : HUBER_K * sigma / res[i]);
	}
	for (int j = 0; j < N_COEF; j++)
		if (!isfinite(coef[j]) || coef[j] < 0)
			return; /* keep the last good fit */
	c->coef.base_s = coef[0];
	c->coef.row_s = coef[1];
	c->coef.pos_s = coef[2];
	c->coef.ctx_s = coef[3];
}

int stepcost_add(struct stepcost *c, const struct stepcost_step *st, double secs)
{
	int k = 0;

	if (st->rows < 1 || st->context < st->rows || st->attended < st->context ||
	    !isfinite(secs) || !(secs > 0))
		return -EINVAL;
	if (secs < SECS_MIN)
		secs = SECS_MIN;
	while (k < STEPCOST_BUCKETS - 1 && st->rows >> (k + 1))
		k++;
	c->s[k][c->next[k]] = (struct stepcost_sample){
		.x = { 1, st->rows, (double)st->attended, (double)st->context },
		.secs = secs, .seq = c->samples + 1,
	};
	c->next[k] = (c->next[k] + 1) % STEPCOST_PER_BUCKET;
	if (c->fill[k] < STEPCOST_PER_BUCKET) {
		c->fill[k]++;
		c->n++;
	}
	c->samples++;
	if (st->rows > c->max_rows)
		c->max_rows = st->rows;
	return 0;
}

void stepcost_fit(struct stepcost *c)
{
	if (!c->pinned)
		refit(c);
}

double stepcost_predict(const struct stepcost *c, const struct stepcost_step *st)
{
	double t = c->coef.base_s;

	if (st->rows > 0)
		t += c->coef.row_s * st->rows;
	if (st->attended > 0)
		t += c->coef.pos_s * (double)st->attended;
	if (st->context > 0)
		t += c->coef.ctx_s * (double)st->context;
	return t;
}

int stepcost_ready(const struct stepcost *c)
{
	return c->pinned || c->n >= STEPCOST_MIN_SAMPLES;
}

int32_t stepcost_seen(const struct stepcost *c, int32_t lo, int32_t hi)
{
	int32_t n = 0;

	if (c->pinned)
		return INT32_MAX;
	for (int b = 0; b < STEPCOST_BUCKETS; b++)
		for (int32_t i = 0; i < c->fill[b]; i++)
			n += c->s[b][i].x[1] >= lo && c->s[b][i].x[1] <= hi;
	return n;
}

void stepcost_pin(struct stepcost *c, const struct stepcost_coef *coef)
{
	if (!coef) {
		c->pinned = 0;
		refit(c);
		return;
	}
	c->pinned = 1;
	c->coef.base_s = clean(coef->base_s);
	c->coef.row_s = clean(coef->row_s);
	c->coef.pos_s = clean(coef->pos_s);
	c->coef.ctx_s = clean(coef->ctx_s);
}
