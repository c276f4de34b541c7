/* cuda_graphs.c - the CUDA backend's recorded decode steps: a step padded
 * to a bucket of rows and a power-of-two table stride, captured once per
 * shape as a CUDA graph and replayed.  The ops it records are cuda_backend.c's.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_private.h"

/* ---- graphs ---- */

/* Rows a graph of a step of N rows has: 1, 2, 4, 8, then multiples of 8. */
static int32_t cb_graph_rows(int32_t n)
{
	int32_t r = 1;

	if (n > 8)
		return (n + 7) / 8 * 8;
	while (r < n)
		r *= 2;
	return r;
}

void cb_graph_drop(struct cb_graph *g)
{
	if (g->exec)
		cudaGraphExecDestroy(g->exec);
	memset(g, 0, sizeof *g);
}

/* Fills the step buffers for ROWS padded to TB rows of STRIDE table entries:
 * ids 0, position -1 and an empty table for the spare rows. */
static int cb_graph_inputs(struct cuda_backend *cb, const struct bk_rows *rows, const int32_t *ids,
			   int32_t TB, int32_t stride)
{
	const int32_t bt = cb->kv_view.block_tokens;
	const size_t n_tab = (size_t)TB * (size_t)stride;
	const size_t bytes = (2 * (size_t)TB + n_tab) * sizeof(int32_t);
	int32_t *h_ids, *h_pos, *h_tab;
	int r;

	if ((r = cb_stage(cb, bytes)) < 0)
		return r;
	h_ids = cb->h_tables;
	h_pos = h_ids + TB;
	h_tab = h_pos + TB;
	for (int32_t t = 0; t < TB; t++) {
		h_ids[t] = t < rows->n ? ids[t] : 0;
		h_pos[t] = t < rows->n ? rows->pos[t] : -1;
	}
	cb_flatten_tables(rows, bt, stride, h_tab);
	memset(h_tab + (size_t)rows->n * stride, 0, (size_t)(TB - rows->n) * stride * sizeof(int32_t));
	if ((r = cb_grow(cb, (void **)&cb->d_ids, &cb->d_ids_cap, (size_t)TB * sizeof(int32_t))) < 0 ||
	    (r = cb_grow(cb, (void **)&cb->d_pos, &cb->d_pos_cap, (size_t)TB * sizeof(int32_t))) < 0 ||
	    (r = cb_grow(cb, (void **)&cb->d_tables, &cb->d_tables_cap, n_tab * sizeof(int32_t))) < 0)
		return r;
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_ids, h_ids, (size_t)TB * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos, h_pos, (size_t)TB * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_tables, h_tab, n_tab * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	cb->step_n = TB;
	cb->step_pos = rows->pos;
	cb->step_table = rows->block_table;
	cb->step_ids = ids;
	cb->step_bt = bt;
	cb->table_stride = stride;
	return 0;
}

int cb_graph_begin(struct backend *be, const struct bk_rows *rows, const int32_t *ids,
			  int32_t max_rows, int32_t *ret_rows)
{
	struct cuda_backend *cb = cbk(be);
	int32_t TB, need, stride = 4;
	size_t att;
	int r;

	if (cb->capturing)
		cb_graph_end(be, 1);
	/* the first steps run uncaptured: they attach the pool, upload every
	 * weight and show attention's shape, which size the buffers below;
	 * and every step when profiling (a replay hides its kernels) */
	if (!cb->kv_dev || !cb->has_attn || rows->n < 1 || rows->n > CB_GRAPH_MAX_ROWS || cb->prof)
		return 2;
	TB = cb_graph_rows(rows->n);
	if (TB > max_rows)
		TB = max_rows;
	if (TB < rows->n)
		return 2;
	need = cb_table_need(rows, cb->kv_view.block_tokens);
	while (stride < need)
		stride *= 2;
	att = cuda_attention_scratch_bytes(&cb->kv_view, &cb->attn, TB, stride, &cb->tuning);
	if (!att)
		return 2;
	if ((r = cb_use_device(cb)) < 0 ||
	    (r = cb_grow(cb, &cb->att_scratch, &cb->att_scratch_cap, att)) < 0 ||
	    (r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, cb->mm_row_bytes * (size_t)TB)) < 0 ||
	    (r = cb_grow(cb, &cb->gemm_scratch, &cb->gemm_scratch_cap,
			 (cb->half_row_bytes * (size_t)TB + 255) / 256 * 256)) < 0 ||
	    (r = cb_graph_inputs(cb, rows, ids, TB, stride)) < 0)
		return r;

	struct cb_graph *g = NULL;
	for (int i = 0; i < CB_N_GRAPHS; i++) {
		struct cb_graph *x = &cb->graphs[i];
		if (x->exec && x->gen != cb->buf_gen)
			cb_graph_drop(x);
		else if (x->exec && x->rows == TB && x->stride == stride)
			g = x;
	}
	*ret_rows = TB;
	if (g) {
		g->used = ++cb->clock;
		CB_CUDA(cb, cudaGraphLaunch(g->exec, cb->stream));
		return 1;
	}
	/* thread-local: another thread's CUDA calls do not spoil the capture */
	CB_CUDA(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
	cb->capturing = 1;
	return 0;
}

int cb_graph_end(struct backend *be, int failed)
{
	struct cuda_backend *cb = cbk(be);
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaError_t e;

	if (!cb->capturing)
		return 0;
	cb->capturing = 0;
	e = cudaStreamEndCapture(cb->stream, &graph);
	if (failed || e != cudaSuccess) {
		if (graph)
			cudaGraphDestroy(graph);
		return failed ? 0 : cb_fail_cuda(cb, "cudaStreamEndCapture", e);
	}
	e = cudaGraphInstantiate(&exec, graph, 0);
	cudaGraphDestroy(graph);
	if (e != cudaSuccess)
		return cb_fail_cuda(cb, "cudaGraphInstantiate", e);

	struct cb_graph *slot = &cb->graphs[0];
	for (int i = 0; i < CB_N_GRAPHS; i++) {
		if (!cb->graphs[i].exec) {
			slot = &cb->graphs[i];
			break;
		}
		if (cb->graphs[i].used < slot->used)
			slot = &cb->graphs[i];
	}
	cb_graph_drop(slot);
	slot->exec = exec;
	slot->rows = cb->step_n;
	slot->stride = cb->table_stride;
	slot->gen = cb->buf_gen;
	slot->used = ++cb->clock;
	CB_CUDA(cb, cudaGraphLaunch(exec, cb->stream));
	return 0;
}
