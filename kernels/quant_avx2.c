/* quant_avx2.c - AVX2 (+FMA, F16C) kernels for every weight type, and the
 * activation quantizers.
 * They follow the lane-by-lane arithmetic fixed in quant.c, so they give the
 * same bits as the scalar code; nothing here chooses an ISA (quant.c does).
 */
#include <errno.h>
#include <immintrin.h>
#include <string.h>

#include "quant.h"
#include "quant_impl.h"

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))


/* A 16-lane float vector of quant.c's arithmetic is two ymm: lanes 0..7, 8..15. */
INLINE TARGET float hsum16(__m256 lo, __m256 hi)
{
	__m256 s8 = _mm256_add_ps(lo, hi);
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

INLINE TARGET int hsum_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
	return _mm_cvtsi128_si32(s);
}

INLINE TARGET float h2f(qt_f16 h)
{
	return _cvtsh_ss(h);
}

/* ---- 32-element blocks: Q4_0, Q4_1, Q8_0 ----
 *
 * quant.c's 16 float lanes are two ymm here: lanes 0..7 ("half" 0) and
 * 8..15 (half 1).  A block's 32 codes are eight 4-byte pieces: its "lo"
 * pieces t = 0..3 hold elements 4t..4t+3, its "hi" pieces elements
 * 16+4t..16+4t+3 (a Q4 byte's two nibbles are elements e and 16+e).
 *
 * Two kernels:
 *   direct (NA <= DIRECT_MAX rows: decode)  weight blocks go from the file
 *     straight into registers, two blocks per ymm (one per 128-bit lane,
 *     where their 16 code bytes already sit in piece order), and the
 *     integer partials of eight blocks are added up into one vector of
 *     block sums by hadds.  Activation rows come in the same pairs.
 *   tile (more rows)  four weight rows at a time are repacked into group
 *     order (lane l of a piece vector = block l of a group of 16), so a
 *     lane's integer sum is its block's whole dot product; 2x2 register
 *     tiles of weight and activation rows keep Q4 sums in int16 over a
 *     whole block (16 products of at most 15 * 127 stay below 2^15).
 *
 * Row layouts (each part 64-byte aligned):
 *   codes  g16 x 512 bytes for the whole groups of 16 blocks, then gt x 128
 *          bytes for the tail's groups ("quads") of four blocks.
 *          Group order (weights, and activations for the tile kernel):
 *          piece vector t (64 bytes; t = 0..7, lo then hi) holds block l's
 *          piece at byte 4l; a quad is lo then hi, byte 4*(4t+k)+u = piece
 *          t of block k, lane 4t+k as in quant.c's tail.
 *          Pair order (activations for the direct kernel): half h, pair i
 *          (64 bytes each) holds blocks 8h+i and 8h+i+4, lo codes [16 | 16]
 *          then hi codes [16 | 16]; a quad holds pairs (k, k+2), k = 0, 1.
 *          Weights: Q4 as unsigned nibbles, Q8_0 as signed bytes;
 *          activations: signed bytes.
 *   d      f32 d of every block in order, zero-padded to nd (multiple of 16).
 *   init   Q4_0 activations: the int32 a lane starts from, -8 times the
 *          activations it covers (the nibbles' offset), laid out as the
 *          lanes it starts: group order 16 per group (one per block) or
 *          per quad (4t+k); pair order 8 per pair (its blocks' pieces).
 *   m / s  Q4_1 only: m (weights) or s (activations) per block, f32,
 *          zero-padded to nd.
 * Blocks past the end of the row are zero and add exact zeros.
 */
#define DIRECT_MAX 4

/* ---- the packed weight layout (quant_pack) ----
 *
 * The same bytes as the file's blocks, reordered for the kernels below:
 * per group of 16 blocks two "octets" (blocks 8h..8h+7), each a 32-byte
 * header of the eight fp16 d, then the eight fp16 m (Q4_1; else zero),
 * followed by the codes in pair order: pair i = blocks i and i+4, 16 code
 * bytes each ([16 | 16]; Q8_0: lo halves then hi halves, 64 bytes).  Per
 * tail quad a header of four d then four m (16 bytes, 16 of padding) and
 * pairs (0, 2), (1, 3).  Blocks past the end are zero.  One vector load
 * gives eight blocks' scales, one more a pair's codes: the file's 18-, 20-
 * or 34-byte blocks need a load per block for each.
 */
#define PK_HDR 32

static int q32_pk_octet(uint32_t type)
{
	return PK_HDR + (type == QT_Q8_0 ? 256 : 128);
}

static int q32_pk_quad(uint32_t type)
{
	return PK_HDR + (type == QT_Q8_0 ? 128 : 64);
}

/* Bytes ahead of the current weight row that the direct kernel prefetches:
 * decoding streams every weight once from DRAM. */
#define PREFETCH 2048

struct q32_shape {
	uint32_t type;   /* QT_Q4_0, QT_Q4_1 or QT_Q8_0 */
	int bytes;       /* bytes per weight block: 18, 20 or 34 */
	int nb;          /* blocks per row */
	int g16;         /* whole groups of 16 blocks */
	int gt;          /* groups of four blocks in the tail */
	int nd;          /* entries in the d, m and s parts (multiple of 16) */
	int direct;      /* 1: activation rows in pair order */
	int packed;      /* 1: weight rows in the packed layout */
	size_t tail_off; /* byte offset of the tail's codes */
	size_t d_off;    /* byte offset of the d part in both row kinds */
	size_t init_off; /* byte offset of init in an activation row */
	size_t tinit;    /* int32 index in init where the tail's quads start */
	size_t ms_off;   /* weights: byte offset of m */
	size_t as_off;   /* activations: byte offset of s */
	size_t wrow;     /* bytes of one repacked weight row */
	size_t arow;     /* bytes of one packed activation row */
};

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static void q32_shape_init(struct q32_shape *s, uint32_t type, int64_t n, int direct)
{
	s->type = type;
	s->bytes = (int)qtype_get(type)->bytes;
	s->nb = (int)(n / QK);
	s->g16 = s->nb / 16;
	s->gt = (s->nb - 16 * s->g16 + 3) / 4;
	s->nd = (16 * s->g16 + 4 * s->gt + 15) / 16 * 16;
	s->direct = direct;
	s->packed = 0;
	s->tail_off = (size_t)s->g16 * 512;
	s->d_off = ALIGN64(s->tail_off + (size_t)s->gt * 128);
	s->ms_off = ALIGN64(s->d_off + (size_t)s->nd * 4);
	s->wrow = ALIGN64(s->ms_off + (type == QT_Q4_1 ? (size_t)s->nd * 4 : 0));
	s->init_off = s->ms_off;
	s->tinit = (size_t)s->g16 * (direct ? 64 : 16);
	size_t init = type == QT_Q4_0 ? (s->tinit + (size_t)s->gt * 16) * 4 : 0;
	s->as_off = ALIGN64(s->init_off + init);
	s->arow = ALIGN64(s->as_off + (type == QT_Q4_1 ? (size_t)s->nd * 4 : 0));
}

/* The 4x4 dword transpose that turns four blocks' 16-byte halves (R0..R3)
 * into pieces: piece t of blocks 0..3 lands at DST + t * STRIDE. */
INLINE TARGET void q32_store_pieces(uint8_t *dst, size_t stride, __m128i r0, __m128i r1, __m128i r2, __m128i r3)
{
	__m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
	__m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
	_mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi64(t0, t1));
	_mm_storeu_si128((__m128i *)(dst + stride), _mm_unpackhi_epi64(t0, t1));
	_mm_storeu_si128((__m128i *)(dst + 2 * stride), _mm_unpacklo_epi64(t2, t3));
	_mm_storeu_si128((__m128i *)(dst + 3 * stride), _mm_unpackhi_epi64(t2, t3));
}

INLINE TARGET uint16_t ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* Activation rows (Q8_0 or, for Q4_1, Q8_1 blocks) into S's layout. */
static TARGET void q32_pack_acts(const struct q32_shape *s, const uint8_t *a, size_t lda, int na, uint8_t *dst)
{
	const int q81 = s->type == QT_Q4_1, bytes = q81 ? 36 : 34, qoff = q81 ? 4 : 2;
	const __m128i ones8 = _mm_set1_epi8(1), ones16 = _mm_set1_epi16(1);
	const int nq = 4 * s->g16 + s->gt;

	for (int j = 0; j < na; j++) {
		const uint8_t *row = a + (size_t)j * lda;
		uint8_t *out = dst + (size_t)j * s->arow;
		float *d = (float *)(out + s->d_off), *sp = (float *)(out + s->as_off);
		int32_t *init = (int32_t *)(out + s->init_off);

		for (int q4 = 0; q4 < nq; q4++) {
			__m128i lo[4], hi[4];
			int32_t p[4][4]; /* Q4_0: piece sums (lo t + hi t) of each block */
			for (int k = 0; k < 4; k++) {
				int b = 4 * q4 + k;
				if (b >= s->nb) {
					lo[k] = hi[k] = _mm_setzero_si128();
					d[b] = 0;
					if (q81)
						sp[b] = 0;
				} else {
					const uint8_t *blk = row + (size_t)b * bytes;
					lo[k] = _mm_loadu_si128((const __m128i *)(blk + qoff));
					hi[k] = _mm_loadu_si128((const __m128i *)(blk + qoff + 16));
					d[b] = h2f(ld16(blk));
					if (q81)
						sp[b] = h2f(ld16(blk + 2));
				}
				if (s->type == QT_Q4_0)
					_mm_storeu_si128((__m128i *)p[k],
							 _mm_madd_epi16(_mm_add_epi16(_mm_maddubs_epi16(ones8, lo[k]),
										      _mm_maddubs_epi16(ones8, hi[k])), ones16));
			}
			int full = q4 < 4 * s->g16, g = q4 / 4, qt = q4 - 4 * s->g16;
			if (!s->direct) {
				uint8_t *c = full ? out + (size_t)g * 512 + 16 * (q4 % 4) : out + s->tail_off + (size_t)qt * 128;
				size_t stride = full ? 64 : 16;
				q32_store_pieces(c, stride, lo[0], lo[1], lo[2], lo[3]);
				q32_store_pieces(c + (full ? 256 : 64), stride, hi[0], hi[1], hi[2], hi[3]);
			} else {
				for (int k = 0; k < 4; k++) {
					/* full: block l = 4(q4%4)+k sits in half l/8, pair l%4,
					 * slot (l%8)/4; tail: pair k%2, slot k/2 */
					int l = 4 * (q4 % 4) + k;
					uint8_t *c = full ? out + (size_t)g * 512 + (l / 8) * 256 + (l % 4) * 64 + ((l % 8) / 4) * 16
							  : out + s->tail_off + (size_t)qt * 128 + (k % 2) * 64 + (k / 2) * 16;
					_mm_storeu_si128((__m128i *)c, lo[k]);
					_mm_storeu_si128((__m128i *)(c + 32), hi[k]);
				}
			}
			if (s->type != QT_Q4_0)
				continue;
			for (int k = 0; k < 4; k++) {
				int l = 4 * (q4 % 4) + k;
				for (int t = 0; t < 4; t++) {
					int32_t v = -8 * p[k][t];
					if (full && s->direct)
						init[(size_t)g * 64 + (l / 8) * 32 + (l % 4) * 8 + ((l % 8) / 4) * 4 + t] = v;
					else if (!full && s->direct)
						init[s->tinit + (size_t)qt * 16 + (k % 2) * 8 + (k / 2) * 4 + t] = v;
					else if (!full)
						init[s->tinit + (size_t)qt * 16 + 4 * t + k] = v;
				}
				if (full && !s->direct)
					init[(size_t)g * 16 + l] = -8 * (p[k][0] + p[k][1] + p[k][2] + p[k][3]);
			}
		}
		for (int b = 4 * nq; b < s->nd; b++) {
			d[b] = 0;
			if (q81)
				sp[b] = 0;
		}
	}
}

/* Byte offsets in a weight row of block B's d, m and codes (16 bytes;
 * Q8_0's hi half 32 bytes on in the packed layout, 16 in the file's). */
static void q32_block_at(const struct q32_shape *s, int b, size_t *ret_d, size_t *ret_m, size_t *ret_codes)
{
	if (!s->packed) {
		size_t blk = (size_t)b * s->bytes;
		*ret_d = blk;
		*ret_m = blk + 2;
		*ret_codes = blk + (s->type == QT_Q4_1 ? 4 : 2);
		return;
	}
	size_t pair = s->type == QT_Q8_0 ? 64 : 32, hdr;
	int k, slot;
	if (b < 16 * s->g16) {
		hdr = (size_t)(b / 8) * q32_pk_octet(s->type);
		k = b % 8;
		*ret_d = hdr + 2 * k;
		*ret_m = hdr + 16 + 2 * k;
		slot = k / 4;
		k %= 4;
	} else {
		hdr = (size_t)(2 * s->g16) * q32_pk_octet(s->type) + (size_t)((b - 16 * s->g16) / 4) * q32_pk_quad(s->type);
		k = b % 4;
		*ret_d = hdr + 2 * k;
		*ret_m = hdr + 8 + 2 * k;
		slot = k / 2;
		k %= 2;
	}
	*ret_codes = hdr + PK_HDR + k * pair + slot * 16;
}

/* One packed weight row into group order: a quarter of a group (or a tail
 * quad) is one slot of four pairs, and the scales come eight at a time. */
static TARGET void q32_unpack_packed_row(const struct q32_shape *s, const uint8_t *row, uint8_t *out)
{
	const __m128i m4 = _mm_set1_epi8(0x0f);
	const int oct = q32_pk_octet(s->type), quad = q32_pk_quad(s->type), pair = s->type == QT_Q8_0 ? 64 : 32;
	float *d = (float *)(out + s->d_off), *m = (float *)(out + s->ms_off);

	memset(out + s->d_off, 0, s->wrow - s->d_off);
	for (int g = 0; g < s->g16; g++) {
		for (int qq = 0; qq < 4; qq++) {
			const uint8_t *o = row + (size_t)(2 * g + qq / 2) * oct;
			__m128i lo[4], hi[4];
			if (qq % 2 == 0) {
				_mm256_storeu_ps(d + 16 * g + 8 * (qq / 2), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o)));
				if (s->type == QT_Q4_1)
					_mm256_storeu_ps(m + 16 * g + 8 * (qq / 2),
							 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))));
			}
			for (int k = 0; k < 4; k++) {
				const uint8_t *c = o + PK_HDR + k * pair + (qq % 2) * 16;
				__m128i q = _mm_loadu_si128((const __m128i *)c);
				if (s->type == QT_Q8_0) {
					lo[k] = q;
					hi[k] = _mm_loadu_si128((const __m128i *)(c + 32));
				} else {
					lo[k] = _mm_and_si128(q, m4);
					hi[k] = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
				}
			}
			uint8_t *c = out + (size_t)g * 512 + 16 * qq;
			q32_store_pieces(c, 64, lo[0], lo[1], lo[2], lo[3]);
			q32_store_pieces(c + 256, 64, hi[0], hi[1], hi[2], hi[3]);
		}
	}
	for (int q = 0; q < s->gt; q++) {
		const uint8_t *o = row + (size_t)(2 * s->g16) * oct + (size_t)q * quad;
		int b0 = 16 * s->g16 + 4 * q;
		__m128i lo[4], hi[4];
		/* zero past the row's end, as the header is */
		_mm_storeu_ps(d + b0, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)o)));
		if (s->type == QT_Q4_1)
			_mm_storeu_ps(m + b0, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(o + 8))));
		for (int k = 0; k < 4; k++) {
			const uint8_t *c = o + PK_HDR + (k % 2) * pair + (k / 2) * 16;
			__m128i qv = _mm_loadu_si128((const __m128i *)c);
			if (s->type == QT_Q8_0) {
				lo[k] = qv;
				hi[k] = _mm_loadu_si128((const __m128i *)(c + 32));
			} else {
				lo[k] = _mm_and_si128(qv, m4);
				hi[k] = _mm_and_si128(_mm_srli_epi16(qv, 4), m4);
			}
		}
		uint8_t *c = out + s->tail_off + (size_t)q * 128;
		q32_store_pieces(c, 16, lo[0], lo[1], lo[2], lo[3]);
		q32_store_pieces(c + 64, 16, hi[0], hi[1], hi[2], hi[3]);
	}
}

/* One weight row (file or packed layout) into group order (see above). */
static TARGET void q32_unpack_row(const struct q32_shape *s, const uint8_t *row, uint8_t *out)
{
	const __m128i m4 = _mm_set1_epi8(0x0f);
	float *d = (float *)(out + s->d_off), *m = (float *)(out + s->ms_off);

	if (s->packed) {
		q32_unpack_packed_row(s, row, out);
		return;
	}
	memset(out + s->d_off, 0, s->wrow - s->d_off);
	for (int b0 = 0; b0 < 16 * s->g16 + 4 * s->gt; b0 += 4) {
		__m128i lo[4], hi[4];
		for (int k = 0; k < 4; k++) {
			int b = b0 + k;
			size_t od, om, oq;
			lo[k] = hi[k] = _mm_setzero_si128();
			if (b >= s->nb)
				continue;
			q32_block_at(s, b, &od, &om, &oq);
			const uint8_t *dp = row + od, *mp = row + om, *qs = row + oq;
			d[b] = h2f(ld16(dp));
			if (s->type == QT_Q8_0) {
				lo[k] = _mm_loadu_si128((const __m128i *)qs);
				hi[k] = _mm_loadu_si128((const __m128i *)(qs + (s->packed ? 32 : 16)));
			} else {
				__m128i q = _mm_loadu_si128((const __m128i *)qs);
				lo[k] = _mm_and_si128(q, m4);
				hi[k] = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
				if (s->type == QT_Q4_1)
					m[b] = h2f(ld16(mp));
			}
		}
		int full = b0 < 16 * s->g16;
		uint8_t *c = full ? out + (size_t)(b0 / 16) * 512 + 4 * (b0 % 16)
				  : out + s->tail_off + (size_t)((b0 - 16 * s->g16) / 4) * 128;
		size_t stride = full ? 64 : 16;
		q32_store_pieces(c, stride, lo[0], lo[1], lo[2], lo[3]);
		q32_store_pieces(c + (full ? 256 : 64), stride, hi[0], hi[1], hi[2], hi[3]);
	}
}

#define LD(p) _mm256_load_si256((const __m256i *)(p))
#define LDU(p) _mm256_loadu_si256((const __m256i *)(p))

/* Q8_0's signed codes: |w| * (a with w's sign), exact while a > -128
 * (quantize_row keeps it so); one int16 holds only two such products. */
INLINE TARGET __m256i q8_idot(__m256i p, __m256i w, __m256i a)
{
	return _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)),
						      _mm256_set1_epi16(1)));
}

/* Integer partials of weight codes LO/HI against activation codes at AP
 * (lo at AP, hi at AP + 32), started from INIT: lane d = the partial of
 * the piece pair in dword d. */
INLINE TARGET __m256i q32_idot2(const uint32_t type, __m256i init, __m256i lo, __m256i hi, const uint8_t *ap)
{
	if (type == QT_Q8_0)
		return q8_idot(q8_idot(init, lo, LD(ap)), hi, LD(ap + 32));
	__m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, LD(ap)), _mm256_maddubs_epi16(hi, LD(ap + 32)));
	return _mm256_add_epi32(init, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

/* ---- the direct kernel ---- */

/* The codes of the blocks at P0 and P1 (block starts), one per 128-bit lane. */
INLINE TARGET void q32_pair_codes(const uint32_t type, const uint8_t *p0, const uint8_t *p1, __m256i *lo, __m256i *hi)
{
	if (type == QT_Q8_0) {
		*lo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + 2))),
					      _mm_loadu_si128((const __m128i *)(p1 + 2)), 1);
		*hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + 18))),
					      _mm_loadu_si128((const __m128i *)(p1 + 18)), 1);
		return;
	}
	const int qoff = type == QT_Q4_1 ? 4 : 2;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + qoff))),
					    _mm_loadu_si128((const __m128i *)(p1 + qoff)), 1);
	*lo = _mm256_and_si256(q, m4);
	*hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}

/* The first dword (d, then m or codes) of the eight blocks at P, block k
 * in lane k: broadcast loads and blends, which stay in vector registers
 * (a vector built from scalar loads goes through the stack and stalls). */
INLINE TARGET __m256i q32_dm8(const uint8_t *p, const int bytes)
{
	__m256i v = _mm256_castps_si256(_mm256_broadcast_ss((const float *)p));
	_Pragma("GCC unroll 8")
	for (int k = 1; k < 8; k++)
		v = _mm256_blend_epi32(v, _mm256_castps_si256(_mm256_broadcast_ss((const float *)(p + k * bytes))), 1 << k);
	return v;
}

/* A pair's codes in the packed layout, at P. */
INLINE TARGET void q32_pk_pair_codes(const uint32_t type, const uint8_t *p, __m256i *lo, __m256i *hi)
{
	if (type == QT_Q8_0) {
		*lo = _mm256_loadu_si256((const __m256i *)p);
		*hi = _mm256_loadu_si256((const __m256i *)(p + 32));
		return;
	}
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256i q = _mm256_loadu_si256((const __m256i *)p);
	*lo = _mm256_and_si256(q, m4);
	*hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}

INLINE TARGET __m256i q32_pair_init(const uint32_t type, const uint8_t *as, const struct q32_shape *s, size_t idx)
{
	return type == QT_Q4_0 ? LD((const int32_t *)(as + s->init_off) + idx) : _mm256_setzero_si256();
}

INLINE TARGET void q32_direct_body(const struct q32_shape *s, const uint32_t type, const int packed, const uint8_t *w,
				   size_t ldw, int nw, const uint8_t *as, const int na, float *c, size_t ldc)
{
	const int oct = q32_pk_octet(type), quad = q32_pk_quad(type), pair = type == QT_Q8_0 ? 64 : 32;
	static const uint8_t zblk[40]; /* a block past the row's end: all codes 0 */
	const int bytes = type == QT_Q4_0 ? 18 : type == QT_Q4_1 ? 20 : 34;
	/* per 128-bit lane: d words of four dwords, then their m words */
	const __m256i dmsplit = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
						 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);

	for (int i = 0; i < nw; i++) {
		const uint8_t *row = w + (size_t)i * ldw;
		__m256 acc[DIRECT_MAX][2], macc[DIRECT_MAX][2];

		_Pragma("GCC unroll 4")
		for (int j = 0; j < na; j++)
			acc[j][0] = acc[j][1] = macc[j][0] = macc[j][1] = _mm256_setzero_ps();
		for (int g = 0; g < s->g16; g++) {
			_Pragma("GCC unroll 2")
			for (int h = 0; h < 2; h++) {
				const uint8_t *p = packed ? row + (size_t)(2 * g + h) * oct : row + (size_t)(16 * g + 8 * h) * bytes;
				__m256i sum[DIRECT_MAX], h01[DIRECT_MAX];
				/* a prefetch never faults, so none is checked against the end */
				_mm_prefetch((const char *)p + PREFETCH, _MM_HINT_T0);
				_mm_prefetch((const char *)p + PREFETCH + 64, _MM_HINT_T0);
				_mm_prefetch((const char *)p + PREFETCH + 128, _MM_HINT_T0);
				if (type == QT_Q8_0) { /* 272 or 288 bytes */
					_mm_prefetch((const char *)p + PREFETCH + 192, _MM_HINT_T0);
					_mm_prefetch((const char *)p + PREFETCH + 256, _MM_HINT_T0);
				}
				_Pragma("GCC unroll 2")
				for (int i2 = 0; i2 < 2; i2++) {
					__m256i lo0, hi0, lo1, hi1;
					if (packed) {
						q32_pk_pair_codes(type, p + PK_HDR + (2 * i2) * pair, &lo0, &hi0);
						q32_pk_pair_codes(type, p + PK_HDR + (2 * i2 + 1) * pair, &lo1, &hi1);
					} else {
						q32_pair_codes(type, p + (2 * i2) * bytes, p + (2 * i2 + 4) * bytes, &lo0, &hi0);
						q32_pair_codes(type, p + (2 * i2 + 1) * bytes, p + (2 * i2 + 5) * bytes, &lo1, &hi1);
					}
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++) {
						const uint8_t *ar = as + (size_t)j * s->arow;
						size_t pr = (size_t)g * 8 + 4 * h + 2 * i2; /* pair index */
						__m256i p0 = q32_idot2(type, q32_pair_init(type, ar, s, pr * 8), lo0, hi0, ar + pr * 64);
						__m256i p1 = q32_idot2(type, q32_pair_init(type, ar, s, pr * 8 + 8), lo1, hi1,
								       ar + pr * 64 + 64);
						__m256i hx = _mm256_hadd_epi32(p0, p1);
						if (i2 == 0)
							h01[j] = hx;
						else
							sum[j] = _mm256_hadd_epi32(h01[j], hx); /* block 8h+k in lane k */
					}
				}
				__m256i dm = packed ? _mm256_loadu_si256((const __m256i *)p)
						    : _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q32_dm8(p, bytes), dmsplit), 0xd8);
				__m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
				__m256 mw = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
				_Pragma("GCC unroll 4")
				for (int j = 0; j < na; j++) {
					const uint8_t *ar = as + (size_t)j * s->arow;
					__m256 dd = _mm256_mul_ps(dw, _mm256_load_ps((const float *)(ar + s->d_off) + 16 * g + 8 * h));
					acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j]), dd, acc[j][h]);
					if (type == QT_Q4_1)
						macc[j][h] = _mm256_fmadd_ps(mw, _mm256_load_ps((const float *)(ar + s->as_off) + 16 * g + 8 * h),
									     macc[j][h]);
				}
			}
		}
		for (int q = 0; q < s->gt; q++) {
			int b0 = 16 * s->g16 + 4 * q;
			const uint8_t *pq = row + (size_t)(2 * s->g16) * oct + (size_t)q * quad;
			const uint8_t *blk[4];
			__m256 dmf; /* d of the four blocks in lanes 0..3, m in 4..7 */
			__m256i lo0, hi0, lo1, hi1;
			if (packed) {
				_mm_prefetch((const char *)pq + PREFETCH, _MM_HINT_T0);
				_mm_prefetch((const char *)pq + PREFETCH + 64, _MM_HINT_T0);
				_mm_prefetch((const char *)pq + PREFETCH + 128, _MM_HINT_T0);
				dmf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pq));
				q32_pk_pair_codes(type, pq + PK_HDR, &lo0, &hi0);
				q32_pk_pair_codes(type, pq + PK_HDR + pair, &lo1, &hi1);
			} else {
				_mm_prefetch((const char *)row + (size_t)b0 * bytes + PREFETCH, _MM_HINT_T0);
				_mm_prefetch((const char *)row + (size_t)b0 * bytes + PREFETCH + 64, _MM_HINT_T0);
				_mm_prefetch((const char *)row + (size_t)b0 * bytes + PREFETCH + 128, _MM_HINT_T0);
				__m256i dm = _mm256_setzero_si256();
				_Pragma("GCC unroll 4")
				for (int k = 0; k < 4; k++) {
					blk[k] = b0 + k < s->nb ? row + (size_t)(b0 + k) * bytes : zblk;
					dm = _mm256_blend_epi32(dm, _mm256_castps_si256(_mm256_broadcast_ss((const float *)blk[k])), 1 << k);
				}
				dmf = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_shuffle_epi8(dm, dmsplit)));
				q32_pair_codes(type, blk[0], blk[2], &lo0, &hi0);
				q32_pair_codes(type, blk[1], blk[3], &lo1, &hi1);
			}
			/* Q4_1: m of block b0+k into lane (b0+k)%16, the other lanes 0 */
			const int mh = (4 * q) / 8, mo = (4 * q) % 8;
			__m256 mw = _mm256_permute2f128_ps(dmf, dmf, 0x11);
			mw = mo ? _mm256_blend_ps(_mm256_setzero_ps(), mw, 0xf0) : _mm256_blend_ps(_mm256_setzero_ps(), mw, 0x0f);
			__m256 dw = _mm256_permute2f128_ps(dmf, dmf, 0x00);
			_Pragma("GCC unroll 4")
			for (int j = 0; j < na; j++) {
				const uint8_t *ar = as + (size_t)j * s->arow;
				const uint8_t *ap = ar + s->tail_off + (size_t)q * 128;
				size_t ii = s->tinit + (size_t)q * 16;
				__m256i p0 = q32_idot2(type, q32_pair_init(type, ar, s, ii), lo0, hi0, ap);
				__m256i p1 = q32_idot2(type, q32_pair_init(type, ar, s, ii + 8), lo1, hi1, ap + 64);
				/* pairs (0, 2) and (1, 3) to lanes 4t+k: t = 0, 1, then t = 2, 3 */
				__m256i v0 = _mm256_permute4x64_epi64(_mm256_unpacklo_epi32(p0, p1), 0xd8);
				__m256i v1 = _mm256_permute4x64_epi64(_mm256_unpackhi_epi32(p0, p1), 0xd8);
				const float *ad = (const float *)(ar + s->d_off);
				__m256 dd = _mm256_mul_ps(dw, _mm256_broadcast_ps((const __m128 *)(ad + b0)));
				acc[j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v0), dd, acc[j][0]);
				acc[j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), dd, acc[j][1]);
				if (type == QT_Q4_1) /* fma(0, s, lane) leaves a lane as it was */
					macc[j][mh] = _mm256_fmadd_ps(mw, _mm256_load_ps((const float *)(ar + s->as_off) + 16 * s->g16 + 8 * mh),
								      macc[j][mh]);
			}
		}
		_Pragma("GCC unroll 4")
		for (int j = 0; j < na; j++) {
			if (type == QT_Q4_1) {
				acc[j][0] = _mm256_add_ps(acc[j][0], macc[j][0]);
				acc[j][1] = _mm256_add_ps(acc[j][1], macc[j][1]);
			}
			c[(size_t)j * ldc + i] = hsum16(acc[j][0], acc[j][1]);
		}
	}
}

/* ---- the tile kernel ---- */

/* Two repacked weight rows (WS, S->wrow apart) against NR (1 or 2)
 * activation rows (AS, S->arow apart): C[j * LDC + i] for i < MR. */
INLINE TARGET void q32_tile22(const struct q32_shape *s, const uint32_t type, const uint8_t *ws,
			      const uint8_t *as, const int nr, int mr, float *c, size_t ldc)
{
	const __m256i ones = _mm256_set1_epi16(1);
	__m256 fin[2][2][2]; /* [half][weight row][activation row] */

	_Pragma("GCC unroll 2")
	for (int h = 0; h < 2; h++) {
		__m256 acc[2][2];
		for (int i = 0; i < 2; i++)
			acc[i][0] = acc[i][1] = _mm256_setzero_ps();
		for (int g = 0; g < s->g16; g++) {
			__m256i sum[2][2];
			for (int i = 0; i < 2; i++)
				sum[i][0] = sum[i][1] = _mm256_setzero_si256();
			_Pragma("GCC unroll 8")
			for (int r = 0; r < 8; r++) {
				size_t off = (size_t)g * 512 + 64 * r + 32 * h;
				__m256i w0 = LD(ws + off), w1 = LD(ws + s->wrow + off);
				if (type == QT_Q8_0) {
					_Pragma("GCC unroll 2")
					for (int j = 0; j < nr; j++) {
						__m256i a = LD(as + (size_t)j * s->arow + off);
						sum[0][j] = q8_idot(sum[0][j], w0, a);
						sum[1][j] = q8_idot(sum[1][j], w1, a);
					}
				} else {
					_Pragma("GCC unroll 2")
					for (int j = 0; j < nr; j++) {
						__m256i a = LD(as + (size_t)j * s->arow + off);
						sum[0][j] = _mm256_add_epi16(sum[0][j], _mm256_maddubs_epi16(w0, a));
						sum[1][j] = _mm256_add_epi16(sum[1][j], _mm256_maddubs_epi16(w1, a));
					}
				}
			}
			_Pragma("GCC unroll 2")
			for (int j = 0; j < nr; j++) {
				const uint8_t *ar = as + (size_t)j * s->arow;
				__m256 da = _mm256_load_ps((const float *)(ar + s->d_off) + 16 * g + 8 * h);
				__m256i init = type == QT_Q4_0 ? LD((const int32_t *)(ar + s->init_off) + 16 * g + 8 * h)
							       : _mm256_setzero_si256();
				for (int i = 0; i < 2; i++) {
					__m256i p = type == QT_Q8_0 ? sum[i][j] : _mm256_add_epi32(init, _mm256_madd_epi16(sum[i][j], ones));
					__m256 dd = _mm256_mul_ps(_mm256_load_ps((const float *)(ws + i * s->wrow + s->d_off) + 16 * g + 8 * h), da);
					acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dd, acc[i][j]);
				}
			}
		}
		for (int q = 0; q < s->gt; q++) {
			size_t off = s->tail_off + (size_t)q * 128 + 32 * h;
			int b0 = 16 * s->g16 + 4 * q;
			for (int i = 0; i < 2; i++) {
				const uint8_t *wr = ws + i * s->wrow;
				__m256i lo = LD(wr + off), hi = LD(wr + off + 64);
				__m256 dw = _mm256_broadcast_ps((const __m128 *)((const float *)(wr + s->d_off) + b0));
				_Pragma("GCC unroll 2")
				for (int j = 0; j < nr; j++) {
					const uint8_t *ar = as + (size_t)j * s->arow;
					__m256i init = type == QT_Q4_0
						? LD((const int32_t *)(ar + s->init_off) + s->tinit + 16 * (size_t)q + 8 * h)
						: _mm256_setzero_si256();
					__m256i p;
					if (type == QT_Q8_0)
						p = q8_idot(q8_idot(init, lo, LD(ar + off)), hi, LD(ar + off + 64));
					else
						p = _mm256_add_epi32(init, _mm256_madd_epi16(
							_mm256_add_epi16(_mm256_maddubs_epi16(lo, LD(ar + off)),
									 _mm256_maddubs_epi16(hi, LD(ar + off + 64))), ones));
					__m256 dd = _mm256_mul_ps(dw, _mm256_broadcast_ps((const __m128 *)((const float *)(ar + s->d_off) + b0)));
					acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dd, acc[i][j]);
				}
			}
		}
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < nr; j++)
				fin[h][i][j] = acc[i][j];
	}
	for (int i = 0; i < mr; i++) {
		for (int j = 0; j < nr; j++) {
			__m256 lo = fin[0][i][j], hi = fin[1][i][j];
			if (type == QT_Q4_1) {
				const float *m = (const float *)(ws + i * s->wrow + s->ms_off);
				const float *sa = (const float *)(as + (size_t)j * s->arow + s->as_off);
				__m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
				for (int l = 0; l < s->nd; l += 16) {
					m0 = _mm256_fmadd_ps(_mm256_load_ps(m + l), _mm256_load_ps(sa + l), m0);
					m1 = _mm256_fmadd_ps(_mm256_load_ps(m + l + 8), _mm256_load_ps(sa + l + 8), m1);
				}
				lo = _mm256_add_ps(lo, m0);
				hi = _mm256_add_ps(hi, m1);
			}
			c[(size_t)j * ldc + i] = hsum16(lo, hi);
		}
	}
}

#undef LD
#undef LDU

/* Each kernel once per type (and activation row count), so that every
 * branch on them folds away. */
INLINE TARGET void q32_direct(const struct q32_shape *s, const uint32_t type, const int packed, const uint8_t *w,
			      size_t ldw, int nw, const uint8_t *as, int na, float *c, size_t ldc)
{
	switch (na) {
	case 1: q32_direct_body(s, type, packed, w, ldw, nw, as, 1, c, ldc); break;
	case 2: q32_direct_body(s, type, packed, w, ldw, nw, as, 2, c, ldc); break;
	case 3: q32_direct_body(s, type, packed, w, ldw, nw, as, 3, c, ldc); break;
	default: q32_direct_body(s, type, packed, w, ldw, nw, as, 4, c, ldc); break;
	}
}

INLINE TARGET void q32_run(const struct q32_shape *s, const uint32_t type, const uint8_t *w, size_t ldw, int nw,
			   const uint8_t *as, int na, float *c, size_t ldc, uint8_t *ws)
{
	if (s->direct) {
		if (s->packed)
			q32_direct(s, type, 1, w, ldw, nw, as, na, c, ldc);
		else
			q32_direct(s, type, 0, w, ldw, nw, as, na, c, ldc);
		return;
	}
	for (int i0 = 0; i0 < nw; i0 += 4) {
		int mr = nw - i0 < 4 ? nw - i0 : 4;
		for (int r = 0; r < 4; r++) {
			if (r < mr)
				q32_unpack_row(s, w + (size_t)(i0 + r) * ldw, ws + r * s->wrow);
			else
				memset(ws + r * s->wrow, 0, s->wrow);
		}
		for (int j0 = 0; j0 < na; j0 += 2) {
			const uint8_t *at = as + (size_t)j0 * s->arow;
			for (int ii = 0; ii < mr; ii += 2) {
				float *ct = c + (size_t)j0 * ldc + i0 + ii;
				int m2 = mr - ii < 2 ? mr - ii : 2;
				if (na - j0 >= 2)
					q32_tile22(s, type, ws + ii * s->wrow, at, 2, m2, ct, ldc);
				else
					q32_tile22(s, type, ws + ii * s->wrow, at, 1, m2, ct, ldc);
			}
		}
	}
}

static TARGET void q32_run_q4_0(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw,
				const uint8_t *as, int na, float *c, size_t ldc, uint8_t *ws)
{
	q32_run(s, QT_Q4_0, w, ldw, nw, as, na, c, ldc, ws);
}

static TARGET void q32_run_q4_1(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw,
				const uint8_t *as, int na, float *c, size_t ldc, uint8_t *ws)
{
	q32_run(s, QT_Q4_1, w, ldw, nw, as, na, c, ldc, ws);
}

static TARGET void q32_run_q8_0(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw,
				const uint8_t *as, int na, float *c, size_t ldc, uint8_t *ws)
{
	q32_run(s, QT_Q8_0, w, ldw, nw, as, na, c, ldc, ws);
}

static TARGET int gemm_q32(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw,
			   const uint8_t *a, size_t lda, int na, float *c, size_t ldc, int packed)
{
	struct q32_shape s;

	q32_shape_init(&s, type, n, na <= DIRECT_MAX);
	s.packed = packed;
	/* packed activations, then four repacked weight rows (tile only) */
	uint8_t *as = quant_scratch((size_t)na * s.arow + 4 * s.wrow);
	if (!as)
		return -ENOMEM;
	uint8_t *ws = as + (size_t)na * s.arow;
	q32_pack_acts(&s, a, lda, na, as);
	if (type == QT_Q4_0)
		q32_run_q4_0(&s, w, ldw, nw, as, na, c, ldc, ws);
	else if (type == QT_Q4_1)
		q32_run_q4_1(&s, w, ldw, nw, as, na, c, ldc, ws);
	else
		q32_run_q8_0(&s, w, ldw, nw, as, na, c, ldc, ws);
	return 0;
}

/* ---- F32, F16, BF16 ---- */

/* Elements E..E+15 of a row of N as two ymm of floats; zeros past N. */
INLINE TARGET void load16(uint32_t type, const void *row, int64_t e, int64_t n, __m256 *v)
{
	uint16_t tmp16[16];
	float tmp32[16];
	const void *p;

	if (e + 16 <= n) {
		p = type == QT_F32 ? (const void *)((const float *)row + e) : (const void *)((const uint16_t *)row + e);
	} else if (type == QT_F32) {
		memset(tmp32, 0, sizeof tmp32);
		memcpy(tmp32, (const float *)row + e, (size_t)(n - e) * 4);
		p = tmp32;
	} else {
		memset(tmp16, 0, sizeof tmp16);
		memcpy(tmp16, (const uint16_t *)row + e, (size_t)(n - e) * 2);
		p = tmp16;
	}
	if (type == QT_F32) {
		v[0] = _mm256_loadu_ps(p);
		v[1] = _mm256_loadu_ps((const float *)p + 8);
	} else if (type == QT_F16) {
		v[0] = _mm256_cvtph_ps(_mm_loadu_si128(p));
		v[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
	} else {
		v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)), 16));
		v[1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p + 1)), 16));
	}
}

INLINE TARGET void float_tile(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, const uint8_t *arow,
			      const int mr, float *c)
{
	__m256 acc[4][2];

	for (int i = 0; i < mr; i++)
		acc[i][0] = acc[i][1] = _mm256_setzero_ps();
	for (int64_t e = 0; e < n; e += 16) {
		__m256 av[2];
		load16(type, arow, e, n, av);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			__m256 wv[2];
			load16(type, w + i * ldw, e, n, wv);
			acc[i][0] = _mm256_fmadd_ps(wv[0], av[0], acc[i][0]);
			acc[i][1] = _mm256_fmadd_ps(wv[1], av[1], acc[i][1]);
		}
	}
	for (int i = 0; i < mr; i++)
		c[i] = hsum16(acc[i][0], acc[i][1]);
}

static TARGET void float_tile4(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, const uint8_t *arow, float *c)
{
	float_tile(type, n, w, ldw, arow, 4, c);
}

static TARGET void float_tile1(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, const uint8_t *arow, float *c)
{
	float_tile(type, n, w, ldw, arow, 1, c);
}

/* Row ROW of N elements of TYPE as f32 at DST, zero-padded to N16. */
static TARGET void float_row(uint32_t type, const void *row, int64_t n, int64_t n16, float *dst)
{
	for (int64_t e = 0; e < n16; e += 16) {
		__m256 v[2];
		load16(type, row, e, n, v);
		_mm256_store_ps(dst + e, v[0]);
		_mm256_store_ps(dst + e + 8, v[1]);
	}
}

/* Four f32 rows (W, N16 apart) against one f32 row A: the same lanes and
 * order as float_tile. */
static TARGET void float_tile_f32(const float *w, const float *a, int64_t n16, float *c)
{
	__m256 acc[4][2];

	for (int i = 0; i < 4; i++)
		acc[i][0] = acc[i][1] = _mm256_setzero_ps();
	for (int64_t e = 0; e < n16; e += 16) {
		__m256 a0 = _mm256_load_ps(a + e), a1 = _mm256_load_ps(a + e + 8);
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			acc[i][0] = _mm256_fmadd_ps(_mm256_load_ps(w + i * n16 + e), a0, acc[i][0]);
			acc[i][1] = _mm256_fmadd_ps(_mm256_load_ps(w + i * n16 + e + 8), a1, acc[i][1]);
		}
	}
	for (int i = 0; i < 4; i++)
		c[i] = hsum16(acc[i][0], acc[i][1]);
}

static TARGET int gemm_float(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw,
			     const uint8_t *a, size_t lda, int na, float *c, size_t ldc)
{
	int64_t n16 = (n + 15) / 16 * 16;
	float *as = NULL, *ws = NULL;

	/* several activation rows: convert both sides to f32 once, so the inner
	 * loop is loads and FMAs only */
	if (na > 2) {
		as = quant_scratch(((size_t)na + 4) * (size_t)n16 * sizeof(float));
		if (!as)
			return -ENOMEM;
		ws = as + (size_t)na * n16;
		for (int j = 0; j < na; j++)
			float_row(type, a + (size_t)j * lda, n, n16, as + (size_t)j * n16);
	}
	/* weight rows outer: four of them stay in L1 while every activation passes */
	for (int i0 = 0; i0 < nw; i0 += 4) {
		int mr = nw - i0 < 4 ? nw - i0 : 4;
		if (as) {
			for (int r = 0; r < 4; r++) {
				if (r < mr)
					float_row(type, w + (size_t)(i0 + r) * ldw, n, n16, ws + (size_t)r * n16);
				else
					memset(ws + (size_t)r * n16, 0, (size_t)n16 * sizeof(float));
			}
		}
		for (int j = 0; j < na; j++) {
			float out[4];
			if (as) {
				float_tile_f32(ws, as + (size_t)j * n16, n16, out);
			} else if (mr == 4) {
				float_tile4(type, n, w + (size_t)i0 * ldw, ldw, a + (size_t)j * lda, out);
			} else {
				for (int r = 0; r < mr; r++)
					float_tile1(type, n, w + (size_t)(i0 + r) * ldw, ldw, a + (size_t)j * lda, out + r);
			}
			for (int r = 0; r < mr; r++)
				c[(size_t)j * ldc + i0 + r] = out[r];
		}
	}
	return 0;
}

/* ---- K-quants ----
 *
 * A weight super-block is unpacked once into 256 unsigned codes and, per
 * 32-element chunk, an int16 vector of its 16-element groups' scales; then
 * every activation row takes it in maddubs/madd steps, exactly.
 */

struct kq_unpacked {
	uint8_t q[QK_K] __attribute__((aligned(32))); /* codes, 0..15 / 0..31 / 0..63 */
	__m256i scv[8];         /* chunk c: scale of group 2c in int16 lanes 0..7, of 2c+1 in 8..15 */
	int16_t off[16] __attribute__((aligned(32))); /* per group: Q4/5_K its min, Q6_K -32 * its scale */
	float d, dmin;          /* d_w and dmin_w (0 for Q6_K) */
};

static TARGET void kq_unpack(uint32_t type, const void *blk, struct kq_unpacked *u)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256i s32; /* dword c: the scales of chunk c's two groups of 16 as int16 */

	if (type == QT_Q6_K) {
		const struct block_q6_k *x = blk;
		const __m256i m2 = _mm256_set1_epi8(3);
		for (int h = 0; h < 2; h++) {
			__m256i ql0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
			__m256i ql1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
			__m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
			__m256i lows[4] = {
				_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
				_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
				_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
			};
			for (int qtr = 0; qtr < 4; qtr++) {
				__m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * qtr), m2);
				_mm256_store_si256((__m256i *)(u->q + 128 * h + 32 * qtr),
						   _mm256_or_si256(lows[qtr], _mm256_slli_epi16(hb, 4)));
			}
		}
		s32 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
		/* -32 * scale, the offset of the 6-bit codes, against bsums */
		_mm256_store_si256((__m256i *)u->off, _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s32, 5)));
		u->d = h2f(x->d);
		u->dmin = 0;
	} else {
		const struct block_q4_k *x4 = blk;
		const struct block_q5_k *x5 = blk;
		int five = type == QT_Q5_K;
		const uint8_t *qs = five ? x5->qs : x4->qs, *scales = five ? x5->scales : x4->scales;
		__m256i qh = five ? _mm256_loadu_si256((const __m256i *)x5->qh) : _mm256_setzero_si256();
		const __m256i one = _mm256_set1_epi8(1);
		for (int c4 = 0; c4 < 4; c4++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c4));
			__m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
			if (five) {
				__m256i bl = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c4), one);
				__m256i bh = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c4 + 1), one);
				lo = _mm256_or_si256(lo, _mm256_slli_epi16(bl, 4));
				hi = _mm256_or_si256(hi, _mm256_slli_epi16(bh, 4));
			}
			_mm256_store_si256((__m256i *)(u->q + 64 * c4), lo);
			_mm256_store_si256((__m256i *)(u->q + 64 * c4 + 32), hi);
		}
		/* the eight 6-bit scales and mins, unpacked 32 bits at a time */
		uint32_t t[3], sc[2], mn[2];
		memcpy(t, scales, 12);
		sc[0] = t[0] & 0x3f3f3f3f;
		sc[1] = (t[2] & 0x0f0f0f0f) | ((t[0] >> 6) & 0x03030303) << 4;
		mn[0] = t[1] & 0x3f3f3f3f;
		mn[1] = ((t[2] >> 4) & 0x0f0f0f0f) | ((t[1] >> 6) & 0x03030303) << 4;
		__m128i scb = _mm_set_epi32(0, 0, (int)sc[1], (int)sc[0]), mnb = _mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]);
		__m256i d32 = _mm256_cvtepu8_epi32(scb);
		s32 = _mm256_or_si256(d32, _mm256_slli_epi32(d32, 16)); /* a sub-block covers both groups */
		_mm256_store_si256((__m256i *)u->off, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb)));
		u->d = h2f(five ? x5->d : x4->d);
		u->dmin = h2f(five ? x5->dmin : x4->dmin);
	}
	/* chunk c: dword c's low scale in int16 lanes 0..7, its high one in 8..15 */
	const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
						2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
	for (int c8 = 0; c8 < 8; c8++)
		u->scv[c8] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s32, _mm256_set1_epi32(c8)), spread);
}

INLINE TARGET float kq_step(uint32_t type, const struct kq_unpacked *u, const struct block_q8_k *y, float acc)
{
	__m256i sum = _mm256_setzero_si256();
	for (int c8 = 0; c8 < 8; c8++) {
		__m256i q = _mm256_load_si256((const __m256i *)(u->q + 32 * c8));
		__m256i a = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * c8));
		sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), u->scv[c8]));
	}
	__m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
					_mm256_load_si256((const __m256i *)u->off));
	if (type == QT_Q6_K)
		return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)hsum_i32(_mm256_add_epi32(sum, off))),
						  _mm_set_ss(u->d * y->d), _mm_set_ss(acc)));
	acc = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)hsum_i32(sum)), _mm_set_ss(u->d * y->d), _mm_set_ss(acc)));
	return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(-(float)hsum_i32(off)), _mm_set_ss(u->dmin * y->d), _mm_set_ss(acc)));
}

#define KQ_JCHUNK 64

static TARGET int gemm_kq(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw,
			  const uint8_t *a, size_t lda, int na, float *c, size_t ldc)
{
	struct kq_unpacked u __attribute__((aligned(32)));
	float acc[KQ_JCHUNK];
	int nsb = (int)(n / QK_K);
	size_t bbytes = qtype_get(type)->bytes;

	for (int j0 = 0; j0 < na; j0 += KQ_JCHUNK) {
		int nj = na - j0 < KQ_JCHUNK ? na - j0 : KQ_JCHUNK;
		for (int i = 0; i < nw; i++) {
			const uint8_t *row = w + (size_t)i * ldw;
			for (int j = 0; j < nj; j++)
				acc[j] = 0;
			for (int b = 0; b < nsb; b++) {
				kq_unpack(type, row + b * bbytes, &u);
				for (int j = 0; j < nj; j++) {
					const struct block_q8_k *y = (const struct block_q8_k *)(a + (size_t)(j0 + j) * lda) + b;
					acc[j] = type == QT_Q6_K ? kq_step(QT_Q6_K, &u, y, acc[j]) : kq_step(QT_Q4_K, &u, y, acc[j]);
				}
			}
			for (int j = 0; j < nj; j++)
				c[(size_t)(j0 + j) * ldc + i] = acc[j];
		}
	}
	return 0;
}

/* ---- activation quantization ----
 *
 * The same operations as quant.c's ggml reference, eight lanes at a time:
 * the same divisions, products and fp16 rounding (F16C's is the
 * reference's), roundf's half-away-from-zero rebuilt from a truncation.
 */

/* Keeps V from being fused into a following add (GCC contracts mul+sub). */
INLINE TARGET __m256 opaque(__m256 v)
{
	__asm__("" : "+x"(v));
	return v;
}

INLINE TARGET float hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

/* x * id rounded to nearest, ties to even, as int32: what ggml's x86
 * quantize_row_q8_0/q8_1 compute (_mm256_round_ps(_MM_ROUND_NEAREST)). */
INLINE TARGET __m256i round_even(__m256 x, __m256 id)
{
	return _mm256_cvtps_epi32(opaque(_mm256_mul_ps(x, id)));
}

INLINE TARGET __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
	__m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
	__m256i v = _mm256_packs_epi16(ab, cd);
	return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static TARGET void quantize_q8_01(const float *x, uint8_t *y, int64_t nb, int with_s)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	size_t bsize = with_s ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);

	for (int64_t b = 0; b < nb; b++, x += QK, y += bsize) {
		__m256 v[4], amax;
		for (int k = 0; k < 4; k++)
			v[k] = _mm256_loadu_ps(x + 8 * k);
		amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
				     _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
		float m = hmax8(amax), d = m / 127;
		float id = m != 0 ? 127.0f / m : 0.0f;
		__m256 idv = _mm256_set1_ps(id);
		__m256i q[4];
		for (int k = 0; k < 4; k++)
			q[k] = round_even(v[k], idv);
		qt_f16 dh = (qt_f16)_cvtss_sh(d, 0);
		int8_t *qs = (int8_t *)(y + (with_s ? 4 : 2));
		memcpy(y, &dh, 2);
		_mm256_storeu_si256((__m256i *)qs, pack32(q[0], q[1], q[2], q[3]));
		if (with_s) {
			__m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
			int sum = hsum_i32(s4);
			qt_f16 sh = (qt_f16)_cvtss_sh((float)sum * d, 0);
			memcpy(y + 2, &sh, 2);
		}
	}
}

static TARGET void quantize_q8_k(const float *x, struct block_q8_k *y, int64_t nb)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);

	for (int64_t b = 0; b < nb; b++, x += QK_K) {
		__m256 amax = _mm256_setzero_ps();
		for (int k = 0; k < QK_K / 8; k++)
			amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
		float am = hmax8(amax);
		if (!am) {
			memset(&y[b], 0, sizeof y[b]);
			continue;
		}
		/* the first element of that magnitude gives the sign, as in ggml */
		int first = 0;
		for (int k = 0; k < QK_K / 8; k++) {
			__m256 eq = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)), _mm256_set1_ps(am), _CMP_EQ_OQ);
			int mask = _mm256_movemask_ps(eq);
			if (mask) {
				first = 8 * k + __builtin_ctz((unsigned)mask);
				break;
			}
		}
		float iscale = -127.f / x[first];
		__m256 is = _mm256_set1_ps(iscale);
		for (int k = 0; k < QK_K / 32; k++) {
			__m256i q[4];
			for (int u = 0; u < 4; u++) /* nearest, ties to even: the reference's nearest_int */
				q[u] = _mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + 32 * k + 8 * u)));
			__m256i p = pack32(q[0], q[1], q[2], q[3]); /* saturation is MIN(127, v) */
			_mm256_storeu_si256((__m256i *)(y[b].qs + 32 * k), p);
			__m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
			/* s16: int32 sums of 4; lanes 0..3 are elements 0..15, 4..7 are 16..31 */
			__m128i h = _mm_add_epi32(_mm256_castsi256_si128(s16), _mm_srli_si128(_mm256_castsi256_si128(s16), 8));
			__m128i hh = _mm_add_epi32(_mm256_extracti128_si256(s16, 1), _mm_srli_si128(_mm256_extracti128_si256(s16, 1), 8));
			y[b].bsums[2 * k] = (int16_t)(_mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 1));
			y[b].bsums[2 * k + 1] = (int16_t)(_mm_cvtsi128_si32(hh) + _mm_extract_epi32(hh, 1));
		}
		y[b].d = 1 / iscale;
	}
}

static TARGET void quantize_f16(const float *x, qt_f16 *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
	for (; i < n; i++)
		y[i] = (qt_f16)_cvtss_sh(x[i], 0);
}

static TARGET void quantize_bf16(const float *x, qt_bf16 *y, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
						 _mm256_set1_epi32(0x7f800000));
		__m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
		__m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
		__m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
		r = _mm256_blendv_epi8(r, qn, nan);
		__m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
		_mm_storeu_si128((__m128i *)(y + i), p);
	}
	for (; i < n; i++)
		y[i] = qt_f32_to_bf16(x[i]);
}

TARGET int quant_avx2_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
	int64_t i = 0;

	if (type == QT_F16) {
		const qt_f16 *x = src;
		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
		for (; i < n; i++)
			dst[i] = qt_f16_to_f32(x[i]);
		return 0;
	}
	if (type == QT_Q8_0) { /* each int8 times its block's scale, as the scalar code */
		const struct block_q8_0 *x = src;
		for (int64_t b = 0; b < n / QK; b++) {
			__m256 d = _mm256_set1_ps(h2f(x[b].d));
			for (int k = 0; k < QK; k += 8) {
				__m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[b].qs + k)));
				_mm256_storeu_ps(dst + b * QK + k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
			}
		}
		return 0;
	}
	if (type == QT_BF16) {
		const qt_bf16 *x = src;
		for (; i + 8 <= n; i += 8) {
			__m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
			_mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
		}
		for (; i < n; i++)
			dst[i] = qt_bf16_to_f32(x[i]);
		return 0;
	}
	return -ENOTSUP;
}

int quant_avx2_quantize_row(uint32_t vec_type, const float *src, void *dst, int64_t n)
{
	switch (vec_type) {
	case QT_Q8_0:
		quantize_q8_01(src, dst, n / QK, 0);
		return 0;
	case QT_Q8_1:
		quantize_q8_01(src, dst, n / QK, 1);
		return 0;
	case QT_Q8_K:
		quantize_q8_k(src, dst, n / QK_K);
		return 0;
	case QT_F16:
		quantize_f16(src, dst, n);
		return 0;
	case QT_BF16:
		quantize_bf16(src, dst, n);
		return 0;
	default:
		return -ENOTSUP;
	}
}

int quant_avx2_gemm(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
		    const void *a, size_t lda, int na, float *c, size_t ldc)
{
	switch (type) {
	case QT_Q4_0:
	case QT_Q4_1:
	case QT_Q8_0:
		return gemm_q32(type, n, w, ldw, nw, a, lda, na, c, ldc, 0);
	case QT_F32:
	case QT_F16:
	case QT_BF16:
		return gemm_float(type, n, w, ldw, nw, a, lda, na, c, ldc);
	case QT_Q4_K:
	case QT_Q5_K:
	case QT_Q6_K:
		return gemm_kq(type, n, w, ldw, nw, a, lda, na, c, ldc);
	default:
		return -ENOTSUP;
	}
}

/* ---- packed weights (quant_pack) ---- */

size_t quant_avx2_packed_row_bytes(uint32_t type, int64_t n)
{
	if ((type != QT_Q4_0 && type != QT_Q4_1 && type != QT_Q8_0) || n <= 0 || n % QK)
		return 0;
	int nb = (int)(n / QK), g16 = nb / 16, gt = (nb - 16 * g16 + 3) / 4;
	return ALIGN64((size_t)(2 * g16) * q32_pk_octet(type) + (size_t)gt * q32_pk_quad(type));
}

void quant_avx2_pack_row(uint32_t type, int64_t n, const void *src, void *dst)
{
	struct q32_shape s;
	const uint8_t *row = src;

	q32_shape_init(&s, type, n, 1);
	s.packed = 1;
	memset(dst, 0, quant_avx2_packed_row_bytes(type, n));
	for (int b = 0; b < s.nb; b++) {
		const uint8_t *blk = row + (size_t)b * s.bytes;
		uint8_t *out = dst;
		size_t od, om, oq;
		q32_block_at(&s, b, &od, &om, &oq);
		memcpy(out + od, blk, 2);
		if (type == QT_Q4_1)
			memcpy(out + om, blk + 2, 2);
		if (type == QT_Q8_0) {
			memcpy(out + oq, blk + 2, 16);
			memcpy(out + oq + 32, blk + 18, 16);
		} else {
			memcpy(out + oq, blk + (type == QT_Q4_1 ? 4 : 2), 16);
		}
	}
}

int quant_avx2_gemm_packed(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
			   const void *a, size_t lda, int na, float *c, size_t ldc)
{
	if (!quant_avx2_packed_row_bytes(type, n))
		return -ENOTSUP;
	return gemm_q32(type, n, w, ldw, nw, a, lda, na, c, ldc, 1);
}
