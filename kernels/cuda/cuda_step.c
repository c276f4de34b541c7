/* cuda_step.c - what every file of the CUDA backend uses: a runtime
 * failure named in last_err, the step buffers that grow, the device made
 * current, and the step's block tables flattened for upload.  No ops and
 * no kernels: cuda_backend.c, cuda_weights.c and cuda_graphs.c build on it.
 * Engine thread.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda_private.h"

/* ---- errors ---- */

int cb_fail_cuda(struct cuda_backend *cb, const char *call, cudaError_t e)
{
	snprintf(cb->last_err, sizeof cb->last_err, "%s: %s (%s)", call, cudaGetErrorString(e),
		 cudaGetErrorName(e));
	return -EIO;
}

/* ---- step buffers ---- */

/* Makes *P hold at least NEED bytes (contents not kept). */
int cb_grow(struct cuda_backend *cb, void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	if (cb->capturing) { /* graph_begin sized everything first */
		snprintf(cb->last_err, sizeof cb->last_err,
			 "internal error: a step buffer (%zu bytes, %zu needed) would grow while a "
			 "CUDA graph is being recorded", *cap, need);
		return -EIO;
	}
	cb->buf_gen++; /* recorded graphs may name the old buffer */
	if (*p) {
		void *old = *p;
		*p = NULL;
		*cap = 0;
		CB_CUDA(cb, cudaFree(old));
	}
	need = need < 256 ? 256 : need + need / 2;
	CB_CUDA(cb, cudaMalloc(p, need));
	*cap = need;
	return 0;
}

/* Makes the backend's device current on the calling thread: the engine is
 * built on one thread and its steps run on another. */
int cb_use_device(struct cuda_backend *cb)
{
	CB_CUDA(cb, cudaSetDevice(cb->device));
	return 0;
}

/* ---- the step's rows ---- */

/* Makes the host staging buffer (h_tables) hold at least BYTES. */
int cb_stage(struct cuda_backend *cb, size_t bytes)
{
	if (bytes <= cb->h_tables_cap)
		return 0;
	int32_t *h = realloc(cb->h_tables, bytes);
	if (!h) {
		snprintf(cb->last_err, sizeof cb->last_err, "out of memory");
		return -ENOMEM;
	}
	cb->h_tables = h;
	cb->h_tables_cap = bytes;
	return 0;
}

/* Table entries the longest of ROWS' tables needs (positions 0..pos, BT
 * positions a block). */
int32_t cb_table_need(const struct bk_rows *rows, int32_t bt)
{
	int32_t need = 1;

	for (int32_t t = 0; t < rows->n; t++)
		if (rows->pos[t] / bt + 1 > need)
			need = rows->pos[t] / bt + 1;
	return need;
}

/* ROWS' block tables into DST, STRIDE entries each; the entries past a
 * row's position are 0 (never read). */
void cb_flatten_tables(const struct bk_rows *rows, int32_t bt, int32_t stride, int32_t *dst)
{
	for (int32_t t = 0; t < rows->n; t++, dst += stride) {
		int32_t need = rows->pos[t] / bt + 1;
		memcpy(dst, rows->block_table[t], (size_t)need * sizeof(int32_t));
		memset(dst + need, 0, (size_t)(stride - need) * sizeof(int32_t));
	}
}
