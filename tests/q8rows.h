/* q8rows.h - the check of activation rows that a CUDA kernel quantized for
 * a matmul (kernels/cuda/quant_q8.cuh's layout) against the CPU's
 * quantizer, shared by the tests of the kernels that fuse it (norms,
 * swiglu, attention).  Include after emu_testutil.h, with quant.h.
 */
#ifndef LLMD_Q8ROWS_H
#define LLMD_Q8ROWS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

/* Each of T rows of the quantized scratch GOT (STRIDE bytes apart) holds
 * WANT's row (N floats) as quant_quantize_row makes it VEC (Q8_0, Q8_1 or
 * Q8_K): the same codes, then each block's f16 d (and s) as floats, or
 * each super-block's d and then its 16 bsums as int32, and after them,
 * 16-byte aligned, its 8 sums over 32 codes as int16. */
static inline void expect_q8_rows(const char *op, const char *what, const std::vector<uint8_t> &got,
				  const std::vector<float> &want, int32_t T, int64_t n, size_t stride,
				  uint32_t vec)
{
	const size_t qb = qtype_get(vec)->bytes;
	const int64_t nb = n / (int64_t)qtype_get(vec)->blck;
	std::vector<uint8_t> ref((size_t)nb * qb);
	int bad = 0;

	for (int32_t t = 0; t < T; t++) {
		quant_quantize_row(vec, want.data() + (size_t)t * n, ref.data(), n);
		const uint8_t *row = got.data() + (size_t)t * stride;
		for (int64_t b = 0; b < nb; b++) {
			const uint8_t *blk = ref.data() + (size_t)b * qb;
			float ds[2] = { 0, 0 };
			memcpy(ds, row + n + 4 * b, 4);
			if (vec == QT_Q8_K) {
				struct block_q8_k k;
				int32_t bs[QK_K / 16];
				memcpy(&k, blk, sizeof k);
				memcpy(bs, row + n + 4 * nb + sizeof bs * b, sizeof bs);
				bad += memcmp(row + QK_K * b, k.qs, QK_K) != 0 || ds[0] != k.d;
				for (int i = 0; i < QK_K / 16; i++)
					bad += bs[i] != k.bsums[i];
				int16_t bs32[QK_K / 32];
				const size_t off32 = ((size_t)n + (size_t)nb * (4 + 16 * 4) + 15) / 16 * 16;
				memcpy(bs32, row + off32 + sizeof bs32 * b, sizeof bs32);
				for (int i = 0; i < QK_K / 32; i++)
					bad += bs32[i] != k.bsums[2 * i] + k.bsums[2 * i + 1];
				continue;
			}
			uint16_t h[2];
			memcpy(h, blk, 4);
			if (vec == QT_Q8_1)
				memcpy(ds + 1, row + n + 4 * (nb + b), 4);
			bad += memcmp(row + QK * b, blk + (vec == QT_Q8_1 ? 4 : 2), QK) != 0;
			bad += ds[0] != qt_f16_to_f32(h[0]);
			bad += vec == QT_Q8_1 && ds[1] != qt_f16_to_f32(h[1]);
		}
	}
	if (bad)
		fprintf(stderr, "%s %s: %d blocks differ from quant_quantize_row\n", op, what, bad);
	CHECK_INT_EQ(bad, 0);
}

/* Bytes of a quantized row in the matmul's layout, rounded to 16. */
static inline size_t q8_stride(uint32_t vec, int64_t n)
{
	const int64_t nb = n / (int64_t)qtype_get(vec)->blck;
	const size_t b = (size_t)n + (size_t)nb * (vec == QT_Q8_K ? 4 + 16 * 4 : vec == QT_Q8_1 ? 8 : 4);
	return (b + 15) / 16 * 16 + (vec == QT_Q8_K ? (size_t)nb * 16 : 0);
}

static const uint32_t q8_vecs[] = { QT_Q8_0, QT_Q8_1, QT_Q8_K };

#endif
