/* quant_q8.cuh - the quantization of activation blocks on the device:
 * one warp's 32-element block into Q8_0 or Q8_1 (quant.c's arithmetic:
 * id = 127 / amax, round half to even, f16 scales rounded to nearest even),
 * one 256-thread block's super-block into Q8_K, in the device layout the
 * matmul kernels read (matmul.cu): per row, the n_in int8 codes, then a
 * float d per block, then (Q8_1) a float s = d * sum(codes) per block, or
 * (Q8_K) 16 int32 bsums per super-block.
 * Shared by matmul.cu's quantizer and the fused norm + quantize of rows.cu,
 * so that both write the same bytes.
 */
#ifndef LLMD_QUANT_Q8_CUH
#define LLMD_QUANT_Q8_CUH

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* Where a Q8_K row of N elements keeps its int16 sums over 32 codes. */
static __host__ __device__ inline size_t q8k_bs32_offset(int64_t n)
{
	return ((size_t)n + (size_t)(n / QK_K) * (4 + 16 * 4) + 15) & ~(size_t)15;
}

/* Bytes of a row of N elements quantized to VEC (QT_Q8_0, QT_Q8_1 or
 * QT_Q8_K) in this layout, or 0 when VEC is another type or N is not a
 * whole number of its blocks. */
static inline size_t q8_row_bytes(uint32_t vec, int64_t n)
{
	switch (vec) {
	case QT_Q8_0: return n % QK ? 0 : (size_t)n + (size_t)(n / QK) * 4;
	case QT_Q8_1: return n % QK ? 0 : (size_t)n + (size_t)(n / QK) * 8;
	case QT_Q8_K: return n % QK_K ? 0 : q8k_bs32_offset(n) + (size_t)(n / QK_K) * 16;
	default: return 0;
	}
}

/* Block B (of NB) of the row at ROW (N_IN codes first): lane LANE holds
 * element 32 * B + LANE as V.  Every lane of the warp must call it. */
static __device__ __forceinline__ void q8_block_store(float v, int lane, int b, int nb, int n_in,
	int with_sum, uint8_t *row)
{
	float amax = fabsf(v);
	for (int off = 16; off > 0; off /= 2)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
	const float d = amax / 127;
	const float id = amax != 0 ? 127.0f / amax : 0.0f;
	const int q = __float2int_rn(v * id);
	reinterpret_cast<int8_t *>(row)[(size_t)b * 32 + lane] = (int8_t)q;
	float *ds = reinterpret_cast<float *>(row + n_in);
	if (lane == 0)
		ds[b] = __half2float(__float2half_rn(d));
	if (with_sum) {
		int sum = q;
		for (int off = 16; off > 0; off /= 2)
			sum += __shfl_xor_sync(0xffffffffu, sum, off);
		if (lane == 0)
			ds[nb + b] = __half2float(__float2half_rn((float)sum * d));
	}
}

/* Super-block B's places in the Q8_K row at ROW (N_IN codes, NSB
 * super-blocks): its 256 codes, its d, its 16 sums over 16 codes and its
 * 8 int16 sums over 32. */
struct q8k_parts {
	int8_t *qs;     /* (256) codes */
	float *d;       /* the scale */
	int *bsums;     /* (16) sums over 16 codes */
	int16_t *bs32;  /* (8) sums over 32 codes */
};

static __device__ __forceinline__ q8k_parts q8k_parts_of(uint8_t *row, int n_in, int nsb, int b)
{
	q8k_parts p;
	p.qs = reinterpret_cast<int8_t *>(row) + (size_t)b * 256;
	p.d = reinterpret_cast<float *>(row + n_in) + b;
	p.bsums = reinterpret_cast<int *>(row + n_in + (size_t)nsb * 4) + b * 16;
	p.bs32 = reinterpret_cast<int16_t *>(row + q8k_bs32_offset(n_in)) + b * 8;
	return p;
}

/* Over the warp, the candidate (magnitude AX, element IDX, value VAL) of
 * largest magnitude, the lowest index among equals; every lane gets it. */
static __device__ __forceinline__ void q8k_warp_first_max(float &ax, int &idx, float &val)
{
	for (int off = 16; off > 0; off /= 2) {
		const float oax = __shfl_xor_sync(0xffffffffu, ax, off);
		const int oidx = __shfl_xor_sync(0xffffffffu, idx, off);
		const float oval = __shfl_xor_sync(0xffffffffu, val, off);
		if (oax > ax || (oax == ax && oidx < idx)) {
			ax = oax;
			idx = oidx;
			val = oval;
		}
	}
}

/* Threads of a block that q8k_block_store takes: one per element. */
#define Q8K_THREADS 256

/* Super-block B (of NSB) of the row at ROW (N_IN codes first): thread i of
 * a block of Q8K_THREADS holds element 256 * B + i as V; every thread must
 * call it.  The scale comes from the first element of largest magnitude,
 * sign included (quant.c's quantize_q8_k): each warp's (its lowest index
 * among equals), then the earliest warp's among equals.  S_AX and S_V are
 * __shared__ arrays of Q8K_THREADS / 32, free again when it returns. */
static __device__ __forceinline__ void q8k_block_store(float v, int b, int nsb, int n_in, uint8_t *row,
	float *s_ax, float *s_v)
{
	const int i = threadIdx.x, lane = i % 32, warp = i / 32;
	float ax = fabsf(v), val = v;
	int idx = i;
	q8k_warp_first_max(ax, idx, val);
	if (lane == 0) {
		s_ax[warp] = ax;
		s_v[warp] = val;
	}
	__syncthreads();
	float amax = s_ax[0], max = s_v[0];
	for (int w = 1; w < Q8K_THREADS / 32; w++)
		if (s_ax[w] > amax) { /* warps in index order: ties keep the earlier */
			amax = s_ax[w];
			max = s_v[w];
		}
	__syncthreads(); /* all have read the arrays: the next call may write them */

	const q8k_parts sb = q8k_parts_of(row, n_in, nsb, b);
	if (amax == 0) {
		sb.qs[i] = 0;
		if (i < 16)
			sb.bsums[i] = 0;
		if (i < 8)
			sb.bs32[i] = 0;
		if (i == 0)
			*sb.d = 0;
		return;
	}
	const float iscale = -127.f / max;
	int q = __float2int_rn(iscale * v);
	q = q < 127 ? q : 127;
	sb.qs[i] = (int8_t)q;
	int s = q; /* sum over the 16-lane group */
	for (int off = 8; off > 0; off /= 2)
		s += __shfl_xor_sync(0xffffffffu, s, off);
	if (i % 16 == 0)
		sb.bsums[i / 16] = s;
	s += __shfl_xor_sync(0xffffffffu, s, 16); /* |s| <= 32 * 127: an int16 */
	if (i % 32 == 0)
		sb.bs32[i / 32] = (int16_t)s;
	if (i == 0)
		*sb.d = 1 / iscale;
}

/* q8k_block_store's bytes by one warp: lane l holds elements 8l..8l+7 of
 * super-block B as V (no block barrier: a block's warps may each take a
 * super-block at once).  The scale's element is the first of largest
 * magnitude (each lane's first, then the lowest index among equals); the
 * codes and sums are the same integers, so the same bytes. */
static __device__ __forceinline__ void q8k_warp_store(const float *v, int lane, int b, int nsb, int n_in,
	uint8_t *row)
{
	float ax = fabsf(v[0]), val = v[0];
	int idx = 8 * lane;
	for (int k = 1; k < 8; k++)
		if (fabsf(v[k]) > ax) {
			ax = fabsf(v[k]);
			val = v[k];
			idx = 8 * lane + k;
		}
	q8k_warp_first_max(ax, idx, val);
	const q8k_parts sb = q8k_parts_of(row, n_in, nsb, b);
	int q[8];
	float iscale = 0.0f;
	if (ax == 0) {
		for (int k = 0; k < 8; k++)
			q[k] = 0;
	} else {
		iscale = -127.f / val;
		for (int k = 0; k < 8; k++) {
			const int c = __float2int_rn(iscale * v[k]);
			q[k] = c < 127 ? c : 127;
		}
	}
	int s = 0;
	for (int k = 0; k < 8; k++) {
		sb.qs[8 * lane + k] = (int8_t)q[k];
		s += q[k];
	}
	s += __shfl_xor_sync(0xffffffffu, s, 1); /* lanes 2j, 2j + 1: bsums[j] */
	if (lane % 2 == 0)
		sb.bsums[lane / 2] = s;
	s += __shfl_xor_sync(0xffffffffu, s, 2); /* |s| <= 32 * 127: an int16 */
	if (lane % 4 == 0)
		sb.bs32[lane / 4] = (int16_t)s;
	if (lane == 0)
		*sb.d = ax == 0 ? 0.0f : 1 / iscale;
}

#endif
