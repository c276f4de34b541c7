/* cuda_backend.c - the backend ops table on CUDA: its lifecycle and
 * tuning, step buffers, the step's rows and the calls of the kernels'
 * extern "C" launchers (cuda_ops.h).  The weight cache is cuda_weights.c's,
 * the recorded steps cuda_graphs.c's, LLMD_CUDA_PROFILE cuda_profile.c's,
 * the helpers all of them use (errors, step buffers, block tables)
 * cuda_step.c's; cuda_private.h is what they share.
 *
 * Plain C against the CUDA runtime API, built twice: against the real
 * toolkit's headers next to the nvcc-built kernels (libcudabackend_gpu.a,
 * for GPUs), and against the CPU emulator's callable-from-C stand-ins
 * (libcudabackend.a, --enable-cuda-emu).  It holds no kernels and does not
 * choose what runs (engine.c does).
 *
 * Device memory: the engine uploads every weight and norm vector at start-up
 * (load_weight) and attaches the KV pool (kv_attach), so what the model takes
 * is known before the pool is sized and a model that does not fit fails
 * there; the ops find a weight's device copy by its host pointer (a small
 * open-addressing map, which also uploads what was not loaded first).  The
 * KV pool's device copy mirrors the host pool's geometry, keyed by its base,
 * and the host memfd pool is never touched (nor made resident); positions
 * and block tables go up once per step (begin_step).  Activations are
 * cudaMalloc'd by the engine through alloc.  Streams: every launch and copy
 * runs in order on the backend's own non-blocking stream; the host waits
 * only for the logits (download).  Threads: the device is made current on
 * the thread that runs a step (the engine is built on another).
 *
 * Graphs: a decode step (every row wants logits) is padded to a bucket of
 * rows (1, 2, 4, 8, then multiples of 8 up to CB_GRAPH_MAX_ROWS; spare rows
 * have position -1, which the kernels skip) and to a power-of-two table
 * stride, and recorded once per (rows, stride) as a CUDA graph; later steps
 * of that shape upload their ids, positions and tables into the same device
 * buffers and replay it, one launch instead of ~15 per layer.  A graph names
 * the step buffers it was recorded with, so it is dropped when one of them
 * is reallocated (buf_gen).  Prefill steps run uncaptured.
 *
 * Matmuls: quantized weights go through our integer kernels (matmul.cu),
 * bit for bit the CPU's and batch invariant.  F32, F16 and BF16 weights go
 * through cuBLAS; so do quantized ones in matmuls of at least gemm_rows rows
 * when that is set (the set_gemm_rows op): weight tiles dequantized to
 * f16 and cublasGemmEx with f32 accumulation, tensor cores for prefill, at
 * the price of batch invariance (a row's arithmetic then depends on the
 * rows beside it).  Recorded (decode) steps always take the integer kernels.
 * The op before an integer matmul (the norms, attention, swiglu: their
 * NEXT) quantizes its output for it in the same launch (cb_fuse_begin), so
 * the matmul's own quantization launch is skipped.
 *
 * Attention tiles a prefill chunk's rows (cuda_attention with the host's
 * rows); recorded steps keep one row per block.
 *
 * Profile: with LLMD_CUDA_PROFILE set (to anything but 0), every launch
 * and cuBLAS call is timed between two events in the stream, keyed by its
 * name, its rows (the step's) and, for matmuls, the weight's type and
 * shape; the host reads them at each step's download, and
 * the write_profile op gives the caller the table (time, calls, time
 * per call, and for matmuls the weight bytes streamed per second).  Graphs
 * are off then (a replay hides its kernels), and so is nothing else: the
 * same kernels, one step at a time.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "backend.h"
#include "cuda_private.h"
#include "cuda_ops.h"
#include "quant.h"

/* ---- errors ---- */

static int cb_fail_blas(struct cuda_backend *cb, const char *call, cublasStatus_t s)
{
	snprintf(cb->last_err, sizeof cb->last_err, "%s: %s", call, cublasGetStatusName(s));
	return -EIO;
}

/* A launcher's negative errno, named. */
int cb_launched(struct cuda_backend *cb, const char *call, int r)
{
	cb_prof_end(cb, call);
	cb->calls++;
	if (r < 0)
		snprintf(cb->last_err, sizeof cb->last_err, "%s: %s", call, strerror(-r));
	return r;
}

static void cb_set_gemm_rows(struct backend *be, int32_t rows)
{
	cbk(be)->gemm_rows = rows > 0 ? rows : 0;
}

static const char *cb_last_error(const struct backend *be)
{
	return ((const struct cuda_backend *)be)->last_err;
}

/* ---- the step's rows ---- */

static int cb_begin_step(struct backend *be, const struct bk_rows *rows)
{
	struct cuda_backend *cb = cbk(be);
	int r;

	if ((r = cb_use_device(cb)) < 0)
		return r;
	cb->step_n = rows->n;
	cb->step_pos = rows->pos;
	cb->step_table = rows->block_table;
	cb->step_ids = NULL;
	cb->step_bt = 0; /* tables are flattened at the first KV op, which knows block_tokens */
	if ((r = cb_grow(cb, (void **)&cb->d_pos, &cb->d_pos_cap, (size_t)rows->n * sizeof(int32_t))) < 0)
		return r;
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos, rows->pos, (size_t)rows->n * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	return 0;
}

/* Device positions and tables for ROWS (uploaded once per step). */
static int cb_rows(struct cuda_backend *cb, const struct bk_rows *rows, int32_t bt)
{
	int r;

	if (rows->n != cb->step_n || rows->pos != cb->step_pos || rows->block_table != cb->step_table) {
		/* ops called outside a step the engine began (tests, tools) */
		if ((r = cb_begin_step(&cb->be, rows)) < 0)
			return r;
	}
	if (cb->step_bt == bt)
		return 0;
	int32_t stride = cb_table_need(rows, bt);
	size_t bytes = (size_t)rows->n * (size_t)stride * sizeof(int32_t);
	if ((r = cb_stage(cb, bytes)) < 0)
		return r;
	cb_flatten_tables(rows, bt, stride, cb->h_tables);
	if ((r = cb_grow(cb, (void **)&cb->d_tables, &cb->d_tables_cap, bytes)) < 0)
		return r;
	/* from pageable memory: h_tables may be rewritten once this returns */
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_tables, cb->h_tables, bytes, cudaMemcpyHostToDevice,
				    cb->stream));
	cb->table_stride = stride;
	cb->step_bt = bt;
	return 0;
}

/* ---- the ops ---- */

static int cb_embed(struct backend *be, const struct bk_weight *w, const int32_t *ids, int32_t T,
		    float *out)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	int r;

	if ((r = cb_weight(cb, w, &dw)) < 0)
		return r;
	if (ids != cb->step_ids || T > cb->step_n) {
		if ((r = cb_grow(cb, (void **)&cb->d_ids, &cb->d_ids_cap, (size_t)T * sizeof(int32_t))) < 0)
			return r;
		CB_CUDA(cb, cudaMemcpyAsync(cb->d_ids, ids, (size_t)T * sizeof(int32_t),
					    cudaMemcpyHostToDevice, cb->stream));
	}
	return cb_launched(cb, "cuda_embed", CB_TIMED(cb, cuda_embed(&dw, cb->d_ids, T, out, &cb->launch)));
}

/* out (T, n_out) = x (T, n_in) · W^T for F32 weights, on cuBLAS: in
 * column-major terms out^T (n_out, T) = W (n_in, n_out)^T · x^T (n_in, T).
 * Pedantic fp32 (no TF32).  The reference cuBLAS of the emulator computes
 * each element alone (batch invariant); a real cuBLAS may pick algorithms
 * by T.  TODO(cuda): a batch-invariant F32/F16/BF16 kernel in matmul.cu. */
static int cb_matmul_f32(struct cuda_backend *cb, const struct bk_weight *dw, const float *x,
			 int32_t T, float *out)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t s;

	if (dw->row_bytes != (size_t)dw->n_in * sizeof(float) || dw->n_in > INT32_MAX ||
	    dw->n_out > INT32_MAX) {
		snprintf(cb->last_err, sizeof cb->last_err, "cublasGemmEx: padded F32 rows");
		return -ENOTSUP;
	}
	if (cb->prof)
		cb_prof_matmul(cb, &dw, 1);
	cb_prof_begin(cb);
	s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)dw->n_out, T, (int)dw->n_in, &one,
			 dw->data, CUDA_R_32F, (int)dw->n_in, x, CUDA_R_32F, (int)dw->n_in, &zero, out,
			 CUDA_R_32F, (int)dw->n_out, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
	cb_prof_end(cb, "cublasGemmEx");
	if (s != CUBLAS_STATUS_SUCCESS)
		return cb_fail_blas(cb, "cublasGemmEx", s);
	return 0;
}

/* out (T, n_out) = x · W^T on cuBLAS in half precision: x rounded to f16
 * (bf16 for BF16 weights) once, W as it is (F16, BF16) or dequantized to
 * f16 a tile of rows at a time, f32 accumulation and output.  With X NULL,
 * the scratch already holds x rounded for a weight of this type and n_in
 * (the rest of a matmul group): the scratch's size depends on those alone,
 * so it never grows (and loses them) between the group's weights. */
static int cb_matmul_half(struct cuda_backend *cb, const struct bk_weight *dw, const float *x,
			  int32_t T, float *out)
{
	const int bf16 = dw->type == QT_BF16, direct = dw->type == QT_F16 || bf16;
	const cudaDataType ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
	const int64_t n_in = dw->n_in, n_out = dw->n_out;
	const float one = 1.0f, zero = 0.0f;
	const size_t xb = ((size_t)T * (size_t)n_in * 2 + 255) / 256 * 256;
	int64_t tile = n_out;
	cublasStatus_t s;
	int r;

	if (n_in > INT32_MAX || n_out > INT32_MAX || (direct && dw->row_bytes != (size_t)n_in * 2)) {
		snprintf(cb->last_err, sizeof cb->last_err, "cublasGemmEx: %s weights of %lld x %lld",
			 direct ? "padded half" : "too large", (long long)n_out, (long long)n_in);
		return -ENOTSUP;
	}
	size_t need = xb;
	if (!direct) {
		tile = (int64_t)(CB_GEMM_TILE_BYTES / ((size_t)n_in * 2)) / 64 * 64;
		if (tile < 64)
			tile = 64;
		need += (size_t)tile * (size_t)n_in * 2; /* before the cut to n_out: see above */
		if (tile > n_out)
			tile = n_out;
	}
	if (!x && need > cb->gemm_scratch_cap) {
		snprintf(cb->last_err, sizeof cb->last_err, "internal error: no rounded rows to reuse");
		return -EIO;
	}
	if ((r = cb_grow(cb, &cb->gemm_scratch, &cb->gemm_scratch_cap, need)) < 0)
		return r;
	void *xh = cb->gemm_scratch, *wh = (char *)cb->gemm_scratch + xb;
	if (x && (r = cb_launched(cb, "cuda_to_half",
				  CB_TIMED(cb, cuda_to_half(x, (int64_t)T * n_in, bf16, xh, &cb->launch)))) < 0)
		return r;
	for (int64_t row0 = 0; row0 < n_out; row0 += tile) {
		const int64_t rows = n_out - row0 < tile ? n_out - row0 : tile;
		const void *a = (const char *)dw->data + (size_t)row0 * dw->row_bytes;
		if (!direct) {
			r = cb_launched(cb, "cuda_dequant_f16",
					CB_TIMED(cb, cuda_dequant_f16(dw, row0, rows, wh, &cb->launch)));
			if (r < 0)
				return r;
			a = wh;
		}
		/* column-major: out^T (rows, T) at out + row0, ld n_out */
		if (cb->prof)
			snprintf(cb->prof->next, sizeof cb->prof->next, "cublasGemmEx %s n_in=%lld n_out=%lld",
				 bf16 ? "bf16" : "f16", (long long)n_in, (long long)rows),
			cb->prof->next_bytes = (double)rows * (double)n_in * 2;
		cb_prof_begin(cb);
		s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, T, (int)n_in, &one, a, ht,
				 (int)n_in, xh, ht, (int)n_in, &zero, out + row0, CUDA_R_32F, (int)n_out,
				 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		cb_prof_end(cb, "cublasGemmEx");
		if (s != CUBLAS_STATUS_SUCCESS)
			return cb_fail_blas(cb, "cublasGemmEx", s);
	}
	return 0;
}

/* Whether device weight DW goes through cuBLAS in half precision for T rows. */
static int cb_mm_half(const struct cuda_backend *cb, const struct bk_weight *dw, int32_t T)
{
	return dw->type == QT_F16 || dw->type == QT_BF16 ||
	       (cb->gemm_rows > 0 && T >= cb->gemm_rows && !cb->capturing &&
		cuda_matmul_scratch_bytes(dw, 1) > 0);
}

/* Each weight on its path; runs of quantized ones of a type (a layer's q,
 * k and v; or of types that cuda_matmul_mixes) take one launch, and all
 * share one quantization of x (the weights share its type: Q4_K and Q6_K
 * both take Q8_K). */
static int cb_matmul(struct backend *be, const struct bk_weight *const *w, int nw, const float *x,
		     int32_t T, float *const *out)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw[CUDA_MM_GROUP];
	const struct bk_weight *run[CUDA_MM_GROUP];
	int r;

	int quantized = 0; /* x sits quantized in mm_scratch for this call */
	int halved = 0;    /* x sits rounded to half in gemm_scratch */
	/* the op before quantized x for us (cb_fuse_end), if nothing ran since */
	const int handed = cb->xq_src == x && cb->xq_T == T && cb->xq_calls == cb->calls;
	cb->xq_src = NULL;

	for (int k = 0; k < nw;) {
		if ((r = cb_weight(cb, w[k], &dw[0])) < 0)
			return r;
		if (dw[0].type == QT_F32) {
			r = cb_matmul_f32(cb, &dw[0], x, T, out[k]);
		} else if (cb_mm_half(cb, &dw[0], T)) {
			r = cb_matmul_half(cb, &dw[0], halved ? NULL : x, T, out[k]);
			halved = r == 0;
		} else if (dw[0].type == QT_Q5_0 || dw[0].type == QT_Q5_1) {
			snprintf(cb->last_err, sizeof cb->last_err,
				 "matmul: %s weights are not supported on CUDA yet",
				 qtype_get(dw[0].type) ? qtype_get(dw[0].type)->name : "these");
			r = -ENOTSUP;
		} else {
			/* this weight and those after it of its type, up to a launch's worth */
			int n = 1;
			run[0] = &dw[0];
			while (n < CUDA_MM_GROUP && k + n < nw && cuda_matmul_mixes(w[k + n]->type, dw[0].type, T, &cb->tuning)) {
				if ((r = cb_weight(cb, w[k + n], &dw[n])) < 0)
					return r;
				run[n] = &dw[n];
				n++;
			}
			size_t need = cuda_matmul_scratch_bytes(&dw[0], T);
			if (handed && dw[0].n_in == cb->xq_n && qtype_get(dw[0].type) &&
			    qtype_get(dw[0].type)->vec_type == cb->xq_vec)
				quantized = 1;
			if (cb->prof)
				cb_prof_matmul(cb, run, n);
			if (quantized || (r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, need)) == 0)
				r = cb_launched(cb, "cuda_matmul_q_group",
						CB_TIMED(cb, cuda_matmul_q_group(run, n, quantized ? NULL : x, T,
										 out + k, cb->mm_scratch,
										 &cb->launch)));
			if (r < 0)
				return r;
			quantized = 1;
			k += n;
			continue;
		}
		if (r < 0)
			return r;
		k++;
	}
	return 0;
}

/* Whether the op before NEXT's matmul may quantize its output (T rows of
 * N) for it: NEXT a weight that cb_matmul will run on its integer kernels
 * (those with a quantized scratch: Q4_0, Q4_1, Q8_0, the K-quants).  Then
 * 1, with mm_scratch grown for it, *RET_STRIDE its row stride and *DW the
 * device weight; else 0, or a negative errno. */
static int cb_fuse_begin(struct cuda_backend *cb, const struct bk_weight *next, int32_t T, int64_t n,
			 struct bk_weight *dw, size_t *ret_stride)
{
	const size_t stride = next && next->n_in == n ? cuda_matmul_scratch_bytes(next, 1) : 0;
	int r;

	if (!stride || T < 1)
		return 0;
	if ((r = cb_weight(cb, next, dw)) < 0)
		return r;
	if (cb_mm_half(cb, dw, T))
		return 0;
	if ((r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, stride * (size_t)T)) < 0)
		return r;
	*ret_stride = stride;
	return 1;
}

/* The launch R of a kernel that quantized OUT for DW (cb_fuse_begin): the
 * next cb_matmul on OUT takes mm_scratch as it is, if nothing runs before. */
static int cb_fuse_end(struct cuda_backend *cb, const char *call, int r, const float *out, int32_t T,
		       const struct bk_weight *dw)
{
	if ((r = cb_launched(cb, call, r)) < 0)
		return r;
	cb->xq_src = out;
	cb->xq_T = T;
	cb->xq_n = dw->n_in;
	cb->xq_vec = qtype_get(dw->type)->vec_type;
	cb->xq_calls = cb->calls;
	return 0;
}

/* RP with its frequency factors' device copy (uploaded at first use, like
 * a norm's) in *RET. */
static int cb_rope_dev(struct cuda_backend *cb, const struct bk_rope *rp, struct bk_rope *ret)
{
	void *dff;
	int r;

	*ret = *rp;
	if (!rp->freq_factors)
		return 0;
	if ((r = cb_device_copy(cb, rp->freq_factors, (size_t)(rp->n_rot / 2) * sizeof(float), &dff)) < 0)
		return r;
	ret->freq_factors = dff;
	return 0;
}

static int cb_rope(struct backend *be, float *x, int32_t T, int32_t n_head, int32_t head_dim,
		   const int32_t *pos, const struct bk_rope *rp)
{
	struct cuda_backend *cb = cbk(be);
	const int32_t *dpos = cb->d_pos;
	struct bk_rope drp;
	int r;

	if ((r = cb_rope_dev(cb, rp, &drp)) < 0)
		return r;
	if (pos != cb->step_pos || T > cb->step_n) {
		if ((r = cb_grow(cb, (void **)&cb->d_pos2, &cb->d_pos2_cap, (size_t)T * sizeof(int32_t))) < 0)
			return r;
		CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos2, pos, (size_t)T * sizeof(int32_t),
					    cudaMemcpyHostToDevice, cb->stream));
		dpos = cb->d_pos2;
	}
	return cb_launched(cb, "cuda_rope", CB_TIMED(cb, cuda_rope(x, T, n_head, head_dim, dpos, &drp,
								  &cb->launch)));
}

static int cb_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
		       const struct bk_rows *rows, const float *k, const float *v)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	int r;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0)
		return r;
	return cb_launched(cb, "cuda_kv_store",
			   CB_TIMED(cb, cuda_kv_store(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
						      cb->table_stride, k, v, &cb->launch)));
}

static int cb_rope_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
			    const struct bk_rows *rows, const struct bk_attn *a, const struct bk_rope *rp,
			    float *q, float *k, const float *v)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	struct bk_rope drp;
	int r;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0 ||
	    (r = cb_rope_dev(cb, rp, &drp)) < 0)
		return r;
	return cb_launched(cb, "cuda_rope_kv_store",
			   CB_TIMED(cb, cuda_rope_kv_store(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
							   cb->table_stride, a, &drp, q, k, v, &cb->launch)));
}

static int cb_attention(struct backend *be, const struct bk_kv *kv, int32_t layer,
			const struct bk_rows *rows, const struct bk_attn *a, const float *q, float *out,
			const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	struct bk_weight dw;
	size_t need, stride;
	int r, fused;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0 ||
	    (fused = r = cb_fuse_begin(cb, next, rows->n, (int64_t)a->n_head * a->head_dim, &dw, &stride)) < 0)
		return r;
	cb->attn = *a;
	cb->has_attn = 1;
	need = cuda_attention_scratch_bytes(&dkv, a, rows->n, cb->table_stride, &cb->tuning);
	if (!need) {
		snprintf(cb->last_err, sizeof cb->last_err, "cuda_attention: unsupported shapes");
		return -EINVAL;
	}
	if ((r = cb_grow(cb, &cb->att_scratch, &cb->att_scratch_cap, need)) < 0)
		return r;
	if (fused)
		return cb_fuse_end(cb, "cuda_attention_q8",
				   CB_TIMED(cb, cuda_attention_q8(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
								  cb->table_stride, a, q, out,
								  cb->capturing ? NULL : rows, cb->att_scratch,
								  qtype_get(dw.type)->vec_type, cb->mm_scratch,
								  stride, &cb->launch)),
				   out, rows->n, &dw);
	return cb_launched(cb, "cuda_attention",
			   CB_TIMED(cb, cuda_attention(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
						       cb->table_stride, a, q, out, cb->capturing ? NULL : rows,
						       cb->att_scratch, &cb->launch)));
}

/* The gated activation ACT, quantizing out for NEXT when it may. */
static int cb_glu(struct backend *be, int act, const float *g, const float *u, int64_t n, float *out,
		  const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	size_t stride;
	int r = 0;
	/* out as rows of next's input, when it is that */
	const int32_t T = next && next->n_in > 0 && n % next->n_in == 0 && n / next->n_in <= INT32_MAX
		? (int32_t)(n / next->n_in) : 0;

	if (T && (r = cb_fuse_begin(cb, next, T, next->n_in, &dw, &stride)) < 0)
		return r;
	if (r)
		return cb_fuse_end(cb, act == BK_ACT_GELU ? "cuda_geglu_q8" : "cuda_swiglu_q8",
				   CB_TIMED(cb, cuda_glu_q8(act, g, u, T, next->n_in, out,
							    qtype_get(dw.type)->vec_type, cb->mm_scratch,
							    stride, &cb->launch)),
				   out, T, &dw);
	return cb_launched(cb, act == BK_ACT_GELU ? "cuda_geglu" : "cuda_swiglu",
			   CB_TIMED(cb, cuda_glu(act, g, u, n, out, &cb->launch)));
}

static int cb_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		     const struct bk_weight *next)
{
	return cb_glu(be, BK_ACT_SILU, g, u, n, out, next);
}

static int cb_geglu(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		    const struct bk_weight *next)
{
	return cb_glu(be, BK_ACT_GELU, g, u, n, out, next);
}

static int cb_scale(struct backend *be, float *x, int64_t n, float s)
{
	return cb_launched(cbk(be), "cuda_scale", CB_TIMED(cbk(be), cuda_scale(x, n, s, &cbk(be)->launch)));
}

static int cb_add_bias(struct backend *be, float *x, const float *b, int32_t T, int64_t n)
{
	struct cuda_backend *cb = cbk(be);
	void *db;
	int r;

	if ((r = cb_device_copy(cb, b, (size_t)n * sizeof(float), &db)) < 0)
		return r;
	return cb_launched(cb, "cuda_add_bias", CB_TIMED(cb, cuda_add_bias(x, db, T, n, &cb->launch)));
}

static int cb_add(struct backend *be, float *x, const float *y, int64_t n)
{
	return cb_launched(cbk(be), "cuda_add", CB_TIMED(cbk(be), cuda_add(x, y, n, &cbk(be)->launch)));
}

/* add_rmsnorm, or rmsnorm with Y NULL (then x is only read), quantizing
 * out for NEXT when it may (cb_fuse_begin). */
static int cb_norm(struct backend *be, float *x, const float *y, const float *g, int32_t T, int64_t n,
		   float eps, float *out, const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	size_t stride;
	void *dg;
	int r;

	if ((r = cb_device_copy(cb, g, (size_t)n * sizeof(float), &dg)) < 0 ||
	    (r = cb_fuse_begin(cb, next, T, n, &dw, &stride)) < 0)
		return r;
	if (r) {
		const uint32_t vec = qtype_get(dw.type)->vec_type;
		return cb_fuse_end(cb, y ? "cuda_add_rmsnorm_q8" : "cuda_rmsnorm_q8",
				   y ? CB_TIMED(cb, cuda_add_rmsnorm_q8(x, y, dg, T, n, eps, out, vec, cb->mm_scratch, stride,
							   &cb->launch))
				     : CB_TIMED(cb, cuda_rmsnorm_q8(x, dg, T, n, eps, out, vec, cb->mm_scratch,
								    stride, &cb->launch)),
				   out, T, &dw);
	}
	if (y)
		return cb_launched(cb, "cuda_add_rmsnorm",
				   CB_TIMED(cb, cuda_add_rmsnorm(x, y, dg, T, n, eps, out, &cb->launch)));
	return cb_launched(cb, "cuda_rmsnorm",
			   CB_TIMED(cb, cuda_rmsnorm(x, dg, T, n, eps, out, &cb->launch)));
}

static int cb_rmsnorm(struct backend *be, const float *x, const float *g, int32_t T, int64_t n,
		      float eps, float *out, const struct bk_weight *next)
{
	return cb_norm(be, (float *)x, NULL, g, T, n, eps, out, next);
}

static int cb_add_rmsnorm(struct backend *be, float *x, const float *y, const float *g, int32_t T,
			  int64_t n, float eps, float *out, const struct bk_weight *next)
{
	return cb_norm(be, x, y, g, T, n, eps, out, next);
}

/* ---- memory hooks ---- */

static void *cb_alloc(struct backend *be, size_t bytes)
{
	struct cuda_backend *cb = cbk(be);
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);

	if (e != cudaSuccess) {
		cb_fail_cuda(cb, "cudaMalloc(activations)", e);
		return NULL;
	}
	return p;
}

static void cb_release(struct backend *be, void *p)
{
	if (p)
		cudaFree(p);
}

static int cb_copy_rows(struct backend *be, float *dst, const float *src, int64_t n)
{
	struct cuda_backend *cb = cbk(be);

	CB_CUDA(cb, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
				    cb->stream));
	return 0;
}

/* The host's only wait: the step's logits. */
static int cb_download(struct backend *be, void *host_dst, const void *src, size_t bytes)
{
	struct cuda_backend *cb = cbk(be);

	CB_CUDA(cb, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
	CB_CUDA(cb, cudaStreamSynchronize(cb->stream));
	cb_prof_read(cb);
	return 0;
}

static void cb_free(struct backend *be)
{
	struct cuda_backend *cb = cbk(be);

	if (!cb)
		return;
	cudaSetDevice(cb->device);
	if (cb->capturing)
		cb_graph_end(be, 1);
	cb_prof_free(cb);
	for (int i = 0; i < CB_N_GRAPHS; i++)
		cb_graph_drop(&cb->graphs[i]);
	for (size_t i = 0; i < cb->map_cap; i++)
		if (cb->map[i].host)
			cudaFree(cb->map[i].dev);
	free(cb->map);
	void *bufs[] = { cb->kv_dev, cb->d_pos, cb->d_tables, cb->d_ids, cb->d_pos2,
			 cb->mm_scratch, cb->att_scratch, cb->gemm_scratch, cb->blas_ws };
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		if (bufs[i])
			cudaFree(bufs[i]);
	free(cb->h_tables);
	if (cb->blas)
		cublasDestroy(cb->blas);
	if (cb->stream)
		cudaStreamDestroy(cb->stream);
	free(cb);
}

static int cb_device_info(struct backend *be, struct bk_device_info *ret)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cudaDeviceProp prop;
	size_t free_b = 0, total_b = 0;
	int r;

	if ((r = cb_use_device(cb)) < 0)
		return r;
	CB_CUDA(cb, cudaGetDeviceProperties(&prop, cb->device));
	CB_CUDA(cb, cudaMemGetInfo(&free_b, &total_b));
	snprintf(ret->name, sizeof ret->name, "%.127s", prop.name);
	ret->index = cb->device;
	ret->total_bytes = total_b;
	ret->free_bytes = free_b;
	return 0;
}

static const struct backend_ops cuda_ops = {
#ifdef LLMD_CUDA_EMU_H
	.name = "cuda-emu",
#else
	.name = "cuda",
#endif
	.free = cb_free,
	.device_info = cb_device_info,
	.embed = cb_embed,
	.rmsnorm = cb_rmsnorm,
	.matmul = cb_matmul,
	.rope = cb_rope,
	.kv_store = cb_kv_store,
	.attention = cb_attention,
	.swiglu = cb_swiglu,
	.geglu = cb_geglu,
	.add = cb_add,
	.scale = cb_scale,
	.add_bias = cb_add_bias,
	.alloc = cb_alloc,
	.release = cb_release,
	.begin_step = cb_begin_step,
	.copy_rows = cb_copy_rows,
	.download = cb_download,
	.graph_begin = cb_graph_begin,
	.graph_end = cb_graph_end,
	.load_weight = cb_load_weight,
	.kv_attach = cb_kv_attach,
	.add_rmsnorm = cb_add_rmsnorm,
	.rope_kv_store = cb_rope_kv_store,
	.last_error = cb_last_error,
	.write_profile = cb_write_profile,
	.set_gemm_rows = cb_set_gemm_rows,
};

int cuda_backend_emulated(void)
{
#ifdef LLMD_CUDA_EMU_H
	return 1;
#else
	return 0;
#endif
}

int cuda_backend_device_count(char *err, size_t errlen)
{
	cudaError_t e;
	int n = 0;

	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
		cudaGetLastError(); /* not sticky: clear it */
		snprintf(err, errlen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return -ENODEV;
	}
	if (n <= 0) {
		snprintf(err, errlen, "cudaGetDeviceCount: no CUDA device");
		return 0;
	}
	if (errlen)
		err[0] = 0;
	return n;
}

/* The launchers' view of the backend: its stream and TUNING (copied), PDL
 * where the device has it (compute capability 9.0 and up), its SMs. */
static void cb_tune(struct cuda_backend *cb, const struct cuda_tuning *tuning)
{
	int major = 0, sms = 0;

	if (tuning) {
		cb->tuning = *tuning;
	} else {
		cuda_tuning_defaults(&cb->tuning);
		cuda_tuning_from_env(&cb->tuning);
	}
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cb->device) != cudaSuccess)
		major = 0;
	if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cb->device) != cudaSuccess)
		sms = 0;
	cb->launch.stream = cb->stream;
	cb->launch.tuning = &cb->tuning;
	cb->launch.pdl = cb->tuning.pdl && major >= 9;
	cb->launch.sms = sms > 0 ? sms : 0;
}

int cuda_backend_new(int device, const struct cuda_tuning *tuning, struct backend **ret, char *err,
		     size_t errlen)
{
	struct cuda_backend *cb;
	cudaError_t e;
	cublasStatus_t s;
	char why[200];
	int n;

	if ((n = cuda_backend_device_count(why, sizeof why)) <= 0) {
		snprintf(err, errlen, "no usable CUDA device: %s", why);
		return -ENODEV;
	}
	if (device < 0 || device >= n) {
		snprintf(err, errlen, "CUDA device %d does not exist (%d found)", device, n);
		return -ENODEV;
	}
	if ((e = cudaSetDevice(device)) != cudaSuccess) {
		snprintf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
		return -EIO;
	}
	cb = calloc(1, sizeof *cb);
	if (!cb) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cb->be.ops = &cuda_ops;
	cb->device = device;
	if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		snprintf(err, errlen, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
		cb->stream = NULL;
		cb_free(&cb->be);
		return -EIO;
	}
	cb_tune(cb, tuning);
	cb_prof_new(cb);
	if ((e = cudaMalloc(&cb->blas_ws, CB_BLAS_WORKSPACE)) != cudaSuccess) {
		snprintf(err, errlen, "cudaMalloc(%u MiB cuBLAS workspace): %s", CB_BLAS_WORKSPACE >> 20,
			 cudaGetErrorString(e));
		cb->blas_ws = NULL;
		cb_free(&cb->be);
		return -ENOMEM;
	}
	if ((s = cublasCreate(&cb->blas)) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasCreate: %s", cublasGetStatusName(s));
		cb->blas = NULL;
		cb_free(&cb->be);
		return -EIO;
	}
	if ((s = cublasSetStream(cb->blas, cb->stream)) != CUBLAS_STATUS_SUCCESS ||
	    (s = cublasSetWorkspace(cb->blas, cb->blas_ws, CB_BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasSetStream/cublasSetWorkspace: %s", cublasGetStatusName(s));
		cb_free(&cb->be);
		return -EIO;
	}
	*ret = &cb->be;
	return 0;
}
