/* cuda_ops.h - the CUDA backend's kernels as C sees them: one extern "C"
 * launcher per op, each in its own kernels/cuda/<op>.cu next to its
 * kernels.  A launcher computes the grid, block and shared-memory sizes,
 * launches through LAUNCH() on STREAM (a cudaStream_t; NULL = the default
 * stream) and returns 0, or a negative errno when the arguments are out of
 * the kernel's range (-EINVAL, -ENOTSUP) or the launch failed (-EIO).  Every
 * pointer is a device pointer.  The same source runs on a GPU (nvcc) and on
 * the CPU in tests (the emulator in kernels/cuda/emu).
 *
 * Layouts are the CPU backend's (kernels/backend.h): activations row-major
 * (T, n) floats; weights in their ggml block format, N_OUT rows of
 * ROW_BYTES; the paged KV pool exactly as struct bk_kv describes it, with
 * BASE a device pointer.  A step's rows name their position and their
 * sequence's block table: row t's table is TABLES + t * TABLE_STRIDE
 * (int32 block ids covering positions 0..pos[t]).  A row whose position is
 * negative is padding (a captured graph's spare rows): kv_store writes
 * nothing for it, attention gives it zeros and reads nothing of its table.
 *
 * Every op keeps each row's arithmetic independent of T and of the other
 * rows (batch invariance), like the CPU backend.
 */
#ifndef LLMD_CUDA_OPS_H
#define LLMD_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element-wise and row ops (kernels/cuda/rows.cu) ---- */

/* out (T, n_in) = rows IDS of W, dequantized (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q4_K, Q5_K, Q6_K). */
int cuda_embed(const struct bk_weight *w, const int32_t *ids, int32_t T, float *out, void *stream);
/* out (T, n) = x / rms(x) * g; out may equal x. */
int cuda_rmsnorm(const float *x, const float *g, int32_t T, int64_t n, float eps, float *out,
		 void *stream);
/* Rotates the first n_rot dims of every head of x (T, n_head * head_dim) in place. */
int cuda_rope(float *x, int32_t T, int32_t n_head, int32_t head_dim, int32_t n_rot,
	      const int32_t *pos, float freq_base, enum bk_rope_style style, void *stream);
/* out (n) = silu(g) * u; out may equal g. */
int cuda_swiglu(const float *g, const float *u, int64_t n, float *out, void *stream);
/* cuda_swiglu of T rows of N_IN that also quantizes out as
 * cuda_add_rmsnorm_q8 does (VEC, XQ, STRIDE and the limits on N_IN as
 * there), with cuda_swiglu's bits in out. */
int cuda_swiglu_q8(const float *g, const float *u, int32_t T, int64_t n_in, float *out, uint32_t vec,
		   void *xq, size_t stride, void *stream);
/* x (n) += y. */
int cuda_add(float *x, const float *y, int64_t n, void *stream);
/* x (T, n) += y, then out = x / rms(x) * g: cuda_add and cuda_rmsnorm in
 * one launch, with their bits.  out may equal x or y. */
int cuda_add_rmsnorm(float *x, const float *y, const float *g, int32_t T, int64_t n, float eps,
		     float *out, void *stream);
/* cuda_add_rmsnorm that also quantizes out, in the same launch, into the
 * rows of VEC (QT_Q8_0, QT_Q8_1 or QT_Q8_K) cuda_matmul_q_group reads from
 * its SCRATCH (XQ, rows STRIDE = cuda_matmul_scratch_bytes(w, 1) bytes
 * apart, 16-byte aligned), with the bytes its own quantizer writes: the
 * matmul of a weight of that vec type and n_in N may then run with X NULL.
 * N must be a whole number of VEC's blocks (32, or 256 for Q8_K). */
int cuda_add_rmsnorm_q8(float *x, const float *y, const float *g, int32_t T, int64_t n, float eps,
			float *out, uint32_t vec, void *xq, size_t stride, void *stream);
/* cuda_rmsnorm that also quantizes out as cuda_add_rmsnorm_q8 does. */
int cuda_rmsnorm_q8(const float *x, const float *g, int32_t T, int64_t n, float eps, float *out,
		    uint32_t vec, void *xq, size_t stride, void *stream);
/* out (n_rows, w->n_in) __half = rows ROW0.. of W as cuda_embed dequantizes
 * them, each rounded to nearest even f16: weight tiles for cuBLAS. */
int cuda_dequant_f16(const struct bk_weight *w, int64_t row0, int64_t n_rows, void *out,
		     void *stream);
/* out (n) = x rounded to nearest even __half, or __nv_bfloat16 with BF16. */
int cuda_to_half(const float *x, int64_t n, int bf16, void *out, void *stream);

/* ---- the paged KV pool (kernels/cuda/attention.cu) ---- */

/* Writes k, v (T, kv_dim) of LAYER at each row's position, converted to the
 * pool's type (F32, F16 round-to-nearest-even, Q8_0 as the CPU quantizes). */
int cuda_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		  const int32_t *tables, int32_t table_stride, const float *k, const float *v,
		  void *stream);
/* cuda_rope of q (T, a->n_head heads) and k (T, a->n_head_kv heads) in
 * place, then cuda_kv_store of k and v: one launch, their bits.  Rows with
 * a negative position are left alone.  kv->kv_dim must be
 * a->n_head_kv * a->head_dim. */
int cuda_rope_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		       const int32_t *tables, int32_t table_stride, const struct bk_attn *a,
		       int32_t n_rot, float freq_base, enum bk_rope_style style, float *q, float *k,
		       const float *v, void *stream);
/* out (T, n_head * head_dim) = softmax(q K^T * scale) V over positions
 * 0..pos[t] of row t's sequence, read through its block table (causal).
 * Query heads h of a group share kv head h / (n_head / n_head_kv) (GQA).
 * Flash decoding: each row's positions are cut into splits of whole KV
 * blocks (a fixed number of positions, so a row's arithmetic depends on its
 * position alone: batch invariant), one CUDA block per (row, kv head,
 * split) computes a partial (max, sum, acc) with online softmax, a second
 * kernel combines a row's partials.  Prefill chunks are tiled: with HOST
 * (the step's rows as the host sees them: positions and table pointers),
 * runs of up to cuda_attention_qrows() rows of one table at consecutive
 * positions share a block, which loads each K/V tile once for all of them
 * (the list goes up into SCRATCH on STREAM); each row still runs exactly
 * the steps it runs alone, so its bits do not depend on its neighbours.
 * HOST NULL: one row per block (what a captured graph records).  The
 * grid is sized from TABLE_STRIDE (a table's capacity: positions below
 * table_stride * block_tokens), never from the device's positions, so a
 * captured graph replays with new positions and tables.  SCRATCH holds the
 * partials and the tile list: at least cuda_attention_scratch_bytes(kv, a,
 * T, table_stride) bytes of device memory, not shared with a concurrent
 * call; it needs no initialisation.  Limits: head_dim <= 256,
 * n_head / n_head_kv <= 64, Q8_0 needs head_dim a multiple or divisor of 32
 * (-EINVAL otherwise). */
int cuda_attention(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		   const int32_t *tables, int32_t table_stride, const struct bk_attn *a,
		   const float *q, float *out, const struct bk_rows *host, void *scratch,
		   void *stream);
/* cuda_attention that also quantizes out, in its last launch, into the
 * rows of VEC cuda_matmul_q_group reads from its scratch, as
 * cuda_add_rmsnorm_q8 does (n_head * head_dim a whole number of VEC's
 * blocks). */
int cuda_attention_q8(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		      const int32_t *tables, int32_t table_stride, const struct bk_attn *a,
		      const float *q, float *out, const struct bk_rows *host, void *scratch,
		      uint32_t vec, void *xq, size_t xq_stride, void *stream);
/* Rows of one sequence a block of cuda_attention takes at once for these
 * shapes (1 .. 16; 0 on bad shapes). */
int32_t cuda_attention_qrows(const struct bk_kv *kv, const struct bk_attn *a);
/* Bytes of SCRATCH cuda_attention needs for these shapes (0 on bad ones). */
size_t cuda_attention_scratch_bytes(const struct bk_kv *kv, const struct bk_attn *a, int32_t T,
				    int32_t table_stride);

/* ---- matmul (kernels/cuda/matmul.cu) ---- */

/* out (T, w->n_out) = x (T, w->n_in) · W^T, reading W's quantized blocks
 * directly with integer dot products (activations quantized on the device
 * first, into SCRATCH of cuda_matmul_scratch_bytes).  For small T (decode). */
int cuda_matmul_q(const struct bk_weight *w, const float *x, int32_t T, float *out, void *scratch,
		  void *stream);
/* Weights a grouped matmul takes in one launch. */
#define CUDA_MM_GROUP 4
/* out[k] (T, w[k]->n_out) = x · W[k]^T for NW (1 .. CUDA_MM_GROUP) weights
 * of one type and n_in (a layer's q, k and v; gate and up), or of types
 * that cuda_matmul_mixes: x quantized once (with X NULL, SCRATCH already
 * holds it), then one launch over every weight's rows.  Each output has
 * the bits cuda_matmul_q gives it. */
int cuda_matmul_q_group(const struct bk_weight *const *w, int nw, const float *x, int32_t T,
			float *const *out, void *scratch, void *stream);
size_t cuda_matmul_scratch_bytes(const struct bk_weight *w, int32_t T);
/* Whether cuda_matmul_q_group takes weights of types A and B over T rows
 * in one launch: the same type, or with cuda_matmul_set_mixed(1) (the
 * default) Q4_K and Q6_K at one row on the wide kernels (a Q4_K_M model's
 * q, k and v; the Q4_K weights' rows 16-byte aligned).  Process-wide, as
 * the setters below: set it before any launch. */
int cuda_matmul_mixes(uint32_t a, uint32_t b, int32_t T);
void cuda_matmul_set_mixed(int on);
/* The matmuls of T rows take the tensor-core kernels from T = MIN_T, the
 * dp4a ones below it: the same bits either way.  Below 1, the default:
 * the K-quants always (at one row the wide kernels, cuda_matmul_set_wide,
 * come first), Q4_0/Q4_1/Q8_0 from 2 rows.  For comparing the two
 * (LLMD_CUDA_MMA_MIN_T, cuda_backend.c) and for the tests; process-wide,
 * set it before any launch. */
void cuda_matmul_set_mma_min_t(int32_t min_t);
/* The tensor-core kernels split a run of 16 weight rows' blocks over up to
 * MAX warps of a block (split-K; default 16) when the launch has too few
 * runs to keep the memory busy: the same bits either way (the float steps
 * stay in order).  1 turns it off (LLMD_CUDA_MM_SPLIT, cuda_backend.c; the
 * tests); process-wide, set it before any launch. */
void cuda_matmul_set_split_k(int32_t max);
/* The most warps a launch's split-K may have in all; below 1, the
 * default: one wave of resident warps on the device (24 an SM for the
 * K-quants, 12 for the others).  The same bits whatever it is.  For timing
 * on a GPU (LLMD_CUDA_MM_WARPS, cuda_backend.c) and the tests;
 * process-wide. */
void cuda_matmul_set_split_warps(int32_t warps);
/* ON: the K-quant tensor-core kernels of up to 8 rows read their
 * weights through cp.async stages in shared memory, 2 super-blocks ahead
 * of the one computed (default off): the same bits either way.  For timing
 * on a GPU (LLMD_CUDA_MM_ASYNC, cuda_backend.c) and the tests;
 * process-wide. */
void cuda_matmul_set_async(int on);
/* ROUNDS > 0: Q4_K (16-byte aligned rows) and Q6_K matmuls of one
 * activation row take a warp per weight row reading it 512 bytes a load,
 * ROUNDS (1, 2, 4 or 8) of those loads in flight per lane; 0: the
 * tensor-core kernels; below 0, the default: 2.  The same bits either
 * way.  LLMD_CUDA_MM_WIDE (cuda_backend.c), the tests; process-wide. */
void cuda_matmul_set_wide(int32_t rounds);
/* ON: the matmul kernels that give a warp a weight row (the wide ones and
 * the dp4a ones) ask L2 for the first bytes of it (the wide kernels' first
 * round of loads; up to 2 KiB) before they wait for the kernel before them
 * (grid_dep_wait_prefetch, cuda_mma.h): with programmatic dependent
 * launch, those reads overlap the previous kernel's tail.  Off by default
 * until timed.  The same bits either way.  LLMD_CUDA_MM_PREFETCH
 * (cuda_backend.c), the tests; process-wide. */
void cuda_matmul_set_prefetch(int on);
/* ON: every launch from here on may start before the kernel before it in
 * its stream has finished (programmatic dependent launch; each kernel
 * waits for it first thing, grid_dep_wait): launch latency hidden behind
 * the previous kernel's tail.  Only for devices of compute capability 9.0
 * and up, where cuda_backend_new turns it on unless LLMD_CUDA_PDL=0; the
 * emulator ignores it.  Process-wide, off until set. */
void cuda_set_pdl(int on);
/* Attention's split: positions per block of the flash-decoding kernel at
 * the shortest (rounded up to whole KV blocks, doubled as a row grows past
 * 32 splits; default 16, below 1 the default).  A row's arithmetic depends
 * on it, so batch invariance holds for one value: set it once, before any
 * launch (LLMD_CUDA_ATTN_SPLIT, cuda_backend.c). */
void cuda_attention_set_split(int32_t tokens);
/* Attention's kernels: 0 attn_split_kernel, 4 warps with a thread per
 * score and per output element, and its reductions; else (the default)
 * attn_split_lanes_kernel, 8 warps with each score and weighted V column
 * spread over lanes and the next tile's loads issued early, and
 * attn_reduce_lanes_kernel (the same bits as the other reductions, with
 * each split's weight computed once a head) (attention.cu).  The split
 * kernels differ in summation order, so in the last bits of attention's
 * output, each within the CPU comparison's tolerance: like the split, set
 * it once, before any launch (LLMD_CUDA_ATTN_LANES, cuda_backend.c). */
void cuda_attention_set_lanes(int on);

#ifdef __cplusplus
}
#endif

#endif
