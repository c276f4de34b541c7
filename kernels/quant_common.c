/* quant_common.c - what every quant path needs and nothing above it: the
 * table of ggml block types, fp16/bf16 conversion and the SIMD kernels'
 * per-thread scratch.  It calls nothing in quant.c or the SIMD files.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "quant_impl.h"

/* ---- the type table ---- */

const struct qtype_info qtype_table[QT_COUNT] = {
	[QT_F32]  = { "F32",  1,    4,                          QT_F32,  1 },
	[QT_F16]  = { "F16",  1,    2,                          QT_F16,  1 },
	[QT_BF16] = { "BF16", 1,    2,                          QT_BF16, 1 },
	[QT_Q4_0] = { "Q4_0", QK,   sizeof(struct block_q4_0),  QT_Q8_0, 1 },
	[QT_Q4_1] = { "Q4_1", QK,   sizeof(struct block_q4_1),  QT_Q8_1, 1 },
	[QT_Q5_0] = { "Q5_0", QK,   sizeof(struct block_q5_0),  QT_Q8_0, 1 },
	[QT_Q5_1] = { "Q5_1", QK,   sizeof(struct block_q5_1),  QT_Q8_1, 1 },
	[QT_Q8_0] = { "Q8_0", QK,   sizeof(struct block_q8_0),  QT_Q8_0, 1 },
	[QT_Q8_1] = { "Q8_1", QK,   sizeof(struct block_q8_1),  QT_Q8_1, 0 },
	[QT_Q4_K] = { "Q4_K", QK_K, sizeof(struct block_q4_k),  QT_Q8_K, 1 },
	[QT_Q5_K] = { "Q5_K", QK_K, sizeof(struct block_q5_k),  QT_Q8_K, 1 },
	[QT_Q6_K] = { "Q6_K", QK_K, sizeof(struct block_q6_k),  QT_Q8_K, 1 },
	[QT_Q8_K] = { "Q8_K", QK_K, sizeof(struct block_q8_k),  QT_Q8_K, 0 },
};

_Static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(struct block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(struct block_q4_k) == 144, "block_q4_k layout");
_Static_assert(sizeof(struct block_q5_k) == 176, "block_q5_k layout");
_Static_assert(sizeof(struct block_q6_k) == 210, "block_q6_k layout");
_Static_assert(sizeof(struct block_q8_k) == 292, "block_q8_k layout");

const struct qtype_info *qtype_get(uint32_t type)
{
	if (type >= QT_COUNT || !qtype_table[type].name)
		return NULL;
	return &qtype_table[type];
}

size_t qtype_row_bytes(uint32_t type, int64_t n)
{
	const struct qtype_info *ti = qtype_get(type);
	if (!ti || n < 0 || n % ti->blck)
		return 0;
	return (size_t)(n / ti->blck) * ti->bytes;
}

/* ---- fp16 and bf16 ---- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

float qt_f16_to_f32(qt_f16 h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;

	if (exp == 0x1f) /* inf, or NaN made quiet as VCVTPH2PS does */
		return bits_f32(sign | 0x7f800000 | (mant << 13) | (mant ? 0x400000 : 0));
	if (exp == 0) /* zero or subnormal: mant * 2^-24 is exact in float */
		return bits_f32(sign | f32_bits((float)mant * 0x1p-24f));
	return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

qt_f16 qt_f32_to_f16(float f)
{
	uint32_t x = f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000;

	x &= 0x7fffffff;
	if (x > 0x7f800000) /* NaN: quiet, payload truncated, as VCVTPS2PH */
		return (qt_f16)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
	if (x >= 0x477ff000) /* from halfway above 65504 on, rounds to inf */
		return (qt_f16)(sign | 0x7c00);
	if (x >= 0x38800000) { /* normal half: round the mantissa at bit 13, even on ties */
		x += 0xfff + ((x >> 13) & 1);
		return (qt_f16)(sign | ((x - (112u << 23)) >> 13));
	}
	/* Below 2^-14: adding 0.5 leaves exactly the subnormal's 2^-24 units in
	 * the low mantissa bits, rounded to nearest even by the FPU; a carry
	 * into 0x400 is the right encoding of the smallest normal. */
	return (qt_f16)(sign | (f32_bits(bits_f32(x) + 0.5f) - 0x3f000000));
}

float qt_bf16_to_f32(qt_bf16 h)
{
	return bits_f32((uint32_t)h << 16);
}

qt_bf16 qt_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffff) > 0x7f800000) /* NaN: keep it quiet */
		return (qt_bf16)((u >> 16) | 64);
	return (qt_bf16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- per-thread scratch for the SIMD kernels ---- */

static pthread_key_t scratch_key;   /* owns each thread's buffer; frees it at thread exit */
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;          /* 1 once scratch_key exists */
static __thread void *scratch_buf;  /* 64-byte aligned, scratch_cap bytes */
static __thread size_t scratch_cap; /* bytes in scratch_buf */

static void scratch_key_init(void)
{
	scratch_key_ok = pthread_key_create(&scratch_key, free) == 0;
}

/* A 64-byte aligned buffer of at least BYTES for the calling thread, valid
 * until its next call; NULL when memory is short.  Grows, never shrinks. */
void *quant_scratch(size_t bytes)
{
	if (bytes <= scratch_cap)
		return scratch_buf;
	pthread_once(&scratch_once, scratch_key_init);
	if (!scratch_key_ok)
		return NULL;
	size_t cap = bytes + bytes / 4 + 4096;
	cap = (cap + 63) & ~(size_t)63;
	void *p = aligned_alloc(64, cap);
	if (!p)
		return NULL;
	if (pthread_setspecific(scratch_key, p) != 0) {
		free(p);
		return NULL;
	}
	free(scratch_buf);
	scratch_buf = p;
	scratch_cap = cap;
	return p;
}
