/* quant.c - ggml's block formats: dequantization, activation quantization,
 * the portable dot products and the choice of SIMD path.  The SIMD kernels
 * live in quant_avx2.c and quant_avx512.c, the type table and fp16/bf16
 * conversion in quant_common.c; this file holds no intrinsics and knows
 * nothing of tensors, threads or models.
 */
#include <cpuid.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "quant_impl.h"


/* ---- block helpers ---- */

static qt_f16 ld_f16(const uint8_t *p)
{
	qt_f16 h;
	memcpy(&h, p, 2);
	return h;
}

/* Element E's five-bit code (0..31) of the Q5 block at X, its qs at QOFF
 * (6 or 8) and qh just before. */
static int q5_code(const uint8_t *x, int qoff, int e)
{
	uint32_t qh;
	memcpy(&qh, x + qoff - 4, 4);
	int lo = e < 16 ? x[qoff + e] & 0xf : x[qoff + e - 16] >> 4;
	return lo | (int)(qh >> e & 1) << 4;
}

#define F16(h) qt_f16_to_f32(h)

/* ---- dequantization ---- */

/* The 6-bit scale and min of sub-block J of a Q4_K/Q5_K super-block. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *ret_sc, uint8_t *ret_m)
{
	if (j < 4) {
		*ret_sc = q[j] & 63;
		*ret_m = q[j + 4] & 63;
	} else {
		*ret_sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
		*ret_m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

/* Element E (0..255) of a Q6_K super-block as its unsigned 6-bit code. */
static int q6_k_code(const struct block_q6_k *x, int e)
{
	int half = e / 128, l = e % 32, quarter = (e % 128) / 32;
	const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
	int low = quarter & 1 ? ql[l + 32] : ql[l];

	low = quarter & 2 ? low >> 4 : low & 0xf;
	return low | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

/* Element E (0..255) of a Q4_K (QH == NULL) or Q5_K super-block's codes. */
static int q45_k_code(const uint8_t *qs, const uint8_t *qh, int e)
{
	int chunk = e / 64, l = e % 32, high = (e % 64) >= 32;
	int q = qs[32 * chunk + l];

	q = high ? q >> 4 : q & 0xf;
	if (qh && (qh[l] >> (2 * chunk + high)) & 1)
		q += 16;
	return q;
}

void quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
	switch (type) {
	case QT_F32:
		memcpy(dst, src, (size_t)n * sizeof(float));
		break;
	case QT_F16:
		if (quant_get_isa() >= QUANT_ISA_AVX2 && quant_avx2_dequantize_row(type, src, dst, n) == 0)
			break;
		for (int64_t i = 0; i < n; i++)
			dst[i] = F16(((const qt_f16 *)src)[i]);
		break;
	case QT_BF16:
		if (quant_get_isa() >= QUANT_ISA_AVX2 && quant_avx2_dequantize_row(type, src, dst, n) == 0)
			break;
		for (int64_t i = 0; i < n; i++)
			dst[i] = qt_bf16_to_f32(((const qt_bf16 *)src)[i]);
		break;
	case QT_Q4_0:
		for (int64_t b = 0; b < n / QK; b++) {
			const struct block_q4_0 *x = (const struct block_q4_0 *)src + b;
			float d = F16(x->d);
			for (int j = 0; j < QK / 2; j++) {
				dst[b * QK + j] = ((x->qs[j] & 0xf) - 8) * d;
				dst[b * QK + j + QK / 2] = ((x->qs[j] >> 4) - 8) * d;
			}
		}
		break;
	case QT_Q4_1:
		for (int64_t b = 0; b < n / QK; b++) {
			const struct block_q4_1 *x = (const struct block_q4_1 *)src + b;
			float d = F16(x->d), m = F16(x->m);
			for (int j = 0; j < QK / 2; j++) {
				/* ggml: x0*d + m, two roundings */
				float lo = (x->qs[j] & 0xf) * d, hi = (x->qs[j] >> 4) * d;
				dst[b * QK + j] = lo + m;
				dst[b * QK + j + QK / 2] = hi + m;
			}
		}
		break;
	case QT_Q5_0:
	case QT_Q5_1:
		for (int64_t b = 0; b < n / QK; b++) {
			const uint8_t *x = (const uint8_t *)src + b * qtype_table[type].bytes;
			float d = F16(ld_f16(x)), m = type == QT_Q5_1 ? F16(ld_f16(x + 2)) : 0;
			for (int e = 0; e < QK; e++) {
				/* ggml: (q - 16) * d, or q * d + m (two roundings) */
				int q = q5_code(x, type == QT_Q5_1 ? 8 : 6, e);
				float qd = (float)(type == QT_Q5_0 ? q - 16 : q) * d;
				dst[b * QK + e] = type == QT_Q5_0 ? qd : qd + m;
			}
		}
		break;
	case QT_Q8_0:
		if (quant_get_isa() >= QUANT_ISA_AVX2 && quant_avx2_dequantize_row(type, src, dst, n) == 0)
			break;
		for (int64_t b = 0; b < n / QK; b++) {
			const struct block_q8_0 *x = (const struct block_q8_0 *)src + b;
			float d = F16(x->d);
			for (int j = 0; j < QK; j++)
				dst[b * QK + j] = x->qs[j] * d;
		}
		break;
	case QT_Q8_1:
		for (int64_t b = 0; b < n / QK; b++) {
			const struct block_q8_1 *x = (const struct block_q8_1 *)src + b;
			float d = F16(x->d);
			for (int j = 0; j < QK; j++)
				dst[b * QK + j] = x->qs[j] * d;
		}
		break;
	case QT_Q4_K:
	case QT_Q5_K:
		for (int64_t b = 0; b < n / QK_K; b++) {
			const struct block_q4_k *x4 = (const struct block_q4_k *)src + b;
			const struct block_q5_k *x5 = (const struct block_q5_k *)src + b;
			int five = type == QT_Q5_K;
			const uint8_t *scales = five ? x5->scales : x4->scales;
			float d = F16(five ? x5->d : x4->d), dmin = F16(five ? x5->dmin : x4->dmin);
			for (int s = 0; s < 8; s++) {
				uint8_t sc, m;
				scale_min_k4(s, scales, &sc, &m);
				float d1 = d * sc, m1 = dmin * m;
				for (int l = 0; l < 32; l++) {
					int e = 32 * s + l;
					int q = five ? q45_k_code(x5->qs, x5->qh, e) : q45_k_code(x4->qs, NULL, e);
					float t = d1 * q; /* ggml: d1*q - m1, two roundings */
					dst[b * QK_K + e] = t - m1;
				}
			}
		}
		break;
	case QT_Q6_K:
		for (int64_t b = 0; b < n / QK_K; b++) {
			const struct block_q6_k *x = (const struct block_q6_k *)src + b;
			float d = F16(x->d);
			for (int e = 0; e < QK_K; e++) {
				float ds = d * x->scales[e / 16];
				dst[b * QK_K + e] = ds * (q6_k_code(x, e) - 32);
			}
		}
		break;
	case QT_Q8_K:
		for (int64_t b = 0; b < n / QK_K; b++) {
			const struct block_q8_k *x = (const struct block_q8_k *)src + b;
			for (int e = 0; e < QK_K; e++)
				dst[b * QK_K + e] = x->d * x->qs[e];
		}
		break;
	default:
		break;
	}
}

/* ---- activation quantization (ggml's quantize_row_*_ref) ---- */

/* ggml's nearest_int (which adds 1.5 * 2^23 and takes the bits): round to
 * nearest, ties to even, for |f| < 2^22.  lrintf does the same, and unlike
 * the add it cannot be fused with the multiply that made F. */
static int nearest_int(float f)
{
	return (int)lrintf(f);
}

/* Q8_0 and Q8_1 follow ggml's x86 SIMD quantizers, which llama.cpp runs on
 * this kind of machine, not its scalar reference: id = 127 / amax (not
 * 1 / d) and rounding half to even (not away from zero).  The two differ in
 * rare ties and last bits, enough to flip a near-tie token. */
static void quantize_q8_0(const float *x, struct block_q8_0 *y, int64_t nb)
{
	for (int64_t b = 0; b < nb; b++, x += QK) {
		float amax = 0.0f;
		for (int j = 0; j < QK; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float d = amax / 127;
		float id = amax != 0 ? 127.0f / amax : 0.0f;
		y[b].d = qt_f32_to_f16(d);
		for (int j = 0; j < QK; j++)
			y[b].qs[j] = (int8_t)nearest_int(x[j] * id);
	}
}

/* s is d * sum(qs) with d still in float, as both ggml's reference and its
 * AVX2 quantize_row_q8_1 compute it (GGML_FP32_TO_FP16(sum*d)). */
static void quantize_q8_1(const float *x, struct block_q8_1 *y, int64_t nb)
{
	for (int64_t b = 0; b < nb; b++, x += QK) {
		float amax = 0.0f;
		for (int j = 0; j < QK; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float d = amax / 127;
		float id = amax != 0 ? 127.0f / amax : 0.0f;
		int sum = 0;
		y[b].d = qt_f32_to_f16(d);
		for (int j = 0; j < QK; j++) {
			y[b].qs[j] = (int8_t)nearest_int(x[j] * id);
			sum += y[b].qs[j];
		}
		y[b].s = qt_f32_to_f16(sum * d);
	}
}

/* The scale comes from the element of largest magnitude, sign included, so
 * that element maps to -127 (ggml's quantize_row_q8_K_ref).  An all-zero
 * block gets d = 0 and zero bsums (ggml leaves bsums unset there). */
static void quantize_q8_k(const float *x, struct block_q8_k *y, int64_t nb)
{
	for (int64_t b = 0; b < nb; b++, x += QK_K) {
		float max = 0, amax = 0;
		for (int j = 0; j < QK_K; j++) {
			float ax = fabsf(x[j]);
			if (ax > amax) {
				amax = ax;
				max = x[j];
			}
		}
		if (!amax) {
			memset(&y[b], 0, sizeof y[b]);
			continue;
		}
		float iscale = -127.f / max;
		for (int j = 0; j < QK_K; j++) {
			int v = nearest_int(iscale * x[j]);
			y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int g = 0; g < QK_K / 16; g++) {
			int sum = 0;
			for (int l = 0; l < 16; l++)
				sum += y[b].qs[16 * g + l];
			y[b].bsums[g] = (int16_t)sum;
		}
		y[b].d = 1 / iscale;
	}
}

void quant_quantize_row(uint32_t vec_type, const float *src, void *dst, int64_t n)
{
	if (quant_get_isa() >= QUANT_ISA_AVX2 && quant_avx2_quantize_row(vec_type, src, dst, n) == 0)
		return;
	switch (vec_type) {
	case QT_F32:
		memcpy(dst, src, (size_t)n * sizeof(float));
		break;
	case QT_F16:
		for (int64_t i = 0; i < n; i++)
			((qt_f16 *)dst)[i] = qt_f32_to_f16(src[i]);
		break;
	case QT_BF16:
		for (int64_t i = 0; i < n; i++)
			((qt_bf16 *)dst)[i] = qt_f32_to_bf16(src[i]);
		break;
	case QT_Q8_0:
		quantize_q8_0(src, dst, n / QK);
		break;
	case QT_Q8_1:
		quantize_q8_1(src, dst, n / QK);
		break;
	case QT_Q8_K:
		quantize_q8_k(src, dst, n / QK_K);
		break;
	default:
		break;
	}
}

/* ---- arithmetic: the one every path reproduces bit for bit ----
 *
 * Integer parts are exact everywhere.  The float part of each dot product is
 * fixed here, lane by lane, so the SIMD kernels (which keep these lanes in
 * registers) and this scalar code give identical bits, whatever the ISA and
 * whatever NW and NA a row is computed in.  Every multiply-add is fused.
 *
 * 32-element blocks (Q4_0, Q4_1, Q8_0): 16 float lanes, dd = d_w*d_a.
 *   Blocks below B16 = nb - nb%16 (whole groups of 16): block b's full
 *   integer dot feeds lane b%16:  lane = fma(sumi, dd, lane).
 *   The other blocks, in groups of four: block b feeds lanes 4t+b%4,
 *   t = 0..3, each with its integer partial over elements 4t..4t+3 and
 *   16+4t..16+4t+3:  lane = fma(partial, dd, lane).
 *   (A kernel then needs its float steps once per 16 blocks where rows are
 *   long, and once per 4 blocks at a ragged end.)
 *   Q4_1 adds m_w*s_a of block b into a second set of lanes at b%16, and the
 *   two sets are added lane by lane before the end.
 *   The result is the tree sum of the 16 lanes (hsum16).
 *
 * F32/F16/BF16: element e feeds lane e%16 with fma(w, a, lane); hsum16.
 *
 * K-quants: exact int sums per super-block, then one float accumulator:
 * acc = fma(sumi, d_w*d_a, acc), and for Q4_K/Q5_K then
 * acc = fma(-summins, dmin_w*d_a, acc).  Q6_K's -32 offset is folded into
 * its sumi through the Q8_K bsums.
 */

static float hsum16(const float *a)
{
	float s8[8], s4[4], s2[2];
	for (int l = 0; l < 8; l++)
		s8[l] = a[l] + a[l + 8];
	for (int l = 0; l < 4; l++)
		s4[l] = s8[l] + s8[l + 4];
	for (int l = 0; l < 2; l++)
		s2[l] = s4[l] + s4[l + 2];
	return s2[0] + s2[1];
}

/* The integer partials p[t] of weight block B against activation block B:
 * the sum over elements 4t..4t+3 and 16+4t..16+4t+3 (Q5_0's codes minus
 * 16, Q5_1's as they are). */
static void q32_partials(uint32_t type, const void *vx, const void *vy, int64_t b, int p[4])
{
	for (int t = 0; t < 4; t++) {
		p[t] = 0;
		for (int u = 0; u < 4; u++) {
			int e = 4 * t + u, w0, w1, a0, a1;
			if (type == QT_Q8_0) {
				const struct block_q8_0 *x = (const struct block_q8_0 *)vx + b;
				w0 = x->qs[e];
				w1 = x->qs[16 + e];
			} else if (type == QT_Q5_0 || type == QT_Q5_1) {
				const uint8_t *x = (const uint8_t *)vx + b * qtype_table[type].bytes;
				int off = type == QT_Q5_0 ? 16 : 0, qoff = type == QT_Q5_1 ? 8 : 6;
				w0 = q5_code(x, qoff, e) - off;
				w1 = q5_code(x, qoff, 16 + e) - off;
			} else {
				const uint8_t *qs = type == QT_Q4_0 ? ((const struct block_q4_0 *)vx + b)->qs
								    : ((const struct block_q4_1 *)vx + b)->qs;
				int off = type == QT_Q4_0 ? 8 : 0;
				w0 = (qs[e] & 0xf) - off;
				w1 = (qs[e] >> 4) - off;
			}
			if (type == QT_Q4_1 || type == QT_Q5_1) {
				const struct block_q8_1 *y = (const struct block_q8_1 *)vy + b;
				a0 = y->qs[e];
				a1 = y->qs[16 + e];
			} else {
				const struct block_q8_0 *y = (const struct block_q8_0 *)vy + b;
				a0 = y->qs[e];
				a1 = y->qs[16 + e];
			}
			p[t] += w0 * a0 + w1 * a1;
		}
	}
}

static float dot_q32(uint32_t type, const void *vx, const void *vy, int64_t nb)
{
	float acc[16] = { 0 }, macc[16] = { 0 };
	int64_t b16 = nb - nb % 16;

	for (int64_t b = 0; b < nb; b++) {
		float dw, da;
		int p[4];
		const uint8_t *x = (const uint8_t *)vx + b * qtype_table[type].bytes; /* d first in all */
		dw = F16(ld_f16(x));
		if (type == QT_Q4_1 || type == QT_Q5_1) {
			const struct block_q8_1 *y = (const struct block_q8_1 *)vy + b;
			da = F16(y->d);
			macc[b % 16] = fmaf(F16(ld_f16(x + 2)), F16(y->s), macc[b % 16]);
		} else {
			da = F16(((const struct block_q8_0 *)vy + b)->d);
		}
		float dd = dw * da;
		q32_partials(type, vx, vy, b, p);
		if (b < b16) {
			acc[b % 16] = fmaf((float)(p[0] + p[1] + p[2] + p[3]), dd, acc[b % 16]);
		} else {
			for (int t = 0; t < 4; t++)
				acc[4 * t + b % 4] = fmaf((float)p[t], dd, acc[4 * t + b % 4]);
		}
	}
	for (int l = 0; l < 16; l++)
		acc[l] += macc[l];
	return hsum16(acc);
}

static float dot_q45_k(uint32_t type, const void *vx, const struct block_q8_k *y, int64_t nsb)
{
	float acc = 0;
	for (int64_t b = 0; b < nsb; b++) {
		const struct block_q4_k *x4 = (const struct block_q4_k *)vx + b;
		const struct block_q5_k *x5 = (const struct block_q5_k *)vx + b;
		int five = type == QT_Q5_K;
		const uint8_t *scales = five ? x5->scales : x4->scales;
		int32_t sumi = 0, summ = 0;
		for (int s = 0; s < 8; s++) {
			uint8_t sc, m;
			int32_t t = 0;
			scale_min_k4(s, scales, &sc, &m);
			for (int l = 0; l < 32; l++) {
				int e = 32 * s + l;
				int q = five ? q45_k_code(x5->qs, x5->qh, e) : q45_k_code(x4->qs, NULL, e);
				t += q * y[b].qs[e];
			}
			sumi += sc * t;
			summ += m * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
		}
		float dall = F16(five ? x5->d : x4->d) * y[b].d;
		float dmin = F16(five ? x5->dmin : x4->dmin) * y[b].d;
		acc = fmaf((float)sumi, dall, acc);
		acc = fmaf((float)-summ, dmin, acc);
	}
	return acc;
}

static float dot_q6_k(const struct block_q6_k *x, const struct block_q8_k *y, int64_t nsb)
{
	float acc = 0;
	for (int64_t b = 0; b < nsb; b++) {
		int32_t sumi = 0;
		for (int g = 0; g < 16; g++) {
			int32_t t = 0;
			for (int l = 0; l < 16; l++)
				t += q6_k_code(&x[b], 16 * g + l) * y[b].qs[16 * g + l];
			sumi += x[b].scales[g] * (t - 32 * y[b].bsums[g]);
		}
		acc = fmaf((float)sumi, F16(x[b].d) * y[b].d, acc);
	}
	return acc;
}

static float load_elem(uint32_t type, const void *p, int64_t i)
{
	if (type == QT_F32)
		return ((const float *)p)[i];
	if (type == QT_F16)
		return F16(((const qt_f16 *)p)[i]);
	return qt_bf16_to_f32(((const qt_bf16 *)p)[i]);
}

static float dot_float(uint32_t type, const void *x, const void *y, int64_t n)
{
	float acc[16] = { 0 };
	for (int64_t e = 0; e < n; e++)
		acc[e % 16] = fmaf(load_elem(type, x, e), load_elem(type, y, e), acc[e % 16]);
	return hsum16(acc);
}

static float dot_scalar(uint32_t type, const void *x, const void *y, int64_t n)
{
	switch (type) {
	case QT_Q4_0:
	case QT_Q4_1:
	case QT_Q5_0:
	case QT_Q5_1:
	case QT_Q8_0: return dot_q32(type, x, y, n / QK);
	case QT_Q4_K:
	case QT_Q5_K: return dot_q45_k(type, x, y, n / QK_K);
	case QT_Q6_K: return dot_q6_k(x, y, n / QK_K);
	default:      return dot_float(type, x, y, n);
	}
}

/* ---- ISA choice ---- */

static enum quant_isa detect_isa(void)
{
	unsigned eax, ebx, ecx, edx;
	uint32_t xcr0_lo, xcr0_hi;

	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
		return QUANT_ISA_SCALAR;
	/* OSXSAVE (27), AVX (28), FMA (12), F16C (29) */
	if ((ecx & (1u << 27 | 1u << 28 | 1u << 12 | 1u << 29)) != (1u << 27 | 1u << 28 | 1u << 12 | 1u << 29))
		return QUANT_ISA_SCALAR;
	__asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
	if ((xcr0_lo & 0x6) != 0x6) /* the OS saves XMM and YMM state */
		return QUANT_ISA_SCALAR;
	if (__get_cpuid_max(0, NULL) < 7)
		return QUANT_ISA_SCALAR;
	__cpuid_count(7, 0, eax, ebx, ecx, edx);
	if (!(ebx & (1u << 5))) /* AVX2 */
		return QUANT_ISA_SCALAR;
	if ((xcr0_lo & 0xe6) != 0xe6) /* opmask and ZMM state */
		return QUANT_ISA_AVX2;
	/* AVX512F (16), DQ (17), BW (30), VL (31) */
	if ((ebx & (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31)) != (1u << 16 | 1u << 17 | 1u << 30 | 1u << 31))
		return QUANT_ISA_AVX2;
	if (!(ecx & (1u << 11))) /* AVX512_VNNI */
		return QUANT_ISA_AVX512;
	return QUANT_ISA_AVX512VNNI;
}

static int isa_best = -1; /* detected once; relaxed atomics, every thread computes the same */
static int isa_cur = -1;  /* the ISA in use; set before workers start */

enum quant_isa quant_isa_best(void)
{
	int best = __atomic_load_n(&isa_best, __ATOMIC_RELAXED);
	if (best < 0) {
		best = detect_isa();
		__atomic_store_n(&isa_best, best, __ATOMIC_RELAXED);
	}
	return (enum quant_isa)best;
}

enum quant_isa quant_set_isa(enum quant_isa isa)
{
	enum quant_isa best = quant_isa_best();
	if ((int)isa < 0)
		isa = QUANT_ISA_SCALAR;
	if (isa > best)
		isa = best;
	__atomic_store_n(&isa_cur, (int)isa, __ATOMIC_RELAXED);
	return isa;
}

enum quant_isa quant_get_isa(void)
{
	int cur = __atomic_load_n(&isa_cur, __ATOMIC_RELAXED);
	if (cur < 0)
		return quant_set_isa(quant_isa_best());
	return (enum quant_isa)cur;
}

const char *quant_isa_name(enum quant_isa isa)
{
	switch (isa) {
	case QUANT_ISA_SCALAR:     return "scalar";
	case QUANT_ISA_AVX2:       return "avx2";
	case QUANT_ISA_AVX512:     return "avx512";
	case QUANT_ISA_AVX512VNNI: return "avx512vnni";
	}
	return "unknown";
}

/* ---- the tile ---- */

void quant_gemm(uint32_t type, int64_t n,
		const void *w, size_t ldw, int nw,
		const void *a, size_t lda, int na,
		float *c, size_t ldc)
{
	const struct qtype_info *ti = qtype_get(type);
	enum quant_isa isa = quant_get_isa();

	if (!ti || !ti->weight_ok || n <= 0 || n % ti->blck || nw <= 0 || na <= 0)
		return;
	if (isa >= QUANT_ISA_AVX512 &&
	    quant_avx512_gemm(type, n, w, ldw, nw, a, lda, na, c, ldc, isa == QUANT_ISA_AVX512VNNI) == 0)
		return;
	if (isa >= QUANT_ISA_AVX2 && quant_avx2_gemm(type, n, w, ldw, nw, a, lda, na, c, ldc) == 0)
		return;
	for (int j = 0; j < na; j++)
		for (int i = 0; i < nw; i++)
			c[(size_t)j * ldc + i] = dot_scalar(type, (const char *)w + (size_t)i * ldw,
							    (const char *)a + (size_t)j * lda, n);
}

/* ---- packed weights ---- */

struct quant_packed {
	uint32_t type;     /* weight type */
	int64_t n;         /* elements per row */
	int nw;            /* rows */
	const void *w;     /* (nw, ldw) the original rows; borrowed */
	size_t ldw;
	void *data;        /* (nw, prow) packed rows; owned, 64-byte aligned */
	size_t prow;       /* bytes per packed row */
};

/* Whether ISA reads TYPE from AVX2's packed layout: the AVX-512 kernels
 * read the file's blocks (Q5 too: measured on Gemma 3 270M's Q5_0, decode
 * ran its matmuls about 30% faster from the 22-byte blocks than from
 * AVX2's 34 bytes of codes and scale per block, and prefill 2.5x). */
static int packs_for(uint32_t type, enum quant_isa isa)
{
	return isa == QUANT_ISA_AVX2;
}

int quant_pack(uint32_t type, int64_t n, const void *w, size_t ldw, int nw, struct quant_packed **ret)
{
	struct quant_packed *p;
	int r = quant_pack_new(type, n, w, ldw, nw, &p);

	if (r < 0)
		return r;
	quant_pack_rows(p, 0, nw);
	*ret = p;
	return 0;
}

int quant_pack_new(uint32_t type, int64_t n, const void *w, size_t ldw, int nw, struct quant_packed **ret)
{
	struct quant_packed *p;
	size_t prow;

	if (nw <= 0 || n <= 0)
		return -EINVAL;
	if (!packs_for(type, quant_get_isa()) || !(prow = quant_avx2_packed_row_bytes(type, n)))
		return -ENOTSUP;
	p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->data = aligned_alloc(64, (prow * (size_t)nw + 63) & ~(size_t)63);
	if (!p->data) {
		free(p);
		return -ENOMEM;
	}
	p->type = type;
	p->n = n;
	p->nw = nw;
	p->w = w;
	p->ldw = ldw;
	p->prow = prow;
	*ret = p;
	return 0;
}

void quant_pack_rows(struct quant_packed *p, int r0, int nr)
{
	for (int r = r0; r < r0 + nr && r < p->nw; r++)
		quant_avx2_pack_row(p->type, p->n, (const char *)p->w + (size_t)r * p->ldw, (char *)p->data + (size_t)r * p->prow);
}

void quant_packed_free(struct quant_packed *p)
{
	if (!p)
		return;
	free(p->data);
	free(p);
}

void quant_gemm_packed(const struct quant_packed *p, int r0, int nw,
		       const void *a, size_t lda, int na, float *c, size_t ldc)
{
	if (r0 < 0 || nw <= 0 || r0 + nw > p->nw || na <= 0)
		return;
	/* the layout is AVX2's; an ISA switched since (tests) reads the original */
	if (packs_for(p->type, quant_get_isa()) &&
	    quant_avx2_gemm_packed(p->type, p->n, (const char *)p->data + (size_t)r0 * p->prow, p->prow, nw,
				   a, lda, na, c, ldc) == 0)
		return;
	quant_gemm(p->type, p->n, (const char *)p->w + (size_t)r0 * p->ldw, p->ldw, nw, a, lda, na, c, ldc);
}

size_t quant_packed_acts_bytes(const struct quant_packed *p, int na)
{
	if (!p || na <= 0 || !packs_for(p->type, quant_get_isa()))
		return 0;
	return quant_avx2_acts_row_bytes(p->type, p->n) * (size_t)na;
}

void quant_packed_pack_acts(const struct quant_packed *p, const void *a, size_t lda, int na, void *dst)
{
	if (na > 0 && quant_packed_acts_bytes(p, na))
		quant_avx2_pack_acts(p->type, p->n, a, lda, na, dst);
}

void quant_gemm_packed_acts(const struct quant_packed *p, int r0, int nw, const void *acts, int na, float *c,
			    size_t ldc)
{
	if (r0 < 0 || nw <= 0 || r0 + nw > p->nw || na <= 0 || !quant_packed_acts_bytes(p, na))
		return;
	quant_avx2_gemm_packed_acts(p->type, p->n, (const char *)p->data + (size_t)r0 * p->prow, p->prow, nw, acts,
				    na, c, ldc);
}
