/* cuda_ops.h - the CUDA backend's kernels as C sees them: one extern "C"
 * launcher per op, each in its own kernels/cuda/<op>.cu next to its
 * kernels.  A launcher computes the grid, block and shared-memory sizes,
 * launches through LAUNCH_PDL() as LC says (struct cuda_launch: the stream,
 * the tuning; NULL: the default stream and the defaults) and returns 0, or
 * a negative errno when the arguments are out of the kernel's range
 * (-EINVAL, -ENOTSUP) or the launch failed (-EIO).  Every pointer is a
 * device pointer.  The same source runs on a GPU (nvcc) and on
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

/* How a launcher launches: one per backend, handed to every launcher
 * (NULL: the default stream, cuda_tuning_defaults() but for the pieces a
 * kernel file's own defaults may override (attention's split), no
 * programmatic dependent launch, the SMs asked of the current device). */
struct cuda_launch {
	void *stream;                     /* a cudaStream_t; NULL: the default stream */
	const struct cuda_tuning *tuning; /* the kernels' choices (backend.h); NULL: the defaults */
	int32_t pdl;                      /* 1: launches may overlap the kernel before them
	                                     (tuning->pdl on a device of compute capability 9.0
	                                     and up: the caller checks); 0: never */
	int32_t sms;                      /* the device's multiprocessors (split-K's wave);
	                                     0: asked of the current device when needed */
};

static inline void *cuda_launch_stream(const struct cuda_launch *lc)
{
	return lc ? lc->stream : NULL;
}

static inline int cuda_launch_pdl(const struct cuda_launch *lc)
{
	return lc && lc->pdl;
}

/* LC's tuning, or the defaults written into *DEF. */
static inline const struct cuda_tuning *cuda_launch_tuning(const struct cuda_launch *lc,
							   struct cuda_tuning *def)
{
	if (lc && lc->tuning)
		return lc->tuning;
	cuda_tuning_defaults(def);
	return def;
}

#ifdef __cplusplus
/* LAUNCH(kernel, grid, block, smem, stream, ...) on LC's stream, with its
 * programmatic dependent launch (the launchers' launches). */
#define LAUNCH_ON(lc, kernel, grid, block, smem, ...)                                           \
	LAUNCH_PDL(cuda_launch_pdl(lc), kernel, grid, block, smem, (cudaStream_t)cuda_launch_stream(lc), \
		   ##__VA_ARGS__)
#endif

/* ---- element-wise and row ops (kernels/cuda/rows.cu) ---- */

/* out (T, n_in) = rows IDS of W, dequantized (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q4_K, Q5_K, Q6_K). */
int cuda_embed(const struct bk_weight *w, const int32_t *ids, int32_t T, float *out, const struct cuda_launch *lc);
/* out (T, n) = x / rms(x) * g; out may equal x. */
int cuda_rmsnorm(const float *x, const float *g, int32_t T, int64_t n, float eps, float *out,
		 const struct cuda_launch *lc);
/* Rotates the first rp->n_rot dims of every head of x (T, n_head * head_dim)
 * in place by RP's angles (backend.h; its freq_factors a device pointer). */
int cuda_rope(float *x, int32_t T, int32_t n_head, int32_t head_dim, const int32_t *pos,
	      const struct bk_rope *rp, const struct cuda_launch *lc);
/* out (n) = silu(g) * u; out may equal g. */
int cuda_swiglu(const float *g, const float *u, int64_t n, float *out, const struct cuda_launch *lc);
/* cuda_swiglu of T rows of N_IN that also quantizes out as
 * cuda_add_rmsnorm_q8 does (VEC, XQ, STRIDE and the limits on N_IN as
 * there), with cuda_swiglu's bits in out. */
int cuda_swiglu_q8(const float *g, const float *u, int32_t T, int64_t n_in, float *out, uint32_t vec,
		   void *xq, size_t stride, const struct cuda_launch *lc);
/* out (n) = act(g) * u for ACT an enum bk_act (cuda_swiglu is SiLU's;
 * GELU: the CPU backend's tanh form with its roundings). */
int cuda_glu(int act, const float *g, const float *u, int64_t n, float *out, const struct cuda_launch *lc);
/* cuda_swiglu_q8 for the activation ACT. */
int cuda_glu_q8(int act, const float *g, const float *u, int32_t T, int64_t n_in, float *out, uint32_t vec,
		void *xq, size_t stride, const struct cuda_launch *lc);
/* x (n) += y. */
int cuda_add(float *x, const float *y, int64_t n, const struct cuda_launch *lc);
/* x (n) *= s. */
int cuda_scale(float *x, int64_t n, float s, const struct cuda_launch *lc);
/* x (T, n) += b (n) on every row. */
int cuda_add_bias(float *x, const float *b, int32_t T, int64_t n, const struct cuda_launch *lc);
/* x (T, n) += y, then out = x / rms(x) * g: cuda_add and cuda_rmsnorm in
 * one launch, with their bits.  out may equal x or y. */
int cuda_add_rmsnorm(float *x, const float *y, const float *g, int32_t T, int64_t n, float eps,
		     float *out, const struct cuda_launch *lc);
/* cuda_add_rmsnorm that also quantizes out, in the same launch, into the
 * rows of VEC (QT_Q8_0, QT_Q8_1 or QT_Q8_K) cuda_matmul_q_group reads from
 * its SCRATCH (XQ, rows STRIDE = cuda_matmul_scratch_bytes(w, 1) bytes
 * apart, 16-byte aligned), with the bytes its own quantizer writes: the
 * matmul of a weight of that vec type and n_in N may then run with X NULL.
 * N must be a whole number of VEC's blocks (32, or 256 for Q8_K). */
int cuda_add_rmsnorm_q8(float *x, const float *y, const float *g, int32_t T, int64_t n, float eps,
			float *out, uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc);
/* cuda_rmsnorm that also quantizes out as cuda_add_rmsnorm_q8 does. */
int cuda_rmsnorm_q8(const float *x, const float *g, int32_t T, int64_t n, float eps, float *out,
		    uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc);
/* out (n_rows, w->n_in) __half = rows ROW0.. of W as cuda_embed dequantizes
 * them, each rounded to nearest even f16: weight tiles for cuBLAS. */
int cuda_dequant_f16(const struct bk_weight *w, int64_t row0, int64_t n_rows, void *out,
		     const struct cuda_launch *lc);
/* out (n) = x rounded to nearest even __half, or __nv_bfloat16 with BF16. */
int cuda_to_half(const float *x, int64_t n, int bf16, void *out, const struct cuda_launch *lc);

/* ---- the paged KV pool (kernels/cuda/attention.cu) ---- */

/* Writes k, v (T, kv_dim) of LAYER at each row's position, converted to the
 * pool's type (F32, F16 round-to-nearest-even, Q8_0 as the CPU quantizes). */
int cuda_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		  const int32_t *tables, int32_t table_stride, const float *k, const float *v,
		  const struct cuda_launch *lc);
/* cuda_rope of q (T, a->n_head heads) and k (T, a->n_head_kv heads) in
 * place, then cuda_kv_store of k and v: one launch, their bits.  Rows with
 * a negative position are left alone.  kv->kv_dim must be
 * a->n_head_kv * a->head_dim. */
int cuda_rope_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		       const int32_t *tables, int32_t table_stride, const struct bk_attn *a,
		       const struct bk_rope *rp, float *q, float *k, const float *v,
		       const struct cuda_launch *lc);
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
		   const struct cuda_launch *lc);
/* cuda_attention that also quantizes out, in its last launch, into the
 * rows of VEC cuda_matmul_q_group reads from its scratch, as
 * cuda_add_rmsnorm_q8 does (n_head * head_dim a whole number of VEC's
 * blocks). */
int cuda_attention_q8(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
		      const int32_t *tables, int32_t table_stride, const struct bk_attn *a,
		      const float *q, float *out, const struct bk_rows *host, void *scratch,
		      uint32_t vec, void *xq, size_t xq_stride, const struct cuda_launch *lc);
/* Rows of one sequence a block of cuda_attention takes at once for these
 * shapes (1 .. 16; 0 on bad shapes). */
int32_t cuda_attention_qrows(const struct bk_kv *kv, const struct bk_attn *a);
/* Bytes of SCRATCH cuda_attention needs for these shapes with TUNING's
 * split (NULL: the default), 0 on bad ones. */
size_t cuda_attention_scratch_bytes(const struct bk_kv *kv, const struct bk_attn *a, int32_t T,
				    int32_t table_stride, const struct cuda_tuning *tuning);

/* ---- matmul (kernels/cuda/matmul.cu) ---- */

/* out (T, w->n_out) = x (T, w->n_in) · W^T, reading W's quantized blocks
 * directly with integer dot products (activations quantized on the device
 * first, into SCRATCH of cuda_matmul_scratch_bytes).  For small T (decode). */
int cuda_matmul_q(const struct bk_weight *w, const float *x, int32_t T, float *out, void *scratch,
		  const struct cuda_launch *lc);
/* Weights a grouped matmul takes in one launch. */
#define CUDA_MM_GROUP 4
/* out[k] (T, w[k]->n_out) = x · W[k]^T for NW (1 .. CUDA_MM_GROUP) weights
 * of one type and n_in (a layer's q, k and v; gate and up), or of types
 * that cuda_matmul_mixes: x quantized once (with X NULL, SCRATCH already
 * holds it), then one launch over every weight's rows.  Each output has
 * the bits cuda_matmul_q gives it. */
int cuda_matmul_q_group(const struct bk_weight *const *w, int nw, const float *x, int32_t T,
			float *const *out, void *scratch, const struct cuda_launch *lc);
size_t cuda_matmul_scratch_bytes(const struct bk_weight *w, int32_t T);
/* Whether cuda_matmul_q_group takes weights of types A and B over T rows
 * in one launch with TUNING (NULL: the defaults): the same type, or with
 * mm_mixed Q4_K and Q6_K at one row on the wide kernels (a Q4_K_M model's
 * q, k and v; the Q4_K weights' rows 16-byte aligned). */
int cuda_matmul_mixes(uint32_t a, uint32_t b, int32_t T, const struct cuda_tuning *tuning);

#ifdef __cplusplus
}
#endif

#endif
