/* quant_impl.h - what quant.c and its SIMD back ends (quant_avx2.c,
 * quant_avx512.c) share; not part of the kernels' interface (quant.h).
 * Calls go one way: quant.c -> the back ends -> quant_common.c (the type
 * table, fp16/bf16 conversion, the scratch below), never back up.
 *
 * Each back end returns 0 when it did the work, -ENOTSUP for a type it has
 * no kernel for and -ENOMEM when it could not get scratch memory; the caller
 * then falls back to the next slower path, which gives the same bits.
 */
#ifndef LLMD_QUANT_IMPL_H
#define LLMD_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

int quant_avx2_gemm(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
		    const void *a, size_t lda, int na, float *c, size_t ldc);
/* VNNI: nonzero to use vpdpbusd; the K-quants need it and more than four
 * activation rows (-ENOTSUP otherwise). */
int quant_avx512_gemm(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
		      const void *a, size_t lda, int na, float *c, size_t ldc, int vnni);
int quant_avx2_quantize_row(uint32_t vec_type, const float *src, void *dst, int64_t n);
/* F16, BF16 and Q8_0 rows to float with F16C / AVX2. */
int quant_avx2_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The packed layout of quant_avx2.c: bytes of one packed row of N elements
 * of TYPE (0 when it has none for TYPE), one row packed, and the gemm over
 * packed rows (W, LDW: packed rows). */
size_t quant_avx2_packed_row_bytes(uint32_t type, int64_t n);
void quant_avx2_pack_row(uint32_t type, int64_t n, const void *src, void *dst);
int quant_avx2_gemm_packed(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
			   const void *a, size_t lda, int na, float *c, size_t ldc);
/* Activation rows in the layout the packed kernels read: bytes of one
 * (0 when TYPE has no packed layout), NA rows packed (DST 64-byte
 * aligned, rows that many bytes apart), and the gemm over packed rows
 * that reads them. */
size_t quant_avx2_acts_row_bytes(uint32_t type, int64_t n);
void quant_avx2_pack_acts(uint32_t type, int64_t n, const void *a, size_t lda, int na, void *dst);
void quant_avx2_gemm_packed_acts(uint32_t type, int64_t n, const void *w, size_t ldw, int nw,
				 const void *as, int na, float *c, size_t ldc);

/* The table behind qtype_get (quant_common.c), indexed by type; an entry
 * without a name is no type.  quant.c's scalar loops read it directly.
 * Needs quant.h included first. */
extern const struct qtype_info qtype_table[QT_COUNT];

/* Per-thread scratch of at least BYTES (quant_common.c), or NULL. */
void *quant_scratch(size_t bytes);

#endif
