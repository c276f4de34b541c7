/* quant.h - weight and activation block formats and their dot products.
 *
 * Block layouts are ggml's (the ones GGUF files carry), numbered with ggml's
 * type ids.  A matrix product W·x with quantized W first quantizes each
 * activation row once into the weight type's "vec type" (Q8_0 for Q4_0/Q8_0,
 * Q8_1 for Q4_1, Q8_K for the K-quants, F16 for F16, BF16 for BF16, F32 for
 * F32) and then takes integer dot products block by block, exactly as
 * llama.cpp does, so results match its arithmetic.
 *
 * Every kernel has a portable C path; AVX2, AVX-512 and AVX-512 VNNI paths are
 * chosen at run time from CPUID (quant_isa_best) and can be forced for tests
 * (quant_set_isa).  All functions are pure and thread-safe; quant_set_isa is
 * meant to be called before any worker runs.
 */
#ifndef LLMD_QUANT_H
#define LLMD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum qtype {
	QT_F32 = 0,
	QT_F16 = 1,
	QT_Q4_0 = 2,
	QT_Q4_1 = 3,
	QT_Q5_0 = 6,
	QT_Q5_1 = 7,
	QT_Q8_0 = 8,
	QT_Q8_1 = 9,
	QT_Q4_K = 12,
	QT_Q5_K = 13,
	QT_Q6_K = 14,
	QT_Q8_K = 15,
	QT_BF16 = 30,
	QT_COUNT = 40, /* bound on ids looked up in the table */
};

#define QK 32     /* elements per block of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q8_1 */
#define QK_K 256  /* elements per super-block of the K-quants and Q8_K */

typedef uint16_t qt_f16;  /* IEEE half, raw bits */
typedef uint16_t qt_bf16; /* bfloat16, raw bits */

struct block_q4_0 { qt_f16 d; uint8_t qs[QK / 2]; };            /* 18 bytes */
struct block_q4_1 { qt_f16 d, m; uint8_t qs[QK / 2]; };         /* 20 bytes */
/* Q5: element e's low four bits in qs as Q4's, its fifth in bit e of qh
 * (little-endian); Q5_0 is that minus 16, times d. */
struct block_q5_0 { qt_f16 d; uint8_t qh[4]; uint8_t qs[QK / 2]; }; /* 22 bytes */
struct block_q5_1 { qt_f16 d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; }; /* 24 bytes */
struct block_q8_0 { qt_f16 d; int8_t qs[QK]; };                 /* 34 bytes */
struct block_q8_1 { qt_f16 d, s; int8_t qs[QK]; };              /* 36 bytes; s = d * sum(qs) */
struct block_q4_k { qt_f16 d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; }; /* 144 */
struct block_q5_k { qt_f16 d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8];
		    uint8_t qs[QK_K / 2]; };                     /* 176 */
struct block_q6_k { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16];
		    qt_f16 d; };                                 /* 210 */
struct block_q8_k { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; }; /* 292 */

struct qtype_info {
	const char *name;   /* "Q4_1" */
	uint32_t blck;      /* elements per block */
	uint32_t bytes;     /* bytes per block */
	uint32_t vec_type;  /* activation format its dot product takes */
	int weight_ok;      /* 1 if supported as a matmul weight / embedding */
};

/* Info for a ggml type id, or NULL when the id is unknown or unsupported. */
const struct qtype_info *qtype_get(uint32_t type);

/* Bytes of a row of N elements (N must be a multiple of the block size;
 * returns 0 otherwise or for an unknown type). */
size_t qtype_row_bytes(uint32_t type, int64_t n);

float qt_f16_to_f32(qt_f16 h);
qt_f16 qt_f32_to_f16(float f);   /* round to nearest even, as F16C */
float qt_bf16_to_f32(qt_bf16 h);
qt_bf16 qt_f32_to_bf16(float f); /* round to nearest even, as ggml */

/* Dequantizes N elements (a multiple of the block size) of TYPE. */
void quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Quantizes N floats into activation format VEC_TYPE (Q8_0, Q8_1, Q8_K, F16,
 * BF16 or F32 = copy), bit-identical to ggml's quantize_row_*. */
void quant_quantize_row(uint32_t vec_type, const float *src, void *dst, int64_t n);

/* The tile kernel every matmul is built from:
 *   c[j * ldc + i] = dot(W row i, A row j)   for i < nw, j < na
 * W rows are weight rows of TYPE (row i at w + i * ldw bytes), A rows are
 * activation rows already in qtype_get(TYPE)->vec_type (row j at a + j * lda
 * bytes), N elements each.  Each W block is loaded once for all NA rows.
 * The per-element arithmetic of c[j*ldc+i] does not depend on NW or NA
 * (batch invariance). */
void quant_gemm(uint32_t type, int64_t n,
		const void *w, size_t ldw, int nw,
		const void *a, size_t lda, int na,
		float *c, size_t ldc);

/* ---- packed weights ----
 *
 * Some kernels read a matrix faster from a layout of their own than from
 * the file's blocks (AVX2's 32-element blocks: one block per lane of every
 * code vector, the scales apart; about the file's size).  A packed matrix
 * holds that copy (owned) and the original rows (borrowed); every path
 * through it gives quant_gemm's bits on the original.  AVX2's quant_gemm
 * on those types packs the rows it is given a strip at a time for every
 * call: for a few activation rows (decode) that is several times slower
 * than a packed copy, so model weights should have one.
 */
struct quant_packed;

/* Packs NW rows of TYPE (N elements each, LDW bytes apart at W) for the ISA
 * in use; W must outlive the result.  Returns 0, -ENOTSUP when that ISA has
 * no packed layout for TYPE (quant_gemm on W is as fast then) or -ENOMEM. */
int quant_pack(uint32_t type, int64_t n, const void *w, size_t ldw, int nw, struct quant_packed **ret);
/* quant_pack in two steps, so that rows can be packed in parallel: the
 * allocation (same returns), then rows [R0, R0 + NR), each exactly once
 * before the first quant_gemm_packed (distinct rows: any threads). */
int quant_pack_new(uint32_t type, int64_t n, const void *w, size_t ldw, int nw, struct quant_packed **ret);
void quant_pack_rows(struct quant_packed *p, int r0, int nr);
/* NULL-safe. */
void quant_packed_free(struct quant_packed *p);
/* quant_gemm over rows [R0, R0 + NW) of P, with the same results. */
void quant_gemm_packed(const struct quant_packed *p, int r0, int nw,
		       const void *a, size_t lda, int na, float *c, size_t ldc);
/* The activations in the layout P's kernels read, made once for every
 * quant_gemm_packed_acts over P's rows (quant_gemm_packed makes it anew
 * each call: 5-9% of the instructions of a decode task of 64 KiB of
 * weights).  Bytes for NA rows, each quant_packed_acts_bytes(P, 1) after
 * the last; 0 when the ISA in use has no such layout for P (then call
 * quant_gemm_packed).  Matrices of one type and row length share it. */
size_t quant_packed_acts_bytes(const struct quant_packed *p, int na);
/* NA rows of P's vec type (LDA bytes apart at A) into DST (64-byte
 * aligned); rows are independent, so threads may pack rows apart. */
void quant_packed_pack_acts(const struct quant_packed *p, const void *a, size_t lda, int na, void *dst);
/* quant_gemm_packed over rows [R0, R0 + NW) of P against NA rows ACTS
 * packed as above, with the same results. */
void quant_gemm_packed_acts(const struct quant_packed *p, int r0, int nw, const void *acts, int na, float *c,
			    size_t ldc);

enum quant_isa {
	QUANT_ISA_SCALAR = 0,
	QUANT_ISA_AVX2 = 1,
	QUANT_ISA_AVX512 = 2,     /* AVX-512 F/BW/VL */
	QUANT_ISA_AVX512VNNI = 3, /* plus VNNI */
};

/* Best ISA this CPU supports (CPUID). */
enum quant_isa quant_isa_best(void);
/* Forces an ISA (clamped to what the CPU supports); returns the one in use. */
enum quant_isa quant_set_isa(enum quant_isa isa);
enum quant_isa quant_get_isa(void);
const char *quant_isa_name(enum quant_isa isa);

#ifdef __cplusplus
}
#endif

#endif
