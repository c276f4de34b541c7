/* quant_q8.cuh - one warp's quantization of a 32-element activation block
 * into Q8_0 or Q8_1 (quant.c's arithmetic: id = 127 / amax, round half to
 * even, f16 scales rounded to nearest even), in the device layout the
 * matmul kernels read (matmul.cu): per row, the n_in int8 codes, then a
 * float d per block, then (Q8_1) a float s = d * sum(codes) per block.
 * Shared by matmul.cu's quantizer and the fused norm + quantize of rows.cu,
 * so that both write the same bytes.
 */
#ifndef LLMD_QUANT_Q8_CUH
#define LLMD_QUANT_Q8_CUH

#include <stdint.h>

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

#endif
