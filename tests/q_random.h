/* q_random.h - the CUDA kernel tests' (and the GPU benchmarks') random
 * numbers: one seeded generator (the same sequence every run), uniform
 * floats from it, and rows of random quantized blocks whose f16 scales
 * are made sane (finite, small; Q4_1's and the K-quants' d positive).
 */
#ifndef LLMD_Q_RANDOM_H
#define LLMD_Q_RANDOM_H

extern "C" {
#include "quant.h"
}

#include <math.h>
#include <string.h>

#include <vector>

static uint64_t rng = 20240611;
static inline uint32_t next_u32()
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 32);
}

static inline float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(next_u32() >> 8) / (float)(1u << 24);
}

static inline void put_f16(uint8_t *p, float f)
{
	qt_f16 h = qt_f32_to_f16(f);
	memcpy(p, &h, 2);
}

/* N_OUT rows of N_IN elements of TYPE: random bytes, scales made sane. */
static inline std::vector<uint8_t> random_weights(uint32_t type, int n_in, int n_out, size_t *ret_row_bytes)
{
	const qtype_info *ti = qtype_get(type);
	size_t rb = qtype_row_bytes(type, n_in);
	std::vector<uint8_t> w(rb * n_out);
	for (uint8_t &b : w)
		b = (uint8_t)next_u32();
	const int nb = n_in / (int)ti->blck;
	for (int r = 0; r < n_out; r++)
		for (int b = 0; b < nb; b++) {
			uint8_t *blk = w.data() + r * rb + (size_t)b * ti->bytes;
			float d = uniform(0.001f, 0.05f) * (next_u32() & 1 ? -1 : 1);
			switch (type) {
			case QT_Q4_0:
			case QT_Q8_0:
				put_f16(blk, d);
				break;
			case QT_Q4_1:
			case QT_Q4_K:
			case QT_Q5_K:
				put_f16(blk, fabsf(d));
				put_f16(blk + 2, uniform(-0.1f, 0.1f));
				break;
			case QT_Q6_K:
				put_f16(blk + 208, d);
				break;
			}
		}
	*ret_row_bytes = rb;
	return w;
}

#endif
