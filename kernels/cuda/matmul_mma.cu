/* matmul.cu - quantized matrix products for small T (decode): out (T, n_out)
 * = x (T, n_in) · W^T with W in its ggml block format.
 *
 * Two launches per call, as the CPU backend does it (kernels/cpu_backend.c,
 * kernels/quant.c), for up to CUDA_MM_GROUP weights sharing the input (a
 * layer's q, k and v; gate and up), whose rows one grid covers:
 *   1. the activation rows are quantized on the device into the weight
 *      type's vec type (Q8_0 for Q4_0/Q8_0, Q8_1 for Q4_1, Q8_K for the
 *      K-quants) with the CPU's arithmetic (id = 127 / amax, round half to
 *      even, f16 scales rounded to nearest even), into SCRATCH;
 *   2. one warp per weight row takes integer dot products (__dp4a) block by
 *      block and reproduces the CPU's float steps exactly (quant.c, "the one
 *      every path reproduces bit for bit"): for 32-element blocks, 16 float
 *      lanes fed by fma in block order (lane l of the warp and lane l + 16
 *      each take half of a block's integer dot and add them exactly with one
 *      shuffle), a ragged tail in groups of four, Q4_1's m*s lanes, then the
 *      same tree sum as hsum16; for the K-quants, one float accumulator over
 *      the super-blocks in order, each lane computing one super-block's
 *      integer sums and the warp broadcasting them in order.
 * Step 2 runs on the int8 tensor cores instead from T = 2 (the K-quants
 * from T = 1, after the wide kernels below; mma.sync m16n8k32,
 * cuda_mma.h): one warp per 16 weight rows takes each 32-element block's
 * (or sub-block's) integer dot for 8 activation rows at a time (from
 * T = 9 for 16 at once, the K-quants from T = 17 for 32, sharing the
 * weights' fragment), exactly the integers dp4a gives, and then the same
 * float steps per (weight row, activation row) pair.  At T = 1 it wastes
 * 7 of the mma's 8 columns, and still issues several times fewer
 * instructions per weight byte than the K-quants' dp4a kernel (a lane per
 * super-block, a serial broadcast); the 32-element types' dp4a kernel is
 * the faster at T = 1 (struct cuda_tuning's mma_min_t moves the threshold).
 * One row of Q4_K or Q6_K takes a warp per weight row reading 512 bytes a
 * load (matmul_q4k_wide_kernel, the tuning's mm_wide).
 * A launch with too few runs of 16 rows to keep the memory busy (an 8B
 * model's 4096-row matrices: 256 warps) gives each run a block of up to
 * 16 warps, within one wave of resident warps (split-K, mm_split): they
 * share its blocks and leave their float steps' operands in shared memory
 * for warp 0 to apply in order.
 * So the result equals the CPU backend's bit for bit on either path, and
 * each output depends only on its own weight row and activation row: not
 * on T, on the other rows or on the launch shape (batch invariance).
 *
 * The scratch rows are not ggml blocks but a device-friendly layout of the
 * same values: per activation row, the int8 codes (n_in bytes), then the
 * block scales as float (already rounded through f16 where the CPU stores
 * f16), then Q8_1's s (float) or Q8_K's bsums (int32, then int16 sums over
 * 32 codes; quant_q8.cuh).  Rows are 16-byte aligned.
 *
 * Large T (prefill) may go through dequantized fp16 weight tiles and
 * cublasGemmEx instead (cuda_backend.c, gemm_rows; rows.cu makes the tiles).
 */
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

/* ---- scratch layout ---- */

/* Bytes of one quantized activation row of N_IN elements for weight TYPE,
 * or 0 when the type is not supported here. */
static size_t mm_xq_stride(uint32_t type, int64_t n_in)
{
	uint32_t vec;
	switch (type) {
	case QT_Q4_0:
	case QT_Q8_0:
		vec = QT_Q8_0;
		break;
	case QT_Q4_1:
		vec = QT_Q8_1;
		break;
	case QT_Q4_K:
	case QT_Q5_K:
	case QT_Q6_K:
		vec = QT_Q8_K;
		break;
	default:
		return 0;
	}
	return (q8_row_bytes(vec, n_in) + 15) & ~(size_t)15;
}

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

/* ---- activation quantization: Q8_0 / Q8_1 ---- */

/* One warp per 32-element block of one row: lane i takes element i. */
static __global__ void quantize_q8_kernel(const float *__restrict__ x, int n_in, int T,
	int with_sum, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	const int nb = n_in / QK;
	const long long gw = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
	const int lane = threadIdx.x % 32;
	if (gw >= (long long)T * nb) /* whole warps only */
		return;
	const int t = (int)(gw / nb), b = (int)(gw % nb);
	q8_block_store(x[(size_t)t * n_in + (size_t)b * QK + lane], lane, b, nb, n_in, with_sum,
		       xq + (size_t)t * stride);
}

/* ---- activation quantization: Q8_K ---- */

/* One block of 256 threads per super-block: thread i takes element i. */
static __global__ void quantize_q8k_kernel(const float *__restrict__ x, int n_in,
	uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	__shared__ float s_ax[Q8K_THREADS / 32], s_v[Q8K_THREADS / 32];
	const int nsb = n_in / QK_K;
	const int t = blockIdx.x / nsb, b = blockIdx.x % nsb;

	q8k_block_store(x[(size_t)t * n_in + (size_t)b * QK_K + threadIdx.x], b, nsb, n_in,
			xq + (size_t)t * stride, s_ax, s_v);
}

/* ---- matmul: 32-element blocks (Q4_0, Q4_1, Q8_0) ---- */

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

/* One warp per weight row; lane l (< 16) and l + 16 hold quant.c's float
 * lane l.  Full groups of 16 blocks: block b goes to lane b % 16, lane
 * l + 16 taking elements 16..31.  Then the ragged blocks, block b feeding
 * lanes 4t + b % 4 with the partial over elements 4t..4t+3 (half 0) and
 * 16+4t..16+4t+3 (half 1).  Every loop bound is uniform over the warp, so
 * the shuffles always see all 32 lanes. */
template <int TYPE>
static __global__ void matmul_q32_kernel(const mm_group g, int nb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	const int l = lane % 16, h = lane / 16;
	const uint8_t *wrow = m.w;
	const int b16 = nb - nb % 16;
	const int n_in = nb * QK;
	const int bytes = q32_traits<TYPE>::bytes;

	for (int t0 = 0; t0 < T; t0 += MM_TB) {
		const int nt = T - t0 < MM_TB ? T - t0 : MM_TB;
		float acc[MM_TB], macc[MM_TB];
		const uint8_t *xr[MM_TB];
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			acc[j] = 0.0f;
			macc[j] = 0.0f;
			xr[j] = xq + (size_t)(t0 + (j < nt ? j : 0)) * stride;
		}

		for (int b = l; b < b16; b += 16) {
			const uint8_t *blk = wrow + (size_t)b * bytes;
			int wc[4];
UNROLL
			for (int k = 0; k < 4; k++)
				wc[k] = w_codes<TYPE>(blk, h, k);
			const float dw = ld_f16(blk);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt) /* uniform: nt is the same in every lane */
					break;
				const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK + 16 * h);
				int s = 0;
UNROLL
				for (int k = 0; k < 4; k++)
					s += dot4<TYPE>(wc[k], __ldg(&a[k]));
				s += __shfl_xor_sync(MM_FULL, s, 16);
				const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
				const float dd = dw * __ldg(&ds[b]);
				acc[j] = fmaf((float)s, dd, acc[j]);
				if (TYPE == QT_Q4_1)
					macc[j] = fmaf(ld_f16(blk + 2), __ldg(&ds[nb + b]), macc[j]);
			}
		}

		/* The ragged end: blocks b16 + 4k + r feed lane 4t + r. */
		const int r = l % 4, tq = l / 4;
		for (int k = 0; b16 + 4 * k < nb; k++) {
			const int b = b16 + 4 * k + r;
			const bool ok = b < nb;
			const uint8_t *blk = wrow + (size_t)(ok ? b : b16) * bytes;
			int wc;
			if (TYPE == QT_Q8_0)
				wc = ld_i32(blk + q32_traits<TYPE>::qs + 16 * h + 4 * tq);
			else
				wc = (ld_i32(blk + q32_traits<TYPE>::qs + 4 * tq) >> (4 * h)) & 0x0f0f0f0f;
			const float dw = ld_f16(blk);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const int *a = reinterpret_cast<const int *>(
					xr[j] + (size_t)(ok ? b : b16) * QK + 16 * h + 4 * tq);
				int s = dot4<TYPE>(wc, __ldg(a));
				s += __shfl_xor_sync(MM_FULL, s, 16);
				if (ok) {
					const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
					acc[j] = fmaf((float)s, dw * __ldg(&ds[b]), acc[j]);
				}
			}
		}

		/* Q4_1's m*s of the ragged blocks: block b16 + l goes to lane l. */
		if (TYPE == QT_Q4_1 && b16 + l < nb) {
			const uint8_t *blk = wrow + (size_t)(b16 + l) * bytes;
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
				macc[j] = fmaf(ld_f16(blk + 2), __ldg(&ds[nb + b16 + l]), macc[j]);
			}
		}

		/* hsum16: (a[l] + a[l+8]), then +4, +2, +1; float addition
		 * commutes, so the xor butterfly gives its bits in lane 0. */
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			float v = acc[j] + macc[j];
			for (int off = 8; off > 0; off /= 2)
				v += __shfl_xor_sync(MM_FULL, v, off);
			if (lane == 0)
				m.out[(size_t)(t0 + j) * m.n_out] = v;
		}
	}
}

/* ---- matmul: 32-element blocks on the tensor cores ----
 *
 * mma_s8_m16n8k32 (cuda_mma.h) takes one block's whole integer dot product
 * for 16 weight rows by 8 activation rows at once: its k = 32 is a block.
 * The float steps stay matmul_q32_kernel's, per (weight row, activation
 * row) pair: the sums are the same integers, so every output has the same
 * bits on either path, and the path may follow T without breaking batch
 * invariance.  A warp takes 16 weight rows and walks quant.c's 16 float
 * lanes one at a time, in the order hsum16's tree adds them (l = 0, 8, 4,
 * 12, 2, ...: four bits reversed), folding each finished lane into the
 * tree at once, so it keeps 6 floats per pair rather than 32. */

/* An A fragment's 4 codes of a Q4_0 block as signed bytes: nibble n is
 * n - 8 (n ^ 8 with bits 4..7 set where n < 8), the same integer sum as
 * dot4's -8 * sum(a). */
static __device__ __forceinline__ int q4_0_signed(int n)
{
	const unsigned u = (unsigned)n;
	return (int)(u ^ 0x08080808u ^ ((~u & 0x08080808u) * 0x1eu));
}

/* This lane's A fragment of block BLK0 (row g) and BLK1 (row g + 8):
 * elements 4q..4q+3 and 16+4q..16+4q+3 of each. */
template <int TYPE>
static __device__ __forceinline__ void mma_a_codes(const uint8_t *blk0, const uint8_t *blk1, int q, int a[4])
{
	a[0] = w_codes<TYPE>(blk0, 0, q);
	a[1] = w_codes<TYPE>(blk1, 0, q);
	a[2] = w_codes<TYPE>(blk0, 1, q);
	a[3] = w_codes<TYPE>(blk1, 1, q);
	if (TYPE == QT_Q4_0)
UNROLL
		for (int i = 0; i < 4; i++)
			a[i] = q4_0_signed(a[i]);
}

/* Block B of the lane's weight rows W0, W1 against every column tile:
 * ACC[tile][i] += its integer dot (piece PIECE only where >= 0: the
 * elements 4 * PIECE.. and 16 + 4 * PIECE.., a ragged block's share of one
 * lane) times the scales, as matmul_q32_kernel does; Q4_1's m * s into
 * MACC for whole blocks.  XB: the lane's B column of each tile; DA: the
 * scales of its D columns 2q, 2q + 1. */
template <int TYPE, int NT>
static __device__ __forceinline__ void mma_block(const uint8_t *w0, const uint8_t *w1, int b, int q, int piece,
	const uint8_t *const *xb, const float *const (*da)[2], int nb, float (*acc)[4], float (*macc)[4])
{
	const int bytes = q32_traits<TYPE>::bytes;
	const uint8_t *blk0 = w0 + (size_t)b * bytes, *blk1 = w1 + (size_t)b * bytes;
	int a[4];
	mma_a_codes<TYPE>(blk0, blk1, q, a);
	if (piece >= 0 && piece != q)
UNROLL
		for (int i = 0; i < 4; i++)
			a[i] = 0;
	const float dw0 = ld_f16(blk0), dw1 = ld_f16(blk1);
UNROLL
	for (int n = 0; n < NT; n++) {
		const int *x = reinterpret_cast<const int *>(xb[n] + (size_t)b * QK);
		const int bf[2] = { __ldg(&x[q]), __ldg(&x[4 + q]) };
		int d[4] = { 0, 0, 0, 0 };
		mma_s8_m16n8k32(d, a, bf);
		const float da0 = __ldg(&da[n][0][b]), da1 = __ldg(&da[n][1][b]);
		acc[n][0] = fmaf((float)d[0], dw0 * da0, acc[n][0]);
		acc[n][1] = fmaf((float)d[1], dw0 * da1, acc[n][1]);
		acc[n][2] = fmaf((float)d[2], dw1 * da0, acc[n][2]);
		acc[n][3] = fmaf((float)d[3], dw1 * da1, acc[n][3]);
		if (TYPE == QT_Q4_1 && piece < 0) {
			const float mw0 = ld_f16(blk0 + 2), mw1 = ld_f16(blk1 + 2);
			const float s0 = __ldg(&da[n][0][nb + b]), s1 = __ldg(&da[n][1][nb + b]);
			macc[n][0] = fmaf(mw0, s0, macc[n][0]);
			macc[n][1] = fmaf(mw0, s1, macc[n][1]);
			macc[n][2] = fmaf(mw1, s0, macc[n][2]);
			macc[n][3] = fmaf(mw1, s1, macc[n][3]);
		}
	}
}

/* Row R of a tensor-core warp's 16 weight rows: the weight's last one where
 * R is past its end (read, never stored). */
static __device__ __forceinline__ const uint8_t *mma_w_row(const mm_row &m, int r)
{
	return m.w + (size_t)(r < m.rows ? r : m.rows - 1) * m.row_bytes;
}

/* The activation rows lane 4g + q reads in a pass of NT tiles from row T0:
 * XB[n], tile n's B column g; XC[n][c], its D column 2q + c.  Rows past T
 * read row T - 1 (never stored). */
template <int NT>
static __device__ __forceinline__ void mma_x_rows(const uint8_t *xq, size_t stride, int T, int t0, int g, int q,
	const uint8_t **xb, const uint8_t *(*xc)[2])
{
UNROLL
	for (int n = 0; n < NT; n++) {
		const int tb = t0 + 8 * n + g, tc = t0 + 8 * n + 2 * q;
		xb[n] = xq + (size_t)(tb < T ? tb : T - 1) * stride;
UNROLL
		for (int c = 0; c < 2; c++)
			xc[n][c] = xq + (size_t)(tc + c < T ? tc + c : T - 1) * stride;
	}
}

/* Lane 4g + q's outputs V of a pass of NT tiles from row T0 (D's layout:
 * weight rows g, g + 8 by activation rows 2q, 2q + 1 of each tile), those
 * past the weight's end or T left out. */
template <int NT>
static __device__ __forceinline__ void mma_store(const mm_row &m, int g, int q, int t0, int T, const float (*v)[4])
{
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++) {
			const int row = g + 8 * (i / 2), col = t0 + 8 * n + 2 * q + i % 2;
			if (row < m.rows && col < T)
				m.out[(size_t)col * m.n_out + row] = v[n][i];
		}
}

/* Float lane L of quant.c's 16 for the lane's weight rows W0, W1 (rows g,
 * g + 8) and each tile's columns: its blocks L, L + 16, ..., its piece of
 * the ragged end (blocks B16 + 4k + L % 4, piece L / 4 of each), Q4_1's
 * m * s of ragged block B16 + L; CUR gets acc + macc per output. */
template <int TYPE, int NT>
static __device__ __forceinline__ void q32_lane(const uint8_t *w0, const uint8_t *w1, int l, int b16, int nb,
	int q, const uint8_t *const *xb, const float *const (*da)[2], float (*cur)[4])
{
	float acc[NT][4], macc[NT][4];
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++)
			acc[n][i] = macc[n][i] = 0.0f;
	for (int b = l; b < b16; b += 16)
		mma_block<TYPE, NT>(w0, w1, b, q, -1, xb, da, nb, acc, macc);
	for (int b = b16 + l % 4; b < nb; b += 4)
		mma_block<TYPE, NT>(w0, w1, b, q, l / 4, xb, da, nb, acc, macc);
	if (TYPE == QT_Q4_1 && b16 + l < nb) {
		const int b = b16 + l;
		const float mw0 = ld_f16(w0 + (size_t)b * q32_traits<TYPE>::bytes + 2);
		const float mw1 = ld_f16(w1 + (size_t)b * q32_traits<TYPE>::bytes + 2);
UNROLL
		for (int n = 0; n < NT; n++) {
			const float s0 = __ldg(&da[n][0][nb + b]), s1 = __ldg(&da[n][1][nb + b]);
			macc[n][0] = fmaf(mw0, s0, macc[n][0]);
			macc[n][1] = fmaf(mw0, s1, macc[n][1]);
			macc[n][2] = fmaf(mw1, s0, macc[n][2]);
			macc[n][3] = fmaf(mw1, s1, macc[n][3]);
		}
	}
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++)
			cur[n][i] = acc[n][i] + macc[n][i];
}

/* The float lane that comes LI-th in hsum16's order: LI's 4 bits reversed. */
static __device__ __forceinline__ int hsum16_lane(int li)
{
	return (li & 1) << 3 | (li & 2) << 1 | (li & 4) >> 1 | (li & 8) >> 3;
}

/* Float lane number LI of hsum16's order (hsum16_lane) into the tree:
 * merged while LI's low bits are ones; the last lands in V. */
template <int NT>
static __device__ __forceinline__ void q32_tree(int li, float (*cur)[4], float (*tree)[NT][4], float (*v)[4])
{
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++) {
			float c = cur[n][i];
			int k = 0;
			for (; k < 4 && (li >> k & 1); k++)
				c = tree[k][n][i] + c;
			if (k < 4)
				tree[k][n][i] = c;
			else
				v[n][i] = c;
		}
}

/* One warp per 16 weight rows (A's rows g, g + 8 in lane 4g + q), NT
 * tiles of 8 activation rows per pass over them (D's columns 2q, 2q + 1).
 * Rows past the weight's end or T read the last real one and are not
 * stored.  Every loop bound is uniform over the warp.
 *
 * Split-K (KS > 1, a block of KS warps on one run of 16 rows): warp kw
 * takes float lanes number kw, kw + KS, ... (of hsum16's order) and leaves
 * each lane's sums in shared memory (PART: 16 x NT x 4 floats per thread
 * of a warp, mm_split_smem); then warp 0 adds them up the tree in order:
 * the same operations, so the same bits, with 16 / KS times fewer blocks
 * in a row for each warp to walk. */
template <int TYPE, int NT>
static __global__ void matmul_q32_mma_kernel(const mm_group g, int nb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4, kw = ks > 1 ? (int)threadIdx.x / 32 : 0;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float, part);
	const uint8_t *w0 = mma_w_row(m, gr), *w1 = mma_w_row(m, gr + 8);
	const int b16 = nb - nb % 16;
	const int n_in = nb * QK;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2]; /* each D column's d, then (Q8_1) s */
		mma_x_rows<NT>(xq, stride, T, t0, gr, q, xb, xc);
UNROLL
		for (int n = 0; n < NT; n++)
UNROLL
			for (int c = 0; c < 2; c++)
				da[n][c] = reinterpret_cast<const float *>(xc[n][c] + n_in);
		/* hsum16's tree: level k holds the sum of 2^k finished lanes */
		float tree[4][NT][4];
		float v[NT][4];
		float cur[NT][4];
		if (ks == 1) {
UNROLL
			for (int li = 0; li < 16; li++) {
				const int l = hsum16_lane(li);
				q32_lane<TYPE, NT>(w0, w1, l, b16, nb, q, xb, da, cur);
				q32_tree<NT>(li, cur, tree, v);
			}
		} else {
			for (int li = kw; li < 16; li += ks) {
				const int l = hsum16_lane(li);
				q32_lane<TYPE, NT>(w0, w1, l, b16, nb, q, xb, da, cur);
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						part[((li * NT + n) * 4 + i) * 32 + lane] = cur[n][i];
			}
			__syncthreads();
			if (kw == 0)
UNROLL
				for (int li = 0; li < 16; li++) {
UNROLL
					for (int n = 0; n < NT; n++)
UNROLL
						for (int i = 0; i < 4; i++)
							cur[n][i] = part[((li * NT + n) * 4 + i) * 32 + lane];
					q32_tree<NT>(li, cur, tree, v);
				}
			__syncthreads(); /* read: the next pass may write */
		}
		if (kw == 0)
			mma_store<NT>(m, gr, q, t0, T, v);
	}
}

/* ---- matmul: K-quants (Q4_K, Q5_K, Q6_K) against Q8_K ---- */

template <int TYPE> struct k_traits;
template <> struct k_traits<QT_Q4_K> { enum { bytes = 144 }; };
template <> struct k_traits<QT_Q5_K> { enum { bytes = 176 }; };
template <> struct k_traits<QT_Q6_K> { enum { bytes = 210 }; };

/* The 6-bit scale and min of sub-block J of a Q4_K/Q5_K super-block. */
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
	if (j < 4) {
		*sc = __ldg(&q[j]) & 63;
		*m = __ldg(&q[j + 4]) & 63;
	} else {
		*sc = (__ldg(&q[j + 4]) & 0xf) | ((__ldg(&q[j - 4]) >> 6) << 4);
		*m = (__ldg(&q[j + 4]) >> 4) | ((__ldg(&q[j]) >> 6) << 4);
	}
}

/* The exact integer sums of super-block BLK against NT activation rows'
 * super-block B: SUMI (scaled codes) and, for Q4_K/Q5_K, SUMM (mins times
 * bsums); Q6_K folds its -32 into SUMI through the bsums. */
template <int TYPE>
static __device__ __forceinline__ void k_sums(const uint8_t *blk, const uint8_t *const *xr,
	int nt, int b, int n_in, int nsb, int *sumi, int *summ)
{
UNROLL
	for (int j = 0; j < MM_TB; j++)
		sumi[j] = summ[j] = 0;
	if (TYPE == QT_Q6_K) {
		const uint8_t *ql = blk, *qh = blk + 128;
		const int8_t *scales = reinterpret_cast<const int8_t *>(blk + 192);
		for (int g = 0; g < QK_K / 16; g++) {
			const int hf = g / 8, quarter = (g % 8) / 2, l0 = 16 * (g % 2);
			int wc[4];
UNROLL
			for (int k = 0; k < 4; k++) {
				const int l = l0 + 4 * k;
				const int lo = (ld_i32(ql + 64 * hf + (quarter & 1) * 32 + l) >>
						(4 * (quarter >> 1))) & 0x0f0f0f0f;
				const int hi = (ld_i32(qh + 32 * hf + l) >> (2 * quarter)) & 0x03030303;
				wc[k] = lo | hi << 4;
			}
			const int sc = __ldg(&scales[g]);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK_K + 16 * g);
				const int *bs = reinterpret_cast<const int *>(xr[j] + n_in + (size_t)nsb * 4);
				int t = 0;
UNROLL
				for (int k = 0; k < 4; k++)
					t = __dp4a(wc[k], __ldg(&a[k]), t);
				sumi[j] += sc * (t - 32 * __ldg(&bs[b * 16 + g]));
			}
		}
		return;
	}
	const uint8_t *scales = blk + 4;
	const uint8_t *qh = blk + 16;                              /* Q5_K only */
	const uint8_t *qs = blk + (TYPE == QT_Q5_K ? 48 : 16);
	for (int s = 0; s < 8; s++) {
		int sc, m;
		scale_min_k4(s, scales, &sc, &m);
		int wc[8];
UNROLL
		for (int k = 0; k < 8; k++) {
			wc[k] = (ld_i32(qs + 32 * (s / 2) + 4 * k) >> (4 * (s & 1))) & 0x0f0f0f0f;
			if (TYPE == QT_Q5_K)
				wc[k] |= ((ld_i32(qh + 4 * k) >> s) & 0x01010101) << 4;
		}
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK_K + 32 * s);
			const int *bs = reinterpret_cast<const int *>(xr[j] + n_in + (size_t)nsb * 4);
			int t = 0;
UNROLL
			for (int k = 0; k < 8; k++)
				t = __dp4a(wc[k], __ldg(&a[k]), t);
			sumi[j] += sc * t;
			summ[j] += m * (__ldg(&bs[b * 16 + 2 * s]) + __ldg(&bs[b * 16 + 2 * s + 1]));
		}
	}
}

/* One warp per weight row: lane i computes super-block b0 + i's integer
 * sums, then the warp walks the 32 in order with one float accumulator, as
 * quant.c's dot_q45_k / dot_q6_k (every lane runs the same chain). */
template <int TYPE>
static __global__ void matmul_k_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	const uint8_t *wrow = m.w;
	const int n_in = nsb * QK_K;
	const int bytes = k_traits<TYPE>::bytes;

	for (int t0 = 0; t0 < T; t0 += MM_TB) {
		const int nt = T - t0 < MM_TB ? T - t0 : MM_TB;
		const uint8_t *xr[MM_TB];
		float acc[MM_TB];
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			acc[j] = 0.0f;
			xr[j] = xq + (size_t)(t0 + (j < nt ? j : 0)) * stride;
		}
		for (int b0 = 0; b0 < nsb; b0 += 32) {
			const int b = b0 + lane;
			int sumi[MM_TB], summ[MM_TB];
			float dw = 0, dminw = 0;
			if (b < nsb) {
				const uint8_t *blk = wrow + (size_t)b * bytes;
				k_sums<TYPE>(blk, xr, nt, b, n_in, nsb, sumi, summ);
				dw = ld_f16(blk + (TYPE == QT_Q6_K ? 208 : 0));
				dminw = TYPE == QT_Q6_K ? 0.0f : ld_f16(blk + 2);
			} else {
UNROLL
				for (int j = 0; j < MM_TB; j++)
					sumi[j] = summ[j] = 0;
			}
			const int n = nsb - b0 < 32 ? nsb - b0 : 32;
			for (int i = 0; i < n; i++) {
				const float dwi = __shfl_sync(MM_FULL, dw, i);
				const float dmi = __shfl_sync(MM_FULL, dminw, i);
UNROLL
				for (int j = 0; j < MM_TB; j++) {
					if (j >= nt)
						break;
					const int si = __shfl_sync(MM_FULL, sumi[j], i);
					const int mi = __shfl_sync(MM_FULL, summ[j], i);
					const float da = __ldg(reinterpret_cast<const float *>(xr[j] + n_in) + b0 + i);
					acc[j] = fmaf((float)si, dwi * da, acc[j]);
					if (TYPE != QT_Q6_K)
						acc[j] = fmaf((float)-mi, dmi * da, acc[j]);
				}
			}
		}
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			if (lane == 0)
				m.out[(size_t)(t0 + j) * m.n_out] = acc[j];
		}
	}
}

/* ---- matmul: K-quants on the tensor cores ----
 *
 * A warp takes 16 weight rows (A's rows g, g + 8 in lane 4g + q) against
 * NT tiles of 8 activation rows a pass, each A fragment shared by the NT
 * mmas.  A 32-element slice of a super-block is mma_s8_m16n8k32's k.  Each
 * sub-block's integer dot times its integer scale (and Q4_K/Q5_K's mins
 * times the activations' sums) sums exactly into the super-block's sumi
 * and summ, then matmul_k_kernel's two fmas per super-block in order: the
 * integers of k_sums and the same float steps, so the same bits.
 *
 * An mma's k need not be the elements in order, only the same order in A
 * and B: lane 4g + q takes elements 8q..8q+7 of a slice as its k = 4q..
 * and 16+4q.. pieces, so each piece pair is one 8-byte run of the weights'
 * bytes and of the activations'.
 *
 * Q4_K / Q5_K (matmul_k45_mma_kernel): a sub-block is a slice; a row's
 * codes for two sub-blocks (the low and high nibbles of the same bytes)
 * are one 8-byte load, a super-block's head (d, dmin, 12 bytes of scales)
 * one 16-byte load, its 6-bit scales and mins unpacked four at a time; the
 * mins term takes the activations' int16 sums over 32 codes (quant_q8.cuh)
 * through four dp2a per (weight row, activation row).  Those loads are
 * whole words where every row starts 16-byte aligned (ALIGNED: cudaMalloc'd
 * weights do, and 144 and 176 bytes per super-block keep each one so),
 * 16-bit ones otherwise. */

/* The start of a K-quant pass of NT tiles from row T0: XB[n], tile n's B
 * column from element 8q (the lane's k pieces); XC[n][c], its D column
 * 2q + c's row and DA[n][c] that row's d per super-block; ACC zero. */
template <int NT>
static __device__ __forceinline__ void mma_k_pass(const uint8_t *xq, size_t stride, int T, int t0, int g, int q,
	int n_in, const uint8_t **xb, const uint8_t *(*xc)[2], const float *(*da)[2], float (*acc)[4])
{
	mma_x_rows<NT>(xq, stride, T, t0, g, q, xb, xc);
UNROLL
	for (int n = 0; n < NT; n++) {
		xb[n] += 8 * q;
UNROLL
		for (int c = 0; c < 2; c++)
			da[n][c] = reinterpret_cast<const float *>(xc[n][c] + n_in);
UNROLL
		for (int i = 0; i < 4; i++)
			acc[n][i] = 0.0f;
	}
}

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

/* 8 (16) bytes at P: whole words where ALIGNED, else 16-bit loads. */
template <bool ALIGNED>
static __device__ __forceinline__ uint2 ld_u2(const uint8_t *p)
{
	if (ALIGNED)
		return __ldg(reinterpret_cast<const uint2 *>(p));
	return make_uint2((unsigned)ld_i32(p), (unsigned)ld_i32(p + 4));
}

template <bool ALIGNED>
static __device__ __forceinline__ uint4 ld_u4(const uint8_t *p)
{
	if (ALIGNED)
		return __ldg(reinterpret_cast<const uint4 *>(p));
	return make_uint4((unsigned)ld_i32(p), (unsigned)ld_i32(p + 4), (unsigned)ld_i32(p + 8),
			  (unsigned)ld_i32(p + 12));
}

/* The K-quant kernels' pointers N super-blocks on: the weight rows W (at
 * BYTES per super-block), each tile's B column XB, its D columns' d (DA)
 * and, where BS is not NULL, their int16 sums. */
template <int NT>
static __device__ __forceinline__ void k_advance(int n, int bytes, const uint8_t **w, const uint8_t **xb,
	const float *(*da)[2], const uint4 *(*bs)[2])
{
	w[0] += (size_t)n * bytes;
	w[1] += (size_t)n * bytes;
UNROLL
	for (int t = 0; t < NT; t++) {
		xb[t] += (size_t)n * QK_K;
UNROLL
		for (int c = 0; c < 2; c++) {
			da[t][c] += n;
			if (bs)
				bs[t][c] += n;
		}
	}
}

/* A K-quant warp's part in split-K (KS warps of a block on one run of
 * rows, warp KW taking super-blocks KW, KW + KS, ...; KS 1: none): PART,
 * the block's shared memory for k_chain's two buffers, and the chunks of
 * KS super-blocks done so far, which pick the buffer. */
struct k_split {
	int ks;       /* warps on the run */
	int kw;       /* this warp's index among them */
	int chunk;    /* chunks done (k_chain counts them) */
	float4 *part; /* (2, ks, NT * 4, 32) float4: the block's dynamic shared memory */
};

/* A super-block's float steps for each output of the lane, in order:
 * acc = fma(F.x, F.y, acc), then (NF 2: Q4_K/Q5_K's mins) fma(F.z, F.w).
 * KS 1: at once.  Split-K: the chunk's N real super-blocks go through a
 * buffer of KS x NT x 4 float4 per thread of a warp, and warp 0 applies
 * them in super-block order: the same operations, so the same bits; only
 * for the outputs in the pass's first COLS activation rows (D's column
 * 8t + 2q + i % 2: the others are never stored, and at T = 1 they are 7
 * of every 8).  Every thread of the block calls it, once per chunk. */
template <int NT, int NF>
static __device__ __forceinline__ void k_chain(const float4 (*f)[4], float (*acc)[4], k_split &sp, int n,
	int lane, int cols)
{
	const int ks = sp.ks, kw = sp.kw;
	if (ks == 1) {
UNROLL
		for (int t = 0; t < NT; t++)
UNROLL
			for (int i = 0; i < 4; i++) {
				acc[t][i] = fmaf(f[t][i].x, f[t][i].y, acc[t][i]);
				if (NF == 2)
					acc[t][i] = fmaf(f[t][i].z, f[t][i].w, acc[t][i]);
			}
		return;
	}
	float4 *buf = sp.part + (size_t)(sp.chunk++ & 1) * ks * NT * 4 * 32;
	const int c0 = 2 * (lane % 4); /* the lane's first D column of a tile */
	if (kw < n)
UNROLL
		for (int t = 0; t < NT; t++)
UNROLL
			for (int i = 0; i < 4; i++)
				if (8 * t + c0 + i % 2 < cols)
					buf[((kw * NT + t) * 4 + i) * 32 + lane] = f[t][i];
	__syncthreads(); /* and buffer chunk + 1's last readers are done */
	if (kw == 0)
		for (int s = 0; s < n; s++)
UNROLL
			for (int t = 0; t < NT; t++)
UNROLL
				for (int i = 0; i < 4; i++) {
					if (8 * t + c0 + i % 2 >= cols)
						continue;
					const float4 v = buf[((s * NT + t) * 4 + i) * 32 + lane];
					acc[t][i] = fmaf(v.x, v.y, acc[t][i]);
					if (NF == 2)
						acc[t][i] = fmaf(v.z, v.w, acc[t][i]);
				}
}

/* Bytes of k_chain's buffer in a block of KS warps on one run (split-K),
 * NT tiles a pass: none without split-K. */
static __host__ __device__ __forceinline__ size_t k_part_bytes(int ks, int nt)
{
	return ks > 1 ? (size_t)2 * ks * nt * 4 * 32 * sizeof(float4) : 0;
}

template <int TYPE, int NT, bool ALIGNED>
static __global__ void matmul_k45_mma_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float4, part);
	k_split sp = { ks, ks > 1 ? (int)threadIdx.x / 32 : 0, 0, part };
	const int bytes = k_traits<TYPE>::bytes;
	const int n_in = nsb * QK_K;
	const size_t bs32 = q8k_bs32_offset(n_in);
	const int qs = TYPE == QT_Q5_K ? 48 : 16;
	const unsigned lo4 = 0x0f0f0f0fu;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		/* pointers that step a super-block at a time: the weight rows'
		 * bytes 8q.. (of the codes, and of Q5_K's high bits), each B
		 * column's codes 8q.., each D column's d and int16 sums */
		const uint8_t *w[2] = { mma_w_row(m, gr) + 8 * q, mma_w_row(m, gr + 8) + 8 * q };
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2];
		const uint4 *bs[NT][2];
		float acc[NT][4];
		mma_k_pass<NT>(xq, stride, T, t0, gr, q, n_in, xb, xc, da, acc);
UNROLL
		for (int n = 0; n < NT; n++)
UNROLL
			for (int c = 0; c < 2; c++)
				bs[n][c] = reinterpret_cast<const uint4 *>(xc[n][c] + bs32);
		k_advance<NT>(sp.kw, bytes, w, xb, da, bs);

		for (int b0 = 0; b0 < nsb; b0 += ks) {
			float4 f[NT][4];
			/* the weight rows' bytes 8q.. of this super-block */
			const uint8_t *wr[2] = { w[0], w[1] };
			if (b0 + sp.kw < nsb) {
				float dw[2], dm[2];
				unsigned sc[2][2], mn[2][2];
				uint2 qh[2];
UNROLL
				for (int r = 0; r < 2; r++) {
					const uint4 h = ld_u4<ALIGNED>(wr[r] - 8 * q);
					dw[r] = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
					dm[r] = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
					k4_scales_packed(h.y, h.z, h.w, sc[r], mn[r]);
					if (TYPE == QT_Q5_K)
						qh[r] = ld_u2<ALIGNED>(wr[r] + 16);
				}
				int sumi[NT][4];
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						sumi[n][i] = 0;
UNROLL
				for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles), 2p + 1 */
					uint2 c[2];
UNROLL
					for (int r = 0; r < 2; r++)
						c[r] = ld_u2<ALIGNED>(wr[r] + qs + 32 * p);
UNROLL
					for (int hi = 0; hi < 2; hi++) {
						const int s = 2 * p + hi;
						/* a[0], a[2]: row g's elements 8q.., 8q+4..; a[1], a[3]: row g + 8's */
						unsigned a[4] = { c[0].x >> 4 * hi & lo4, c[1].x >> 4 * hi & lo4,
								  c[0].y >> 4 * hi & lo4, c[1].y >> 4 * hi & lo4 };
						if (TYPE == QT_Q5_K) {
							const unsigned h5[4] = { qh[0].x, qh[1].x, qh[0].y, qh[1].y };
UNROLL
							for (int i = 0; i < 4; i++)
								a[i] |= (h5[i] >> s & 0x01010101u) << 4;
						}
						const int ai[4] = { (int)a[0], (int)a[1], (int)a[2], (int)a[3] };
						/* byte s % 4 of the packed scales, zero-extended: one PRMT */
						const int s0 = (int)__byte_perm(sc[0][s / 4], 0, 0x4440 | s % 4);
						const int s1 = (int)__byte_perm(sc[1][s / 4], 0, 0x4440 | s % 4);
UNROLL
						for (int n = 0; n < NT; n++) {
							const uint2 v = __ldg(reinterpret_cast<const uint2 *>(xb[n] + 32 * s));
							const int bf[2] = { (int)v.x, (int)v.y };
							int d[4] = { 0, 0, 0, 0 };
							mma_s8_m16n8k32(d, ai, bf);
							sumi[n][0] += s0 * d[0];
							sumi[n][1] += s0 * d[1];
							sumi[n][2] += s1 * d[2];
							sumi[n][3] += s1 * d[3];
						}
					}
				}
				/* the mins against the sums over 32 codes, then the two fmas */
UNROLL
				for (int n = 0; n < NT; n++) {
UNROLL
					for (int c = 0; c < 2; c++) {
						const uint4 b4 = __ldg(bs[n][c]);
						const float dac = __ldg(da[n][c]);
UNROLL
						for (int r = 0; r < 2; r++) {
							int summ = __dp2a_lo((int)b4.x, (int)mn[r][0], 0);
							summ = __dp2a_hi((int)b4.y, (int)mn[r][0], summ);
							summ = __dp2a_lo((int)b4.z, (int)mn[r][1], summ);
							summ = __dp2a_hi((int)b4.w, (int)mn[r][1], summ);
							const int i = 2 * r + c;
							f[n][i] = make_float4((float)sumi[n][i], dw[r] * dac, (float)-summ,
									      dm[r] * dac);
						}
					}
				}
			}
			k_chain<NT, 2>(f, acc, sp, nsb - b0 < ks ? nsb - b0 : ks, lane, T - t0);
			k_advance<NT>(ks, bytes, w, xb, da, bs);
		}
		if (sp.kw == 0)
			mma_store<NT>(m, gr, q, t0, T, acc);
	}
}

/* Q6_K's codes of one A piece as signed bytes: c - 32 (c ^ 32 with bits
 * 6 and 7 set where c < 32), the same sum as k_sums' -32 * bsums. */
static __device__ __forceinline__ int q6_k_signed(int c)
{
	const unsigned u = (unsigned)c;
	return (int)(u ^ 0x20202020u ^ ((~u & 0x20202020u) * 6u));
}

/* Q6_K (matmul_q6k_mma_kernel): a slice holds two 16-element sub-blocks,
 * lanes q < 2 the first and q >= 2 the second, so each slice takes two
 * mmas per tile with the other sub-block's codes zero, times its scale
 * into sumi.  A row's low nibbles for quarters 0 and 2 (1 and 3) of a half
 * are the same bytes, and its high bits for all four one 8-byte run: a
 * half's codes are three 8-byte runs per row, read 16 bits at a time since
 * 210 bytes per super-block leave rows only 2-byte aligned.  The codes are
 * made signed (c - 32), so no bsums. */
template <int NT>
static __global__ void matmul_q6k_mma_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float4, part);
	k_split sp = { ks, ks > 1 ? (int)threadIdx.x / 32 : 0, 0, part };
	const int n_in = nsb * QK_K;
	const int bytes = k_traits<QT_Q6_K>::bytes;
	const bool first = q < 2; /* this lane's elements are a slice's first sub-block */
	const unsigned lo4 = 0x0f0f0f0fu;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		/* pointers that step a super-block at a time: the weight rows,
		 * each B column's codes 8q.., each D column's d */
		const uint8_t *w[2] = { mma_w_row(m, gr), mma_w_row(m, gr + 8) };
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2];
		float acc[NT][4];
		mma_k_pass<NT>(xq, stride, T, t0, gr, q, n_in, xb, xc, da, acc);
		k_advance<NT>(sp.kw, bytes, w, xb, da, NULL);

		for (int b0 = 0; b0 < nsb; b0 += ks) {
			float4 f[NT][4];
			/* the weight rows of this super-block */
			const uint8_t *wr[2] = { w[0], w[1] };
			if (b0 + sp.kw < nsb) {
				int sumi[NT][4];
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						sumi[n][i] = 0;
UNROLL
				for (int hf = 0; hf < 2; hf++) {
					/* [row][word]: ql for quarters 0/2 and 1/3, qh for all */
					int l02[2][2], l13[2][2], h[2][2];
UNROLL
					for (int r = 0; r < 2; r++)
UNROLL
						for (int k = 0; k < 2; k++) {
							l02[r][k] = ld_i32(wr[r] + 64 * hf + 8 * q + 4 * k);
							l13[r][k] = ld_i32(wr[r] + 64 * hf + 32 + 8 * q + 4 * k);
							h[r][k] = ld_i32(wr[r] + 128 + 32 * hf + 8 * q + 4 * k);
						}
UNROLL
					for (int quarter = 0; quarter < 4; quarter++) {
						const int s = 4 * hf + quarter;
						int c[2][2];
UNROLL
						for (int r = 0; r < 2; r++)
UNROLL
							for (int k = 0; k < 2; k++) {
								const int lo = ((quarter & 1 ? l13[r][k] : l02[r][k]) >> 4 * (quarter >> 1)) & lo4;
								const int hi = (h[r][k] >> 2 * quarter) & 0x03030303;
								c[r][k] = q6_k_signed(lo | hi << 4);
							}
						/* a[0], a[2]: row g's elements 8q.., 8q+4..; a[1], a[3]: row g + 8's */
						const int a0[4] = { first ? c[0][0] : 0, first ? c[1][0] : 0,
								    first ? c[0][1] : 0, first ? c[1][1] : 0 };
						const int a1[4] = { first ? 0 : c[0][0], first ? 0 : c[1][0],
								    first ? 0 : c[0][1], first ? 0 : c[1][1] };
						int sc[2][2];
UNROLL
						for (int r = 0; r < 2; r++) {
							sc[r][0] = __ldg(reinterpret_cast<const int8_t *>(wr[r] + 192 + 2 * s));
							sc[r][1] = __ldg(reinterpret_cast<const int8_t *>(wr[r] + 192 + 2 * s + 1));
						}
UNROLL
						for (int n = 0; n < NT; n++) {
							const uint2 v = __ldg(reinterpret_cast<const uint2 *>(xb[n] + 32 * s));
							const int bf[2] = { (int)v.x, (int)v.y };
							int d0[4] = { 0, 0, 0, 0 }, d1[4] = { 0, 0, 0, 0 };
							mma_s8_m16n8k32(d0, a0, bf);
							mma_s8_m16n8k32(d1, a1, bf);
UNROLL
							for (int i = 0; i < 4; i++)
								sumi[n][i] += sc[i / 2][0] * d0[i] + sc[i / 2][1] * d1[i];
						}
					}
				}
				const float dw[2] = { ld_f16(wr[0] + 208), ld_f16(wr[1] + 208) };
UNROLL
				for (int n = 0; n < NT; n++) {
UNROLL
					for (int c = 0; c < 2; c++) {
						const float dac = __ldg(da[n][c]);
UNROLL
						for (int r = 0; r < 2; r++)
							f[n][2 * r + c] = make_float4((float)sumi[n][2 * r + c], dw[r] * dac,
										      0.0f, 0.0f);
					}
				}
			}
			k_chain<NT, 1>(f, acc, sp, nsb - b0 < ks ? nsb - b0 : ks, lane, T - t0);
			k_advance<NT>(ks, bytes, w, xb, da, NULL);
		}
		if (sp.kw == 0)
			mma_store<NT>(m, gr, q, t0, T, acc);
	}
}

/* ---- matmul: Q4_K and Q6_K rows read whole (one activation row) ----
 *
 * At T = 1 the tensor-core kernels waste 7 of the mma's 8 columns and read
 * 8 rows' 32 bytes a load, and their split-K (to have enough warps for
 * HBM) costs a barrier a chunk.
 * Here (the tuning's mm_wide) one warp takes one weight row, reading it 512
 * bytes a load: lane 8c + k takes 16-byte piece k of super-block 4i + c's
 * codes (so a load is 4 super-blocks' codes, contiguous but for their
 * 16-byte heads), U such rounds' loads in flight before any is used.  A
 * piece is 16 codes of sub-block 2j (low nibbles) and the same 16 of
 * 2j + 1 (high), j = k / 2: two dp4a chains times their 6-bit scales; the
 * even pieces add sub-blocks 2j and 2j + 1's mins times the activations'
 * sums over 32 codes.  The 8 lanes of a super-block add those exactly
 * (integers), and the two fmas per super-block then run in order from
 * shared memory, as matmul_k_kernel's: so the same bits. */
#define MM_WIDE_WARPS MM_WARPS /* rows (warps) per block */

/* A super-block's float steps, as matmul_k_kernel takes them: Q4_K's two
 * fmas (sumi * d, -summ * dmin), Q6_K's one. */
static __device__ __forceinline__ float wide_step(float4 v, float acc)
{
	return fmaf(v.z, v.w, fmaf(v.x, v.y, acc));
}

static __device__ __forceinline__ float wide_step(float2 v, float acc)
{
	return fmaf(v.x, v.y, acc);
}

/* A wide warp's chunk from super-block B0: its steps, left in ST by each
 * super-block's lane 0, applied to ACC in super-block order. */
template <int U, typename S>
static __device__ __forceinline__ float wide_chain(const S *st, int b0, int nsb, float acc)
{
	__syncwarp(); /* the chunk's steps are in shared memory */
	const int n = nsb - b0 < 4 * U ? nsb - b0 : 4 * U;
	for (int i = 0; i < n; i++)
		acc = wide_step(st[i], acc);
	__syncwarp(); /* read before the next chunk's writes */
	return acc;
}

/* matmul_q4k_wide_kernel's work after its wait, which
 * matmul_kq_wide_kernel's Q4_K blocks run too. */
template <int U>
static __device__ __forceinline__ void matmul_q4k_wide_body(const mm_group &g, int nsb,
	const uint8_t *__restrict__ xq, size_t stride, int T)
{
	__shared__ float4 steps[MM_WIDE_WARPS][4 * U];
	const int lane = threadIdx.x % 32, c = lane / 8, k = lane % 8, j = k / 2, h = k % 2;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	float4 *st = steps[threadIdx.x / 32];
	const int n_in = nsb * QK_K;
	const int8_t *x = reinterpret_cast<const int8_t *>(xq);
	const float *xd = reinterpret_cast<const float *>(xq + n_in);
	const unsigned *bs = reinterpret_cast<const unsigned *>(xq + q8k_bs32_offset(n_in));
	float acc = 0.0f;

	for (int b0 = 0; b0 < nsb; b0 += 4 * U) {
		uint4 code[U], head[U], xa[U], xb[U];
		unsigned bsw[U];
		float da[U];
UNROLL
		for (int u = 0; u < U; u++) { /* every load of the U rounds first */
			const int sb0 = b0 + 4 * u + c, sb = sb0 < nsb ? sb0 : nsb - 1;
			const uint8_t *blk = m.w + (size_t)sb * k_traits<QT_Q4_K>::bytes;
			head[u] = __ldg(reinterpret_cast<const uint4 *>(blk));
			code[u] = __ldg(reinterpret_cast<const uint4 *>(blk + 16 + 16 * k));
			xa[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + 64 * j + 16 * h));
			xb[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + 64 * j + 32 + 16 * h));
			bsw[u] = __ldg(&bs[4 * sb + j]);
			da[u] = __ldg(&xd[sb]);
		}
UNROLL
		for (int u = 0; u < U; u++) {
			const unsigned cw[4] = { code[u].x, code[u].y, code[u].z, code[u].w };
			const unsigned aw[4] = { xa[u].x, xa[u].y, xa[u].z, xa[u].w };
			const unsigned bw[4] = { xb[u].x, xb[u].y, xb[u].z, xb[u].w };
			int slo = 0, shi = 0;
UNROLL
			for (int i = 0; i < 4; i++) {
				slo = __dp4a((int)(cw[i] & 0x0f0f0f0fu), (int)aw[i], slo);
				shi = __dp4a((int)(cw[i] >> 4 & 0x0f0f0f0fu), (int)bw[i], shi);
			}
			unsigned sc[2], mn[2];
			k4_scales_packed(head[u].y, head[u].z, head[u].w, sc, mn);
			/* sub-blocks 2j, 2j + 1: bytes 2 (j % 2) and + 1 of word j / 2 */
			const unsigned scw = j < 2 ? sc[0] : sc[1], mnw = j < 2 ? mn[0] : mn[1];
			const int sel = 2 * (j % 2);
			int sumi = (int)__byte_perm(scw, 0, 0x4440 | sel) * slo +
				   (int)__byte_perm(scw, 0, 0x4440 | (sel + 1)) * shi;
			int summ = h ? 0
				 : j % 2 ? __dp2a_hi((int)bsw[u], (int)mnw, 0) : __dp2a_lo((int)bsw[u], (int)mnw, 0);
UNROLL
			for (int off = 1; off < 8; off *= 2) {
				sumi += __shfl_xor_sync(MM_FULL, sumi, off);
				summ += __shfl_xor_sync(MM_FULL, summ, off);
			}
			if (k == 0) {
				const float dw = __half2float(__ushort_as_half((unsigned short)(head[u].x & 0xffffu)));
				const float dm = __half2float(__ushort_as_half((unsigned short)(head[u].x >> 16)));
				st[4 * u + c] = make_float4((float)sumi, dw * da[u], (float)-summ, dm * da[u]);
			}
		}
		acc = wide_chain<U>(st, b0, nsb, acc);
	}
	if (lane == 0)
		m.out[0] = acc;
}

template <int U>
static __global__ void matmul_q4k_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	matmul_q4k_wide_body<U>(g, nsb, xq, stride, T);
}

/* Q6_K a row a warp: as Q4_K's, lane 8c + k on super-block 4i + c, its
 * piece k = 4 hf + 2 q + p (hf: the half of 128 elements, q: quarter q
 * and q + 2 of it, p: elements 16p.. of each quarter): 16 bytes of ql
 * (quarter q's low nibbles, q + 2's high ones) and the 16 bytes of qh that
 * hold both quarters' top bits, 32 codes made signed (c - 32, as
 * matmul_q6k_mma_kernel) into two dp4a chains times their groups' int8
 * scales.  210 bytes a super-block leave them only 2-byte aligned: each
 * 16 bytes are 5 aligned words funnel-shifted into 4. */
static __device__ __forceinline__ uint4 ld_u4_a2(const uint8_t *p)
{
	const unsigned *a = reinterpret_cast<const unsigned *>(p - ((uintptr_t)p & 2));
	const unsigned sh = ((unsigned)(uintptr_t)p & 2) * 8;
	unsigned w[5];
UNROLL
	for (int i = 0; i < 5; i++)
		w[i] = __ldg(&a[i]);
	return make_uint4(__funnelshift_r(w[0], w[1], sh), __funnelshift_r(w[1], w[2], sh),
			  __funnelshift_r(w[2], w[3], sh), __funnelshift_r(w[3], w[4], sh));
}

/* matmul_q6k_wide_kernel's work after its wait, which
 * matmul_kq_wide_kernel's Q6_K blocks run too. */
template <int U>
static __device__ __forceinline__ void matmul_q6k_wide_body(const mm_group &g, int nsb,
	const uint8_t *__restrict__ xq, size_t stride, int T)
{
	__shared__ float2 steps[MM_WIDE_WARPS][4 * U];
	const int lane = threadIdx.x % 32, c = lane / 8, k = lane % 8;
	const int hf = k / 4, q = k / 2 % 2, p = k % 2;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	float2 *st = steps[threadIdx.x / 32];
	const int n_in = nsb * QK_K;
	const int8_t *x = reinterpret_cast<const int8_t *>(xq);
	const float *xd = reinterpret_cast<const float *>(xq + n_in);
	const int e0 = 128 * hf + 32 * q + 16 * p; /* the low nibbles' first element; + 64 the high's */
	const int grp = e0 / 16;                   /* their scales: groups grp and grp + 4 */
	float acc = 0.0f;

	for (int b0 = 0; b0 < nsb; b0 += 4 * U) {
		uint4 ql[U], qh[U], xa[U], xb[U];
		int sc0[U], sc1[U];
		float dw[U], da[U];
UNROLL
		for (int u = 0; u < U; u++) { /* every load of the U rounds first */
			const int sb0 = b0 + 4 * u + c, sb = sb0 < nsb ? sb0 : nsb - 1;
			const uint8_t *blk = m.w + (size_t)sb * k_traits<QT_Q6_K>::bytes;
			ql[u] = ld_u4_a2(blk + 64 * hf + 32 * q + 16 * p);
			qh[u] = ld_u4_a2(blk + 128 + 32 * hf + 16 * p);
			sc0[u] = __ldg(reinterpret_cast<const int8_t *>(blk + 192 + grp));
			sc1[u] = __ldg(reinterpret_cast<const int8_t *>(blk + 192 + grp + 4));
			dw[u] = ld_f16(blk + 208);
			xa[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + e0));
			xb[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + e0 + 64));
			da[u] = __ldg(&xd[sb]);
		}
UNROLL
		for (int u = 0; u < U; u++) {
			const unsigned lw[4] = { ql[u].x, ql[u].y, ql[u].z, ql[u].w };
			const unsigned hw[4] = { qh[u].x, qh[u].y, qh[u].z, qh[u].w };
			const unsigned aw[4] = { xa[u].x, xa[u].y, xa[u].z, xa[u].w };
			const unsigned bw[4] = { xb[u].x, xb[u].y, xb[u].z, xb[u].w };
			int t0 = 0, t1 = 0;
UNROLL
			for (int i = 0; i < 4; i++) {
				const unsigned lo = (lw[i] & 0x0f0f0f0fu) | (hw[i] >> 2 * q & 0x03030303u) << 4;
				const unsigned hi = (lw[i] >> 4 & 0x0f0f0f0fu) | (hw[i] >> (2 * q + 4) & 0x03030303u) << 4;
				t0 = __dp4a(q6_k_signed((int)lo), (int)aw[i], t0);
				t1 = __dp4a(q6_k_signed((int)hi), (int)bw[i], t1);
			}
			int sumi = sc0[u] * t0 + sc1[u] * t1;
UNROLL
			for (int off = 1; off < 8; off *= 2)
				sumi += __shfl_xor_sync(MM_FULL, sumi, off);
			if (k == 0)
				st[4 * u + c] = make_float2((float)sumi, dw[u] * da[u]);
		}
		acc = wide_chain<U>(st, b0, nsb, acc);
	}
	if (lane == 0)
		m.out[0] = acc;
}

template <int U>
static __global__ void matmul_q6k_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	matmul_q6k_wide_body<U>(g, nsb, xq, stride, T);
}

/* ---- Q4_K and Q6_K weights in one launch ----
 *
 * One row of a group of Q4_K and Q6_K weights sharing their input (a
 * Q4_K_M model's q and k are Q4_K, its v Q6_K in half the layers) takes
 * one launch of the wide kernels rather than one a type, with
 * the tuning's mm_mixed: each block runs its member's type's body, the
 * same code as alone, so the same bits. */

/* Whether this block's member of G (mm_member) is Q6_K, read with
 * constant indices as mm_pick does. */
static __device__ __forceinline__ bool mm_member_q6(const mm_group &g)
{
	const int k0 = mm_member(g);
	bool q6 = false;
UNROLL
	for (int k = 0; k < CUDA_MM_GROUP; k++)
		if (k == k0)
			q6 = g.q6[k];
	return q6;
}

template <int U>
static __global__ void matmul_kq_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	if (mm_member_q6(g)) /* uniform across the block */
		matmul_q6k_wide_body<U>(g, nsb, xq, stride, T);
	else
		matmul_q4k_wide_body<U>(g, nsb, xq, stride, T);
}

/* ---- launchers ---- */

static int mm_launched(void)
{
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* Bytes per block of a supported weight type and its block size, or 0. */
static size_t mm_block_bytes(uint32_t type, int *ret_blck)
{
	switch (type) {
	case QT_Q4_0: *ret_blck = QK; return 18;
	case QT_Q4_1: *ret_blck = QK; return 20;
	case QT_Q8_0: *ret_blck = QK; return 34;
	case QT_Q4_K: *ret_blck = QK_K; return 144;
	case QT_Q5_K: *ret_blck = QK_K; return 176;
	case QT_Q6_K: *ret_blck = QK_K; return 210;
	default: *ret_blck = 0; return 0;
	}
}

extern "C" size_t cuda_matmul_scratch_bytes(const struct bk_weight *w, int32_t T)
{
	if (!w || T < 1 || w->n_in <= 0)
		return 0;
	return mm_xq_stride(w->type, w->n_in) * (size_t)T;
}

/* The wide kernels' rounds of loads with tuning T (mm_wide): 0 (off), 1,
 * 2, 4 or 8; below 0, the default 2 (cuda_mm_bench on an H200: 1 and 2
 * best, 4 some 15% slower). */
static int mm_wide_rounds(const struct cuda_tuning *t)
{
	const int32_t r = t->mm_wide;
	return r < 0 ? 2 : r <= 2 ? r : r <= 4 ? 4 : 8;
}

/* Whether one launch may take weights of types A and B over T rows
 * (mm_mixed; matmul_kq_wide_kernel): Q4_K and Q6_K, one row, the wide
 * kernels on.  On by default: on an H200, an 8B Q4_K_M decode step 1-2.6%
 * faster. */
static int mm_mixes(const struct cuda_tuning *tu, uint32_t a, uint32_t b, int32_t T)
{
	return tu->mm_mixed && mm_wide_rounds(tu) && T == 1 && (a == QT_Q4_K || a == QT_Q6_K) &&
	       (b == QT_Q4_K || b == QT_Q6_K);
}

extern "C" int cuda_matmul_mixes(uint32_t a, uint32_t b, int32_t T, const struct cuda_tuning *tuning)
{
	struct cuda_tuning def;
	if (!tuning) {
		cuda_tuning_defaults(&def);
		tuning = &def;
	}
	return a == b || mm_mixes(tuning, a, b, T);
}

/* Weight W's checks against the group's first, G0 (NULL: W is the first). */
static int mm_check(const struct cuda_tuning *tu, const struct bk_weight *w, const struct bk_weight *g0,
	int32_t T)
{
	int blck;

	if (!w || !w->data || T < 1)
		return -EINVAL;
	const size_t bb = mm_block_bytes(w->type, &blck);
	if (!bb)
		return -ENOTSUP; /* F32/F16/BF16 weights: not on this path */
	if (g0 && ((w->type != g0->type && !mm_mixes(tu, w->type, g0->type, T)) || w->n_in != g0->n_in))
		return -EINVAL;
	if (w->n_in <= 0 || w->n_in % blck || w->n_in > (1 << 24) || w->n_out <= 0 ||
	    w->n_out > (1 << 24) || (int64_t)T * w->n_out > ((int64_t)1 << 31) - 1)
		return -EINVAL;
	if (w->row_bytes < (size_t)(w->n_in / blck) * bb || w->row_bytes % 2 || (uintptr_t)w->data % 2)
		return -EINVAL;
	return 0;
}

/* Whether a matmul of TYPE over T activation rows takes the tensor-core
 * kernels (the same bits as the others; T only picks the faster): from
 * tuning TU's mma_min_t rows; below 1, the default: the K-quants always (at
 * T = 1 the wide kernels first, mm_use_wide), the 32-element types from
 * T = 2 (one row is faster on dp4a: a warp a row). */
static int mm_use_mma(const struct cuda_tuning *tu, uint32_t type, int32_t T)
{
	int blck;
	if (!mm_block_bytes(type, &blck))
		return 0;
	return T >= (tu->mma_min_t >= 1 ? tu->mma_min_t : blck == QK ? 2 : 1);
}

/* Whether weights WS (NW, of one type) are read a word at a time: every
 * row 16-byte aligned (matmul_k45_mma_kernel's ALIGNED). */
static int mm_aligned16(const struct bk_weight *const *ws, int nw)
{
	for (int k = 0; k < nw; k++)
		if ((uintptr_t)ws[k]->data % 16 || ws[k]->row_bytes % 16)
			return 0;
	return 1;
}

typedef void (*mm_kernel)(const mm_group, int, const uint8_t *, size_t, int, int);

/* The warps a launch's split-K may have in all: tuning TU's mm_warps, or
 * below 1 one wave of the kernels' resident warps on SMS multiprocessors
 * (0: the current device's; per SM: some 24 of the K-quant kernels at
 * their ~80 registers; 12 for the 32-element ones, whose split adds a
 * shared-memory tree), so that no launch leaves a last wave mostly empty.
 * On an H200 (cuda_mm_bench): an 8B's gate+up at T = 2..8 (1792 runs)
 * 17-21% faster unsplit than split in two waves; its down (256 runs)
 * wants the 8 warps a run that stay within the one wave. */
static long long mm_split_target(const struct cuda_tuning *tu, int sms, int blck)
{
	if (tu->mm_warps >= 1)
		return tu->mm_warps;
	if (sms < 1) {
		int dev = 0, n = 0;
		sms = cudaGetDevice(&dev) == cudaSuccess &&
			      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0
		      ? n : 132;
	}
	return (long long)sms * (blck == QK ? 12 : 24);
}

/* The warps per run of 16 rows (KS) of a tensor-core launch over RUNS runs
 * of blocks of BLCK elements, NB of them per row, NT tiles a pass: the
 * most powers of two that keep the launch within mm_split_target's warps,
 * at most the 16 float lanes of the 32-element types or the super-blocks
 * of a row of the K-quants, and within 32 KiB of shared memory
 * (mm_split_smem). */
static int mm_split(const struct cuda_tuning *tu, int sms, int blck, int nb, int nt, long long runs)
{
	int cap = blck == QK ? 16 : nt == 1 ? 8 : nt == 2 ? 4 : 1;
	if (cap > tu->mm_split)
		cap = tu->mm_split < 1 ? 1 : tu->mm_split;
	const long long target = mm_split_target(tu, sms, blck);
	int ks = 1;
	while (ks * 2 <= cap && runs * ks * 2 <= target && (blck == QK || ks * 2 <= nb))
		ks *= 2;
	return ks;
}

/* The shared memory of a split-K launch (KS > 1): the 32-element kernels'
 * 16 float lanes, or the K-quants' two chunks of KS super-blocks' float4
 * steps, NT x 4 outputs per thread of a warp. */
static size_t mm_split_smem(int blck, int nt, int ks)
{
	if (ks < 2)
		return 0;
	return blck == QK ? (size_t)16 * nt * 4 * 32 * sizeof(float) : k_part_bytes(ks, nt);
}

/* The tensor-core kernel of a supported TYPE with NT tiles of 8 activation
 * rows a pass (the 32-element types at most 2); ALIGNED: every row
 * 16-byte aligned (mm_aligned16). */
template <int NT>
static mm_kernel mm_mma_kernel_of(uint32_t type, int aligned)
{
	const int nq = NT < 2 ? NT : 2;
	switch (type) {
	case QT_Q4_0: return matmul_q32_mma_kernel<QT_Q4_0, nq>;
	case QT_Q4_1: return matmul_q32_mma_kernel<QT_Q4_1, nq>;
	case QT_Q8_0: return matmul_q32_mma_kernel<QT_Q8_0, nq>;
	case QT_Q4_K:
		return aligned ? matmul_k45_mma_kernel<QT_Q4_K, NT, true>
			       : matmul_k45_mma_kernel<QT_Q4_K, NT, false>;
	case QT_Q5_K:
		return aligned ? matmul_k45_mma_kernel<QT_Q5_K, NT, true>
			       : matmul_k45_mma_kernel<QT_Q5_K, NT, false>;
	default:      return matmul_q6k_mma_kernel<NT>;
	}
}

/* Whether a matmul of TYPE over T activation rows reads its weight rows
 * whole (matmul_q4k_wide_kernel: Q4_K, 16-byte aligned rows; or
 * matmul_q6k_wide_kernel; T = 1) with mm_wide_rounds of loads in flight
 * (0: never). */
static int mm_use_wide(const struct cuda_tuning *tu, uint32_t type, int aligned, int32_t T)
{
	return mm_wide_rounds(tu) && ((type == QT_Q4_K && aligned) || type == QT_Q6_K) && T == 1;
}

static mm_kernel mm_wide_kernel(const struct cuda_tuning *tu, uint32_t type)
{
	switch (mm_wide_rounds(tu)) {
	case 1:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<1> : matmul_q4k_wide_kernel<1>;
	case 2:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<2> : matmul_q4k_wide_kernel<2>;
	case 4:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<4> : matmul_q4k_wide_kernel<4>;
	default: return type == QT_Q6_K ? matmul_q6k_wide_kernel<8> : matmul_q4k_wide_kernel<8>;
	}
}

/* The mixed Q4_K / Q6_K group's kernel (matmul_kq_wide_kernel). */
static mm_kernel mm_kq_kernel(const struct cuda_tuning *tu)
{
	switch (mm_wide_rounds(tu)) {
	case 1:  return matmul_kq_wide_kernel<1>;
	case 2:  return matmul_kq_wide_kernel<2>;
	case 4:  return matmul_kq_wide_kernel<4>;
	default: return matmul_kq_wide_kernel<8>;
	}
}

/* The dp4a kernel of a supported TYPE, a warp a weight row. */
static mm_kernel mm_dp4a_kernel_of(uint32_t type)
{
	switch (type) {
	case QT_Q4_0: return matmul_q32_kernel<QT_Q4_0>;
	case QT_Q4_1: return matmul_q32_kernel<QT_Q4_1>;
	case QT_Q8_0: return matmul_q32_kernel<QT_Q8_0>;
	case QT_Q4_K: return matmul_k_kernel<QT_Q4_K>;
	case QT_Q5_K: return matmul_k_kernel<QT_Q5_K>;
	default:      return matmul_k_kernel<QT_Q6_K>;
	}
}

/* The matmul kernel of a supported TYPE: on the tensor cores (MMA) with 1
 * tile of 8 activation rows a pass up to T = 8, 2 up to 16, then 4; or the
 * dp4a one. */
static mm_kernel mm_kernel_of(uint32_t type, int mma, int aligned, int32_t T)
{
	if (mma)
		return T <= 8 ? mm_mma_kernel_of<1>(type, aligned)
		     : T <= 16 ? mm_mma_kernel_of<2>(type, aligned) : mm_mma_kernel_of<4>(type, aligned);
	return mm_dp4a_kernel_of(type);
}

/* cuda_matmul_q_group; with X NULL, SCRATCH already holds the rows
 * quantized. */
static int matmul_q(const struct bk_weight *const *ws, int nw, const float *x, int32_t T,
	float *const *outs, void *scratch, const struct cuda_launch *lc)
{
	struct cuda_tuning def;
	const struct cuda_tuning *tu = cuda_launch_tuning(lc, &def);
	struct mm_group g;
	long long blocks = 0;
	int blck, r;

	if (!ws || !outs || nw < 1 || nw > CUDA_MM_GROUP || !scratch || (uintptr_t)scratch % 16 ||
	    (uintptr_t)x % 4)
		return -EINVAL;
	for (int k = 0; k < nw; k++) {
		if ((r = mm_check(tu, ws[k], k ? ws[0] : NULL, T)) < 0)
			return r;
		if (!outs[k] || (uintptr_t)outs[k] % 4)
			return -EINVAL;
	}
	int mixed = 0, aligned_k4 = 1; /* of the Q4_K members, for a mixed group */
	for (int k = 0; k < nw; k++) {
		mixed |= ws[k]->type != ws[0]->type;
		if (ws[k]->type == QT_Q4_K)
			aligned_k4 &= mm_aligned16(&ws[k], 1);
	}
	if (mixed && !aligned_k4)
		return -EINVAL; /* (the wide Q4_K kernel, 16-byte rows) */
	const int aligned = mm_aligned16(ws, nw);
	const int wide = mixed || mm_use_wide(tu, ws[0]->type, aligned, T);
	const int mma = !wide && mm_use_mma(tu, ws[0]->type, T);
	mm_block_bytes(ws[0]->type, &blck);
	const int nbk = (int)(ws[0]->n_in / blck);
	const int nt = T <= 8 ? 1 : T <= 16 || blck == QK ? 2 : 4;
	long long runs = 0; /* of 16 weight rows, for the tensor cores */
	for (int k = 0; k < nw; k++)
		runs += (ws[k]->n_out + MMA_ROWS - 1) / MMA_ROWS;
	const int ks = mma ? mm_split(tu, lc ? lc->sms : 0, blck, nbk, nt, runs) : 1;
	const int rows_per_block = ks > 1 ? MMA_ROWS : MM_WARPS * (mma ? MMA_ROWS : 1);
	const unsigned threads = 32u * (ks > 1 ? ks : MM_WARPS);
	const size_t smem = mm_split_smem(blck, nt, ks);
	for (int k = 0; k < CUDA_MM_GROUP; k++) {
		const int used = k < nw;
		g.w[k] = used ? (const uint8_t *)ws[k]->data : NULL;
		g.out[k] = used ? outs[k] : NULL;
		g.row_bytes[k] = used ? ws[k]->row_bytes : 0;
		g.n_out[k] = used ? (int)ws[k]->n_out : 0;
		g.first[k] = used ? (int)blocks : INT_MAX;
		if (used)
			blocks += (ws[k]->n_out + rows_per_block - 1) / rows_per_block;
	}
	if (blocks > 0x7fffffffLL)
		return -EINVAL;
	g.first[CUDA_MM_GROUP] = INT_MAX;
	for (int k = 0; k < CUDA_MM_GROUP; k++)
		g.q6[k] = k < nw && ws[k]->type == QT_Q6_K;

	const struct bk_weight *w = ws[0];
	const int n_in = (int)w->n_in;
	const size_t stride = mm_xq_stride(w->type, w->n_in);
	uint8_t *xq = (uint8_t *)scratch;
	const unsigned mm_blocks = (unsigned)blocks;
	const mm_kernel kernel = mixed ? mm_kq_kernel(tu) : wide ? mm_wide_kernel(tu, w->type)
			       : mm_kernel_of(w->type, mma, aligned, T);

	if (blck == QK) {
		const int nb = n_in / QK;
		const long long warps = (long long)T * nb;
		const long long qblocks = (warps + MMQ_WARPS - 1) / MMQ_WARPS;
		if (qblocks > 0x7fffffffLL)
			return -EINVAL;
		if (x) {
			LAUNCH_ON(lc, quantize_q8_kernel, (unsigned)qblocks, MMQ_WARPS * 32, 0, x, n_in,
			       (int)T, w->type == QT_Q4_1 ? 1 : 0, xq, stride);
			if (mm_launched())
				return -EIO;
		}
		LAUNCH_ON(lc, kernel, mm_blocks, threads, smem, g, nb, (const uint8_t *)xq, stride, (int)T, ks);
		return mm_launched();
	}

	const int nsb = n_in / QK_K;
	if ((long long)T * nsb > 0x7fffffffLL)
		return -EINVAL;
	if (x) {
		LAUNCH_ON(lc, quantize_q8k_kernel, (unsigned)(T * nsb), MMQK_THREADS, 0, x, n_in, xq, stride);
		if (mm_launched())
			return -EIO;
	}
	LAUNCH_ON(lc, kernel, mm_blocks, threads, smem, g, nsb, (const uint8_t *)xq, stride, (int)T, ks);
	return mm_launched();
}

extern "C" int cuda_matmul_q_group(const struct bk_weight *const *w, int nw, const float *x, int32_t T,
	float *const *out, void *scratch, const struct cuda_launch *lc)
{
	return matmul_q(w, nw, x, T, out, scratch, lc);
}

extern "C" int cuda_matmul_q(const struct bk_weight *w, const float *x, int32_t T, float *out,
	void *scratch, const struct cuda_launch *lc)
{
	return x ? matmul_q(&w, 1, x, T, &out, scratch, lc) : -EINVAL;
}
