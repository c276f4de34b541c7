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

/* hsum16's last steps for four rows at once, the same additions: S8[j]
 * is row j's lo + hi; its sum goes to C[j * LDC]. */
INLINE TARGET void hsum8x4(const __m256 s8[4], float *c, size_t ldc)
{
	/* [s4 of row 0 | of row 1], [row 2 | row 3]: lanes l and 4 + l */
	__m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(s8[0], s8[1], 0x20), _mm256_permute2f128_ps(s8[0], s8[1], 0x31));
	__m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(s8[2], s8[3], 0x20), _mm256_permute2f128_ps(s8[2], s8[3], 0x31));
	/* s2: lanes 0 + 2 and 1 + 3 of each: [r0 r0 r2 r2 | r1 r1 r3 r3] */
	__m256 w = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xee));
	/* s2's two lanes: [r0 r2 . . | r1 r3 . .] */
	__m256 f = _mm256_add_ps(_mm256_shuffle_ps(w, w, 0x88), _mm256_shuffle_ps(w, w, 0xdd));
	__m128 f02 = _mm256_castps256_ps128(f), f13 = _mm256_extractf128_ps(f, 1);
	_mm_store_ss(c, f02);
	_mm_store_ss(c + 2 * ldc, _mm_movehdup_ps(f02));
	_mm_store_ss(c + ldc, f13);
	_mm_store_ss(c + 3 * ldc, _mm_movehdup_ps(f13));
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

/* ---- 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ----
 *
 * quant.c's 16 float lanes are two ymm here: lanes 0..7 ("half" 0) and
 * 8..15 (half 1).  A block's 32 codes are eight 4-byte pieces: its "lo"
 * pieces t = 0..3 hold elements 4t..4t+3, its "hi" pieces elements
 * 16+4t..16+4t+3 (a Q4 byte's two nibbles are elements e and 16+e).
 *
 * One kernel: a weight row against up to four activation rows at a time,
 * its codes straight from the packed layout (below) into registers, where
 * dword lane l of every piece vector of a half belongs to block 8h+l of a
 * group of 16.  A lane's integer sum is then its block's whole dot product
 * with no horizontal adds, and Q4 sums stay in int16 over a whole block
 * (16 products of at most 15 * 127 stay below 2^15).  More activation rows
 * run in fours over a strip of weight rows (up to 128 KiB, from L2) while
 * the four stay in L1.  Weights not packed are packed 16 rows at a time
 * into scratch.
 *
 * Activation rows (each part 64-byte aligned):
 *   codes  g16 x 512 bytes for the whole groups of 16 blocks: piece vector
 *          t (64 bytes; t = 0..7, lo then hi) holds block l's piece at
 *          byte 4l; then gt x 128 bytes for the tail's groups ("quads") of
 *          four blocks: lo then hi, byte 4*(4t+k)+u = piece t of block k,
 *          lane 4t+k as in quant.c's tail.  A last quad of one or two
 *          blocks ("short") holds lo then hi, at the same places, in 32
 *          bytes each: dword 4(t%2) + 2(t/2) + k = piece t of block k, so
 *          one vector holds both halves' lanes (half t/2, lanes 4(t%2)+k).
 *          Signed bytes.
 *   d      f32 d of every block in order, zero-padded to nd (multiple of 16).
 *   init   Q4_0: the int32 a lane starts from, -8 times the activations it
 *          covers (the nibbles' offset): 16 per group (one per block), 16
 *          per quad (4t+k; a short quad's 8 in its dword order).
 *   s      Q4_1: s per block, f32, zero-padded to nd.
 * Blocks past the end of the row are zero and add exact zeros.
 */

/* ---- the packed weight layout (quant_pack) ----
 *
 * The file's bytes reordered; a row is at most one block's codes and
 * three scales bigger than the file's (576 elements: 368 bytes for Q4_1's
 * 360).  Per group of 16 blocks and half h, the four lo piece vectors t
 * (32 bytes: piece t of blocks 8h..8h+7; a Q4 byte holds lo piece t in its
 * low nibbles and hi piece t in its high ones, as the file's do; Q8_0 has
 * a hi vector after each lo one).  A tail quad holds per half h its
 * pieces t = 2h, 2h+1 of blocks k = 0..3 (byte 16(t-2h) + 4k + u; Q8_0:
 * lo then hi); a last quad of one or two blocks only blocks 0 and 1, in
 * half the bytes, in one vector (Q8_0: lo, then hi) of the activations'
 * short-quad order (dword 4(t%2) + 2(t/2) + k).  Then the fp16 d of every
 * block, then (Q4_1) every fp16 m, both zero-padded to whole quads.  Rows
 * follow each other unpadded.
 */

/* Tiles of weight rows ahead that the kernel prefetches: decoding streams
 * every weight once from DRAM. */
#define PF_TILES 2
/* What a type's kernel does: byte codes (Q8_0; Q5's, packed as codes
 * minus 16) or nibbles (Q4's); an m term, with Q8_1 activations (Q4_1,
 * Q5_1); a start value per lane from the activations' sums (Q4_0: -8 times
 * them for its nibbles' offset, Q5_1: +16 times them for the 16 its packed
 * codes lack). */
#define Q32_BYTES(type) ((type) == QT_Q8_0 || (type) == QT_Q5_0 || (type) == QT_Q5_1)
#define Q32_M(type) ((type) == QT_Q4_1 || (type) == QT_Q5_1)
#define Q32_INIT(type) ((type) == QT_Q4_0 || (type) == QT_Q5_1)

/* Activation rows per kernel pass; weight rows per strip of file rows
 * packed into scratch; bytes of packed weight rows per strip. */
#define Q32_NA 4
#define Q32_STRIP 16
#define Q32_STRIP_BYTES (128 * 1024)

struct q32_shape {
	uint32_t type;   /* QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1 or QT_Q8_0 */
	int bytes;       /* bytes per file block: 18, 20 or 34 */
	int cb;          /* code bytes per block: 16 (Q4) or 32 */
	int nb;          /* blocks per row */
	int g16;         /* whole groups of 16 blocks */
	int gt;          /* quads in the tail */
	int half;        /* 1: the last quad holds one or two blocks */
	int nbp;         /* blocks the packed row has room for */
	int nd;          /* entries in the activations' d and s (multiple of 16) */
	size_t pk_d;     /* packed row: byte offset of the fp16 d */
	size_t pk_m;     /* packed row: byte offset of the fp16 m (Q4_1) */
	size_t prow;     /* bytes of one packed row */
	size_t tail_off; /* activations: byte offset of the tail's codes */
	size_t d_off;    /* activations: byte offset of d */
	size_t init_off; /* activations: byte offset of init (Q4_0) */
	size_t tinit;    /* int32 index in init where the tail's quads start */
	size_t as_off;   /* activations: byte offset of s (Q4_1) */
	size_t arow;     /* bytes of one packed activation row */
};

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

INLINE void q32_shape_init(struct q32_shape *s, uint32_t type, int64_t n)
{
	s->type = type;
	s->bytes = (int)qtype_get(type)->bytes;
	s->cb = Q32_BYTES(type) ? 32 : 16;
	s->nb = (int)(n / QK);
	s->g16 = s->nb / 16;
	int rest = s->nb - 16 * s->g16;
	s->gt = (rest + 3) / 4;
	s->half = rest % 4 == 1 || rest % 4 == 2;
	s->nbp = 16 * s->g16 + 4 * s->gt - 2 * s->half;
	s->nd = (16 * s->g16 + 4 * s->gt + 15) / 16 * 16;
	s->pk_d = (size_t)s->nbp * s->cb;
	s->pk_m = s->pk_d + (size_t)(16 * s->g16 + 4 * s->gt) * 2;
	s->prow = s->pk_m + (Q32_M(type) ? (size_t)(16 * s->g16 + 4 * s->gt) * 2 : 0);
	s->tail_off = (size_t)s->g16 * 512;
	s->d_off = ALIGN64(s->tail_off + (size_t)s->gt * 128);
	s->init_off = ALIGN64(s->d_off + (size_t)s->nd * 4);
	s->tinit = (size_t)s->g16 * 16;
	size_t init = Q32_INIT(type) ? (s->tinit + (size_t)s->gt * 16) * 4 : 0;
	s->as_off = ALIGN64(s->init_off + init);
	s->arow = ALIGN64(s->as_off + (Q32_M(type) ? (size_t)s->nd * 4 : 0));
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
	const int q81 = Q32_M(s->type), bytes = q81 ? 36 : 34, qoff = q81 ? 4 : 2;
	const int32_t mult = s->type == QT_Q4_0 ? -8 : 16; /* init per activation sum */
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
				if (Q32_INIT(s->type))
					_mm_storeu_si128((__m128i *)p[k],
							 _mm_madd_epi16(_mm_add_epi16(_mm_maddubs_epi16(ones8, lo[k]),
										      _mm_maddubs_epi16(ones8, hi[k])), ones16));
			}
			int full = q4 < 4 * s->g16, g = q4 / 4, qt = q4 - 4 * s->g16;
			int short_q = !full && s->half && qt == s->gt - 1;
			uint8_t *c = full ? out + (size_t)g * 512 + 16 * (q4 % 4) : out + s->tail_off + (size_t)qt * 128;
			size_t stride = full ? 64 : 16;
			if (short_q) {
				/* piece t of blocks 0, 1 to dwords 4(t%2) + 2(t/2) */
				uint8_t tmp[128];
				q32_store_pieces(tmp, 16, lo[0], lo[1], lo[2], lo[3]);
				q32_store_pieces(tmp + 64, 16, hi[0], hi[1], hi[2], hi[3]);
				memset(c, 0, 128);
				for (int t = 0; t < 4; t++) {
					memcpy(c + 16 * (t % 2) + 8 * (t / 2), tmp + 16 * t, 8);
					memcpy(c + 64 + 16 * (t % 2) + 8 * (t / 2), tmp + 64 + 16 * t, 8);
				}
			} else {
				q32_store_pieces(c, stride, lo[0], lo[1], lo[2], lo[3]);
				q32_store_pieces(c + (full ? 256 : 64), stride, hi[0], hi[1], hi[2], hi[3]);
			}
			if (!Q32_INIT(s->type))
				continue;
			for (int k = 0; k < 4; k++) {
				if (full) {
					init[(size_t)g * 16 + 4 * (q4 % 4) + k] = mult * (p[k][0] + p[k][1] + p[k][2] + p[k][3]);
					continue;
				}
				for (int t = 0; t < 4; t++) {
					/* a short quad's 8 in its dword order, then 8 unused */
					size_t at = !short_q ? 4 * (size_t)t + k
						: k < 2 ? 4 * (size_t)(t % 2) + 2 * (size_t)(t / 2) + k : 8 + 4 * (size_t)(k - 2) + t;
					init[s->tinit + (size_t)qt * 16 + at] = k < 2 || !short_q ? mult * p[k][t] : 0;
				}
			}
		}
		for (int b = 4 * nq; b < s->nd; b++) {
			d[b] = 0;
			if (q81)
				sp[b] = 0;
		}
	}
}

/* Four blocks' 16-byte halves R0..R3 as pieces: P[t] = piece t of blocks
 * 0..3, four bytes each. */
INLINE TARGET void q32_pieces(__m128i r0, __m128i r1, __m128i r2, __m128i r3, __m128i p[4])
{
	__m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
	__m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
	p[0] = _mm_unpacklo_epi64(t0, t1);
	p[1] = _mm_unpackhi_epi64(t0, t1);
	p[2] = _mm_unpacklo_epi64(t2, t3);
	p[3] = _mm_unpackhi_epi64(t2, t3);
}

/* A Q5 block's codes minus 16 as signed bytes: elements 0..15 in LO,
 * 16..31 in HI (its qs at QOFF, qh before them). */
static void q5_codes(const uint8_t *blk, int qoff, __m128i *lo, __m128i *hi)
{
	int8_t c[QK];
	uint32_t qh;

	memcpy(&qh, blk + qoff - 4, 4);
	for (int e = 0; e < QK / 2; e++) {
		c[e] = (int8_t)(((blk[qoff + e] & 0xf) | (int)(qh >> e & 1) << 4) - 16);
		c[e + 16] = (int8_t)(((blk[qoff + e] >> 4) | (int)(qh >> (e + 16) & 1) << 4) - 16);
	}
	*lo = _mm_loadu_si128((const __m128i *)c);
	*hi = _mm_loadu_si128((const __m128i *)(c + 16));
}

/* One file row into the packed layout at DST (S->prow bytes), four blocks
 * at a time. */
static TARGET void q32_pack_row(const struct q32_shape *s, const uint8_t *src, uint8_t *dst)
{
	const int q8 = Q32_BYTES(s->type), qoff = s->type == QT_Q4_1 ? 4 : 2;
	const size_t grp = 16 * (size_t)s->cb, quad = 4 * (size_t)s->cb;

	memset(dst, 0, s->prow);
	for (int q4 = 0; q4 < 4 * s->g16 + s->gt; q4++) {
		__m128i lo[4], hi[4], pl[4], ph[4];
		for (int k = 0; k < 4; k++) {
			int b = 4 * q4 + k;
			lo[k] = hi[k] = _mm_setzero_si128();
			if (b >= s->nb)
				continue;
			const uint8_t *blk = src + (size_t)b * s->bytes;
			if (s->type == QT_Q5_0 || s->type == QT_Q5_1) {
				q5_codes(blk, s->type == QT_Q5_1 ? 8 : 6, &lo[k], &hi[k]);
			} else {
				lo[k] = _mm_loadu_si128((const __m128i *)(blk + qoff));
				if (q8)
					hi[k] = _mm_loadu_si128((const __m128i *)(blk + qoff + 16));
			}
			memcpy(dst + s->pk_d + 2 * (size_t)b, blk, 2);
			if (Q32_M(s->type))
				memcpy(dst + s->pk_m + 2 * (size_t)b, blk + 2, 2);
		}
		q32_pieces(lo[0], lo[1], lo[2], lo[3], pl);
		q32_pieces(hi[0], hi[1], hi[2], hi[3], ph);
		/* where lo piece t goes (Q8_0's hi piece follows at + his) */
		for (int t = 0; t < 4; t++) {
			uint8_t *o;
			size_t his;
			int qt = q4 - 4 * s->g16;
			if (qt < 0) {
				o = dst + (size_t)(q4 / 4) * grp + (size_t)(q4 % 4 / 2) * (grp / 2) + (size_t)t * (q8 ? 64 : 32) +
				    16 * (q4 % 2);
				his = 32;
			} else if (!(s->half && qt == s->gt - 1)) {
				o = dst + (size_t)s->g16 * grp + (size_t)qt * quad + (size_t)(t / 2) * (quad / 2) + 16 * (t % 2);
				his = 32;
			} else { /* a short quad: blocks 0 and 1, the activations' order */
				o = dst + (size_t)s->g16 * grp + (size_t)qt * quad + 16 * (t % 2) + 8 * (t / 2);
				_mm_storel_epi64((__m128i *)o, pl[t]);
				if (q8)
					_mm_storel_epi64((__m128i *)(o + 32), ph[t]);
				continue;
			}
			_mm_storeu_si128((__m128i *)o, pl[t]);
			if (q8)
				_mm_storeu_si128((__m128i *)(o + his), ph[t]);
		}
	}
}

#define LD(p) _mm256_load_si256((const __m256i *)(p))
#define LDU(p) _mm256_loadu_si256((const __m256i *)(p))
/* Keeps a running sum in a register as it is: without it GCC reassociates
 * the sums into trees whose leaves spill to the stack. */
#define KEEP(v) __asm__("" : "+x"(v))

/* Q8_0's signed codes: |w| * (a with w's sign), exact while a > -128
 * (quantize_row keeps it so); one int16 holds only two such products. */
INLINE TARGET __m256i q8_idot(__m256i p, __m256i w, __m256i a)
{
	return _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)),
						      _mm256_set1_epi16(1)));
}

/* A Q4 vector of 32 code bytes into its lo (low nibbles) and hi codes. */
INLINE TARGET void q4_split(__m256i q, __m256i *lo, __m256i *hi)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	*lo = _mm256_and_si256(q, m4);
	*hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}

/* The lo and hi codes at P: 32 code bytes (Q8_0: lo, then hi 32 bytes on). */
INLINE TARGET void q32_codes(const uint32_t type, const uint8_t *p, __m256i *lo, __m256i *hi)
{
	if (Q32_BYTES(type)) {
		*lo = LDU(p);
		*hi = LDU(p + 32);
	} else {
		q4_split(LDU(p), lo, hi);
	}
}

/* The integer lane sums of one tail quad's half H against activation
 * pieces at AP (lo) and AP + 64 (hi), from INIT. */
INLINE TARGET __m256i q32_quad_dot(const uint32_t type, __m256i init, __m256i lo, __m256i hi, const uint8_t *ap)
{
	if (Q32_BYTES(type))
		return q8_idot(q8_idot(init, lo, LD(ap)), hi, LD(ap + 64));
	__m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, LD(ap)), _mm256_maddubs_epi16(hi, LD(ap + 64)));
	return _mm256_add_epi32(init, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

/* Weight rows W (packed, LDW apart) against NA activation rows AS, MR
 * weight rows at a time (NW a multiple of MR): C[j * LDC + i]. */
INLINE TARGET void q32_body(const struct q32_shape *s, const uint32_t type, const uint8_t *w, size_t ldw, int nw,
			    const uint8_t *as, const int na, const int mr, float *c, size_t ldc)
{
	const __m256i ones = _mm256_set1_epi16(1);
	const size_t grp = Q32_BYTES(type) ? 512 : 256, quad = grp / 4;
	const uint8_t *arows[Q32_NA]; /* the activation rows, computed once */

	_Pragma("GCC unroll 4")
	for (int j = 0; j < na; j++)
		arows[j] = as + (size_t)j * s->arow;

	for (int i = 0; i < nw; i += mr) {
		const uint8_t *row = w + (size_t)i * ldw;
		__m256 fin[Q32_NA][Q32_NA][2]; /* [weight row][activation row][half] */

		/* each row fetches ahead the same row of a later tile, a part as
		 * it reads one (a prefetch never faults: none is checked) */
		const size_t ahead = (size_t)mr * ldw * PF_TILES;
		for (int h = 0; h < 2; h++) {
			__m256 acc[Q32_NA][Q32_NA];
			_Pragma("GCC unroll 4")
			for (int r = 0; r < mr; r++)
				_Pragma("GCC unroll 4")
				for (int j = 0; j < na; j++)
					acc[r][j] = _mm256_setzero_ps();
			for (int g = 0; g < s->g16; g++) {
				const size_t wo = (size_t)g * grp + (size_t)h * (grp / 2), ao = (size_t)g * 512 + 32 * h;
				__m256i sum[Q32_NA][Q32_NA];
				_Pragma("GCC unroll 4")
				for (int r = 0; r < mr; r++) {
					if (h == 0)
						_Pragma("GCC unroll 8")
						for (size_t o = 0; o < grp; o += 64)
							_mm_prefetch((const char *)row + (size_t)r * ldw + wo + ahead + o, _MM_HINT_T0);
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++)
						sum[r][j] = _mm256_setzero_si256();
				}
				_Pragma("GCC unroll 4")
				for (int t = 0; t < 4; t++) {
					_Pragma("GCC unroll 4")
					for (int r = 0; r < mr; r++) {
						const uint8_t *p = row + (size_t)r * ldw + wo;
						__m256i lo, hi;
						q32_codes(type, p + (Q32_BYTES(type) ? 64 : 32) * t, &lo, &hi);
						_Pragma("GCC unroll 4")
						for (int j = 0; j < na; j++) {
							const uint8_t *ap = arows[j] + ao;
							if (Q32_BYTES(type)) {
								sum[r][j] = q8_idot(q8_idot(sum[r][j], lo, LD(ap + 64 * t)), hi,
										    LD(ap + 64 * t + 256));
							} else {
								sum[r][j] = _mm256_add_epi16(sum[r][j], _mm256_maddubs_epi16(lo, LD(ap + 64 * t)));
								sum[r][j] = _mm256_add_epi16(sum[r][j],
											     _mm256_maddubs_epi16(hi, LD(ap + 64 * t + 256)));
							}
							KEEP(sum[r][j]);
						}
					}
				}
				_Pragma("GCC unroll 4")
				for (int r = 0; r < mr; r++) {
					const uint8_t *dq = row + (size_t)r * ldw + s->pk_d;
					__m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dq + 2 * (16 * (size_t)g + 8 * h))));
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++) {
						const uint8_t *ar = arows[j];
						__m256i isum = sum[r][j];
						if (!Q32_BYTES(type))
							isum = _mm256_madd_epi16(isum, ones);
						if (Q32_INIT(type))
							isum = _mm256_add_epi32(LD((const int32_t *)(ar + s->init_off) + 16 * g + 8 * h), isum);
						__m256 dd = _mm256_mul_ps(dw, _mm256_load_ps((const float *)(ar + s->d_off) + 16 * g + 8 * h));
						acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[r][j]);
					}
				}
			}
			if (h == 0)
				for (int r = 0; r < mr; r++)
					for (size_t o = (size_t)s->g16 * grp; o < ldw; o += 64)
						_mm_prefetch((const char *)row + (size_t)r * ldw + ahead + o, _MM_HINT_T0);
			for (int q = 0; q < s->gt - s->half; q++) {
				const int b0 = 16 * s->g16 + 4 * q;
				_Pragma("GCC unroll 4")
				for (int r = 0; r < mr; r++) {
					const uint8_t *pq = row + (size_t)r * ldw + (size_t)s->g16 * grp + (size_t)q * quad;
					__m256i lo, hi;
					q32_codes(type, pq + (size_t)h * (quad / 2), &lo, &hi);
					const uint8_t *dq = row + (size_t)r * ldw + s->pk_d;
					__m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(dq + 2 * (size_t)b0)));
					__m256 dw = _mm256_set_m128(d4, d4);
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++) {
						const uint8_t *ar = arows[j];
						__m256i init = Q32_INIT(type)
							? LD((const int32_t *)(ar + s->init_off) + s->tinit + 16 * (size_t)q + 8 * h)
							: _mm256_setzero_si256();
						__m256i p = q32_quad_dot(type, init, lo, hi, ar + s->tail_off + (size_t)q * 128 + 32 * h);
						__m256 dd = _mm256_mul_ps(dw, _mm256_broadcast_ps((const __m128 *)((const float *)(ar + s->d_off) + b0)));
						acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dd, acc[r][j]);
					}
				}
			}
			_Pragma("GCC unroll 4")
			for (int r = 0; r < mr; r++)
				_Pragma("GCC unroll 4")
				for (int j = 0; j < na; j++)
					fin[r][j][h] = acc[r][j];
		}
		/* A short quad last, both halves from one vector: its lanes
		 * 4(t%2) + k of half t/2 hold dwords 0, 1, 4, 5 (half 0) and 2, 3,
		 * 6, 7 (half 1); the rest add 0 * 0, as a full quad's empty
		 * blocks do. */
		if (s->half) {
			const int q = s->gt - 1, b0 = 16 * s->g16 + 4 * q;
			const __m256 keep = _mm256_castsi256_ps(_mm256_setr_epi32(-1, -1, 0, 0, -1, -1, 0, 0));
			_Pragma("GCC unroll 4")
			for (int r = 0; r < mr; r++) {
				const uint8_t *pr = row + (size_t)r * ldw;
				__m256i lo, hi;
				q32_codes(type, pr + (size_t)s->g16 * grp + (size_t)q * quad, &lo, &hi);
				uint32_t d2;
				memcpy(&d2, pr + s->pk_d + 2 * (size_t)b0, 4);
				__m256 dw = _mm256_castpd_ps(_mm256_broadcastsd_pd(
					_mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128((int)d2)))));
				_Pragma("GCC unroll 4")
				for (int j = 0; j < na; j++) {
					const uint8_t *ar = arows[j];
					__m256i init = Q32_INIT(type) ? LD((const int32_t *)(ar + s->init_off) + s->tinit + 16 * (size_t)q)
								      : _mm256_setzero_si256();
					__m256i p = q32_quad_dot(type, init, lo, hi, ar + s->tail_off + (size_t)q * 128);
					__m256 da = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)((const float *)(ar + s->d_off) + b0)));
					__m256 dd = _mm256_and_ps(_mm256_mul_ps(dw, da), keep), f = _mm256_cvtepi32_ps(p);
					fin[r][j][0] = _mm256_fmadd_ps(_mm256_and_ps(f, keep), dd, fin[r][j][0]);
					fin[r][j][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_srli_si256(_mm256_castps_si256(f), 8)),
								       dd, fin[r][j][1]);
				}
			}
		}
		_Pragma("GCC unroll 4")
		for (int r = 0; r < mr; r++) {
			const uint8_t *mq = row + (size_t)r * ldw + s->pk_m;
			/* m_w * s_a of block b into lane b % 16, in block order: each
			 * weight vector once for every activation row */
			__m256 m0[Q32_NA], m1[Q32_NA];
			if (Q32_M(type)) {
				_Pragma("GCC unroll 4")
				for (int j = 0; j < na; j++)
					m0[j] = m1[j] = _mm256_setzero_ps();
				for (int g = 0; g < s->g16; g++) {
					__m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mq + 32 * (size_t)g)));
					__m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mq + 32 * (size_t)g + 16)));
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++) {
						const float *sa = (const float *)(arows[j] + s->as_off);
						m0[j] = _mm256_fmadd_ps(w0, _mm256_load_ps(sa + 16 * g), m0[j]);
						m1[j] = _mm256_fmadd_ps(w1, _mm256_load_ps(sa + 16 * g + 8), m1[j]);
					}
				}
				for (int q = 0; q < s->gt; q++) {
					const int b0 = 16 * s->g16 + 4 * q;
					/* lanes 4q..4q+3 of the 16: the rest multiply zero */
					__m256 mw = _mm256_zextps128_ps256(
						_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(mq + 2 * (size_t)b0))));
					if (q % 2)
						mw = _mm256_permute2f128_ps(mw, mw, 0x08);
					_Pragma("GCC unroll 4")
					for (int j = 0; j < na; j++) {
						const float *sa = (const float *)(arows[j] + s->as_off);
						if (q < 2)
							m0[j] = _mm256_fmadd_ps(mw, _mm256_load_ps(sa + 16 * s->g16), m0[j]);
						else
							m1[j] = _mm256_fmadd_ps(mw, _mm256_load_ps(sa + 16 * s->g16 + 8), m1[j]);
					}
				}
			}
			__m256 s8[Q32_NA];
			_Pragma("GCC unroll 4")
			for (int j = 0; j < na; j++) {
				__m256 lo = fin[r][j][0], hi = fin[r][j][1];
				if (Q32_M(type)) {
					lo = _mm256_add_ps(lo, m0[j]);
					hi = _mm256_add_ps(hi, m1[j]);
				}
				if (na == 4)
					s8[j] = _mm256_add_ps(lo, hi);
				else
					c[(size_t)j * ldc + i + r] = hsum16(lo, hi);
			}
			if (na == 4)
				hsum8x4(s8, c + i + r, ldc);
		}
	}
}

#undef LD
#undef LDU

/* The kernel once per type and tile shape (MR weight rows by NA
 * activation rows), so that every branch on them folds away: in decode up
 * to four weight rows share each activation load, two activation rows go
 * two by two, three or four against one weight row at a time. */
INLINE TARGET void q32_run(const struct q32_shape *s, const uint32_t type, const uint8_t *w, size_t ldw, int nw,
			   const uint8_t *as, int na, float *c, size_t ldc)
{
	int i4 = 0;

	switch (na) {
	case 1:
		/* measured: longer rows stream from DRAM slower in 2- and 4-row
		 * tiles (SmolLM2: 368-byte rows in fours, Q8_0's 616 in twos,
		 * 1536 wide rows alone) */
		if (ldw <= 512) {
			i4 = nw & ~3;
			q32_body(s, type, w, ldw, i4, as, 1, 4, c, ldc);
		} else if (ldw <= 768) {
			i4 = nw & ~1;
			q32_body(s, type, w, ldw, i4, as, 1, 2, c, ldc);
		} else {
			q32_body(s, type, w, ldw, nw, as, 1, 1, c, ldc);
			return;
		}
		break;
	case 2:
		i4 = nw & ~1;
		q32_body(s, type, w, ldw, i4, as, 2, 2, c, ldc);
		break;
	case 3:
		q32_body(s, type, w, ldw, nw, as, 3, 1, c, ldc);
		return;
	default:
		q32_body(s, type, w, ldw, nw, as, 4, 1, c, ldc);
		return;
	}
	if (i4 < nw) /* the last rows one at a time */
		switch (na) {
		case 1: q32_body(s, type, w + (size_t)i4 * ldw, ldw, nw - i4, as, 1, 1, c + i4, ldc); break;
		default: q32_body(s, type, w + (size_t)i4 * ldw, ldw, nw - i4, as, 2, 1, c + i4, ldc); break;
		}
}

/* Row lengths, in blocks, whose kernels are compiled for their exact shape:
 * SmolLM2-135M's 576 and 1536 elements, SmolLM2-360M's 960.  With its loop
 * bounds constants a short row's few loops (its groups, its tail quads,
 * its m terms) unroll into straight code; measured on one Zen 3 core, a
 * Q4_1 matmul of 32 activation rows ran 1.7 times as fast at 576 (about
 * 25 -> 43 GMAC/s) and 1.25 times at 1536 as in the general kernel, which
 * every other length takes, with the same bits. */
#define Q32_FIXED_NB(X) X(18) X(30) X(48)

/* q32_run for TYPE, with S a constant where its length is in Q32_FIXED_NB
 * (the common types only: each adds a copy of every tile shape). */
INLINE TARGET void q32_typed(const struct q32_shape *s, const uint32_t type, const uint8_t *w, size_t ldw, int nw,
			     const uint8_t *as, int na, float *c, size_t ldc)
{
	if (type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q8_0)
		switch (s->nb) {
#define Q32_CASE(NB)                                                    \
		case NB: {                                              \
			struct q32_shape k;                             \
			q32_shape_init(&k, type, (int64_t)(NB) * QK);   \
			q32_run(&k, type, w, ldw, nw, as, na, c, ldc);  \
			return;                                         \
		}
			Q32_FIXED_NB(Q32_CASE)
#undef Q32_CASE
		}
	q32_run(s, type, w, ldw, nw, as, na, c, ldc);
}

/* NW packed weight rows W (LDW apart) against NA <= Q32_NA activation
 * rows: q32_typed once per type, its type a constant in each. */
static TARGET void q32_rows(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw, const uint8_t *as,
			    int na, float *c, size_t ldc)
{
	switch (s->type) {
	case QT_Q4_0: q32_typed(s, QT_Q4_0, w, ldw, nw, as, na, c, ldc); break;
	case QT_Q4_1: q32_typed(s, QT_Q4_1, w, ldw, nw, as, na, c, ldc); break;
	case QT_Q5_0: q32_typed(s, QT_Q5_0, w, ldw, nw, as, na, c, ldc); break;
	case QT_Q5_1: q32_typed(s, QT_Q5_1, w, ldw, nw, as, na, c, ldc); break;
	default:      q32_typed(s, QT_Q8_0, w, ldw, nw, as, na, c, ldc); break;
	}
}

/* NW weight rows W (LDW apart; file rows when WS, packed a strip at a time
 * into WS, else packed) against NA activation rows AS in S's layout. */
static TARGET void q32_gemm(const struct q32_shape *s, const uint8_t *w, size_t ldw, int nw, const uint8_t *as,
			    int na, float *c, size_t ldc, uint8_t *ws)
{
	/* Up to four activation rows: one pass streams the weights.  More:
	 * a strip of weight rows at a time against every four of them, the
	 * four in L1 while the strip streams from L2 (a quarter of Zen 3's:
	 * measured, a prefill of 173 rows ran about 3% faster in strips of
	 * all a task's rows than in the 16 rows of a packed strip). */
	int strip = Q32_STRIP;
	if (!ws) {
		strip = na <= Q32_NA ? nw : (int)(Q32_STRIP_BYTES / ldw);
		if (strip < Q32_STRIP)
			strip = Q32_STRIP;
	}
	for (int i0 = 0; i0 < nw; i0 += strip) {
		int mr = nw - i0 < strip ? nw - i0 : strip;
		const uint8_t *wp = w + (size_t)i0 * ldw;
		size_t ldp = ldw;
		if (ws) {
			for (int r = 0; r < mr; r++)
				q32_pack_row(s, wp + (size_t)r * ldw, ws + (size_t)r * s->prow);
			wp = ws;
			ldp = s->prow;
		}
		for (int j0 = 0; j0 < na; j0 += Q32_NA)
			q32_rows(s, wp, ldp, mr, as + (size_t)j0 * s->arow, na - j0 < Q32_NA ? na - j0 : Q32_NA,
				 c + (size_t)j0 * ldc + i0, ldc);
	}
}

static TARGET int gemm_q32(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw,
			   const uint8_t *a, size_t lda, int na, float *c, size_t ldc, int packed)
{
	struct q32_shape s;

	q32_shape_init(&s, type, n);
	/* packed activations, then (file rows) a packed strip of weights */
	size_t abytes = (size_t)na * s.arow;
	uint8_t *as = quant_scratch(abytes + (packed ? 0 : Q32_STRIP * s.prow));
	if (!as)
		return -ENOMEM;
	q32_pack_acts(&s, a, lda, na, as);
	q32_gemm(&s, w, ldw, nw, as, na, c, ldc, packed ? NULL : as + abytes);
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

/* A super-block's scales: S32 (dword c: the scales of chunk c's two groups
 * of 16 as int16), OFF (per group: Q4/5_K its min, Q6_K -32 * its scale),
 * d and dmin (0 for Q6_K). */
INLINE TARGET void kq_scales(uint32_t type, const void *blk, __m256i *s32, __m256i *off, float *d, float *dmin)
{
	if (type == QT_Q6_K) {
		const struct block_q6_k *x = blk;
		*s32 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
		/* -32 * scale, the offset of the 6-bit codes, against bsums */
		*off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(*s32, 5));
		*d = h2f(x->d);
		*dmin = 0;
		return;
	}
	const struct block_q4_k *x4 = blk;
	const struct block_q5_k *x5 = blk;
	int five = type == QT_Q5_K;
	const uint8_t *scales = five ? x5->scales : x4->scales;
	/* the eight 6-bit scales and mins, unpacked 32 bits at a time */
	uint32_t t[3], sc[2], mn[2];
	memcpy(t, scales, 12);
	sc[0] = t[0] & 0x3f3f3f3f;
	sc[1] = (t[2] & 0x0f0f0f0f) | ((t[0] >> 6) & 0x03030303) << 4;
	mn[0] = t[1] & 0x3f3f3f3f;
	mn[1] = ((t[2] >> 4) & 0x0f0f0f0f) | ((t[1] >> 6) & 0x03030303) << 4;
	__m128i scb = _mm_set_epi32(0, 0, (int)sc[1], (int)sc[0]), mnb = _mm_set_epi32(0, 0, (int)mn[1], (int)mn[0]);
	__m256i d32 = _mm256_cvtepu8_epi32(scb);
	*s32 = _mm256_or_si256(d32, _mm256_slli_epi32(d32, 16)); /* a sub-block covers both groups */
	*off = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mnb, mnb));
	*d = h2f(five ? x5->d : x4->d);
	*dmin = h2f(five ? x5->dmin : x4->dmin);
}

/* Chunk C's scales from S32, its low group's in int16 lanes 0..7, its high
 * one's in 8..15: one byte shuffle of S32's half holding dword C, which
 * SHALF has in both lanes (kq_scale_halves). */
INLINE TARGET __m256i kq_chunk_scales(const __m256i shalf[2], int c)
{
	const int k = 4 * (c % 4);
	const __m256i pick = _mm256_setr_epi8(k, k + 1, k, k + 1, k, k + 1, k, k + 1, k, k + 1, k, k + 1, k, k + 1, k, k + 1,
					      k + 2, k + 3, k + 2, k + 3, k + 2, k + 3, k + 2, k + 3, k + 2, k + 3, k + 2, k + 3,
					      k + 2, k + 3, k + 2, k + 3);
	return _mm256_shuffle_epi8(shalf[c / 4], pick);
}

/* S32's low and high halves, each in both lanes. */
INLINE TARGET void kq_scale_halves(__m256i s32, __m256i shalf[2])
{
	shalf[0] = _mm256_permute2x128_si256(s32, s32, 0x00);
	shalf[1] = _mm256_permute2x128_si256(s32, s32, 0x11);
}

/* The sums of S's and O's int32 lanes (exact, in any order): lanes 0
 * and 1. */
INLINE TARGET __m128i hsum2_i32(__m256i s, __m256i o)
{
	__m256i t = _mm256_hadd_epi32(s, o); /* s01 s23 o01 o23 | s45 s67 o45 o67 */
	__m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
	return _mm_hadd_epi32(u, u);         /* S O S O */
}

/* The unsigned codes of chunks 2 P and 2 P + 1 (32 elements each) of a
 * super-block: Q4_K/Q5_K's P-th 32 bytes of nibbles (and QH's bits),
 * Q6_K's low nibbles and high bits. */
INLINE TARGET void kq_codes(uint32_t type, const void *blk, int p, __m256i *c0, __m256i *c1)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	if (type == QT_Q6_K) {
		/* chunk 4h + qtr: nibbles of ql (h, qtr) with two bits of qh (h) */
		const struct block_q6_k *x = blk;
		const __m256i m2 = _mm256_set1_epi8(3);
		const int h = p / 2;
		__m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
		for (int k = 0; k < 2; k++) {
			const int qtr = 2 * (p % 2) + k;
			__m256i ql = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (qtr % 2)));
			__m256i lo = qtr < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
			__m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * qtr), m2);
			*(k ? c1 : c0) = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
		}
		return;
	}
	const struct block_q4_k *x4 = blk;
	const struct block_q5_k *x5 = blk;
	const uint8_t *qs = type == QT_Q5_K ? x5->qs : x4->qs;
	__m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
	*c0 = _mm256_and_si256(v, m4);
	*c1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
	if (type == QT_Q5_K) {
		const __m256i one = _mm256_set1_epi8(1);
		__m256i qh = _mm256_loadu_si256((const __m256i *)x5->qh);
		*c0 = _mm256_or_si256(*c0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
		*c1 = _mm256_or_si256(*c1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
	}
}

static TARGET void kq_unpack(uint32_t type, const void *blk, struct kq_unpacked *u)
{
	__m256i s32, off;

	for (int p = 0; p < 4; p++) {
		__m256i c0, c1;
		if (type == QT_Q6_K)
			kq_codes(QT_Q6_K, blk, p, &c0, &c1);
		else if (type == QT_Q5_K)
			kq_codes(QT_Q5_K, blk, p, &c0, &c1);
		else
			kq_codes(QT_Q4_K, blk, p, &c0, &c1);
		_mm256_store_si256((__m256i *)(u->q + 64 * p), c0);
		_mm256_store_si256((__m256i *)(u->q + 64 * p + 32), c1);
	}
	kq_scales(type, blk, &s32, &off, &u->d, &u->dmin);
	_mm256_store_si256((__m256i *)u->off, off);
	__m256i shalf[2];
	kq_scale_halves(s32, shalf);
	_Pragma("GCC unroll 8")
	for (int c8 = 0; c8 < 8; c8++)
		u->scv[c8] = kq_chunk_scales(shalf, c8);
}

/* A super-block's float steps in each lane, for every K-quant path: ISUM
 * and IOFF a row's integer sums and min offsets, DA its activations' d,
 * ACC its accumulator, D and DMIN the weights'.  acc += isum * (d * da),
 * then (Q4_K/Q5_K) acc += -ioff * (dmin * da); Q6_K's offsets join isum. */
INLINE TARGET __m256 kq_finish(uint32_t type, float d, float dmin, __m256i isum, __m256i ioff, __m256 da,
			       __m256 acc)
{
	if (type == QT_Q6_K)
		return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(isum, ioff)),
				       _mm256_mul_ps(_mm256_set1_ps(d), da), acc);
	acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(d), da), acc);
	/* a sign flip: -0 stays -0 */
	__m256 noff = _mm256_xor_ps(_mm256_cvtepi32_ps(ioff), _mm256_set1_ps(-0.0f));
	return _mm256_fmadd_ps(noff, _mm256_mul_ps(_mm256_set1_ps(dmin), da), acc);
}

/* kq_finish for one row, from its unreduced sums SUM and OFF: its values
 * in lane 0 of vectors whose other lanes are zero (broadcasting each to
 * eight cost more than the float steps themselves). */
INLINE TARGET float kq_finish1(uint32_t type, float d, float dmin, __m256i sum, __m256i off, float da, float acc)
{
	__m128i so = hsum2_i32(sum, off); /* isum ioff . . */

	return _mm256_cvtss_f32(kq_finish(type, d, dmin, _mm256_zextsi128_si256(so),
					  _mm256_zextsi128_si256(_mm_srli_si128(so, 4)),
					  _mm256_zextps128_ps256(_mm_set_ss(da)), _mm256_zextps128_ps256(_mm_set_ss(acc))));
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
	return kq_finish1(type, u->d, u->dmin, sum, off, y->d, acc);
}

/* kq_step for one activation row straight from the weight block BLK: its
 * codes and scales stay in registers (for a few rows, unpacking a block to
 * memory first costs more than the products).  The same integer sums and
 * float steps, so the same bits. */
INLINE TARGET float kq_dot1(uint32_t type, const void *blk, const struct block_q8_k *y, float acc)
{
	__m256i s32, uoff, shalf[2], sum = _mm256_setzero_si256();
	float d, dmin;

	kq_scales(type, blk, &s32, &uoff, &d, &dmin);
	kq_scale_halves(s32, shalf);
	_Pragma("GCC unroll 4")
	for (int p = 0; p < 4; p++) {
		__m256i c0, c1;
		kq_codes(type, blk, p, &c0, &c1);
		__m256i a0 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p));
		__m256i a1 = _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p + 32));
		sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c0, a0), kq_chunk_scales(shalf, 2 * p)));
		sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c1, a1), kq_chunk_scales(shalf, 2 * p + 1)));
	}
	__m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), uoff);
	return kq_finish1(type, d, dmin, sum, off, y->d, acc);
}

/* Lane k: the sum of S[k]'s eight int32 lanes (exact, in any order). */
INLINE TARGET __m256i hsum8_i32(const __m256i s[8])
{
	__m256i t0 = _mm256_hadd_epi32(s[0], s[1]), t1 = _mm256_hadd_epi32(s[2], s[3]);
	__m256i t2 = _mm256_hadd_epi32(s[4], s[5]), t3 = _mm256_hadd_epi32(s[6], s[7]);
	__m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
	return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* NR (8 or 4) activation rows' block b, interleaved so one pointer reaches
 * all of it at constant offsets: chunk c8 of row k at 32 (NR c8 + k), row
 * k's bsums at KQ_BSUMS(NR) + 32 k, the NR d at KQ_D(NR); KQ_BYTES(NR) in
 * all, whole 32-byte vectors. */
#define KQ_BSUMS(nr) (256 * (nr))
#define KQ_D(nr) (288 * (nr))
#define KQ_BYTES(nr) ((292 * (size_t)(nr) + 31) & ~(size_t)31)

/* NR rows A (LDA apart), NSB blocks each, into DST. */
static TARGET void kq_pack(const uint8_t *a, size_t lda, int nr, int nsb, uint8_t *dst)
{
	for (int b = 0; b < nsb; b++, dst += KQ_BYTES(nr))
		for (int k = 0; k < nr; k++) {
			const struct block_q8_k *y = (const struct block_q8_k *)(a + (size_t)k * lda) + b;
			for (int c8 = 0; c8 < 8; c8++)
				_mm256_store_si256((__m256i *)(dst + 32 * (nr * c8 + k)),
						   _mm256_loadu_si256((const __m256i *)(y->qs + 32 * c8)));
			_mm256_store_si256((__m256i *)(dst + KQ_BSUMS(nr) + 32 * k),
					   _mm256_loadu_si256((const __m256i *)y->bsums));
			((float *)(dst + KQ_D(nr)))[k] = y->d;
		}
}

/* The integer sums of NR rows at P (kq_pack's layout) against U: each
 * chunk's codes and scales once for all of them. */
INLINE TARGET void kq_isums(const struct kq_unpacked *u, const uint8_t *p, const int nr, __m256i s[8])
{
	_Pragma("GCC unroll 8")
	for (int k = 0; k < nr; k++)
		s[k] = _mm256_setzero_si256();
	_Pragma("GCC unroll 8")
	for (int c8 = 0; c8 < 8; c8++) {
		__m256i q = _mm256_load_si256((const __m256i *)(u->q + 32 * c8)), sc = u->scv[c8];
		_Pragma("GCC unroll 8")
		for (int k = 0; k < nr; k++) {
			__m256i a = _mm256_load_si256((const __m256i *)(p + 32 * (nr * c8 + k)));
			s[k] = _mm256_add_epi32(s[k], _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), sc));
		}
	}
}

/* Their min offsets: bsums against U's per-group offsets. */
INLINE TARGET void kq_offs(const struct kq_unpacked *u, const uint8_t *p, const int nr, __m256i o[8])
{
	const __m256i uoff = _mm256_load_si256((const __m256i *)u->off);
	_Pragma("GCC unroll 8")
	for (int k = 0; k < nr; k++)
		o[k] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(p + KQ_BSUMS(nr) + 32 * k)), uoff);
}

/* kq_step for eight activation rows at once (P: their block, kq_pack's
 * layout), their accumulators the lanes of ACC; the integer sums'
 * horizontal adds are shared. */
INLINE TARGET __m256 kq_step8(uint32_t type, const struct kq_unpacked *u, const uint8_t *p, __m256 acc)
{
	__m256i s[8];

	kq_isums(u, p, 8, s);
	__m256i isum = hsum8_i32(s);
	kq_offs(u, p, 8, s);
	return kq_finish(type, u->d, u->dmin, isum, hsum8_i32(s), _mm256_load_ps((const float *)(p + KQ_D(8))), acc);
}

/* Lane k: the sum of S[k]'s eight int32 lanes, for four rows. */
INLINE TARGET __m128i hsum4_i32(const __m256i s[4])
{
	__m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
	return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* kq_step8 for four rows (a group of four after the eights), in the low
 * four lanes. */
INLINE TARGET __m128 kq_step4(uint32_t type, const struct kq_unpacked *u, const uint8_t *p, __m128 acc)
{
	__m256i s[8];

	kq_isums(u, p, 4, s);
	__m128i isum = hsum4_i32(s);
	kq_offs(u, p, 4, s);
	__m128i ioff = hsum4_i32(s);
	__m256 da = _mm256_zextps128_ps256(_mm_load_ps((const float *)(p + KQ_D(4))));
	return _mm256_castps256_ps128(kq_finish(type, u->d, u->dmin, _mm256_zextsi128_si256(isum),
						_mm256_zextsi128_si256(ioff), da, _mm256_zextps128_ps256(acc)));
}

/* Weight rows W (LDW apart, NSB blocks of BBYTES each) against one or two
 * activation rows A (decode), their products straight from the blocks:
 * kq_dot1 in a loop of its own per row, the type a constant in each. */
INLINE TARGET void kq_rows_direct(uint32_t type, int nsb, size_t bbytes, const uint8_t *w, size_t ldw, int nw,
				  const uint8_t *a, size_t lda, int na, float *c, size_t ldc)
{
	for (int i = 0; i < nw; i++)
		for (int j = 0; j < na; j++) {
			const uint8_t *row = w + (size_t)i * ldw;
			const struct block_q8_k *y = (const struct block_q8_k *)(a + (size_t)j * lda);
			float acc = 0;
			for (int b = 0; b < nsb; b++)
				acc = kq_dot1(type, row + (size_t)b * bbytes, y + b, acc);
			c[(size_t)j * ldc + i] = acc;
		}
}

#define KQ_JCHUNK 64
/* Activation rows up to which each takes its products straight from the
 * weight block (kq_dot1) rather than from an unpacked copy. */
#define KQ_DIRECT 2

/* Each weight super-block unpacked once for up to KQ_JCHUNK activation
 * rows: eight at a time from an interleaved copy (kq_pack, kq_step8),
 * then four, the last few one by one from A; one or two rows (decode) read
 * it directly instead (kq_dot1). */
static TARGET int gemm_kq(uint32_t type, int64_t n, const uint8_t *w, size_t ldw, int nw,
			  const uint8_t *a, size_t lda, int na, float *c, size_t ldc)
{
	struct kq_unpacked u __attribute__((aligned(32)));
	float acc[KQ_JCHUNK] __attribute__((aligned(32)));
	int nsb = (int)(n / QK_K), na8 = na & ~7, na4 = na - na8 >= 4 ? na8 + 4 : na8;
	size_t bbytes = qtype_get(type)->bytes, g8 = (size_t)nsb * KQ_BYTES(8), g4 = (size_t)nsb * KQ_BYTES(4);
	uint8_t *ap = NULL, *ap4 = NULL;

	if (na <= KQ_DIRECT) {
		switch (type) {
		case QT_Q4_K: kq_rows_direct(QT_Q4_K, nsb, bbytes, w, ldw, nw, a, lda, na, c, ldc); break;
		case QT_Q5_K: kq_rows_direct(QT_Q5_K, nsb, bbytes, w, ldw, nw, a, lda, na, c, ldc); break;
		default:      kq_rows_direct(QT_Q6_K, nsb, bbytes, w, ldw, nw, a, lda, na, c, ldc); break;
		}
		return 0;
	}
	if (na4 > 0) {
		if (!(ap = quant_scratch((size_t)(na8 / 8) * g8 + g4)))
			return -ENOMEM;
		for (int j = 0; j < na8; j += 8)
			kq_pack(a + (size_t)j * lda, lda, 8, nsb, ap + (size_t)(j / 8) * g8);
		ap4 = ap + (size_t)(na8 / 8) * g8;
		if (na4 > na8)
			kq_pack(a + (size_t)na8 * lda, lda, 4, nsb, ap4);
	}
	for (int j0 = 0; j0 < na; j0 += KQ_JCHUNK) {
		/* j0 <= na8, both multiples of 8, so the four after the eights
		 * lie in one chunk */
		int nj = na - j0 < KQ_JCHUNK ? na - j0 : KQ_JCHUNK;
		int nj8 = na8 - j0 < nj ? na8 - j0 : nj, nj4 = na4 - j0 < nj ? na4 - j0 : nj;
		for (int i = 0; i < nw; i++) {
			const uint8_t *row = w + (size_t)i * ldw;
			for (int j = 0; j < nj; j++)
				acc[j] = 0;
			for (int b = 0; b < nsb; b++) {
				kq_unpack(type, row + b * bbytes, &u);
				for (int j = 0; j < nj8; j += 8) {
					const uint8_t *p = ap + (size_t)((j0 + j) / 8) * g8 + (size_t)b * KQ_BYTES(8);
					__m256 v = _mm256_load_ps(acc + j);
					v = type == QT_Q6_K ? kq_step8(QT_Q6_K, &u, p, v) : kq_step8(QT_Q4_K, &u, p, v);
					_mm256_store_ps(acc + j, v);
				}
				if (nj4 > nj8) {
					const uint8_t *p = ap4 + (size_t)b * KQ_BYTES(4);
					__m128 v = _mm_load_ps(acc + nj8);
					v = type == QT_Q6_K ? kq_step4(QT_Q6_K, &u, p, v) : kq_step4(QT_Q4_K, &u, p, v);
					_mm_store_ps(acc + nj8, v);
				}
				for (int j = nj4; j < nj; j++) {
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
	case QT_Q5_0:
	case QT_Q5_1:
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
	struct q32_shape s;

	if ((type != QT_Q4_0 && type != QT_Q4_1 && type != QT_Q5_0 && type != QT_Q5_1 && type != QT_Q8_0) ||
	    n <= 0 || n % QK)
		return 0;
	q32_shape_init(&s, type, n);
	return s.prow;
}

void quant_avx2_pack_row(uint32_t type, int64_t n, const void *src, void *dst)
{
	struct q32_shape s;

	q32_shape_init(&s, type, n);
	q32_pack_row(&s, src, dst);
}

int quant_avx2_gemm_packed(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
			   const void *a, size_t lda, int na, float *c, size_t ldc)
{
	if (!quant_avx2_packed_row_bytes(type, n))
		return -ENOTSUP;
	return gemm_q32(type, n, w, ldw, nw, a, lda, na, c, ldc, 1);
}

size_t quant_avx2_acts_row_bytes(uint32_t type, int64_t n)
{
	struct q32_shape s;

	if (!quant_avx2_packed_row_bytes(type, n))
		return 0;
	q32_shape_init(&s, type, n);
	return s.arow;
}

void quant_avx2_pack_acts(uint32_t type, int64_t n, const void *a, size_t lda, int na, void *dst)
{
	struct q32_shape s;

	q32_shape_init(&s, type, n);
	q32_pack_acts(&s, a, lda, na, dst);
}

void quant_avx2_gemm_packed_acts(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
				 const void *as, int na, float *c, size_t ldc)
{
	struct q32_shape s;

	q32_shape_init(&s, type, n);
	q32_gemm(&s, w, ldw, nw, as, na, c, ldc, NULL);
}
