/* test_quant.c - pins kernels/quant.c: the block layouts and their values,
 * fp16/bf16 rounding, ggml-identical activation quantization, and quant_gemm
 * on every ISA the CPU has (accuracy against a double reference, identical
 * bits to the scalar path, batch invariance).
 * LLMD_QUANT_BENCH=1 also times the kernels on SmolLM2-135M's shapes (rows per
 * step: LLMD_QUANT_BENCH_T="1,8,32", default 1 and 128).
 */
#include <immintrin.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "quant.h"
#include "testutil.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1). */
static float rndf(void)
{
	return (float)((int32_t)rnd() >> 7) * 0x1p-24f;
}

static uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* quant.c's AVX2 level includes F16C (and the OS saving YMM state). */
static int has_f16c(void)
{
	return quant_isa_best() >= QUANT_ISA_AVX2;
}

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
	return (uint16_t)_cvtss_sh(f, 0);
}

__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* fp16 of F: the F16C instruction when there is one, the library otherwise
 * (whose agreement with F16C test_fp16 pins). */
static uint16_t to_f16(float f)
{
	return has_f16c() ? hw_f32_to_f16(f) : qt_f32_to_f16(f);
}

static float h2f(uint16_t h)
{
	return has_f16c() ? hw_f16_to_f32(h) : qt_f16_to_f32(h);
}

static int n_isas(void)
{
	return (int)quant_isa_best() + 1;
}

/* ---- the type table ---- */

static void test_types(void)
{
	CHECK_STR_EQ(qtype_get(QT_Q4_1)->name, "Q4_1");
	CHECK_INT_EQ(qtype_get(QT_Q4_1)->bytes, 20);
	CHECK_INT_EQ(qtype_get(QT_Q4_1)->vec_type, QT_Q8_1);
	CHECK_INT_EQ(qtype_get(QT_Q4_0)->vec_type, QT_Q8_0);
	CHECK_INT_EQ(qtype_get(QT_Q5_0)->bytes, 22);
	CHECK_INT_EQ(qtype_get(QT_Q5_0)->vec_type, QT_Q8_0);
	CHECK_INT_EQ(qtype_get(QT_Q5_1)->bytes, 24);
	CHECK_INT_EQ(qtype_get(QT_Q5_1)->vec_type, QT_Q8_1);
	CHECK_INT_EQ(qtype_get(QT_Q8_0)->vec_type, QT_Q8_0);
	CHECK_INT_EQ(qtype_get(QT_Q6_K)->vec_type, QT_Q8_K);
	CHECK_INT_EQ(qtype_get(QT_Q6_K)->bytes, 210);
	CHECK_INT_EQ(qtype_get(QT_BF16)->vec_type, QT_BF16);
	CHECK_INT_EQ(qtype_get(QT_Q8_K)->weight_ok, 0);
	CHECK(qtype_get(QT_Q8_1) && !qtype_get(QT_Q8_1)->weight_ok);
	CHECK(qtype_get(4) == NULL);   /* ggml's retired Q4_2 */
	CHECK(qtype_get(16) == NULL);  /* IQ2_XXS: not supported */
	CHECK(qtype_get(1000) == NULL);
	CHECK_INT_EQ(qtype_row_bytes(QT_Q4_1, 576), 18 * 20);
	CHECK_INT_EQ(qtype_row_bytes(QT_Q8_0, 49152), 1536 * 34);
	CHECK_INT_EQ(qtype_row_bytes(QT_Q6_K, 512), 420);
	CHECK_INT_EQ(qtype_row_bytes(QT_F16, 7), 14);
	CHECK_INT_EQ(qtype_row_bytes(QT_Q4_0, 33), 0);
	CHECK_INT_EQ(qtype_row_bytes(QT_Q4_K, 128), 0);
	CHECK_INT_EQ(qtype_row_bytes(77, 32), 0);
}

/* ---- fp16 / bf16 ---- */

static void test_fp16(void)
{
	static const struct { float f; uint16_t h; } cases[] = {
		{ 1.0f, 0x3c00 }, { -2.0f, 0xc000 }, { 0.0f, 0x0000 }, { -0.0f, 0x8000 },
		{ 65504.0f, 0x7bff },                 /* largest half */
		{ 65519.99f, 0x7bff },                /* just below the halfway point */
		{ 65520.0f, 0x7c00 },                 /* halfway, odd mantissa: rounds to inf */
		{ 1e10f, 0x7c00 }, { -INFINITY, 0xfc00 },
		{ 0x1p-14f, 0x0400 },                 /* smallest normal */
		{ 0x1p-24f, 0x0001 },                 /* smallest subnormal */
		{ 0x1p-25f, 0x0000 },                 /* tie with 0: even */
		{ 0x1.8p-24f, 0x0002 },               /* tie 1.5 units: to 2 */
		{ 0x1.8p-25f, 0x0001 },               /* 0.75 units */
		{ 0x1.ff8p-15f, 0x03ff },             /* largest subnormal */
		{ 0x1.ffcp-15f, 0x0400 },             /* tie rounding up into the normals */
		{ 1.0f + 0x1p-11f, 0x3c00 },          /* tie, even below */
		{ 1.0f + 0x3p-11f, 0x3c02 },          /* tie, even above */
		{ 1.0f + 0x1p-11f + 0x1p-20f, 0x3c01 },
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		CHECK_INT_EQ(qt_f32_to_f16(cases[k].f), cases[k].h);
		if (!isinf(cases[k].f) && cases[k].h != 0x7c00 && fabsf(cases[k].f) <= 65504.0f &&
		    (bits(cases[k].f) & 0x1fff) == 0 && fabsf(cases[k].f) >= 0x1p-14f)
			CHECK(qt_f16_to_f32(cases[k].h) == cases[k].f);
	}
	CHECK(isnan(qt_f16_to_f32(qt_f32_to_f16(NAN))));
	CHECK_INT_EQ(qt_f32_to_f16(from_bits(0x7f800001)) & 0x7e00, 0x7e00); /* sNaN comes back quiet */
	CHECK(qt_f16_to_f32(0x0001) == 0x1p-24f);
	CHECK(qt_f16_to_f32(0x83ff) == -0x3ffp-24f);
	CHECK(isinf(qt_f16_to_f32(0x7c00)) && qt_f16_to_f32(0xfc00) < 0);

	if (!has_f16c()) {
		fprintf(stderr, "test_quant: no F16C, fp16 not compared with hardware\n");
		return;
	}
	/* every half, and a few million floats, against the F16C instructions */
	for (uint32_t h = 0; h < 0x10000; h++) {
		uint32_t want = bits(hw_f16_to_f32((uint16_t)h)), got = bits(qt_f16_to_f32((uint16_t)h));
		if (want != got) {
			CHECK_INT_EQ(got, want);
			break;
		}
	}
	for (int k = 0; k < 4000000; k++) {
		uint32_t u = (uint32_t)rnd() << 16 ^ rnd();
		if (k & 1) /* concentrate on the half range */
			u = (u & 0x8fffffff) | 0x30000000;
		float f = from_bits(u);
		if (qt_f32_to_f16(f) != hw_f32_to_f16(f)) {
			CHECK_INT_EQ(qt_f32_to_f16(f), hw_f32_to_f16(f));
			break;
		}
	}
}

static void test_bf16(void)
{
	CHECK_INT_EQ(qt_f32_to_bf16(1.0f), 0x3f80);
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie, even below */
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x3f818000)), 0x3f82); /* tie, even above */
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
	CHECK_INT_EQ(qt_f32_to_bf16(INFINITY), 0x7f80);
	CHECK_INT_EQ(qt_f32_to_bf16(-INFINITY), 0xff80);
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  /* FLT_MAX rounds to inf */
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x7f800001)), 0x7fc0);  /* sNaN made quiet */
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0xffc12345)), 0xffc1);
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x00010000)), 0x0001);  /* subnormals are kept */
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x00008000)), 0x0000);
	CHECK_INT_EQ(qt_f32_to_bf16(from_bits(0x00018000)), 0x0002);
	CHECK_INT_EQ(qt_f32_to_bf16(-0.0f), 0x8000);
	CHECK(qt_bf16_to_f32(0x3f80) == 1.0f);
	CHECK(qt_bf16_to_f32(0xc0a0) == -5.0f);
	CHECK(bits(qt_bf16_to_f32(0x0001)) == 0x00010000);
	CHECK(isnan(qt_bf16_to_f32(0x7fc1)));
}

/* ---- dequantization of hand-built blocks ---- */

static void test_dequant_q4_q8(void)
{
	float out[64];

	struct block_q4_1 b41[2];
	b41[0].d = 0x3800; /* 0.5 */
	b41[0].m = 0xbc00; /* -1 */
	b41[1].d = 0x4000; /* 2 */
	b41[1].m = 0x3c00; /* 1 */
	for (int j = 0; j < 16; j++) {
		b41[0].qs[j] = (uint8_t)(j | (15 - j) << 4);
		b41[1].qs[j] = (uint8_t)((j % 3) | 7 << 4);
	}
	quant_dequantize_row(QT_Q4_1, b41, out, 64);
	CHECK(out[0] == -1.0f);           /* 0 * 0.5 - 1 */
	CHECK(out[5] == 1.5f);            /* 5 * 0.5 - 1 */
	CHECK(out[15] == 6.5f);
	CHECK(out[16] == 6.5f);           /* high nibble of qs[0] = 15 */
	CHECK(out[31] == -1.0f);
	CHECK(out[32 + 4] == 3.0f);       /* (4 % 3) * 2 + 1 */
	CHECK(out[32 + 20] == 15.0f);     /* 7 * 2 + 1 */

	struct block_q4_0 b40;
	b40.d = 0x4000; /* 2 */
	for (int j = 0; j < 16; j++)
		b40.qs[j] = (uint8_t)(j | (j ^ 8) << 4);
	quant_dequantize_row(QT_Q4_0, &b40, out, 32);
	CHECK(out[0] == -16.0f);
	CHECK(out[8] == 0.0f);
	CHECK(out[15] == 14.0f);
	CHECK(out[16] == 0.0f);           /* 0 ^ 8 = 8 -> 0 */
	CHECK(out[16 + 8] == -16.0f);

	struct block_q8_0 b80;
	b80.d = 0x3400; /* 0.25 */
	for (int j = 0; j < 32; j++)
		b80.qs[j] = (int8_t)(j * 8 - 128);
	quant_dequantize_row(QT_Q8_0, &b80, out, 32);
	CHECK(out[0] == -32.0f);
	CHECK(out[16] == 0.0f);
	CHECK(out[31] == 30.0f);

	uint16_t h[3] = { 0x3c00, 0xc500, 0x0001 };
	quant_dequantize_row(QT_F16, h, out, 3);
	CHECK(out[0] == 1.0f && out[1] == -5.0f && out[2] == 0x1p-24f);
	uint16_t bf[2] = { 0x4040, 0xbf00 };
	quant_dequantize_row(QT_BF16, bf, out, 2);
	CHECK(out[0] == 3.0f && out[1] == -0.5f);
	float f[2] = { 1.25f, -7.0f };
	quant_dequantize_row(QT_F32, f, out, 2);
	CHECK(out[0] == 1.25f && out[1] == -7.0f);
}

/* ggml's 12-byte packing of eight 6-bit scales and mins (the inverse of
 * get_scale_min_k4). */
static void pack_scales_k4(const uint8_t *sc, const uint8_t *m, uint8_t *q)
{
	memset(q, 0, 12);
	for (int j = 0; j < 4; j++) {
		q[j] = (uint8_t)(sc[j] & 63);
		q[j + 4] = (uint8_t)(m[j] & 63);
	}
	for (int j = 4; j < 8; j++) {
		q[j + 4] = (uint8_t)((sc[j] & 0xf) | (m[j] & 0xf) << 4);
		q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
		q[j] |= (uint8_t)((m[j] >> 4) << 6);
	}
}

/* Q5: the fifth bit of element e is bit e of qh, little-endian (ggml). */
static void test_dequant_q5(void)
{
	float out[64];
	struct block_q5_0 b50;
	struct block_q5_1 b51;
	uint32_t qh = 1u << 0 | 1u << 3 | 1u << 16 | 1u << 31;

	b50.d = 0x4000; /* 2 */
	memcpy(b50.qh, &qh, 4);
	b51.d = 0x3800; /* 0.5 */
	b51.m = 0xbc00; /* -1 */
	memcpy(b51.qh, &qh, 4);
	for (int j = 0; j < 16; j++)
		b50.qs[j] = b51.qs[j] = (uint8_t)(j | (15 - j) << 4);
	quant_dequantize_row(QT_Q5_0, &b50, out, 32);
	CHECK(out[0] == 0.0f);            /* (0 | 16) - 16 */
	CHECK(out[1] == -30.0f);          /* (1 - 16) * 2 */
	CHECK(out[3] == 6.0f);            /* (3 | 16) - 16 = 3 */
	CHECK(out[15] == -2.0f);          /* 15 - 16 */
	CHECK(out[16] == 30.0f);          /* high nibble 15, bit 16 set: 31 - 16 */
	CHECK(out[17] == -4.0f);          /* 14 - 16 */
	CHECK(out[31] == 0.0f);           /* high nibble 0, bit 31 set */
	quant_dequantize_row(QT_Q5_1, &b51, out, 32);
	CHECK(out[0] == 7.0f);            /* 16 * 0.5 - 1 */
	CHECK(out[1] == -0.5f);           /* 1 * 0.5 - 1 */
	CHECK(out[16] == 14.5f);          /* 31 * 0.5 - 1 */
	CHECK(out[30] == -0.5f);          /* high nibble 1 */
	CHECK(out[31] == 7.0f);
}

static void test_dequant_k(void)
{
	static const uint8_t sc[8] = { 1, 2, 3, 63, 17, 32, 48, 5 };
	static const uint8_t mn[8] = { 0, 1, 62, 4, 33, 9, 16, 63 };
	float out[QK_K];

	/* Q4_K: element 64c + l is qs[32c + l] & 15, element 64c + 32 + l its high nibble */
	struct block_q4_k k4;
	k4.d = 0x3800;    /* 0.5 */
	k4.dmin = 0x3400; /* 0.25 */
	pack_scales_k4(sc, mn, k4.scales);
	for (int j = 0; j < 128; j++)
		k4.qs[j] = (uint8_t)((j % 16) | ((j * 7) % 16) << 4);
	quant_dequantize_row(QT_Q4_K, &k4, out, QK_K);
	for (int e = 0; e < QK_K; e++) {
		int s = e / 32, c = e / 64, l = e % 32;
		int q = e % 64 < 32 ? k4.qs[32 * c + l] & 15 : k4.qs[32 * c + l] >> 4;
		float want = 0.5f * sc[s] * q - 0.25f * mn[s]; /* all exact */
		if (out[e] != want) {
			fprintf(stderr, "Q4_K element %d: %g, expected %g\n", e, out[e], want);
			CHECK(0);
			break;
		}
	}
	CHECK(out[32 * 3] == 0.5f * 63 * (k4.qs[32] & 15) - 0.25f * 4); /* a scale of 63 */

	/* Q5_K: bit 2c (low half) / 2c+1 (high half) of qh[l] adds 16 */
	struct block_q5_k k5;
	k5.d = 0x3c00;    /* 1 */
	k5.dmin = 0x3800; /* 0.5 */
	pack_scales_k4(sc, mn, k5.scales);
	for (int j = 0; j < 128; j++)
		k5.qs[j] = (uint8_t)((j % 16) | ((j * 5) % 16) << 4);
	for (int j = 0; j < 32; j++)
		k5.qh[j] = (uint8_t)(j * 37 + 11);
	quant_dequantize_row(QT_Q5_K, &k5, out, QK_K);
	for (int e = 0; e < QK_K; e++) {
		int s = e / 32, c = e / 64, l = e % 32, high = e % 64 >= 32;
		int q = high ? k5.qs[32 * c + l] >> 4 : k5.qs[32 * c + l] & 15;
		q += ((k5.qh[l] >> (2 * c + high)) & 1) * 16;
		float want = 1.0f * sc[s] * q - 0.5f * mn[s];
		if (out[e] != want) {
			fprintf(stderr, "Q5_K element %d: %g, expected %g\n", e, out[e], want);
			CHECK(0);
			break;
		}
	}

	/* Q6_K: ql low/high nibbles and qh 2-bit pairs, minus 32, times an int8 scale per 16 */
	struct block_q6_k k6;
	int code[QK_K];
	memset(&k6, 0, sizeof k6);
	k6.d = 0x3400; /* 0.25 */
	for (int g = 0; g < 16; g++)
		k6.scales[g] = (int8_t)(g * 17 - 128);
	for (int e = 0; e < QK_K; e++) {
		code[e] = (e * 13 + 5) % 64;
		int half = e / 128, l = e % 32, qtr = (e % 128) / 32;
		uint8_t *ql = k6.ql + 64 * half + (qtr & 1) * 32 + l;
		*ql |= (uint8_t)((code[e] & 15) << (qtr & 2 ? 4 : 0));
		k6.qh[32 * half + l] |= (uint8_t)((code[e] >> 4) << (2 * qtr));
	}
	quant_dequantize_row(QT_Q6_K, &k6, out, QK_K);
	for (int e = 0; e < QK_K; e++) {
		float want = 0.25f * k6.scales[e / 16] * (code[e] - 32);
		if (out[e] != want) {
			fprintf(stderr, "Q6_K element %d: %g, expected %g\n", e, out[e], want);
			CHECK(0);
			break;
		}
	}
	CHECK(out[0] == 0.25f * -128 * (5 - 32));
}

/* ---- activation quantization against straightforward versions ---- */

static void ref_q8_0(const float *x, struct block_q8_0 *y, int nb, struct block_q8_1 *y1)
{
	for (int b = 0; b < nb; b++) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			if (fabsf(x[32 * b + j]) > amax)
				amax = fabsf(x[32 * b + j]);
		float d = amax / 127.0f;
		float id = amax != 0 ? 127.0f / amax : 0.0f;
		int sum = 0;
		for (int j = 0; j < 32; j++) {
			int q = (int)nearbyintf(x[32 * b + j] * id);
			y[b].qs[j] = (int8_t)q;
			sum += q;
		}
		y[b].d = to_f16(d);
		if (y1) {
			y1[b].d = y[b].d;
			memcpy(y1[b].qs, y[b].qs, 32);
			y1[b].s = to_f16((float)sum * d);
		}
	}
}

static void ref_q8_k(const float *x, struct block_q8_k *y, int nb)
{
	for (int b = 0; b < nb; b++) {
		const float *xb = x + QK_K * b;
		float max = 0;
		for (int j = 0; j < QK_K; j++)
			if (fabsf(xb[j]) > fabsf(max))
				max = xb[j];
		memset(&y[b], 0, sizeof y[b]);
		if (max == 0)
			continue;
		float iscale = -127.0f / max;
		for (int j = 0; j < QK_K; j++) {
			long v = lrintf(iscale * xb[j]);
			y[b].qs[j] = (int8_t)(v > 127 ? 127 : v);
			y[b].bsums[j / 16] += y[b].qs[j];
		}
		y[b].d = 1.0f / iscale;
	}
}

static void test_quantize(void)
{
	enum { N = 1024 };
	float x[N];
	struct block_q8_0 got0[N / 32], want0[N / 32];
	struct block_q8_1 got1[N / 32], want1[N / 32];
	struct block_q8_k gotk[N / QK_K], wantk[N / QK_K];

	for (int round = 0; round < 50; round++) {
		float scale = round < 10 ? 1.0f : ldexpf(1.0f, (int)(rnd() % 40) - 20);
		for (int e = 0; e < N; e++)
			x[e] = rndf() * scale;
		if (round == 1) {
			/* ties of x * id: amax 127 gives id = 1, so the rounding of halves shows */
			for (int e = 0; e < 64; e++)
				x[e] = e % 32 == 0 ? 127.0f : (float)(e % 7) - 3.5f;
			/* ties for Q8_K: the largest magnitude is 127, so iscale is -1 */
			for (int e = 256; e < 512; e++)
				x[e] = e == 300 ? 127.0f : (float)(e % 9) - 4.5f;
		}
		if (round == 2)
			for (int e = 0; e < 300; e++) /* all-zero blocks */
				x[e] = 0;
		if (round == 3)
			for (int e = 512; e < 768; e++) /* the largest magnitude negative */
				x[e] = e == 600 ? -3.0f : rndf();

		ref_q8_0(x, want0, N / 32, want1);
		ref_q8_k(x, wantk, N / QK_K);
		for (int isa = 0; isa < n_isas(); isa++) {
			quant_set_isa((enum quant_isa)isa);
			quant_quantize_row(QT_Q8_0, x, got0, N);
			quant_quantize_row(QT_Q8_1, x, got1, N);
			quant_quantize_row(QT_Q8_K, x, gotk, N);
			CHECK(memcmp(got0, want0, sizeof got0) == 0);
			CHECK(memcmp(got1, want1, sizeof got1) == 0);
			CHECK(memcmp(gotk, wantk, sizeof gotk) == 0);
		}
		quant_set_isa(quant_isa_best());
		if (round == 1) {
			CHECK_INT_EQ(got0[0].qs[1], -2);  /* -2.5 rounds to even, as ggml's x86 quantizer */
			CHECK_INT_EQ(got0[0].qs[6], 2);   /* 2.5 */
			CHECK_INT_EQ(got0[0].qs[5], 2);   /* 1.5 */
			CHECK_INT_EQ(gotk[1].qs[300 - 256], -127);
			CHECK_INT_EQ(gotk[1].qs[262 - 256], 4);  /* -(-3.5) -> 4, even */
			CHECK_INT_EQ(gotk[1].qs[263 - 256], 2);  /* -(-2.5) -> 2, even */
			CHECK_INT_EQ(gotk[1].qs[257 - 256], 0);  /* -0.5 -> 0 */
		}
	}

	/* F16 and BF16 rows: every element as the scalar conversion, on every ISA */
	for (int isa = 0; isa < n_isas(); isa++) {
		enum { M = 203 };
		float xs[M];
		uint16_t hs[M], bs[M];
		quant_set_isa((enum quant_isa)isa);
		for (int e = 0; e < M; e++)
			xs[e] = e < 8 ? from_bits(0x7f800001u + (uint32_t)e * 0x100000u) /* NaNs */
				      : from_bits((uint32_t)rnd() << 16 ^ rnd());
		quant_quantize_row(QT_F16, xs, hs, M);
		quant_quantize_row(QT_BF16, xs, bs, M);
		for (int e = 0; e < M; e++) {
			if (hs[e] != qt_f32_to_f16(xs[e]) || bs[e] != qt_f32_to_bf16(xs[e])) {
				fprintf(stderr, "%s: %08x -> f16 %04x bf16 %04x\n", quant_isa_name((enum quant_isa)isa),
					bits(xs[e]), hs[e], bs[e]);
				CHECK(0);
				break;
			}
		}
	}
	quant_set_isa(quant_isa_best());

	float f[5] = { 1.0f, -2.5f, 65520.0f, 0x1p-25f, 3.0f };
	uint16_t h[5], bf[5];
	float back[5];
	quant_quantize_row(QT_F16, f, h, 5);
	quant_quantize_row(QT_BF16, f, bf, 5);
	quant_quantize_row(QT_F32, f, back, 5);
	CHECK(h[0] == 0x3c00 && h[1] == 0xc100 && h[2] == 0x7c00 && h[3] == 0 && h[4] == 0x4200);
	CHECK(bf[0] == 0x3f80 && bf[1] == 0xc020 && bf[4] == 0x4040);
	CHECK(memcmp(back, f, sizeof f) == 0);
}

/* ---- quant_gemm ---- */

static const uint32_t weight_types[] = {
	QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K,
};

/* Random but well-formed weight rows of TYPE. */
static void fill_weights(uint32_t type, uint8_t *w, size_t ldw, int nw, int64_t n)
{
	for (int i = 0; i < nw; i++) {
		uint8_t *row = w + (size_t)i * ldw;
		size_t bytes = qtype_row_bytes(type, n);
		for (size_t k = 0; k < bytes; k++)
			row[k] = (uint8_t)rnd();
		const struct qtype_info *ti = qtype_get(type);
		for (int64_t b = 0; b < n / ti->blck; b++) {
			uint8_t *blk = row + b * ti->bytes;
			uint16_t d = to_f16(0.001f + 0.02f * fabsf(rndf()));
			uint16_t m = to_f16(0.05f * rndf());
			switch (type) {
			case QT_F32: {
				float v = rndf();
				memcpy(blk, &v, 4);
				break;
			}
			case QT_F16: {
				uint16_t v = to_f16(rndf());
				memcpy(blk, &v, 2);
				break;
			}
			case QT_BF16: {
				uint16_t v = qt_f32_to_bf16(rndf());
				memcpy(blk, &v, 2);
				break;
			}
			case QT_Q4_0:
			case QT_Q5_0:
			case QT_Q8_0:
			case QT_Q4_K:
			case QT_Q5_K:
				memcpy(blk, &d, 2);
				if (type == QT_Q4_K || type == QT_Q5_K)
					memcpy(blk + 2, &d, 2); /* dmin */
				break;
			case QT_Q4_1:
			case QT_Q5_1:
				memcpy(blk, &d, 2);
				memcpy(blk + 2, &m, 2);
				break;
			case QT_Q6_K:
				memcpy(blk + 208, &d, 2);
				break;
			}
		}
	}
}

static size_t vec_row_bytes(uint32_t type, int64_t n)
{
	return qtype_row_bytes(qtype_get(type)->vec_type, n);
}

static void fill_acts(uint32_t type, uint8_t *a, size_t lda, int na, int64_t n)
{
	float *x = malloc((size_t)n * sizeof *x);
	for (int j = 0; j < na; j++) {
		float scale = ldexpf(1.0f, (int)(rnd() % 8) - 3);
		for (int64_t e = 0; e < n; e++)
			x[e] = rndf() * scale;
		quant_quantize_row(qtype_get(type)->vec_type, x, a + (size_t)j * lda, n);
	}
	free(x);
}

/* The dot in double from dequantized rows.  Q4_1's s is d * sum(qs) rounded
 * to fp16, a rounding of the format itself: SLACK gets its size. */
static double ref_dot(uint32_t type, const uint8_t *wrow, const uint8_t *arow, int64_t n,
		      double *ret_mag, double *ret_slack)
{
	float *wf = malloc((size_t)n * sizeof *wf), *af = malloc((size_t)n * sizeof *af);
	double dot = 0, mag = 0, slack = 0;

	quant_dequantize_row(type, wrow, wf, n);
	quant_dequantize_row(qtype_get(type)->vec_type, arow, af, n);
	for (int64_t e = 0; e < n; e++) {
		dot += (double)wf[e] * af[e];
		mag += fabs((double)wf[e] * af[e]);
	}
	if (type == QT_Q4_1 || type == QT_Q5_1) {
		const size_t bytes = qtype_get(type)->bytes;
		const struct block_q8_1 *y = (const void *)arow;
		for (int64_t b = 0; b < n / QK; b++) {
			uint16_t m;
			memcpy(&m, wrow + b * bytes + 2, 2);
			slack += fabs(h2f(m)) * fabs(h2f(y[b].s)) * 0x1p-10;
		}
	}
	free(wf);
	free(af);
	*ret_mag = mag;
	*ret_slack = slack;
	return dot;
}

/* TYPE's N-wide ROWS rows against 19 activation rows. */
static void test_gemm_type(uint32_t type, int64_t n, const int rows)
{
	enum { NA = 19 };
	const struct qtype_info *ti = qtype_get(type);
	size_t ldw = qtype_row_bytes(type, n) + 64, lda = vec_row_bytes(type, n) + 32;
	size_t ldc = rows + 3;
	uint8_t *w = malloc(ldw * rows), *a = malloc(lda * NA);
	float *want = malloc(sizeof(float) * ldc * NA), *c = malloc(sizeof(float) * ldc * NA);
	char what[64];

	snprintf(what, sizeof what, "%s n=%lld x %d", ti->name, (long long)n, rows);
	fill_weights(type, w, ldw, rows, n);
	fill_acts(type, a, lda, NA, n);

	/* the scalar path is the oracle the others must equal bit for bit */
	quant_set_isa(QUANT_ISA_SCALAR);
	quant_gemm(type, n, w, ldw, rows, a, lda, NA, want, ldc);
	for (int j = 0; j < NA; j++) {
		for (int i = 0; i < rows; i++) {
			double mag, slack, ref = ref_dot(type, w + i * ldw, a + j * lda, n, &mag, &slack);
			double err = fabs(want[j * ldc + i] - ref);
			if (err > 1e-5 * mag + slack + 1e-30) {
				fprintf(stderr, "%s: c[%d][%d] = %.9g, reference %.9g (magnitude %.3g)\n",
					what, j, i, want[j * ldc + i], ref, mag);
				CHECK(0);
				goto out;
			}
		}
	}

	for (int isa = 0; isa < n_isas(); isa++) {
		quant_set_isa((enum quant_isa)isa);
		for (size_t k = 0; k < ldc * NA; k++)
			c[k] = -12345.0f;
		quant_gemm(type, n, w, ldw, rows, a, lda, NA, c, ldc);
		for (int j = 0; j < NA; j++) {
			for (int i = 0; i < (int)ldc; i++) {
				float got = c[j * ldc + i];
				if (i >= rows) {
					CHECK(got == -12345.0f); /* outside the tile: untouched */
					continue;
				}
				if (got != want[j * ldc + i]) {
					fprintf(stderr, "%s on %s: c[%d][%d] = %.9g, scalar %.9g\n", what,
						quant_isa_name((enum quant_isa)isa), j, i, got, want[j * ldc + i]);
					CHECK(0);
					goto out;
				}
			}
		}
		/* batch invariance: each element alone, and inside odd sub-tiles */
		for (int j = 0; j < NA; j += 3) {
			for (int i = 0; i < rows; i += 2) {
				float one;
				quant_gemm(type, n, w + i * ldw, ldw, 1, a + j * lda, lda, 1, &one, 1);
				if (one != want[j * ldc + i]) {
					fprintf(stderr, "%s on %s: c[%d][%d] alone = %.9g, in the tile %.9g\n", what,
						quant_isa_name((enum quant_isa)isa), j, i, one, want[j * ldc + i]);
					CHECK(0);
					goto out;
				}
			}
		}
		/* every row count the kernels branch on (decode's direct kernel
		 * takes up to four activation rows, tiles take two at a time) */
		for (int na = 1; na <= 7; na++) {
			int i0 = 5, j0 = 2, nw = 7;
			quant_gemm(type, n, w + i0 * ldw, ldw, nw, a + j0 * lda, lda, na, c, 8);
			for (int j = 0; j < na; j++)
				for (int i = 0; i < nw; i++)
					if (c[j * 8 + i] != want[(j0 + j) * ldc + i0 + i]) {
						fprintf(stderr, "%s on %s: %d rows: c[%d][%d] = %.9g, scalar %.9g\n", what,
							quant_isa_name((enum quant_isa)isa), na, j0 + j, i0 + i, c[j * 8 + i],
							want[(j0 + j) * ldc + i0 + i]);
						CHECK(0);
						goto out;
					}
		}
	}
	/* AVX-512 reads every type from the file's blocks: no packed copy */
	if (quant_isa_best() >= QUANT_ISA_AVX512) {
		struct quant_packed *pk = NULL;
		quant_set_isa(quant_isa_best());
		CHECK(quant_pack(type, n, w, ldw, rows, &pk) == -ENOTSUP && !pk);
	}
	/* packed weights (AVX2's layout): the same bits through every kernel
	 * and every row range, and through the fallback once the ISA changes */
	if (quant_isa_best() >= QUANT_ISA_AVX2) {
		struct quant_packed *pk = NULL;
		quant_set_isa(QUANT_ISA_AVX2);
		int r = quant_pack(type, n, w, ldw, rows, &pk);
		int q32 = type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q5_0 || type == QT_Q5_1 || type == QT_Q8_0;
		CHECK(q32 ? r == 0 : r == -ENOTSUP);
		for (int isa = QUANT_ISA_AVX2; pk && isa >= QUANT_ISA_SCALAR; isa -= QUANT_ISA_AVX2) {
			quant_set_isa((enum quant_isa)isa);
			/* the activations packed once (AVX2), each row apart */
			size_t xrow = quant_packed_acts_bytes(pk, 1);
			CHECK(isa == QUANT_ISA_AVX2 ? xrow > 0 : xrow == 0);
			uint8_t *xp = xrow ? aligned_alloc(64, xrow * NA) : NULL;
			for (int j = 0; xp && j < NA / 2; j++) /* a row at a time, then the rest at once */
				quant_packed_pack_acts(pk, a + j * lda, lda, 1, xp + j * xrow);
			if (xp)
				quant_packed_pack_acts(pk, a + NA / 2 * lda, lda, NA - NA / 2, xp + NA / 2 * xrow);
			for (int na = 1; na <= 9; na += (na < 5 ? 1 : 2)) {
				int i0 = na % 3, j0 = NA - na - 3, nw = rows - 2 * (na % 3);
				for (int how = 0; how < (xp ? 2 : 1); how++) {
					if (how)
						quant_gemm_packed_acts(pk, i0, nw, xp + j0 * xrow, na, c, ldc);
					else
						quant_gemm_packed(pk, i0, nw, a + j0 * lda, lda, na, c, ldc);
					for (int j = 0; j < na; j++)
						for (int i = 0; i < nw; i++)
							if (c[j * ldc + i] != want[(j0 + j) * ldc + i0 + i]) {
								fprintf(stderr, "%s packed%s on %s: %d rows: c[%d][%d] = %.9g, scalar %.9g\n",
									what, how ? " with packed activations" : "",
									quant_isa_name((enum quant_isa)isa), na, j0 + j, i0 + i,
									c[j * ldc + i], want[(j0 + j) * ldc + i0 + i]);
								CHECK(0);
								free(xp);
								quant_packed_free(pk);
								goto out;
							}
				}
			}
			free(xp);
		}
		quant_packed_free(pk);
	}
out:
	quant_set_isa(quant_isa_best());
	free(w);
	free(a);
	free(want);
	free(c);
}

/* TYPE's N-wide ROWS rows cut as the CPU backend cuts a matmul among its
 * threads (contiguous row ranges of any size, each its own quant_gemm) and
 * against every activation row count the kernels treat apart (up to four
 * rows straight from the blocks, more repacked, in tiles of four with a
 * ragged last): every part gives the scalar bits on every ISA. */
static void test_gemm_splits(uint32_t type, int64_t n, const int rows)
{
	enum { NA = 13 };
	static const int counts[] = { 1, 2, 3, 4, 5, 8, 13 };
	size_t ldw = qtype_row_bytes(type, n), lda = vec_row_bytes(type, n);
	uint8_t *w = malloc(ldw * rows), *a = malloc(lda * NA);
	float *want = malloc(sizeof(float) * rows * NA), *c = malloc(sizeof(float) * rows * NA);

	fill_weights(type, w, ldw, rows, n);
	fill_acts(type, a, lda, NA, n);
	quant_set_isa(QUANT_ISA_SCALAR);
	quant_gemm(type, n, w, ldw, rows, a, lda, NA, want, rows);
	for (int isa = 1; isa < n_isas(); isa++) {
		quant_set_isa((enum quant_isa)isa);
		for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
			const int na = counts[k], j0 = NA - na;
			for (int parts = 1; parts <= 7; parts++) {
				for (int p = 0; p < parts; p++) {
					int r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
					if (r1 > r0)
						quant_gemm(type, n, w + (size_t)r0 * ldw, ldw, r1 - r0, a + (size_t)j0 * lda,
							   lda, na, c + r0, rows);
				}
				for (int j = 0; j < na; j++)
					for (int i = 0; i < rows; i++)
						if (c[j * rows + i] != want[(j0 + j) * rows + i]) {
							fprintf(stderr, "%s n=%lld x %d on %s, %d rows in %d parts: c[%d][%d] = %.9g, "
								"scalar %.9g\n", qtype_get(type)->name, (long long)n, rows,
								quant_isa_name((enum quant_isa)isa), na, parts, j0 + j, i,
								c[j * rows + i], want[(j0 + j) * rows + i]);
							CHECK(0);
							goto out;
						}
			}
		}
	}
out:
	quant_set_isa(quant_isa_best());
	free(w);
	free(a);
	free(want);
	free(c);
}

static void test_gemm(void)
{
	/* 576, 960 and 1536 are SmolLM2's (AVX2 has kernels compiled for
	 * them); 544, 640 and 1120 end in 1, 4 and 3 blocks past a whole group
	 * of 16, 800 in two whole quads and one block; 32, 64 and 96 have no
	 * whole group */
	static const int64_t sizes[] = { 32, 64, 96, 256, 544, 576, 640, 800, 960, 1120, 1536 };
	static const int64_t odd[] = { 1, 7, 17, 33 };

	for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
		uint32_t type = weight_types[t];
		for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
			if (sizes[k] % qtype_get(type)->blck == 0)
				test_gemm_type(type, sizes[k], 37);
		if (qtype_get(type)->blck == 1)
			for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++)
				test_gemm_type(type, odd[k], 37);
		/* AVX2 takes packed rows against many activation rows in strips
		 * of up to 128 KiB: 300 rows are several strips and a ragged
		 * last one, in the 1536-wide kernel and the general one */
		if (type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q5_0 || type == QT_Q5_1 || type == QT_Q8_0) {
			test_gemm_type(type, 1536, 300);
			test_gemm_type(type, 4096, 300);
		}
		/* Gemma 3 270M's shapes: 640 (a whole group of 16 and a quad),
		 * 1024 and 2048 (whole groups, four and eight super-blocks) */
		if (qtype_get(type)->blck == QK) {
			test_gemm_splits(type, 640, 45);
			test_gemm_splits(type, 2048, 23);
		} else if (qtype_get(type)->blck == QK_K) {
			test_gemm_splits(type, 1024, 45);
			test_gemm_splits(type, 2048, 23);
		}
	}
}

/* Q8_0 weights may hold -128 (ggml never writes it, other tools might):
 * every ISA still agrees. */
static void test_gemm_q8_0_extremes(void)
{
	enum { N = 128 };
	struct block_q8_0 w[2][N / 32];
	uint8_t a[2 * sizeof(struct block_q8_0) * N / 32];
	float want[4], got[4];

	for (int i = 0; i < 2; i++)
		for (int b = 0; b < N / 32; b++) {
			w[i][b].d = 0x3c00;
			for (int e = 0; e < 32; e++)
				w[i][b].qs[e] = (int8_t)(i == 0 ? -128 : (e & 1 ? 127 : -128));
		}
	float x[2][N];
	for (int e = 0; e < N; e++) {
		x[0][e] = e % 2 ? 1.0f : -1.0f;
		x[1][e] = -1.0f;
	}
	quant_quantize_row(QT_Q8_0, x[0], a, N);
	quant_quantize_row(QT_Q8_0, x[1], a + sizeof(struct block_q8_0) * N / 32, N);
	quant_set_isa(QUANT_ISA_SCALAR);
	quant_gemm(QT_Q8_0, N, w, sizeof w[0], 2, a, sizeof(struct block_q8_0) * N / 32, 2, want, 2);
	CHECK(want[0] == 0.0f);                     /* -128 * (+-127) cancels */
	for (int isa = 1; isa < n_isas(); isa++) {
		quant_set_isa((enum quant_isa)isa);
		quant_gemm(QT_Q8_0, N, w, sizeof w[0], 2, a, sizeof(struct block_q8_0) * N / 32, 2, got, 2);
		CHECK(memcmp(got, want, sizeof want) == 0);
	}
	quant_set_isa(quant_isa_best());
}

/* K-quant codes and scales at their largest (Q6_K's scales at both ends)
 * against activation codes of +127, of -128 (which quantize_row never
 * writes, other tools might) and alternating: the integer sums at their
 * widest (a Q4_K group's 16 products at the edge of int16), every ISA
 * and both AVX-512 paths (one row from the blocks, eight repacked) agree
 * with the scalar code. */
static void test_gemm_k_extremes(void)
{
	enum { N = 2 * QK_K, NW = 3, NA = 8 };
	static const uint32_t types[] = { QT_Q4_K, QT_Q5_K, QT_Q6_K };
	struct block_q8_k a[NA][N / QK_K];

	memset(a, 0, sizeof a);
	for (int j = 0; j < NA; j++)
		for (int b = 0; b < N / QK_K; b++) {
			a[j][b].d = 1.0f / (1 + j);
			for (int e = 0; e < QK_K; e++)
				a[j][b].qs[e] = (int8_t)(j % 3 == 0 ? 127 : j % 3 == 1 ? -128 : (e + b) % 2 ? 127 : -128);
			for (int g = 0; g < QK_K / 16; g++) {
				int sum = 0;
				for (int l = 0; l < 16; l++)
					sum += a[j][b].qs[16 * g + l];
				a[j][b].bsums[g] = (int16_t)sum;
			}
		}
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		uint32_t type = types[t];
		size_t ldw = qtype_row_bytes(type, N);
		uint8_t *w = malloc(ldw * NW);
		float want[NA * NW], got[NA * NW];
		memset(w, 0xff, ldw * NW);
		for (int i = 0; i < NW; i++)
			for (int b = 0; b < N / QK_K; b++) {
				uint8_t *blk = w + (size_t)i * ldw + (size_t)b * qtype_get(type)->bytes;
				uint16_t one = 0x3c00;
				if (type == QT_Q6_K) {
					memset(blk + 192, i == 0 ? 127 : i == 1 ? 0x80 : 0xff, 16);
					memcpy(blk + 208, &one, 2);
				} else {
					memcpy(blk, &one, 2);
					memcpy(blk + 2, &one, 2);
				}
			}
		quant_set_isa(QUANT_ISA_SCALAR);
		quant_gemm(type, N, w, ldw, NW, a, sizeof a[0], NA, want, NW);
		for (int isa = 1; isa < n_isas(); isa++) {
			quant_set_isa((enum quant_isa)isa);
			for (int na = 1; na <= NA; na += NA - 1) {
				quant_gemm(type, N, w, ldw, NW, a[NA - na], sizeof a[0], na, got, NW);
				for (int k = 0; k < na * NW; k++)
					if (memcmp(&got[k], &want[(NA - na) * NW + k], 4)) {
						fprintf(stderr, "%s extremes on %s, %d rows: c[%d] = %.9g, scalar %.9g\n",
							qtype_get(type)->name, quant_isa_name((enum quant_isa)isa), na, k, got[k],
							want[(NA - na) * NW + k]);
						CHECK(0);
						break;
					}
			}
		}
		free(w);
	}
	quant_set_isa(quant_isa_best());
}

/* BYTES of room that end exactly where an inaccessible page begins, so a
 * kernel reading one byte past its rows faults. */
static uint8_t *guarded(size_t bytes, void **ret_map, size_t *ret_len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t len = (bytes + page - 1) / page * page + page;
	uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED)
		return NULL;
	mprotect(map + len - page, page, PROT_NONE);
	*ret_map = map;
	*ret_len = len;
	return map + len - page - bytes;
}

/* No kernel reads past the last weight or activation row (ragged group ends
 * load under masks), for every type, ISA and both AVX-512 paths. */
static void test_gemm_bounds(void)
{
	static const int64_t sizes[] = { 32, 96, 256, 544, 576, 960, 1536 };
	for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
		uint32_t type = weight_types[t];
		for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
			int64_t n = sizes[k];
			if (n % qtype_get(type)->blck)
				continue;
			size_t ldw = qtype_row_bytes(type, n), lda = vec_row_bytes(type, n);
			void *wmap, *amap;
			size_t wlen, alen;
			uint8_t *w = guarded(ldw * 5, &wmap, &wlen), *a = guarded(lda * 6, &amap, &alen);
			float c[5 * 6], want[5 * 6];
			if (!w || !a) {
				CHECK(0);
				return;
			}
			fill_weights(type, w, ldw, 5, n);
			fill_acts(type, a, lda, 6, n);
			quant_set_isa(QUANT_ISA_SCALAR);
			quant_gemm(type, n, w, ldw, 5, a, lda, 6, want, 5);
			for (int isa = 0; isa < n_isas(); isa++) {
				quant_set_isa((enum quant_isa)isa);
				for (int na = 1; na <= 6; na += 5) { /* direct and repacked */
					const uint8_t *alast = a + lda * (size_t)(6 - na);
					quant_gemm(type, n, w, ldw, 5, alast, lda, na, c, 5);
					for (int j = 0; j < na; j++)
						for (int i = 0; i < 5; i++)
							CHECK(c[j * 5 + i] == want[(6 - na + j) * 5 + i]);
				}
			}
			munmap(wmap, wlen);
			munmap(amap, alen);
		}
	}
	quant_set_isa(quant_isa_best());
}

static void test_isa(void)
{
	enum quant_isa best = quant_isa_best();
	CHECK(quant_set_isa(QUANT_ISA_AVX512VNNI) == best); /* clamped */
	CHECK(quant_get_isa() == best);
	CHECK(quant_set_isa(QUANT_ISA_SCALAR) == QUANT_ISA_SCALAR);
	CHECK(quant_get_isa() == QUANT_ISA_SCALAR);
	CHECK_STR_EQ(quant_isa_name(QUANT_ISA_AVX512VNNI), "avx512vnni");
	quant_set_isa(best);
	fprintf(stderr, "test_quant: best ISA %s\n", quant_isa_name(best));
}

/* ---- LLMD_QUANT_BENCH=1: SmolLM2-135M's matmuls ---- */

struct bench_mat {
	uint32_t type;  /* weight type */
	int64_t n;      /* row length */
	int rows;       /* rows */
	uint8_t *w;     /* rows x row bytes */
	struct quant_packed *pk; /* its packed copy, as the engine keeps one, or NULL */
};

struct bench_job {
	struct bench_mat *mats; /* the model's matrices */
	int nmats;              /* entries in mats */
	uint8_t *act[2];        /* per vec type (Q8_0, Q8_1): T rows of the longest n */
	float *out;             /* T x the largest rows */
	int t;                  /* activation rows */
	int part, nparts;       /* this thread's share of every matrix's rows */
};

static void bench_run(struct bench_job *job)
{
	for (int m = 0; m < job->nmats; m++) {
		struct bench_mat *bm = &job->mats[m];
		size_t ldw = qtype_row_bytes(bm->type, bm->n);
		int lo = (int)((int64_t)bm->rows * job->part / job->nparts);
		int hi = (int)((int64_t)bm->rows * (job->part + 1) / job->nparts);
		uint8_t *a = job->act[bm->type == QT_Q4_1 ? 1 : 0];
		if (bm->pk)
			quant_gemm_packed(bm->pk, lo, hi - lo, a, vec_row_bytes(bm->type, bm->n), job->t, job->out + lo,
					  (size_t)bm->rows);
		else
			quant_gemm(bm->type, bm->n, bm->w + (size_t)lo * ldw, ldw, hi - lo, a,
				   vec_row_bytes(bm->type, bm->n), job->t, job->out + lo, (size_t)bm->rows);
	}
}

/* A second, persistent thread (as the engine's pool would be) that runs
 * part 1 of every pass between two barrier waits. */
static pthread_barrier_t bench_start, bench_done;
static struct bench_job bench_jobs[2];
static int bench_quit;

static void *bench_worker(void *arg)
{
	for (;;) {
		pthread_barrier_wait(&bench_start);
		if (bench_quit)
			return arg;
		bench_run(&bench_jobs[1]);
		pthread_barrier_wait(&bench_done);
	}
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return a < b ? -1 : a > b;
}

static double bench_pass(struct bench_mat *mats, int nmats, uint8_t **act, float *out, int t, int threads)
{
	for (int p = 0; p < threads; p++)
		bench_jobs[p] = (struct bench_job){ mats, nmats, { act[0], act[1] }, out, t, p, threads };
	double t0 = clock_s();
	if (threads > 1)
		pthread_barrier_wait(&bench_start);
	bench_run(&bench_jobs[0]);
	if (threads > 1)
		pthread_barrier_wait(&bench_done);
	return clock_s() - t0;
}

/* The memory read bandwidth the weights stream at best: THREADS threads
 * each summing its share of a 256 MiB buffer (far past the caches), best
 * of five passes.  Decode reads every weight once per token, so this over
 * the bytes of weights per token bounds its tokens/s. */
struct membw_job {
	const uint64_t *p; /* this thread's share */
	size_t n;          /* words in it */
	uint64_t sum;      /* keeps the loads alive */
};

__attribute__((target("avx2"))) static void *membw_read_avx2(void *arg)
{
	struct membw_job *j = arg;
	const __m256i *p = (const __m256i *)j->p;
	__m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
	for (size_t i = 0; i + 16 <= j->n; i += 16, p += 4) {
		s0 = _mm256_add_epi64(s0, _mm256_load_si256(p));
		s1 = _mm256_add_epi64(s1, _mm256_load_si256(p + 1));
		s2 = _mm256_add_epi64(s2, _mm256_load_si256(p + 2));
		s3 = _mm256_add_epi64(s3, _mm256_load_si256(p + 3));
	}
	s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
	j->sum = (uint64_t)_mm256_extract_epi64(s0, 0);
	return NULL;
}

static void *membw_read(void *arg)
{
	struct membw_job *j = arg;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	for (size_t i = 0; i + 4 <= j->n; i += 4) {
		s0 += j->p[i];
		s1 += j->p[i + 1];
		s2 += j->p[i + 2];
		s3 += j->p[i + 3];
	}
	j->sum = s0 + s1 + s2 + s3;
	return NULL;
}


static void bench_membw(void)
{
	const size_t bytes = (size_t)256 << 20;
	uint64_t *buf = aligned_alloc(64, bytes);
	if (!buf)
		return;
	memset(buf, 1, bytes);
	for (int threads = 1; threads <= 2; threads++) {
		double best = 1e9;
		for (int rep = 0; rep < 5; rep++) {
			struct membw_job jobs[2];
			pthread_t th[2];
			double t0 = clock_s();
			for (int t = 0; t < threads; t++) {
				size_t n = bytes / 8 / threads;
				jobs[t] = (struct membw_job){ buf + t * n, n, 0 };
				pthread_create(&th[t], NULL, quant_isa_best() >= QUANT_ISA_AVX2 ? membw_read_avx2 : membw_read,
					       &jobs[t]);
			}
			for (int t = 0; t < threads; t++)
				pthread_join(th[t], NULL);
			double dt = clock_s() - t0;
			if (dt < best)
				best = dt;
		}
		fprintf(stderr, "bench: memory read bandwidth, %d thread%s: %.1f GB/s (256 MiB, best of 5)\n",
			threads, threads > 1 ? "s" : "", bytes / best / 1e9);
	}
	free(buf);
}

static void bench(void)
{
	enum { LAYERS = 30, T = 128 };
	struct bench_mat mats[LAYERS * 7 + 1];
	int nmats = 0;
	double bytes = 0, macs = 0;

	for (int l = 0; l < LAYERS; l++) {
		static const int shape[7][2] = {
			{ 576, 576 }, { 192, 576 }, { 192, 576 }, { 576, 576 }, { 1536, 576 }, { 1536, 576 }, { 576, 1536 },
		};
		for (int k = 0; k < 7; k++)
			mats[nmats++] = (struct bench_mat){ QT_Q4_1, shape[k][1], shape[k][0], NULL, NULL };
	}
	mats[nmats++] = (struct bench_mat){ QT_Q8_0, 576, 49152, NULL, NULL };
	for (int m = 0; m < nmats; m++) {
		size_t sz = qtype_row_bytes(mats[m].type, mats[m].n) * mats[m].rows;
		mats[m].w = aligned_alloc(64, (sz + 63) & ~(size_t)63);
		fill_weights(mats[m].type, mats[m].w, qtype_row_bytes(mats[m].type, mats[m].n), mats[m].rows, mats[m].n);
		if (quant_pack(mats[m].type, mats[m].n, mats[m].w, qtype_row_bytes(mats[m].type, mats[m].n),
			       mats[m].rows, &mats[m].pk) < 0)
			mats[m].pk = NULL;
		bytes += sz;
		macs += (double)mats[m].n * mats[m].rows;
	}
	uint8_t *act[2];
	act[0] = malloc(vec_row_bytes(QT_Q8_0, 1536) * T);
	act[1] = malloc(vec_row_bytes(QT_Q4_1, 1536) * T);
	/* every matrix reads its activations with its own row length; the rows
	 * are refilled per length in the timed code's place, so fill for 1536
	 * and reuse the prefix (values are irrelevant to the timing) */
	fill_acts(QT_Q8_0, act[0], vec_row_bytes(QT_Q8_0, 1536), T, 1536);
	fill_acts(QT_Q4_1, act[1], vec_row_bytes(QT_Q4_1, 1536), T, 1536);
	float *out = malloc(sizeof(float) * 49152 * T);

	fprintf(stderr, "bench: %.1f MB of weights, %.1f M MACs per token, ISA %s, %s\n", bytes / 1e6, macs / 1e6,
		quant_isa_name(quant_get_isa()), mats[0].pk ? "packed copies (as the engine reads)" : "file layout");
	pthread_t worker;
	pthread_barrier_init(&bench_start, NULL, 2);
	pthread_barrier_init(&bench_done, NULL, 2);
	pthread_create(&worker, NULL, bench_worker, NULL);
	/* rows per step: LLMD_QUANT_BENCH_T="1,8,32" (each 1..128), else 1 and 128 */
	int ts[16] = { 1, T }, n_ts = 2;
	const char *te = getenv("LLMD_QUANT_BENCH_T");
	if (te) {
		n_ts = 0;
		for (char *end; *te && n_ts < 16; te = *end ? end + 1 : end) {
			long v = strtol(te, &end, 10);
			if (end == te)
				break;
			if (v >= 1 && v <= T)
				ts[n_ts++] = (int)v;
		}
	}
	for (int threads = 1; threads <= 2; threads++) {
		for (int ti = 0; ti < n_ts; ti++) {
			const int t = ts[ti];
			int reps = t == 1 ? 15 : 5;
			double times[16];
			bench_pass(mats, nmats, act, out, t, threads); /* warm */
			for (int r = 0; r < reps; r++)
				times[r] = bench_pass(mats, nmats, act, out, t, threads);
			qsort(times, (size_t)reps, sizeof times[0], cmp_double);
			double med = times[reps / 2];
			fprintf(stderr, "bench: threads %d T=%3d: median %.2f ms (min %.2f): %.1f GB/s weights, "
				"%.1f GOPS, %.0f tok/s (matmuls only)\n", threads, t, med * 1e3, times[0] * 1e3,
				bytes / med / 1e9, 2 * macs * t / med / 1e9, t / med);
		}
	}
	bench_quit = 1;
	pthread_barrier_wait(&bench_start);
	pthread_join(worker, NULL);
	for (int m = 0; m < nmats; m++) {
		free(mats[m].w);
		quant_packed_free(mats[m].pk);
	}
	free(act[0]);
	free(act[1]);
	free(out);
}

int main(void)
{
	const char *b = getenv("LLMD_QUANT_BENCH");
	if (b && *b == '1') {
		const char *isa = getenv("LLMD_QUANT_ISA");
		if (isa)
			quant_set_isa((enum quant_isa)atoi(isa));
		bench_membw();
		bench();
		return 0;
	}
	test_types();
	test_fp16();
	test_bf16();
	test_dequant_q4_q8();
	test_dequant_q5();
	test_dequant_k();
	test_quantize();
	test_isa();
	test_gemm();
	test_gemm_q8_0_extremes();
	test_gemm_k_extremes();
	test_gemm_bounds();
	return test_result();
}
