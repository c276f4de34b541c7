/* matmul.cuh - what matmul.cu's kernel families share: the launch's
 * weights (struct mm_group) and a warp's rows of them, the weight blocks'
 * layouts and loads, and each family's launcher (matmul_dp4a.cu,
 * matmul_mma.cu, matmul_wide.cu), which matmul.cu's cuda_matmul_q_group
 * calls with its plan.  No kernel lives here.
 */
#ifndef LLMD_CUDA_MATMUL_CUH
#define LLMD_CUDA_MATMUL_CUH

#include "cuda_compat.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "quant.h"
}
#include "cuda_mma.h"
#include "cuda_ops.h"
#include "quant_q8.cuh"

#define MM_FULL 0xffffffffu
#define MM_WARPS 4      /* warps (weight rows) per block of the matmul kernels */
#define MM_TB 4         /* activation rows a warp keeps in registers at once */
#define MMA_ROWS 16     /* weight rows per warp of the tensor-core kernels (mma's M) */
#define MMQ_WARPS 4     /* warps per block of the Q8_0/Q8_1 quantizer */
#define MMQK_THREADS Q8K_THREADS /* one Q8_K super-block per block of its quantizer */

/* The weights of one launch: a matmul group's q, k and v (or gate and up)
 * share their activations and take one grid, weight k its blocks
 * first[k] .. first[k + 1] - 1.  Unused entries start at INT_MAX. */
struct mm_group {
	const uint8_t *w[CUDA_MM_GROUP];
	float *out[CUDA_MM_GROUP];
	size_t row_bytes[CUDA_MM_GROUP];
	int n_out[CUDA_MM_GROUP];
	int first[CUDA_MM_GROUP + 1];
	bool q6[CUDA_MM_GROUP]; /* matmul_kq_wide_kernel: member k is Q6_K (else Q4_K) */
};

/* ---- device helpers ---- */

/* 4 bytes from a 2-byte aligned address (ggml blocks are only that aligned). */
static __device__ __forceinline__ int ld_i32(const uint8_t *p)
{
	const uint16_t *q = reinterpret_cast<const uint16_t *>(p);
	return (int)((uint32_t)__ldg(&q[0]) | (uint32_t)__ldg(&q[1]) << 16);
}

static __device__ __forceinline__ float ld_f16(const uint8_t *p)
{
	return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const uint16_t *>(p))));
}

/* ---- the weights' blocks ---- */

template <int TYPE> struct q32_traits;
template <> struct q32_traits<QT_Q4_0> { enum { bytes = 18, qs = 2 }; };
template <> struct q32_traits<QT_Q4_1> { enum { bytes = 20, qs = 4 }; };
template <> struct q32_traits<QT_Q8_0> { enum { bytes = 34, qs = 2 }; };

/* The 4 weight codes (as dp4a bytes) at element offset 16 * H + 4 * K of
 * block BLK: Q8_0 stores them in order, Q4_0/Q4_1 hold element j in the low
 * nibble of qs[j] and element j + 16 in its high nibble. */
template <int TYPE>
static __device__ __forceinline__ int w_codes(const uint8_t *blk, int h, int k)
{
	const uint8_t *qs = blk + q32_traits<TYPE>::qs;
	if (TYPE == QT_Q8_0)
		return ld_i32(qs + 16 * h + 4 * k);
	return (ld_i32(qs + 4 * k) >> (4 * h)) & 0x0f0f0f0f;
}

/* The integer dot of those 4 codes with activations A (4 int8 as an int);
 * Q4_0's -8 offset is taken out exactly through the sum of A. */
template <int TYPE>
static __device__ __forceinline__ int dot4(int w, int a)
{
	int s = __dp4a(w, a, 0);
	if (TYPE == QT_Q4_0)
		s -= 8 * __dp4a(0x01010101, a, 0);
	return s;
}

template <int TYPE> struct k_traits;
template <> struct k_traits<QT_Q4_K> { enum { bytes = 144 }; };
template <> struct k_traits<QT_Q5_K> { enum { bytes = 176 }; };
template <> struct k_traits<QT_Q6_K> { enum { bytes = 210 }; };

/* The 8 six-bit scales and mins of a Q4_K/Q5_K super-block from its
 * scales[12] as words S0..S2: SC[0] holds sub-blocks 0..3's scales as
 * bytes, SC[1] 4..7's; MN likewise. */
static __device__ __forceinline__ void k4_scales_packed(unsigned s0, unsigned s1, unsigned s2, unsigned sc[2],
	unsigned mn[2])
{
	sc[0] = s0 & 0x3f3f3f3fu;
	mn[0] = s1 & 0x3f3f3f3fu;
	sc[1] = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
	mn[1] = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
}

/* Q6_K's codes of one A piece as signed bytes: c - 32 (c ^ 32 with bits
 * 6 and 7 set where c < 32), the same sum as k_sums' -32 * bsums. */
static __device__ __forceinline__ int q6_k_signed(int c)
{
	const unsigned u = (unsigned)c;
	return (int)(u ^ 0x20202020u ^ ((~u & 0x20202020u) * 6u));
}

/* ---- a warp's rows ---- */

/* A warp's rows of a group: the first, W (NULL past the end of its
 * weight), its output column OUT (N_OUT floats between rows of T), and
 * ROWS of them (at most the warp's share, fewer at the weight's end),
 * ROW_BYTES apart. */
struct mm_row {
	const uint8_t *w;
	float *out;
	int n_out;
	int rows;
	size_t row_bytes;
};

/* The member of G whose rows this block takes. */
static __device__ __forceinline__ int mm_member(const mm_group &g)
{
	/* first[] rises, so the last member this block reaches is its own */
	int k0 = 0;
UNROLL
	for (int k = 1; k < CUDA_MM_GROUP; k++)
		if ((int)blockIdx.x >= g.first[k])
			k0 = k;
	return k0;
}

/* This warp's rows of G, RPW per warp, found member by member with
 * constant indices, so the parameters stay in the constant bank rather
 * than a local copy.  KS 1: a block's MM_WARPS warps take a run of rows
 * each; KS > 1 (split-K): its KS warps all take the block's one run. */
static __device__ __forceinline__ mm_row mm_pick(const mm_group &g, int rpw, int ks = 1)
{
	const int k0 = mm_member(g);
	mm_row m = { NULL, NULL, 0, 0, 0 };
UNROLL
	for (int k = 0; k < CUDA_MM_GROUP; k++)
		if (k == k0) {
			const int run = ks > 1 ? (int)blockIdx.x - g.first[k]
					       : ((int)blockIdx.x - g.first[k]) * MM_WARPS + (int)threadIdx.x / 32;
			const int row = run * rpw;
			if (row < g.n_out[k]) {
				m.w = g.w[k] + (size_t)row * g.row_bytes[k];
				m.out = g.out[k] + row;
				m.n_out = g.n_out[k];
				m.rows = g.n_out[k] - row < rpw ? g.n_out[k] - row : rpw;
				m.row_bytes = g.row_bytes[k];
			}
		}
	return m;
}

/* Bytes of k_chain's buffer in a block of KS warps on one run (split-K),
 * NT tiles a pass: none without split-K. */
static __host__ __device__ __forceinline__ size_t k_part_bytes(int ks, int nt)
{
	return ks > 1 ? (size_t)2 * ks * nt * 4 * 32 * sizeof(float4) : 0;
}

/* ---- the families' launchers ---- */

/* One launch of a matmul kernel as cuda_matmul_q_group planned it. */
struct mm_launch {
	mm_group g;           /* the weights and their outputs */
	int nb;               /* blocks (32-element types) or super-blocks per row */
	const uint8_t *xq;    /* (T, stride) the quantized activations (the scratch) */
	size_t stride;        /* bytes between their rows */
	int T;                /* activation rows */
	int ks;               /* warps on one run of 16 weight rows (split-K); 1: none */
	unsigned blocks;      /* the grid */
	unsigned threads;     /* per block */
	size_t smem;          /* dynamic shared memory, bytes */
};

static inline int mm_launched(void)
{
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* The kernels' one signature: (group, blocks or super-blocks per row,
 * activations, their stride, T, split-K warps). */
typedef void (*mm_kernel)(const mm_group, int, const uint8_t *, size_t, int, int);

/* L on KERNEL as LC says: 0, or -EIO when the launch failed. */
static inline int mm_launch_kernel(mm_kernel kernel, const struct mm_launch *l, const struct cuda_launch *lc)
{
	LAUNCH_ON(lc, kernel, l->blocks, l->threads, l->smem, l->g, l->nb, l->xq, l->stride, l->T, l->ks);
	return mm_launched();
}

/* L on the dp4a kernel of TYPE, a warp a weight row (matmul_dp4a.cu). */
extern "C" int cuda_mm_dp4a(const struct mm_launch *l, uint32_t type, const struct cuda_launch *lc);
/* L on the tensor-core kernel of TYPE with NT (1, 2 or 4; the 32-element
 * types at most 2) tiles of 8 activation rows a pass; ALIGNED: every row
 * 16-byte aligned (matmul_mma.cu). */
extern "C" int cuda_mm_mma(const struct mm_launch *l, uint32_t type, int aligned, int nt,
	const struct cuda_launch *lc);
/* L on the wide kernel of TYPE (Q4_K or Q6_K; MIXED: the group's Q4_K and
 * Q6_K in one launch) with ROUNDS (1, 2, 4 or 8) of loads in flight
 * (matmul_wide.cu). */
extern "C" int cuda_mm_wide(const struct mm_launch *l, uint32_t type, int rounds, int mixed,
	const struct cuda_launch *lc);

#endif
