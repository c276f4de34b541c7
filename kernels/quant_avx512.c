/* quant_avx512.c - AVX-512 kernels for the 32-element block formats (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0), in a plain AVX-512BW flavour and a VNNI one
 * (vpdpbusd), and with VNNI for the K-quants (Q4_K, Q5_K, Q6_K) against
 * more than a few activation rows.
 * They follow quant.c's arithmetic lane by lane, so they give the scalar
 * code's bits; other types and cases are left to quant_avx2.c.
 */
#include <errno.h>
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "quant.h"
#include "quant_impl.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define T512V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* What a type's kernels do: an m term with Q8_1 activations (Q4_1, Q5_1);
 * five-bit codes, their fifth bits from qh (Q5_0, Q5_1). */
#define Q32_M(type) ((type) == QT_Q4_1 || (type) == QT_Q5_1)
#define Q32_Q5(type) ((type) == QT_Q5_0 || (type) == QT_Q5_1)

/* Bytes of a block of TYPE, a constant where TYPE is. */
INLINE int q32_bytes(uint32_t type)
{
	switch (type) {
	case QT_Q4_0: return 18;
	case QT_Q4_1: return 20;
	case QT_Q5_0: return 22;
	case QT_Q5_1: return 24;
	default:      return 34;
	}
}

/* Up to this many activation rows, weights go from their blocks straight
 * into registers; above it they are repacked once per four rows and reused
 * for NR activation rows at a time (4 x NR int and float accumulators plus
 * the weights fit the 32 zmm with few spills). */
#define DIRECT_MAX 4
#define NR 4

/* Bytes ahead of the current weight row the direct kernel prefetches into
 * L1, and further ahead into L2 (more lines in flight than L1's fill
 * buffers allow: more bandwidth from one core). */
#define PREFETCH 4096
#define PREFETCH_L2 12288

/* ---- the repacked layout ----
 *
 * quant.c's arithmetic works on 16 lanes.  A block's 32 codes are eight
 * 4-byte pieces: "lo" pieces t = 0..3 hold elements 4t..4t+3, "hi" pieces
 * elements 16+4t..16+4t+3 (a Q4 byte's two nibbles are elements e and 16+e).
 * A repacked row is, each part 64-byte aligned:
 *   codes  g16 x 512 bytes for the whole groups of 16 blocks: eight 64-byte
 *          vectors, lo piece t then hi piece t, lane l = block l of the
 *          group; then gt x 128 bytes for the tail's groups of four blocks:
 *          lo then hi, byte 4*(4t+k)+u = piece t of block k.
 *          Weights: Q4 and Q5 as unsigned codes (0..15, 0..31), Q8_0 as
 *          signed bytes, or biased by +128 (xor 0x80) for vpdpbusd's
 *          unsigned operand with VNNI; activations: signed bytes.
 *   d      f32 d of every block in order, zero-padded to nd (multiple of 16).
 *   init   activations of Q4_0, Q5_0 and (VNNI) Q8_0: the int32 a lane
 *          starts from, -8, -16 resp. -128 times the activations it covers,
 *          removing the codes' offset: g16 x 16 (a whole block each), then
 *          gt x 16.
 *   m / s  Q4_1 and Q5_1 only: weights' m, activations' s, f32, zero-padded
 *          to nd.
 * Blocks past the end of a row are zero and add exact zeros.  Activation
 * rows for the direct (decode) kernel keep every group of four in tail
 * order, as that kernel adds up partials instead of moving weights.
 */
struct q32_shape {
	uint32_t type;   /* QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1 or QT_Q8_0 */
	int vnni;        /* 1: Q8_0 weights biased for vpdpbusd */
	int nb;          /* blocks per row */
	int g16;         /* whole groups of 16 blocks */
	int gt;          /* groups of four blocks in the tail */
	int nd;          /* entries in the d, m and s parts (multiple of 16) */
	int init;        /* 1 when activation rows carry init */
	int ag16;        /* whole groups laid out as such in activation rows: g16,
			  * or 0 when every group of four is in tail order (decode) */
	size_t tail_off; /* byte offset of the tail's codes (weights) */
	size_t atail_off; /* ... in activation rows */
	size_t d_off;    /* byte offset of the d part in both row kinds */
	size_t m_off;    /* weights: offset of m */
	size_t init_off; /* activations: offset of init */
	size_t s_off;    /* activations: offset of s */
	size_t wrow;     /* bytes of one repacked weight row */
	size_t arow;     /* bytes of one repacked activation row */
};

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static void q32_shape_init(struct q32_shape *s, uint32_t type, int64_t n, int vnni, int direct)
{
	s->type = type;
	s->vnni = vnni;
	s->nb = (int)(n / QK);
	s->g16 = s->nb / 16;
	s->gt = (s->nb - 16 * s->g16 + 3) / 4;
	s->nd = (16 * s->g16 + 4 * s->gt + 15) / 16 * 16;
	s->init = type == QT_Q4_0 || type == QT_Q5_0 || (type == QT_Q8_0 && vnni);
	s->tail_off = (size_t)s->g16 * 512;
	s->d_off = ALIGN64(s->tail_off + (size_t)s->gt * 128);
	s->m_off = ALIGN64(s->d_off + (size_t)s->nd * 4);
	s->wrow = ALIGN64(s->m_off + (Q32_M(type) ? (size_t)s->nd * 4 : 0));
	s->ag16 = direct ? 0 : s->g16;
	s->atail_off = (size_t)s->ag16 * 512;
	s->init_off = s->m_off; /* the codes take as much room in either order */
	s->s_off = s->init_off + (s->init ? (size_t)(s->ag16 + (4 * (s->g16 - s->ag16) + s->gt)) * 64 : 0);
	s->arow = ALIGN64(s->s_off + (Q32_M(type) ? (size_t)s->nd * 4 : 0));
}

/* ---- four blocks from their block format ----
 *
 * A group of four blocks becomes its lo and hi pieces in tail order (lane
 * 4t+k = piece t of block k) and its d (and Q4_1's or Q5_1's m) as fp16
 * words.  The gathers use the cheap permutes: Q4_1's, Q5_1's and (from two
 * windows) Q4_0's and Q5_0's pieces sit on 4-byte boundaries, so one
 * vpermt2d orders them; Q8_0's halves are assembled 16 bytes at a time by
 * masked broadcasts and then interleaved.  A Q5 block's qh goes by another
 * vpermt2d into every lane of its block; a byte shuffle and a bit test then
 * turn it into the byte mask of the codes that get 16.  Ragged groups load
 * under masks (which also suppress faults) so that nothing past the row's
 * last block is touched.
 */
struct q32_idx {
	__m512i q;        /* vpermt2d picks of the pieces (Q8_0: the interleave) */
	__m512i dm4;      /* d/m words for a tail group: d of block w%4 in words 0..15, m in 16..19 */
	__m512i dm16[4];  /* for quarter q of a 16-group: d at words 4q..4q+3, m at 16+4q.. */
	__m512i qh;       /* Q5: vpermt2d picks of qh, block k's in lanes 4t+k */
	__m512i hsel[2];  /* Q5: byte u of lane 4t+k takes qh byte t/2 (lo) or 2+t/2 (hi) */
	__m512i hbit;     /* Q5: ... and tests its bit 4(t%2)+u */
};

/* The second window of a group's words: Q5_0's at p+24 (where the
 * group's 88 bytes end), the others' at p+64. */
#define Q32_WIN2(type) ((type) == QT_Q5_0 ? 24 : 64)

INLINE T512 void q32_idx_init(struct q32_idx *ix, uint32_t type)
{
	uint32_t q[16], qh[16];
	uint16_t dm[5][32];
	uint8_t hsel[2][64], hbit[64];
	const int bytes = q32_bytes(type), win2 = Q32_WIN2(type);

	memset(dm, 0, sizeof dm);
	memset(qh, 0, sizeof qh);
	for (int k = 0; k < 4; k++) {
		/* word WD of the group at byte 2 * WD, as an index into its two
		 * windows [p, p+64) and [p+win2, ..) */
		int d = k * bytes / 2, m = d + 1;
		d = d < 32 ? d : 32 + d - win2 / 2;
		m = m < 32 ? m : 32 + m - win2 / 2;
		for (int t = 0; t < 4; t++) {
			if (type == QT_Q4_1)       /* qs at 20k+4: dwords 5k+1.. of [p, p+80) */
				q[4 * t + k] = (uint32_t)(5 * k + 1 + t);
			else if (type == QT_Q4_0)  /* even k from the window at p+2, odd from p+8 */
				q[4 * t + k] = (uint32_t)(k % 2 == 0 ? 18 * k / 4 + t : 16 + (18 * k - 6) / 4 + t);
			else if (type == QT_Q5_1)  /* qs at 24k+8, qh at 24k+4: dwords of [p, p+96) */
				q[4 * t + k] = (uint32_t)(6 * k + 2 + t), qh[4 * t + k] = (uint32_t)(6 * k + 1);
			else if (type == QT_Q5_0)  /* qs at 22k+6, qh at 22k+2: even k from p+2, odd from p+24 */
				q[4 * t + k] = (uint32_t)(k % 2 == 0 ? 22 * k / 4 + 1 + t : 16 + (22 * k - 18) / 4 + t),
				qh[4 * t + k] = (uint32_t)(k % 2 == 0 ? 22 * k / 4 : 16 + (22 * k - 22) / 4);
			else                       /* block k's 16 bytes sit in 128-bit lane k */
				q[4 * t + k] = (uint32_t)(4 * k + t);
			dm[4][4 * t + k] = (uint16_t)d;
			for (int u = 0; u < 4; u++) {
				hsel[0][16 * t + 4 * k + u] = (uint8_t)(4 * k + t / 2);
				hsel[1][16 * t + 4 * k + u] = (uint8_t)(4 * k + 2 + t / 2);
				hbit[16 * t + 4 * k + u] = (uint8_t)(1 << (4 * (t % 2) + u));
			}
		}
		dm[4][16 + k] = (uint16_t)m;
		for (int qq = 0; qq < 4; qq++) {
			dm[qq][4 * qq + k] = (uint16_t)d;
			dm[qq][16 + 4 * qq + k] = (uint16_t)m;
		}
	}
	ix->q = _mm512_loadu_si512(q);
	ix->dm4 = _mm512_loadu_si512(dm[4]);
	for (int qq = 0; qq < 4; qq++)
		ix->dm16[qq] = _mm512_loadu_si512(dm[qq]);
	ix->qh = _mm512_loadu_si512(qh);
	ix->hsel[0] = _mm512_loadu_si512(hsel[0]);
	ix->hsel[1] = _mm512_loadu_si512(hsel[1]);
	ix->hbit = _mm512_loadu_si512(hbit);
}

/* Bytes [OFF, OFF+WIDTH) of a group of which VALID bytes exist; FULL groups
 * load plainly, a ragged one under a mask. */
INLINE T512 __m512i q32_window(const uint8_t *p, int off, int width, const int full, int valid)
{
	if (full) {
		if (width == 64)
			return _mm512_loadu_si512(p + off);
		if (width == 32)
			return _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + off)));
		if (width == 16)
			return _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + off)));
		return _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(p + off)));
	}
	int v = valid - off;
	__mmask64 k = v <= 0 ? 0 : v >= width ? (width == 64 ? ~0ull : (1ull << width) - 1) : (1ull << v) - 1;
	return _mm512_maskz_loadu_epi8(k, p + off);
}

/* The 16 bytes at P + OFF of each of NBK 34-byte blocks, block k in 128-bit
 * lane k, then put in piece order by IQ. */
INLINE T512 __m512i q8_0_half(const uint8_t *p, int off, const int nbk, __m512i iq)
{
	__m512i v = _mm512_setzero_si512();
	for (int k = 0; k < nbk; k++)
		v = _mm512_mask_broadcast_i32x4(v, (__mmask16)(0xf << 4 * k),
						_mm_loadu_si128((const __m128i *)(p + 34 * k + off)));
	return _mm512_permutexvar_epi32(iq, v);
}

/* Four blocks at P (all of them when FULL, else VALID bytes) as tail-order
 * LO and HI pieces and their d/m words DM (picked by IDM, one of IX's). */
INLINE T512 void q32_weight_group(const uint32_t type, const int vnni, const uint8_t *p, const int full, int valid,
				  const struct q32_idx *ix, __m512i idm, __m512i *lo, __m512i *hi, __m512i *dm)
{
	const __m512i iq = ix->q;

	if (type == QT_Q8_0) {
		if (full) {
			*lo = q8_0_half(p, 2, 4, iq);
			*hi = q8_0_half(p, 18, 4, iq);
		} else {
			*lo = q8_0_half(p, 2, valid / 34, iq);
			*hi = q8_0_half(p, 18, valid / 34, iq);
		}
		*dm = _mm512_permutex2var_epi16(q32_window(p, 0, 64, full, valid), idm,
						q32_window(p, 64, 64, full, valid));
		if (vnni) {
			*lo = _mm512_xor_si512(*lo, _mm512_set1_epi8((char)0x80));
			*hi = _mm512_xor_si512(*hi, _mm512_set1_epi8((char)0x80));
		}
	} else {
		const __m512i m4bits = _mm512_set1_epi8(0x0f);
		__m512i q, qh;
		if (type == QT_Q4_1) {
			__m512i z0 = q32_window(p, 0, 64, full, valid);
			q = _mm512_permutex2var_epi32(z0, iq, q32_window(p, 64, 16, full, valid));
			*dm = _mm512_permutexvar_epi16(idm, z0);
		} else if (type == QT_Q5_1) {
			__m512i z0 = q32_window(p, 0, 64, full, valid), z1 = q32_window(p, 64, 32, full, valid);
			q = _mm512_permutex2var_epi32(z0, iq, z1);
			qh = _mm512_permutex2var_epi32(z0, ix->qh, z1);
			*dm = _mm512_permutex2var_epi16(z0, idm, z1);
		} else if (type == QT_Q5_0) {
			__m512i za = q32_window(p, 2, 64, full, valid), zb = q32_window(p, 24, 64, full, valid);
			q = _mm512_permutex2var_epi32(za, iq, zb);
			qh = _mm512_permutex2var_epi32(za, ix->qh, zb);
			*dm = _mm512_permutex2var_epi16(q32_window(p, 0, 64, full, valid), idm, zb);
		} else {
			q = _mm512_permutex2var_epi32(q32_window(p, 2, 64, full, valid), iq,
						      q32_window(p, 8, 64, full, valid));
			*dm = _mm512_permutexvar_epi16(idm, q32_window(p, 0, 64, full, valid));
		}
		*lo = _mm512_and_si512(q, m4bits);
		*hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4bits);
		if (Q32_Q5(type)) {
			const __m512i h16 = _mm512_set1_epi8(16);
			__mmask64 klo = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, ix->hsel[0]), ix->hbit);
			__mmask64 khi = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, ix->hsel[1]), ix->hbit);
			*lo = _mm512_mask_add_epi8(*lo, klo, *lo, h16);
			*hi = _mm512_mask_add_epi8(*hi, khi, *hi, h16);
		}
	}
}

/* Four tail-order vectors (X[q] = four blocks 4q..4q+3) to group order: V[t]
 * takes 128-bit lane t of every X, i.e. piece t of blocks 0..15. */
INLINE T512 void q32_transpose(const __m512i *x, __m512i *v)
{
	__m512i u0 = _mm512_shuffle_i32x4(x[0], x[1], 0x88), u1 = _mm512_shuffle_i32x4(x[0], x[1], 0xdd);
	__m512i u2 = _mm512_shuffle_i32x4(x[2], x[3], 0x88), u3 = _mm512_shuffle_i32x4(x[2], x[3], 0xdd);
	v[0] = _mm512_shuffle_i32x4(u0, u2, 0x88);
	v[2] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
	v[1] = _mm512_shuffle_i32x4(u1, u3, 0x88);
	v[3] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
}

/* Block sums of four tail-order partial vectors (X_q lane 4t+k = piece t of
 * block 4q+k) into lane 4q+k: the integer adds of q32_transpose's columns,
 * in fewer shuffles (exact in any order). */
INLINE T512 __m512i q32_block_sums(__m512i x0, __m512i x1, __m512i x2, __m512i x3)
{
	__m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(x0, x1, 0x44), _mm512_shuffle_i32x4(x0, x1, 0xee));
	__m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(x2, x3, 0x44), _mm512_shuffle_i32x4(x2, x3, 0xee));
	return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xdd));
}

/* A whole group of 16 blocks at P: its eight piece vectors and its d (words
 * 0..15) and Q4_1's or Q5_1's m (words 16..31) as fp16. */
INLINE T512 void q32_weight_group16(const uint32_t type, const int vnni, const uint8_t *p,
				    const struct q32_idx *ix, __m512i *v, __m512i *dm16)
{
	const int bytes = q32_bytes(type);
	__m512i lo[4], hi[4], dm[4];

	for (int q = 0; q < 4; q++)
		q32_weight_group(type, vnni, p + 4 * q * bytes, 1, 0, ix, ix->dm16[q], &lo[q], &hi[q], &dm[q]);
	q32_transpose(lo, v);
	q32_transpose(hi, v + 4);
	*dm16 = dm[0];
	for (int q = 1; q < 4; q++)
		*dm16 = _mm512_mask_blend_epi16((__mmask32)(0xfu << 4 * q | 0xfu << (16 + 4 * q)), *dm16, dm[q]);
}

/* ---- activations ----
 *
 * Packed once per call, so the general two-window word gather will do:
 * Q8_1 (36-byte blocks) or Q8_0 (34), upper halves from a second window H
 * bytes on so that no load runs past the group.
 */
static T512 void q32_pack_acts(const struct q32_shape *s, const uint8_t *a, size_t lda, int na, uint8_t *dst)
{
	const int q81 = Q32_M(s->type);
	const int bytes = q81 ? 36 : 34, qs = q81 ? 4 : 2, h = q81 ? 16 : 8;
	/* init = -(sum << shift) */
	const int shift = s->type == QT_Q4_0 ? 3 : s->type == QT_Q5_0 ? 4 : 7;
	const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
	uint16_t lo_w[32], hi_w[32], dm_w[32];

	memset(dm_w, 0, sizeof dm_w);
	for (int k = 0; k < 4; k++) {
		for (int t = 0; t < 4; t++) {
			for (int v = 0; v < 2; v++) {
				lo_w[2 * (4 * t + k) + v] = (uint16_t)((k * bytes + qs) / 2 + 2 * t + v);
				hi_w[2 * (4 * t + k) + v] = (uint16_t)((k * bytes + qs + 16 - h) / 2 + 2 * t + v);
			}
		}
		dm_w[k] = (uint16_t)(k * bytes / 2);
		dm_w[4 + k] = (uint16_t)(k * bytes / 2 + 1);
	}
	const __m512i ilo = _mm512_loadu_si512(lo_w), ihi = _mm512_loadu_si512(hi_w), idm = _mm512_loadu_si512(dm_w);

	for (int j = 0; j < na; j++) {
		const uint8_t *row = a + (size_t)j * lda;
		uint8_t *out = dst + (size_t)j * s->arow;
		float *d = (float *)(out + s->d_off), *sp = (float *)(out + s->s_off);
		__m512i lo[4], hi[4];
		for (int g = 0; g < 4 * s->g16 + s->gt; g++) {
			const uint8_t *p = row + (size_t)g * 4 * bytes;
			int valid = (s->nb - 4 * g) * bytes, full = valid >= 4 * bytes;
			__m512i z0 = q32_window(p, 0, 64, full, valid), z1 = q32_window(p, 64, 64, full, valid);
			__m512i dm = _mm512_permutex2var_epi16(z0, idm, z1);
			int q = g % 4;
			lo[q] = _mm512_permutex2var_epi16(z0, ilo, z1);
			hi[q] = _mm512_permutex2var_epi16(q32_window(p, h, 64, full, valid), ihi,
							  q32_window(p, 64 + h, 64, full, valid));
			_mm_store_ps(d + 4 * g, _mm_cvtph_ps(_mm512_castsi512_si128(dm)));
			if (q81)
				_mm_store_ps(sp + 4 * g, _mm_cvtph_ps(_mm_srli_si128(_mm512_castsi512_si128(dm), 8)));
			if (g < 4 * s->ag16) {
				if (q < 3)
					continue;
				/* a whole group of 16: pieces in group order, init per block */
				__m512i v[8], sum16 = _mm512_setzero_si512();
				uint8_t *grp = out + (size_t)(g / 4) * 512;
				q32_transpose(lo, v);
				q32_transpose(hi, v + 4);
				for (int r = 0; r < 8; r++) {
					_mm512_store_si512(grp + 64 * r, v[r]);
					sum16 = _mm512_add_epi16(sum16, _mm512_maddubs_epi16(ones8, v[r]));
				}
				if (s->init)
					_mm512_store_si512(out + s->init_off + (size_t)(g / 4) * 64,
							   _mm512_sub_epi32(_mm512_setzero_si512(),
									    _mm512_slli_epi32(_mm512_madd_epi16(sum16, ones16), shift)));
			} else {
				int qt = g - 4 * s->ag16;
				uint8_t *grp = out + s->atail_off + (size_t)qt * 128;
				_mm512_store_si512(grp, lo[q]);
				_mm512_store_si512(grp + 64, hi[q]);
				if (s->init) {
					__m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(ones8, lo[q]),
								       _mm512_maddubs_epi16(ones8, hi[q]));
					_mm512_store_si512(out + s->init_off + (size_t)(s->ag16 + qt) * 64,
							   _mm512_sub_epi32(_mm512_setzero_si512(),
									    _mm512_slli_epi32(_mm512_madd_epi16(p16, ones16), shift)));
				}
			}
		}
		for (int l = 16 * s->g16 + 4 * s->gt; l < s->nd; l++) {
			d[l] = 0;
			if (q81)
				sp[l] = 0;
		}
	}
}

/* Repacks MR weight rows (four slots; unused ones zeroed) into WS. */
static T512 void q32_unpack_rows(const struct q32_shape *s, const struct q32_idx *pix, const uint8_t *w,
			       size_t ldw, int mr, uint8_t *ws)
{
	const int bytes = (int)qtype_get(s->type)->bytes;
	const struct q32_idx ix = *pix;

	for (int r = 0; r < 4; r++) {
		uint8_t *out = ws + r * s->wrow;
		if (r >= mr) {
			memset(out, 0, s->wrow);
			continue;
		}
		const uint8_t *row = w + (size_t)r * ldw;
		float *d = (float *)(out + s->d_off), *m = (float *)(out + s->m_off);
		for (int g = 0; g < s->g16; g++) {
			__m512i v[8], dm16;
			q32_weight_group16(s->type, s->vnni, row + (size_t)g * 16 * bytes, &ix, v, &dm16);
			for (int k = 0; k < 8; k++)
				_mm512_store_si512(out + (size_t)g * 512 + 64 * k, v[k]);
			_mm512_store_ps(d + 16 * g, _mm512_cvtph_ps(_mm512_castsi512_si256(dm16)));
			if (Q32_M(s->type))
				_mm512_store_ps(m + 16 * g, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm16, 1)));
		}
		if (s->gt) { /* padding past the tail's blocks: zero, then the tail's fours */
			_mm512_store_ps(d + 16 * s->g16, _mm512_setzero_ps());
			if (Q32_M(s->type))
				_mm512_store_ps(m + 16 * s->g16, _mm512_setzero_ps());
		}
		for (int q = 0; q < s->gt; q++) {
			int b0 = 16 * s->g16 + 4 * q, valid = (s->nb - b0) * bytes;
			const uint8_t *p = row + (size_t)b0 * bytes;
			__m512i lo, hi, dm;
			if (valid >= 4 * bytes)
				q32_weight_group(s->type, s->vnni, p, 1, 0, &ix, ix.dm4, &lo, &hi, &dm);
			else
				q32_weight_group(s->type, s->vnni, p, 0, valid, &ix, ix.dm4, &lo, &hi, &dm);
			_mm512_store_si512(out + s->tail_off + (size_t)q * 128, lo);
			_mm512_store_si512(out + s->tail_off + (size_t)q * 128 + 64, hi);
			_mm_store_ps(d + b0, _mm512_castps512_ps128(_mm512_cvtph_ps(_mm512_castsi512_si256(dm))));
			if (Q32_M(s->type))
				_mm_store_ps(m + b0, _mm_cvtph_ps(_mm512_extracti32x4_epi32(dm, 2)));
		}
	}
}

/* ---- integer dot steps (quant.c's partials), both flavours ----
 *
 * idot1: one piece vector of weights W against activations A, added to P.
 * idot2: a tail group's lo and hi against the activations', added to P.
 */
INLINE T512 __m512i idot1_bw(const uint32_t type, __m512i p, __m512i w, __m512i a)
{
	const __m512i ones = _mm512_set1_epi16(1);
	if (type == QT_Q8_0) {
		/* |w| * (a with w's sign): exact while a > -128, which quantize_row keeps */
		__m512i sa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
		return _mm512_add_epi32(p, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), sa), ones));
	}
	return _mm512_add_epi32(p, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), ones));
}

INLINE T512 __m512i idot2_bw(const uint32_t type, __m512i p, __m512i lo, __m512i hi, __m512i alo, __m512i ahi)
{
	if (type == QT_Q8_0)
		return idot1_bw(type, idot1_bw(type, p, lo, alo), hi, ahi);
	/* Q4's or Q5's code * a: four products per int16 stay below 2^15 */
	__m512i s16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, alo), _mm512_maddubs_epi16(hi, ahi));
	return _mm512_add_epi32(p, _mm512_madd_epi16(s16, _mm512_set1_epi16(1)));
}

INLINE T512V __m512i idot1_vnni(const uint32_t type, __m512i p, __m512i w, __m512i a)
{
	return _mm512_dpbusd_epi32(p, w, a);
}

INLINE T512V __m512i idot2_vnni(const uint32_t type, __m512i p, __m512i lo, __m512i hi, __m512i alo, __m512i ahi)
{
	return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p, lo, alo), hi, ahi);
}

/* ---- finishing ---- */

INLINE T512 float hsum16(__m512 v)
{
	__m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* hsum16 of sixteen vectors at once: the same additions on the same
 * operands, arranged as a transpose.  Lane 4q+r of the result is the sum of
 * V[4r+q]. */
INLINE T512 __m512 hsum16x16(const __m512 *v)
{
	__m512 l1[8], l2[4], l3[2];
	_Pragma("GCC unroll 8")
	for (int k = 0; k < 8; k++) /* lanes l + lanes l+8 */
		l1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
				      _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) /* l + l+4 */
		l2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * k], l1[2 * k + 1], 0x88),
				      _mm512_shuffle_f32x4(l1[2 * k], l1[2 * k + 1], 0xdd));
	_Pragma("GCC unroll 2")
	for (int k = 0; k < 2; k++) /* l + l+2 */
		l3[k] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * k], l2[2 * k + 1], 0x44),
				      _mm512_shuffle_ps(l2[2 * k], l2[2 * k + 1], 0xee));
	/* 0 + 1 */
	return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], 0x88), _mm512_shuffle_ps(l3[0], l3[1], 0xdd));
}

/* Q4_1's or Q5_1's m*s lanes of weight row M and activation row SA, added to V. */
INLINE T512 __m512 q32_add_ms(const struct q32_shape *s, __m512 v, const float *m, const float *sa)
{
	__m512 ms = _mm512_setzero_ps();
	for (int l = 0; l < s->nd; l += 16)
		ms = _mm512_fmadd_ps(_mm512_load_ps(m + l), _mm512_load_ps(sa + l), ms);
	return _mm512_add_ps(v, ms);
}

/* ---- the kernels, stamped out for both flavours ----
 *
 * NAME_rows: weight rows straight from their blocks, NA <= DIRECT_MAX.
 * NAME_tile: four repacked weight rows against NR (or fewer) activation rows.
 * The integer steps need the VNNI target in one flavour and must not have it
 * in the other, which is why these loops are written once inside a macro.
 */
#define AROW(s, as, j) ((as) + (size_t)(j) * (s)->arow)

#define DEFINE_Q32_FLAVOUR(NAME, TGT, IDOT1, IDOT2, VNNI)                                           \
/* Integer partials of one group of four blocks (lo, hi) against activation   \
 * group Q (in tail order) of NA rows, added to P. */                                               \
INLINE TGT void NAME##_quad(const struct q32_shape *s, const uint32_t type, __m512i lo, __m512i hi, \
			    const uint8_t *as, int q, const int na, __m512i *p)                      \
{                                                                                                   \
	_Pragma("GCC unroll 4")                                                                     \
	for (int j = 0; j < na; j++) {                                                              \
		const uint8_t *ag = AROW(s, as, j) + s->atail_off + (size_t)q * 128;               \
		__m512i init = s->init ? _mm512_load_si512(AROW(s, as, j) + s->init_off + (size_t)(s->ag16 + q) * 64) \
				       : _mm512_setzero_si512();                                    \
		p[j] = IDOT2(type, init, lo, hi, _mm512_load_si512(ag), _mm512_load_si512(ag + 64)); \
	}                                                                                           \
}                                                                                                   \
                                                                                                    \
/* One tail group Q (four blocks) of one weight row against NA activation rows. */                  \
INLINE TGT void NAME##_tail_step(const struct q32_shape *s, const uint32_t type, __m512i lo,        \
				 __m512i hi, __m512 dw, const uint8_t *as, int q, const int na,     \
				 __m512 *acc)                                                        \
{                                                                                                   \
	__m512i p[DIRECT_MAX > NR ? DIRECT_MAX : NR];                                               \
	NAME##_quad(s, type, lo, hi, as, 4 * (s->g16 - s->ag16) + q, na, p);                        \
	_Pragma("GCC unroll 4")                                                                     \
	for (int j = 0; j < na; j++) {                                                              \
		__m512 dd = _mm512_mul_ps(dw, _mm512_broadcast_f32x4(_mm_load_ps(                   \
			(const float *)(AROW(s, as, j) + s->d_off) + 16 * s->g16 + 4 * q)));         \
		acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[j]), dd, acc[j]);                     \
	}                                                                                           \
}                                                                                                   \
                                                                                                    \
INLINE TGT void NAME##_rows_body(const struct q32_shape *s, const uint32_t type, const uint8_t *w,  \
				 size_t ldw, int nw, const uint8_t *as, const int na, float *c,     \
				 size_t ldc)                                                         \
{                                                                                                   \
	const int bytes = q32_bytes(type);                                                          \
	struct q32_idx ix;                                                                          \
	q32_idx_init(&ix, type);                                                                    \
	const uint8_t *end = w + (size_t)nw * ldw;                                                  \
	/* hsum16x16 puts the sum of row k in lane 4(k%4)+k/4 */                                    \
	const __m512i hperm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0); \
	__m512 vb[DIRECT_MAX][16];                                                                  \
	const __m512i dmi = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 31, 26, 21, 16, 15, 10, 5, 0); \
	const __m512i dmw = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, \
					     30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0); \
	for (int i = 0; i < nw; i++) {                                                              \
		const uint8_t *row = w + (size_t)i * ldw;                                           \
		__m512 acc[DIRECT_MAX], macc[DIRECT_MAX];                                           \
		/* decoding streams the weights once from DRAM: the hardware prefetcher \
		 * alone leaves a third of the bandwidth unused */                                  \
		for (size_t o = 0; o < (size_t)s->nb * bytes; o += 64) {                            \
			if (row + PREFETCH + o < end)                                               \
				_mm_prefetch((const char *)row + PREFETCH + o, _MM_HINT_T0);        \
			if (row + PREFETCH_L2 + o < end)                                            \
				_mm_prefetch((const char *)row + PREFETCH_L2 + o, _MM_HINT_T1);     \
		}                                                                                   \
		_Pragma("GCC unroll 4")                                                             \
		for (int j = 0; j < na; j++)                                                        \
			acc[j] = macc[j] = _mm512_setzero_ps();                                     \
		for (int g = 0; g < s->g16; g++) {                                                  \
			/* partials of four groups of four, then each block's lanes added up     \
			 * into lane 4q+k: a transpose of the partials instead of the weights */  \
			__m512i p4[4][DIRECT_MAX], dmq[4], dm16;                                    \
			_Pragma("GCC unroll 4")                                                     \
			for (int q = 0; q < 4; q++) {                                               \
				__m512i lo, hi;                                                     \
				q32_weight_group(type, VNNI, row + (size_t)(16 * g + 4 * q) * bytes, 1, 0, \
						 &ix, ix.dm16[q], &lo, &hi, &dmq[q]);               \
				NAME##_quad(s, type, lo, hi, as, 4 * g + q, na, p4[q]);             \
			}                                                                           \
			if (type == QT_Q4_1) {                                                      \
				/* block k's d and m are dword 5k of the group: two dword    \
				 * gathers, then d to words 0..15, m to 16..31 */                \
				const uint8_t *pg = row + (size_t)(16 * g) * bytes;                 \
				__m512i z01 = _mm512_permutex2var_epi32(_mm512_loadu_si512(pg), dmi, \
									 _mm512_loadu_si512(pg + 80)); \
				__m512i z23 = _mm512_permutex2var_epi32(_mm512_loadu_si512(pg + 160), dmi, \
									 _mm512_loadu_si512(pg + 240)); \
				dm16 = _mm512_permutexvar_epi16(dmw, _mm512_shuffle_i64x2(z01, z23, 0x44)); \
			} else {                                                                    \
				dm16 = dmq[0];                                                      \
				_Pragma("GCC unroll 4")                                             \
				for (int q = 1; q < 4; q++)                                         \
					dm16 = _mm512_mask_blend_epi16((__mmask32)(0xfu << 4 * q | 0xfu << (16 + 4 * q)), dm16, dmq[q]); \
			}                                                                           \
			__m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(dm16));                  \
			__m512 mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm16, 1));            \
			_Pragma("GCC unroll 4")                                                     \
			for (int j = 0; j < na; j++) {                                              \
				const uint8_t *ar = AROW(s, as, j);                                 \
				__m512i p = q32_block_sums(p4[0][j], p4[1][j], p4[2][j], p4[3][j]); \
				__m512 dd = _mm512_mul_ps(dw, _mm512_load_ps((const float *)(ar + s->d_off) + 16 * g)); \
				acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), dd, acc[j]);        \
				if (Q32_M(type))                                                    \
					macc[j] = _mm512_fmadd_ps(mw, _mm512_load_ps(               \
						(const float *)(ar + s->s_off) + 16 * g), macc[j]); \
			}                                                                           \
		}                                                                                   \
		for (int q = 0; q < s->gt; q++) {                                                   \
			int b0 = 16 * s->g16 + 4 * q, valid = (s->nb - b0) * bytes;                 \
			__m512i lo, hi, dm;                                                         \
			if (valid >= 4 * bytes)                                                     \
				q32_weight_group(type, VNNI, row + (size_t)b0 * bytes, 1, 0, &ix, ix.dm4, &lo, &hi, &dm); \
			else                                                                        \
				q32_weight_group(type, VNNI, row + (size_t)b0 * bytes, 0, valid, &ix, ix.dm4, &lo, &hi, &dm); \
			NAME##_tail_step(s, type, lo, hi, _mm512_cvtph_ps(_mm512_castsi512_si256(dm)), as, q, na, acc); \
			if (Q32_M(type)) {                                                          \
				/* m*s into lanes b0%16.., from s chunk b0/16 */                    \
				__m512 mv = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm512_extracti32x4_epi32(dm, 2))); \
				__mmask16 k = (__mmask16)(0xf << (b0 % 16));                        \
				_Pragma("GCC unroll 4")                                             \
				for (int j = 0; j < na; j++)                                        \
					macc[j] = _mm512_mask3_fmadd_ps(mv, _mm512_load_ps(         \
						(const float *)(AROW(s, as, j) + s->s_off) + b0 / 16 * 16), \
						macc[j], k);                                        \
			}                                                                           \
		}                                                                                   \
		/* the lanes' sums, sixteen rows at a time (hsum16x16, hsum16's adds) */           \
		_Pragma("GCC unroll 4")                                                             \
		for (int j = 0; j < na; j++)                                                        \
			vb[j][i & 15] = Q32_M(type) ? _mm512_add_ps(acc[j], macc[j]) : acc[j];      \
		if ((i & 15) == 15 || i == nw - 1) {                                                \
			int cnt = (i & 15) + 1;                                                     \
			_Pragma("GCC unroll 4")                                                     \
			for (int j = 0; j < na; j++) {                                              \
				for (int k = cnt; k < 16; k++)                                      \
					vb[j][k] = _mm512_setzero_ps();                             \
				_mm512_mask_storeu_ps(c + (size_t)j * ldc + (i & ~15), (__mmask16)((1u << cnt) - 1), \
						      _mm512_permutexvar_ps(hperm, hsum16x16(vb[j]))); \
			}                                                                           \
		}                                                                                   \
	}                                                                                           \
}                                                                                                   \
                                                                                                    \
INLINE TGT void NAME##_tile_body(const struct q32_shape *s, const uint32_t type, const uint8_t *ws, \
				 const uint8_t *as, const int nr, int mr, float *c, size_t ldc)     \
{                                                                                                   \
	__m512 acc[4][NR];                                                                          \
	_Pragma("GCC unroll 4")                                                                     \
	for (int i = 0; i < 4; i++)                                                                 \
		_Pragma("GCC unroll 4")                                                             \
		for (int j = 0; j < nr; j++)                                                        \
			acc[i][j] = _mm512_setzero_ps();                                            \
	for (int g = 0; g < s->g16; g++) {                                                          \
		__m512i p[4][NR];                                                                   \
		_Pragma("GCC unroll 4")                                                             \
		for (int j = 0; j < nr; j++) {                                                      \
			__m512i init = s->init ? _mm512_load_si512(AROW(s, as, j) + s->init_off + (size_t)g * 64) \
					       : _mm512_setzero_si512();                            \
			_Pragma("GCC unroll 4")                                                     \
			for (int i = 0; i < 4; i++)                                                 \
				p[i][j] = init;                                                     \
		}                                                                                   \
		_Pragma("GCC unroll 8")                                                             \
		for (int r = 0; r < 8; r++) {                                                       \
			__m512i wv[4];                                                              \
			_Pragma("GCC unroll 4")                                                     \
			for (int i = 0; i < 4; i++)                                                 \
				wv[i] = _mm512_load_si512(ws + i * s->wrow + (size_t)g * 512 + 64 * r); \
			_Pragma("GCC unroll 4")                                                     \
			for (int j = 0; j < nr; j++) {                                              \
				__m512i av = _mm512_load_si512(AROW(s, as, j) + (size_t)g * 512 + 64 * r); \
				_Pragma("GCC unroll 4")                                             \
				for (int i = 0; i < 4; i++)                                         \
					p[i][j] = IDOT1(type, p[i][j], wv[i], av);                  \
			}                                                                           \
		}                                                                                   \
		_Pragma("GCC unroll 4")                                                             \
		for (int i = 0; i < 4; i++) {                                                       \
			__m512 dw = _mm512_load_ps((const float *)(ws + i * s->wrow + s->d_off) + 16 * g); \
			_Pragma("GCC unroll 4")                                                     \
			for (int j = 0; j < nr; j++) {                                              \
				__m512 dd = _mm512_mul_ps(dw, _mm512_load_ps(                       \
					(const float *)(AROW(s, as, j) + s->d_off) + 16 * g));      \
				acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[i][j]), dd, acc[i][j]); \
			}                                                                           \
		}                                                                                   \
	}                                                                                           \
	for (int q = 0; q < s->gt; q++) {                                                           \
		_Pragma("GCC unroll 4")                                                             \
		for (int i = 0; i < 4; i++) {                                                       \
			const uint8_t *wr = ws + i * s->wrow;                                       \
			__m512 dw = _mm512_broadcast_f32x4(_mm_load_ps((const float *)(wr + s->d_off) + 16 * s->g16 + 4 * q)); \
			NAME##_tail_step(s, type, _mm512_load_si512(wr + s->tail_off + (size_t)q * 128), \
					 _mm512_load_si512(wr + s->tail_off + (size_t)q * 128 + 64), dw, as, q, nr, acc[i]); \
		}                                                                                   \
	}                                                                                           \
	__m512 v[16];                                                                               \
	_Pragma("GCC unroll 4")                                                                     \
	for (int i = 0; i < 4; i++) {                                                               \
		_Pragma("GCC unroll 4")                                                             \
		for (int j = 0; j < 4; j++) {                                                       \
			v[4 * i + j] = j < nr ? acc[i][j] : _mm512_setzero_ps();                    \
			if (Q32_M(type) && j < nr)                                                  \
				v[4 * i + j] = q32_add_ms(s, v[4 * i + j],                          \
					(const float *)(ws + i * s->wrow + s->m_off),               \
					(const float *)(AROW(s, as, j) + s->s_off));                \
		}                                                                                   \
	}                                                                                           \
	float r[16] __attribute__((aligned(64)));                                                   \
	_mm512_store_ps(r, hsum16x16(v)); /* r[4j+i]: weight row i, activation row j */             \
	for (int j = 0; j < nr; j++)                                                                \
		_mm_mask_storeu_ps(c + (size_t)j * ldc, (__mmask8)((1 << mr) - 1), _mm_load_ps(r + 4 * j)); \
}                                                                                                   \
                                                                                                    \
INLINE TGT void NAME##_typed(const struct q32_shape *s, const uint32_t type, const uint8_t *w,      \
			     size_t ldw, int nw, const uint8_t *as, int na, float *c, size_t ldc,   \
			     uint8_t *ws)                                                            \
{                                                                                                   \
	if (na <= DIRECT_MAX) {                                                                     \
		switch (na) {                                                                       \
		case 1: NAME##_rows_body(s, type, w, ldw, nw, as, 1, c, ldc); break;                \
		case 2: NAME##_rows_body(s, type, w, ldw, nw, as, 2, c, ldc); break;                \
		case 3: NAME##_rows_body(s, type, w, ldw, nw, as, 3, c, ldc); break;                \
		default: NAME##_rows_body(s, type, w, ldw, nw, as, 4, c, ldc); break;               \
		}                                                                                   \
		return;                                                                             \
	}                                                                                           \
	struct q32_idx ix;                                                                          \
	q32_idx_init(&ix, type);                                                                    \
	for (int i0 = 0; i0 < nw; i0 += 4) {                                                        \
		int mr = nw - i0 < 4 ? nw - i0 : 4;                                                 \
		q32_unpack_rows(s, &ix, w + (size_t)i0 * ldw, ldw, mr, ws);                         \
		for (int j0 = 0; j0 < na; j0 += NR) {                                               \
			const uint8_t *at = AROW(s, as, j0);                                        \
			float *ct = c + (size_t)j0 * ldc + i0;                                      \
			switch (na - j0 < NR ? na - j0 : NR) {                                      \
			case 1: NAME##_tile_body(s, type, ws, at, 1, mr, ct, ldc); break;           \
			case 2: NAME##_tile_body(s, type, ws, at, 2, mr, ct, ldc); break;           \
			case 3: NAME##_tile_body(s, type, ws, at, 3, mr, ct, ldc); break;           \
			default: NAME##_tile_body(s, type, ws, at, NR, mr, ct, ldc); break;         \
			}                                                                           \
		}                                                                                   \
	}                                                                                           \
}                                                                                                   \
                                                                                                    \
static TGT void NAME(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw,               \
		     const uint8_t *as, int na, float *c, size_t ldc, uint8_t *ws)                   \
{                                                                                                   \
	switch (s->type) {                                                                          \
	case QT_Q4_0: NAME##_typed(s, QT_Q4_0, w, ldw, nw, as, na, c, ldc, ws); break;              \
	case QT_Q4_1: NAME##_typed(s, QT_Q4_1, w, ldw, nw, as, na, c, ldc, ws); break;              \
	case QT_Q5_0: NAME##_typed(s, QT_Q5_0, w, ldw, nw, as, na, c, ldc, ws); break;              \
	case QT_Q5_1: NAME##_typed(s, QT_Q5_1, w, ldw, nw, as, na, c, ldc, ws); break;              \
	default:      NAME##_typed(s, QT_Q8_0, w, ldw, nw, as, na, c, ldc, ws); break;              \
	}                                                                                           \
}

DEFINE_Q32_FLAVOUR(q32_bw, T512, idot1_bw, idot2_bw, 0)
DEFINE_Q32_FLAVOUR(q32_vnni, T512V, idot1_vnni, idot2_vnni, 1)

/* ---- K-quants (VNNI) ----
 *
 * quant.c's K-quant arithmetic is an exact integer sum per super-block and
 * pair of weight and activation rows, then one or two fmas into one float.
 * Here a tile of four weight rows by four activation rows takes each
 * super-block in four vpdpbusd per pair whose 16 int32 lanes each gather
 * one 16-element group: vector c, lane h, byte u holds element 16h + 4c + u
 * ("group order", weights and activations alike).  A lane then holds its
 * group's whole sum, which the group's scale multiplies: vpdpwssd for Q4_K
 * (a group of 4-bit codes sums within int16, so the lane's low word is the
 * sum and the scale in the low word of the other operand, 0 in its high
 * one, takes exactly it), vpmulld for Q5_K's and Q6_K's wider sums.  Q6_K's
 * -32 offset starts every lane at -32 times its group's bsum.  The sixteen
 * pairs' lanes are then added up into lane 4j+i of one vector (hsum16x16's
 * transpose) where the float steps run for the sixteen pairs at once; the
 * mins term of Q4_K/Q5_K comes from vpdpwssd of mins against bsums laid
 * out one pair per lane.  Up to DIRECT_MAX activation rows go to
 * quant_avx2.c instead (decode reads each weight once: nothing to share).
 *
 * Per super-block, a tile of four weight rows (KW_BYTES):
 *   codes  [i][c] 64 bytes: unsigned codes in group order
 *   scale  [i] 16 int32: lane h the scale of group h
 *   mins   [p] 16 int32 (Q4_K/Q5_K): lane 4j+i the mins of sub-blocks 2p
 *          and 2p+1 of row i as int16
 *   d      16 f32: lane 4j+i d of row i;  dmin likewise
 * and of four activation rows (KA_BYTES):
 *   codes  [j][c] 64 bytes: signed codes in group order
 *   init   Q6_K: [j] 16 int32: lane h -32 times bsum h of row j;
 *          Q4_K/Q5_K: [p] 16 int32: lane 4j+i the activation sums of
 *          sub-blocks 2p and 2p+1 of row j as int16
 *   d      16 f32: lane 4j+i d of row j
 * Rows past the last are zero.
 */
#define KW_CODES 0
#define KW_SCALE 1024
#define KW_MINS 1280
#define KW_D 1536
#define KW_DMIN 1600
#define KW_BYTES 1664
#define KA_CODES 0
#define KA_INIT 1024
#define KA_D 1280
#define KA_BYTES 1344

/* 256 codes in element order (N[k]: elements 64k..64k+63) to group order:
 * a dword transpose inside each vector, then one of 128-bit lanes across
 * them. */
INLINE T512 void kq_group_order(const __m512i *n, __m512i *g)
{
	const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
	__m512i p[4];

	for (int k = 0; k < 4; k++)
		p[k] = _mm512_permutexvar_epi32(idx, n[k]);
	q32_transpose(p, g);
}

/* A weight super-block's 256 codes in element order (quant.c's
 * q45_k_code and q6_k_code, 64 at a time). */
INLINE T512 void kq_weight_codes(const uint32_t type, const uint8_t *blk, __m512i n[4])
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);

	if (type == QT_Q6_K) {
		/* elements 64k.. are quarters 2(k%2), 2(k%2)+1 of half k/2: ql's
		 * low (k even) or high nibbles of its 64 bytes, and the bit pairs
		 * of qh's 32 at 4(k%2) and 4(k%2)+2 */
		const struct block_q6_k *x = (const struct block_q6_k *)blk;
		for (int k = 0; k < 4; k++) {
			__m512i ql = _mm512_loadu_si512(x->ql + 64 * (k / 2));
			__m512i nib = k % 2 ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
			__m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * (k / 2))));
			__m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (k % 2))),
							 _mm256_set1_epi16((short)(4 * (k % 2) + 2)), 1);
			__m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt), _mm512_set1_epi8(3));
			n[k] = _mm512_or_si512(nib, _mm512_slli_epi16(hb, 4));
		}
		return;
	}
	/* Q4_K/Q5_K: chunk k's 32 bytes hold elements 64k.. (low nibbles)
	 * and 64k+32.. (high); Q5_K's fifth bits are bits 2k, 2k+1 of qh */
	const uint8_t *qs = blk + (type == QT_Q5_K ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs));
	for (int k2 = 0; k2 < 2; k2++) {
		__m512i v = _mm512_loadu_si512(qs + 64 * k2);
		__m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
		n[2 * k2] = _mm512_shuffle_i64x2(lo, hi, 0x44);
		n[2 * k2 + 1] = _mm512_shuffle_i64x2(lo, hi, 0xee);
	}
	if (type == QT_Q5_K) {
		const struct block_q5_k *x = (const struct block_q5_k *)blk;
		__m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->qh));
		for (int k = 0; k < 4; k++) {
			__m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << 2 * k)),
							 _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
			n[k] = _mm512_mask_add_epi8(n[k], _mm512_test_epi8_mask(qh, bit), n[k], _mm512_set1_epi8(16));
		}
	}
}

/* Rows [0, MR) of the four at W (LDW apart) into WS, NSB super-blocks. */
static T512 void kq_unpack_rows(const uint32_t type, int nsb, const uint8_t *w, size_t ldw, int mr, uint8_t *ws)
{
	const size_t bytes = qtype_get(type)->bytes;

	for (int b = 0; b < nsb; b++, ws += KW_BYTES) {
		float d[4] = { 0 }, dmin[4] = { 0 };
		uint8_t mins[4][8];
		memset(mins, 0, sizeof mins);
		for (int i = 0; i < 4; i++) {
			__m512i n[4], g[4], sc = _mm512_setzero_si512();
			const uint8_t *blk = w + (size_t)i * ldw + (size_t)b * bytes;
			if (i >= mr) {
				g[0] = g[1] = g[2] = g[3] = sc;
			} else if (type == QT_Q6_K) {
				const struct block_q6_k *x = (const struct block_q6_k *)blk;
				kq_weight_codes(type, blk, n);
				kq_group_order(n, g);
				sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x->scales));
				d[i] = _cvtsh_ss(x->d);
			} else {
				/* quant.c's scale_min_k4; group h is in sub-block h/2 */
				const struct block_q4_k *x = (const struct block_q4_k *)blk; /* d, dmin, scales alike */
				uint32_t s32[16];
				kq_weight_codes(type, blk, n);
				kq_group_order(n, g);
				for (int s = 0; s < 8; s++) {
					const uint8_t *q = x->scales;
					int scv = s < 4 ? q[s] & 63 : (q[s + 4] & 0xf) | (q[s - 4] >> 6) << 4;
					mins[i][s] = (uint8_t)(s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | (q[s] >> 6) << 4);
					s32[2 * s] = s32[2 * s + 1] = (uint32_t)scv;
				}
				sc = _mm512_loadu_si512(s32);
				d[i] = _cvtsh_ss(x->d);
				dmin[i] = _cvtsh_ss(x->dmin);
			}
			for (int c = 0; c < 4; c++)
				_mm512_store_si512(ws + KW_CODES + 64 * (4 * i + c), g[c]);
			_mm512_store_si512(ws + KW_SCALE + 64 * i, sc);
		}
		uint32_t mv[4][16];
		float dv[16], dminv[16];
		for (int l = 0; l < 16; l++) {
			int i = l % 4;
			for (int p = 0; p < 4; p++)
				mv[p][l] = mins[i][2 * p] | (uint32_t)mins[i][2 * p + 1] << 16;
			dv[l] = d[i];
			dminv[l] = dmin[i];
		}
		memcpy(ws + KW_MINS, mv, sizeof mv);
		memcpy(ws + KW_D, dv, sizeof dv);
		memcpy(ws + KW_DMIN, dminv, sizeof dminv);
	}
}

/* NA Q8_K rows at A (LDA apart), NSB super-blocks each, into AS: tiles of
 * four rows, each its NSB super-blocks in order. */
static T512 void kq_pack_acts(const uint32_t type, int nsb, const uint8_t *a, size_t lda, int na, uint8_t *as)
{
	for (int j0 = 0; j0 < na; j0 += 4) {
		for (int b = 0; b < nsb; b++, as += KA_BYTES) {
			int16_t sums[4][8]; /* Q4_K/Q5_K: sub-block sums of the activations */
			float da[4] = { 0 };
			memset(sums, 0, sizeof sums);
			for (int j = 0; j < 4; j++) {
				__m512i n[4], g[4], init = _mm512_setzero_si512();
				if (j0 + j >= na) {
					g[0] = g[1] = g[2] = g[3] = init;
				} else {
					const struct block_q8_k *y = (const struct block_q8_k *)(a + (size_t)(j0 + j) * lda) + b;
					for (int k = 0; k < 4; k++)
						n[k] = _mm512_loadu_si512(y->qs + 64 * k);
					kq_group_order(n, g);
					if (type == QT_Q6_K)
						init = _mm512_sub_epi32(init, _mm512_slli_epi32(_mm512_cvtepi16_epi32(
							_mm256_loadu_si256((const __m256i *)y->bsums)), 5));
					for (int s = 0; s < 8; s++)
						sums[j][s] = (int16_t)(y->bsums[2 * s] + y->bsums[2 * s + 1]);
					da[j] = y->d;
				}
				for (int c = 0; c < 4; c++)
					_mm512_store_si512(as + KA_CODES + 64 * (4 * j + c), g[c]);
				if (type == QT_Q6_K)
					_mm512_store_si512(as + KA_INIT + 64 * j, init);
			}
			float dv[16];
			for (int l = 0; l < 16; l++)
				dv[l] = da[l / 4];
			memcpy(as + KA_D, dv, sizeof dv);
			if (type != QT_Q6_K) {
				uint32_t bv[4][16];
				for (int p = 0; p < 4; p++)
					for (int l = 0; l < 16; l++)
						bv[p][l] = (uint16_t)sums[l / 4][2 * p] | (uint32_t)(uint16_t)sums[l / 4][2 * p + 1] << 16;
				memcpy(as + KA_INIT, bv, sizeof bv);
			}
		}
	}
}

/* hsum16x16's transpose on int32 lanes (exact in any order): lane 4q+r is
 * the sum of V[4r+q]'s lanes. */
INLINE T512 __m512i hsum16x16_epi32(const __m512i *v)
{
	__m512i l1[8], l2[4], l3[2];
	_Pragma("GCC unroll 8")
	for (int k = 0; k < 8; k++)
		l1[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * k], v[2 * k + 1], 0x44),
					 _mm512_shuffle_i32x4(v[2 * k], v[2 * k + 1], 0xee));
	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++)
		l2[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(l1[2 * k], l1[2 * k + 1], 0x88),
					 _mm512_shuffle_i32x4(l1[2 * k], l1[2 * k + 1], 0xdd));
	_Pragma("GCC unroll 2")
	for (int k = 0; k < 2; k++)
		l3[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(l2[2 * k], l2[2 * k + 1]),
					 _mm512_unpackhi_epi64(l2[2 * k], l2[2 * k + 1]));
	__m512 a = _mm512_castsi512_ps(l3[0]), b = _mm512_castsi512_ps(l3[1]);
	return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
				_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xdd)));
}

/* Four unpacked weight rows WS against the four activation rows AT, NSB
 * super-blocks: C[j * LDC + i] for i < MR, j < NR. */
INLINE T512V void kq_tile(const uint32_t type, int nsb, const uint8_t *ws, const uint8_t *at, int mr, int nr,
			  float *c, size_t ldc)
{
	__m512 acc = _mm512_setzero_ps();

	for (int b = 0; b < nsb; b++, ws += KW_BYTES, at += KA_BYTES) {
		__m512i s[16]; /* pair (i, j) at 4i+j */
		_Pragma("GCC unroll 4")
		for (int j = 0; j < 4; j++) {
			__m512i init = type == QT_Q6_K ? _mm512_load_si512(at + KA_INIT + 64 * j) : _mm512_setzero_si512();
			_Pragma("GCC unroll 4")
			for (int i = 0; i < 4; i++)
				s[4 * i + j] = init;
		}
		_Pragma("GCC unroll 4")
		for (int cc = 0; cc < 4; cc++) {
			__m512i wv[4];
			_Pragma("GCC unroll 4")
			for (int i = 0; i < 4; i++)
				wv[i] = _mm512_load_si512(ws + KW_CODES + 64 * (4 * i + cc));
			_Pragma("GCC unroll 4")
			for (int j = 0; j < 4; j++) {
				__m512i av = _mm512_load_si512(at + KA_CODES + 64 * (4 * j + cc));
				_Pragma("GCC unroll 4")
				for (int i = 0; i < 4; i++)
					s[4 * i + j] = _mm512_dpbusd_epi32(s[4 * i + j], wv[i], av);
			}
		}
		_Pragma("GCC unroll 4")
		for (int i = 0; i < 4; i++) {
			__m512i sc = _mm512_load_si512(ws + KW_SCALE + 64 * i);
			_Pragma("GCC unroll 4")
			for (int j = 0; j < 4; j++)
				s[4 * i + j] = type == QT_Q4_K ? _mm512_dpwssd_epi32(_mm512_setzero_si512(), s[4 * i + j], sc)
							       : _mm512_mullo_epi32(s[4 * i + j], sc);
		}
		__m512 da = _mm512_load_ps((const float *)(at + KA_D));
		acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hsum16x16_epi32(s)),
				      _mm512_mul_ps(_mm512_load_ps((const float *)(ws + KW_D)), da), acc);
		if (type != QT_Q6_K) {
			__m512i summ = _mm512_setzero_si512();
			_Pragma("GCC unroll 4")
			for (int p = 0; p < 4; p++)
				summ = _mm512_dpwssd_epi32(summ, _mm512_load_si512(ws + KW_MINS + 64 * p),
							   _mm512_load_si512(at + KA_INIT + 64 * p));
			/* quant.c's -summ: a sign flip, exact */
			__m512 nm = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_cvtepi32_ps(summ)),
									  _mm512_set1_epi32((int)0x80000000u)));
			acc = _mm512_fmadd_ps(nm, _mm512_mul_ps(_mm512_load_ps((const float *)(ws + KW_DMIN)), da), acc);
		}
	}
	float r[16] __attribute__((aligned(64)));
	_mm512_store_ps(r, acc); /* r[4j+i]: weight row i, activation row j */
	for (int j = 0; j < nr; j++)
		_mm_mask_storeu_ps(c + (size_t)j * ldc, (__mmask8)((1 << mr) - 1), _mm_load_ps(r + 4 * j));
}

/* NW weight rows against NA activation rows packed in AS: four weight
 * rows unpacked at a time into WS, then every tile of four activation
 * rows against them. */
INLINE T512V void kq_run(const uint32_t type, int nsb, const uint8_t *w, size_t ldw, int nw, const uint8_t *as,
			 int na, float *c, size_t ldc, uint8_t *ws)
{
	for (int i0 = 0; i0 < nw; i0 += 4) {
		int mr = nw - i0 < 4 ? nw - i0 : 4;
		kq_unpack_rows(type, nsb, w + (size_t)i0 * ldw, ldw, mr, ws);
		for (int j0 = 0; j0 < na; j0 += 4)
			kq_tile(type, nsb, ws, as + (size_t)(j0 / 4) * nsb * KA_BYTES, mr, na - j0 < 4 ? na - j0 : 4,
				c + (size_t)j0 * ldc + i0, ldc);
	}
}

static T512V void kq_gemm(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw, const uint8_t *a,
			  size_t lda, int na, float *c, size_t ldc, uint8_t *as)
{
	const int nsb = (int)(n / QK_K);
	uint8_t *ws = as + (size_t)((na + 3) / 4) * nsb * KA_BYTES;

	switch (type) {
	case QT_Q4_K:
		kq_pack_acts(QT_Q4_K, nsb, a, lda, na, as);
		kq_run(QT_Q4_K, nsb, w, ldw, nw, as, na, c, ldc, ws);
		break;
	case QT_Q5_K:
		kq_pack_acts(QT_Q5_K, nsb, a, lda, na, as);
		kq_run(QT_Q5_K, nsb, w, ldw, nw, as, na, c, ldc, ws);
		break;
	default:
		kq_pack_acts(QT_Q6_K, nsb, a, lda, na, as);
		kq_run(QT_Q6_K, nsb, w, ldw, nw, as, na, c, ldc, ws);
		break;
	}
}

/* ---- the entry ---- */

int quant_avx512_gemm(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
		      const void *a, size_t lda, int na, float *c, size_t ldc, int vnni)
{
	struct q32_shape s;

	if (type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K) {
		if (!vnni || na <= DIRECT_MAX)
			return -ENOTSUP;
		int nsb = (int)(n / QK_K);
		uint8_t *as = quant_scratch((size_t)((na + 3) / 4) * nsb * KA_BYTES + (size_t)nsb * KW_BYTES);
		if (!as)
			return -ENOMEM;
		kq_gemm(type, n, w, ldw, nw, a, lda, na, c, ldc, as);
		return 0;
	}
	if (type != QT_Q4_0 && type != QT_Q4_1 && type != QT_Q5_0 && type != QT_Q5_1 && type != QT_Q8_0)
		return -ENOTSUP;
	q32_shape_init(&s, type, n, vnni, na <= DIRECT_MAX);
	/* activations, then four repacked weight rows */
	uint8_t *as = quant_scratch((size_t)na * s.arow + 4 * s.wrow);
	if (!as)
		return -ENOMEM;
	uint8_t *ws = as + (size_t)na * s.arow;
	q32_pack_acts(&s, a, lda, na, as);
	if (vnni)
		q32_vnni(&s, w, ldw, nw, as, na, c, ldc, ws);
	else
		q32_bw(&s, w, ldw, nw, as, na, c, ldc, ws);
	return 0;
}
