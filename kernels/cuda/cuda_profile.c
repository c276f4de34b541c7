/* cuda_profile.c - LLMD_CUDA_PROFILE: every launch and cuBLAS call of the
 * CUDA backend timed between two events in its stream, and the table the
 * write_profile op gives.  It launches nothing and chooses nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_private.h"
#include "quant.h"

/* Adds the pending launches' times to their keys (waits for the last). */
void cb_prof_read(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p || !p->n)
		return;
	if (cudaEventSynchronize(p->ev[2 * p->n - 1]) != cudaSuccess) {
		p->n = 0; /* lost (the step failed too); the slots are free again */
		return;
	}
	for (int i = 0; i < p->n; i++) {
		float ms = 0;
		if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess)
			p->keys[p->key[i]].ms += ms;
	}
	p->n = 0;
}

/* Before a launch: its start event (launched steps only). */
void cb_prof_begin(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p || cb->capturing)
		return;
	if (p->n == CB_PROF_PENDING)
		cb_prof_read(cb);
	p->open = cudaEventRecord(p->ev[2 * p->n], cb->stream) == cudaSuccess;
}

/* After it: its end event, and its key (CALL, or the one set in next). */
void cb_prof_end(struct cuda_backend *cb, const char *call)
{
	struct cb_prof *p = cb->prof;
	char name[128];
	int k;

	if (!p || !p->open)
		return;
	p->open = 0;
	if (cudaEventRecord(p->ev[2 * p->n + 1], cb->stream) != cudaSuccess)
		return;
	snprintf(name, sizeof name, "%.100s T=%d", p->next[0] ? p->next : call, (int)cb->step_n);
	for (k = 0; k < p->n_keys && strcmp(p->keys[k].name, name); k++)
		;
	if (k == p->n_keys) {
		if (k == CB_PROF_KEYS) { /* the last collects the rest */
			k = CB_PROF_KEYS - 1;
			snprintf(p->keys[k].name, sizeof p->keys[k].name, "(more kinds of launch)");
		} else {
			snprintf(p->keys[p->n_keys++].name, sizeof p->keys[0].name, "%s", name);
		}
	}
	p->keys[k].calls++;
	p->keys[k].bytes += p->next_bytes;
	p->key[p->n++] = k;
	p->next[0] = 0;
	p->next_bytes = 0;
}

static int cb_prof_cmp(const void *a, const void *b)
{
	double x = ((const struct cb_prof_key *)a)->ms, y = ((const struct cb_prof_key *)b)->ms;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* The events go (NULL-safe). */
void cb_prof_free(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p)
		return;
	for (int i = 0; i < 2 * CB_PROF_PENDING; i++)
		if (p->ev[i])
			cudaEventDestroy(p->ev[i]);
	free(p);
	cb->prof = NULL;
}

int cb_write_profile(struct backend *be, FILE *f)
{
	struct cuda_backend *cb = cbk(be);
	struct cb_prof *p = cb->prof;
	double total = 0;

	if (cb->prof_failed)
		fprintf(f, "llmd cuda profile (LLMD_CUDA_PROFILE): none, cudaEventCreate failed\n");
	if (!p)
		return -ENODATA;
	cb_prof_read(cb);
	qsort(p->keys, (size_t)p->n_keys, sizeof p->keys[0], cb_prof_cmp);
	for (int k = 0; k < p->n_keys; k++)
		total += p->keys[k].ms;
	fprintf(f, "llmd cuda profile (LLMD_CUDA_PROFILE): %.3f ms in %d kinds of launch\n"
		"%10s %6s %8s %10s %7s  %s\n", total, p->n_keys, "ms", "%", "calls", "us/call", "GB/s",
		"launch (T = the step's rows)");
	for (int k = 0; k < p->n_keys; k++) {
		const struct cb_prof_key *e = &p->keys[k];
		char bw[16] = "";
		if (e->bytes > 0 && e->ms > 0)
			snprintf(bw, sizeof bw, "%7.0f", e->bytes / (e->ms * 1e-3) / 1e9);
		fprintf(f, "%10.3f %6.2f %8llu %10.2f %7s  %s\n", e->ms,
			total > 0 ? 100.0 * e->ms / total : 0.0, (unsigned long long)e->calls,
			e->calls ? 1e3 * e->ms / (double)e->calls : 0.0, bw, e->name);
	}
	return 0;
}

/* LLMD_CUDA_PROFILE: the events, made once. */
void cb_prof_new(struct cuda_backend *cb)
{
	const char *v = getenv("LLMD_CUDA_PROFILE");

	if (!v || !*v || !strcmp(v, "0") || !(cb->prof = calloc(1, sizeof *cb->prof)))
		return;
	for (int i = 0; i < 2 * CB_PROF_PENDING; i++)
		if (cudaEventCreate(&cb->prof->ev[i]) != cudaSuccess) {
			cb->prof->ev[i] = NULL;
			cb_prof_free(cb);
			cb->prof_failed = 1;
			return;
		}
}

/* The next launch's key: matmul TYPE n_in=N n_out=A+B+..., TYPE the
 * weights' types in order of first appearance ("Q4_K+Q6_K" for a mixed
 * launch), and its bytes. */
void cb_prof_matmul(struct cuda_backend *cb, const struct bk_weight *const *w, int n)
{
	struct cb_prof *p = cb->prof;
	size_t len = (size_t)snprintf(p->next, sizeof p->next, "matmul ");

	for (int i = 0; i < n; i++) {
		const struct qtype_info *qt = qtype_get(w[i]->type);
		int seen = 0;
		for (int j = 0; j < i; j++)
			seen |= w[j]->type == w[i]->type;
		if (!seen && len < sizeof p->next)
			len += (size_t)snprintf(p->next + len, sizeof p->next - len, "%s%s", i ? "+" : "",
						qt ? qt->name : "?");
	}
	if (len < sizeof p->next)
		len += (size_t)snprintf(p->next + len, sizeof p->next - len, " n_in=%lld n_out=",
					(long long)w[0]->n_in);
	p->next_bytes = 0;
	for (int i = 0; i < n; i++) {
		if (len < sizeof p->next)
			len += (size_t)snprintf(p->next + len, sizeof p->next - len, "%s%lld", i ? "+" : "",
						(long long)w[i]->n_out);
		p->next_bytes += (double)w[i]->n_out * (double)w[i]->row_bytes;
	}
}
