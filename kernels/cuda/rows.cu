/* rows.cu - the CUDA backend's element-wise and row ops: embedding gather
 * (dequantizing every weight type the CPU backend takes), RMSNorm, RoPE,
 * SwiGLU, the residual add (alone or fused with the RMSNorm after it); and
 * the fp16/bf16 copies of weight rows and activations that the cuBLAS GEMM
 * path takes.
 *
 * Each op repeats the CPU backend's (kernels/cpu_backend.c, kernels/quant.c)
 * arithmetic operation for operation, so that on the emulator the results
 * are bit-identical to it, and on a GPU they differ only where CUDA's libm
 * does (expf, sinf, cosf: at most 2 ulp, CUDA C Programming Guide, "Mathematical
 * Functions").  Products that the CPU rounds before an add are written with
 * __fmul_rn so that nvcc cannot contract them into an FMA.  Every row's
 * arithmetic is independent of T and of the other rows (batch invariance).
 */
#include "cuda_compat.h"

#include <cuda_bf16.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "cuda_mma.h"
#include "cuda_ops.h"
#include "quant_q8.cuh"
#include "rope.cuh"

#ifdef __cplusplus
extern "C" {
#endif
#include "quant.h"
#ifdef __cplusplus
}
#endif

#define ROWS_THREADS 256     /* threads per block of every kernel here */
#define ROWS_WARPS (ROWS_THREADS / 32)
#define EW_MAX_BLOCKS 65536  /* grid of the element-wise grid-stride loops */
#define ROWS_BATCH 16        /* a norm's loads in flight per thread (rows_add_scale) */
#define NORM_PRE_Q8 8        /* 32-element blocks per warp whose g a Q8_0/Q8_1 norm loads first */
#define NORM_PRE_Q8K 2       /* super-blocks per warp whose g a Q8_K norm loads first */
static_assert(ROWS_THREADS == Q8K_THREADS, "the fused Q8_K quantization takes a row block's threads");

/* ---- shared helpers ---- */

static __device__ __forceinline__ float rows_f16(const uint8_t *p)
{
	return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short *>(p)));
}

static int rows_launched(void)
{
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* ---- embed ---- */

/* Element E (0..255) of a Q4_K (QH == NULL) or Q5_K super-block's codes: quant.c's q45_k_code. */
static __device__ __forceinline__ int rows_q45_k_code(const uint8_t *qs, const uint8_t *qh, int e)
{
	const int chunk = e / 64, l = e % 32, high = (e % 64) >= 32;
	int q = qs[32 * chunk + l];

	q = high ? q >> 4 : q & 0xf;
	if (qh && (qh[l] >> (2 * chunk + high)) & 1)
		q += 16;
	return q;
}

/* Element E (0..255) of a Q6_K super-block as its unsigned 6-bit code: quant.c's q6_k_code. */
static __device__ __forceinline__ int rows_q6_k_code(const struct block_q6_k *x, int e)
{
	const int hi = e / 128, l = e % 32, quarter = (e % 128) / 32;
	const uint8_t *ql = x->ql + 64 * hi, *qh = x->qh + 32 * hi;
	int low = quarter & 1 ? ql[l + 32] : ql[l];

	low = quarter & 2 ? low >> 4 : low & 0xf;
	return low | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

/* Element E of a row of TYPE, exactly as quant_dequantize_row computes it. */
static __device__ __forceinline__ float rows_dequant(uint32_t type, const uint8_t *row, int64_t e)
{
	switch (type) {
	case QT_F32:
		return reinterpret_cast<const float *>(row)[e];
	case QT_F16:
		return rows_f16(row + 2 * e);
	case QT_BF16:
		return __uint_as_float((unsigned)reinterpret_cast<const unsigned short *>(row)[e] << 16);
	case QT_Q4_0: {
		const uint8_t *b = row + (e / QK) * sizeof(struct block_q4_0);
		const int j = (int)(e % QK);
		const uint8_t q = b[2 + j % (QK / 2)];
		const int c = j < QK / 2 ? q & 0xf : q >> 4;
		return (float)(c - 8) * rows_f16(b);
	}
	case QT_Q4_1: {
		const uint8_t *b = row + (e / QK) * sizeof(struct block_q4_1);
		const int j = (int)(e % QK);
		const uint8_t q = b[4 + j % (QK / 2)];
		const int c = j < QK / 2 ? q & 0xf : q >> 4;
		/* ggml: x0*d + m, two roundings */
		return __fmul_rn((float)c, rows_f16(b)) + rows_f16(b + 2);
	}
	case QT_Q8_0: {
		const uint8_t *b = row + (e / QK) * sizeof(struct block_q8_0);
		return (float)(int8_t)b[2 + e % QK] * rows_f16(b);
	}
	case QT_Q4_K:
	case QT_Q5_K: {
		const int five = type == QT_Q5_K;
		const uint8_t *b = row + (e / QK_K) * (five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k));
		const int el = (int)(e % QK_K), s = el / 32;
		const uint8_t *scales = b + 4; /* after d, dmin in both layouts */
		int sc, m;
		if (s < 4) {
			sc = scales[s] & 63;
			m = scales[s + 4] & 63;
		} else {
			sc = (scales[s + 4] & 0xf) | ((scales[s - 4] >> 6) << 4);
			m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
		}
		const float d1 = rows_f16(b) * (float)sc, m1 = rows_f16(b + 2) * (float)m;
		const int q = five ? rows_q45_k_code(b + 16 + QK_K / 8, b + 16, el)
				   : rows_q45_k_code(b + 16, NULL, el);
		/* ggml: d1*q - m1, two roundings */
		return __fmul_rn(d1, (float)q) - m1;
	}
	case QT_Q6_K: {
		const struct block_q6_k *x = reinterpret_cast<const struct block_q6_k *>(
			row + (e / QK_K) * sizeof(struct block_q6_k));
		const int el = (int)(e % QK_K);
		const float ds = rows_f16(reinterpret_cast<const uint8_t *>(&x->d)) * (float)x->scales[el / 16];
		return ds * (float)(rows_q6_k_code(x, el) - 32);
	}
	default:
		return __uint_as_float(0x7fc00000u);
	}
}

/* Grid (T, chunks of ROWS_THREADS elements): one element per thread.  A row
 * whose id is out of range comes out as NaNs (the CPU backend returns
 * -EINVAL; the ids live on the device here). */
static __global__ void embed_kernel(const uint8_t *__restrict__ w, uint32_t type, int64_t n_in,
	int64_t n_out, size_t row_bytes, const int32_t *__restrict__ ids, float *__restrict__ out)
{
	grid_dep_wait();
	const int64_t t = blockIdx.x;
	const int64_t e = (int64_t)blockIdx.y * ROWS_THREADS + threadIdx.x;
	if (e >= n_in)
		return;
	const int32_t id = ids[t];
	float v;
	if (id < 0 || id >= n_out)
		v = __uint_as_float(0x7fc00000u);
	else
		v = rows_dequant(type, w + (size_t)id * row_bytes, e);
	out[t * n_in + e] = v;
}

/* Elements per block and bytes per block of the types embed takes, or 0. */
static int rows_type_block(uint32_t type, int *ret_bytes)
{
	switch (type) {
	case QT_F32: *ret_bytes = 4; return 1;
	case QT_F16: *ret_bytes = 2; return 1;
	case QT_BF16: *ret_bytes = 2; return 1;
	case QT_Q4_0: *ret_bytes = (int)sizeof(struct block_q4_0); return QK;
	case QT_Q4_1: *ret_bytes = (int)sizeof(struct block_q4_1); return QK;
	case QT_Q8_0: *ret_bytes = (int)sizeof(struct block_q8_0); return QK;
	case QT_Q4_K: *ret_bytes = (int)sizeof(struct block_q4_k); return QK_K;
	case QT_Q5_K: *ret_bytes = (int)sizeof(struct block_q5_k); return QK_K;
	case QT_Q6_K: *ret_bytes = (int)sizeof(struct block_q6_k); return QK_K;
	default: return 0;
	}
}

/* 0 when W's rows are a layout embed and dequant_f16 read (a type they
 * know, whole blocks, aligned rows, at most 65535 chunks of elements),
 * else -ENOTSUP (the type) or -EINVAL. */
static int rows_weight_check(const struct bk_weight *w)
{
	int bytes = 0, blck;

	if (!(blck = rows_type_block(w->type, &bytes)))
		return -ENOTSUP;
	if (w->n_in % blck || w->row_bytes < (size_t)(w->n_in / blck) * (size_t)bytes ||
	    w->row_bytes % 2 || (w->type == QT_F32 && w->row_bytes % 4) ||
	    (w->n_in + ROWS_THREADS - 1) / ROWS_THREADS > 65535)
		return -EINVAL;
	return 0;
}

extern "C" int cuda_embed(const struct bk_weight *w, const int32_t *ids, int32_t T, float *out,
	const struct cuda_launch *lc)
{
	int err;

	if (!w || T < 0 || (T && (!ids || !out || !w->data)) || w->n_in <= 0 || w->n_out <= 0)
		return -EINVAL;
	if ((err = rows_weight_check(w)))
		return err;
	const int64_t chunks = (w->n_in + ROWS_THREADS - 1) / ROWS_THREADS;
	if (!T)
		return 0;
	LAUNCH_ON(lc, embed_kernel, dim3((unsigned)T, (unsigned)chunks), ROWS_THREADS, 0,
		(const uint8_t *)w->data, w->type, w->n_in, w->n_out,
		w->row_bytes, ids, out);
	return rows_launched();
}

/* ---- half-precision copies for cuBLAS ---- */

/* Grid (rows, chunks of ROWS_THREADS elements): element e of weight row
 * ROW0 + blockIdx.x as embed dequantizes it, rounded to f16 (nearest even). */
static __global__ void dequant_f16_kernel(const uint8_t *__restrict__ w, uint32_t type, int64_t n_in,
	size_t row_bytes, int64_t row0, __half *__restrict__ out)
{
	grid_dep_wait();
	const int64_t r = blockIdx.x;
	const int64_t e = (int64_t)blockIdx.y * ROWS_THREADS + threadIdx.x;
	if (e >= n_in)
		return;
	out[r * n_in + e] = __float2half_rn(rows_dequant(type, w + (size_t)(row0 + r) * row_bytes, e));
}

extern "C" int cuda_dequant_f16(const struct bk_weight *w, int64_t row0, int64_t n_rows, void *out,
	const struct cuda_launch *lc)
{
	int err;

	if (!w || !w->data || !out || w->n_in <= 0 || row0 < 0 || n_rows < 0 ||
	    row0 + n_rows > w->n_out || n_rows > 0x7fffffff)
		return -EINVAL;
	if ((err = rows_weight_check(w)))
		return err;
	const int64_t chunks = (w->n_in + ROWS_THREADS - 1) / ROWS_THREADS;
	if (!n_rows)
		return 0;
	LAUNCH_ON(lc, dequant_f16_kernel, dim3((unsigned)n_rows, (unsigned)chunks), ROWS_THREADS, 0,
		(const uint8_t *)w->data, w->type, w->n_in, w->row_bytes, row0,
		(__half *)out);
	return rows_launched();
}

/* Grid-stride: out[i] = x[i] rounded to nearest even f16, or bf16. */
static __global__ void to_half_kernel(const float *__restrict__ x, int64_t n, int bf16, void *out)
{
	grid_dep_wait();
	for (int64_t i = (int64_t)blockIdx.x * ROWS_THREADS + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * ROWS_THREADS) {
		if (bf16)
			reinterpret_cast<__nv_bfloat16 *>(out)[i] = __float2bfloat16_rn(x[i]);
		else
			reinterpret_cast<__half *>(out)[i] = __float2half_rn(x[i]);
	}
}

extern "C" int cuda_to_half(const float *x, int64_t n, int bf16, void *out, const struct cuda_launch *lc)
{
	if (n < 0 || (n && (!x || !out)) || (uintptr_t)out % 2)
		return -EINVAL;
	if (!n)
		return 0;
	int64_t blocks = (n + ROWS_THREADS - 1) / ROWS_THREADS;
	if (blocks > EW_MAX_BLOCKS)
		blocks = EW_MAX_BLOCKS;
	LAUNCH_ON(lc, to_half_kernel, (unsigned)blocks, ROWS_THREADS, 0, x, n, bf16, out);
	return rows_launched();
}

/* ---- rmsnorm ---- */

/* Sum over the block of one double per thread; every thread gets it.  The
 * order (per thread, then xor butterfly per warp, then warps in order) is
 * a function of blockDim only, so every row of every T sums alike. */
static __device__ double rows_block_sum(double v, double *s_warp)
{
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	for (int off = 16; off > 0; off /= 2)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	if (lane == 0)
		s_warp[warp] = v;
	__syncthreads();
	double sum = 0;
	for (int i = 0; i < ROWS_WARPS; i++)
		sum += s_warp[i];
	return sum;
}

/* The norms' first pass over a row, by the block: x += y (thread i taking
 * elements i, i + ROWS_THREADS, ...), then the scale
 * 1 / sqrt(mean(x^2) + eps), the squares summed in double (as ggml and the
 * CPU).  Y NULL: rmsnorm's pass, which only reads x. */
static __device__ float rows_add_scale(float *xr, const float *yr, int64_t n, float eps, double *s_warp)
{
	double part = 0;
	/* ROWS_BATCH elements' loads before their stores (x may alias y:
	 * otherwise each load would wait for the store before it; a 4096-wide
	 * row is one batch), then the same adds in the same order */
	for (int64_t i0 = threadIdx.x; i0 < n; i0 += ROWS_BATCH * ROWS_THREADS) {
		float v[ROWS_BATCH], w[ROWS_BATCH];
UNROLL
		for (int k = 0; k < ROWS_BATCH; k++) {
			const int64_t i = i0 + (int64_t)k * ROWS_THREADS;
			v[k] = i < n ? xr[i] : 0.0f;
			w[k] = yr && i < n ? yr[i] : 0.0f;
		}
UNROLL
		for (int k = 0; k < ROWS_BATCH; k++) {
			const int64_t i = i0 + (int64_t)k * ROWS_THREADS;
			if (i >= n)
				break;
			if (yr) {
				v[k] += w[k];
				xr[i] = v[k];
			}
			part += (double)__fmul_rn(v[k], v[k]);
		}
	}
	const double sum = rows_block_sum(part, s_warp);
	return 1.0f / sqrtf((float)(sum / (double)n) + eps);
}

/* One block per row: the scale (rows_add_scale), then y = (x * scale) * g.
 * Each thread reads and writes the same elements, so OUT may equal X. */
static __global__ void rmsnorm_kernel(const float *x, const float *__restrict__ g, int64_t n,
	float eps, float *out)
{
	grid_dep_wait();
	__shared__ double s_warp[ROWS_WARPS];
	const float *xr = x + (int64_t)blockIdx.x * n;
	float *yr = out + (int64_t)blockIdx.x * n;
	const float scale = rows_add_scale(const_cast<float *>(xr), NULL, n, eps, s_warp);
	for (int64_t i = threadIdx.x; i < n; i += ROWS_THREADS)
		yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), g[i]);
}

extern "C" int cuda_rmsnorm(const float *x, const float *g, int32_t T, int64_t n, float eps,
	float *out, const struct cuda_launch *lc)
{
	if (T < 0 || n <= 0 || (T && (!x || !g || !out)))
		return -EINVAL;
	if (!T)
		return 0;
	LAUNCH_ON(lc, rmsnorm_kernel, (unsigned)T, ROWS_THREADS, 0, x, g, n, eps,
		out);
	return rows_launched();
}

/* add_kernel then rmsnorm_kernel in one block per row: x += y, then
 * out = x / rms(x) * g with the same operations, so the same bits.  Each
 * thread reads y and writes x and out at its own elements only, so OUT may
 * equal Y (the engine norms into the buffer it added from) or X. */
static __global__ void add_rmsnorm_kernel(float *x, const float *y, const float *__restrict__ g,
	int64_t n, float eps, float *out)
{
	grid_dep_wait();
	__shared__ double s_warp[ROWS_WARPS];
	float *xr = x + (int64_t)blockIdx.x * n;
	const float *yr = y + (int64_t)blockIdx.x * n;
	float *o = out + (int64_t)blockIdx.x * n;
	const float scale = rows_add_scale(xr, yr, n, eps, s_warp);
	for (int64_t i = threadIdx.x; i < n; i += ROWS_THREADS)
		o[i] = __fmul_rn(__fmul_rn(xr[i], scale), g[i]);
}

extern "C" int cuda_add_rmsnorm(float *x, const float *y, const float *g, int32_t T, int64_t n,
	float eps, float *out, const struct cuda_launch *lc)
{
	if (T < 0 || n <= 0 || (T && (!x || !y || !g || !out)))
		return -EINVAL;
	if (!T)
		return 0;
	LAUNCH_ON(lc, add_rmsnorm_kernel, (unsigned)T, ROWS_THREADS, 0, x, y, g, n,
		eps, out);
	return rows_launched();
}

/* add_rmsnorm_kernel that also quantizes each row of OUT into Q8_0 or Q8_1
 * (WITH_SUM) blocks at XQ + t * STRIDE, as the matmul's quantizer would
 * (quant_q8.cuh): N a multiple of 32.  Element e is thread e % ROWS_THREADS's
 * in both passes (e = 32 * block + lane, blocks going to the warps in
 * turn), so a thread still touches only its own elements.  Y NULL:
 * rmsnorm_kernel's arithmetic (x only read). */
static __global__ void add_rmsnorm_q8_kernel(float *x, const float *y, const float *__restrict__ g,
	int64_t n, float eps, float *out, int with_sum, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	__shared__ double s_warp[ROWS_WARPS];
	float *xr = x + (int64_t)blockIdx.x * n;
	const float *yr = y ? y + (int64_t)blockIdx.x * n : NULL;
	float *o = out + (int64_t)blockIdx.x * n;
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nb = (int)(n / 32);
	/* the first blocks' g, loaded while the first pass runs */
	float gp[NORM_PRE_Q8];
UNROLL
	for (int j = 0; j < NORM_PRE_Q8; j++) {
		const int b = warp + j * ROWS_WARPS;
		gp[j] = b < nb ? __ldg(&g[(int64_t)b * 32 + lane]) : 0.0f;
	}
	const float scale = rows_add_scale(xr, yr, n, eps, s_warp);
	uint8_t *row = xq + (size_t)blockIdx.x * stride;
	/* NORM_PRE_Q8 blocks' x loaded before any store (OUT may alias X) */
	for (int b0 = warp, j0 = 0; b0 < nb; b0 += NORM_PRE_Q8 * ROWS_WARPS, j0 += NORM_PRE_Q8) {
		float xv[NORM_PRE_Q8];
UNROLL
		for (int j = 0; j < NORM_PRE_Q8; j++) {
			const int b = b0 + j * ROWS_WARPS;
			xv[j] = b < nb ? xr[(int64_t)b * 32 + lane] : 0.0f;
		}
UNROLL
		for (int j = 0; j < NORM_PRE_Q8; j++) {
			const int b = b0 + j * ROWS_WARPS; /* the same for every lane of a warp */
			if (b >= nb)
				continue;
			const int64_t i = (int64_t)b * 32 + lane;
			const float gi = j0 ? __ldg(&g[i]) : gp[j];
			const float v = __fmul_rn(__fmul_rn(xv[j], scale), gi);
			o[i] = v;
			q8_block_store(v, lane, b, nb, (int)n, with_sum, row);
		}
	}
}

/* Lane LANE's elements 8 LANE..8 LANE + 7 of super-block B of the row P
 * into V, zeros where B >= NSB; LDG: through the read-only cache (g, which
 * no thread writes). */
template <bool LDG>
static __device__ __forceinline__ void sb_lane_load(const float *p, int b, int nsb, int lane, float v[8])
{
UNROLL
	for (int k = 0; k < 8; k++) {
		const int64_t i = (int64_t)b * 256 + 8 * lane + k;
		v[k] = b >= nsb ? 0.0f : LDG ? __ldg(&p[i]) : p[i];
	}
}

/* The same into Q8_K super-blocks (N a multiple of 256): each warp takes
 * super-blocks in turn, lane l its elements 8l..8l+7 (q8k_warp_store),
 * after the first pass's barrier (rows_block_sum's), which also makes the
 * elements other threads added visible.  A thread reads x and writes out
 * at the same elements, so OUT may equal X or Y. */
static __global__ void add_rmsnorm_q8k_kernel(float *x, const float *y, const float *__restrict__ g,
	int64_t n, float eps, float *out, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	__shared__ double s_warp[ROWS_WARPS];
	float *xr = x + (int64_t)blockIdx.x * n;
	const float *yr = y ? y + (int64_t)blockIdx.x * n : NULL;
	float *o = out + (int64_t)blockIdx.x * n;
	const int nsb = (int)(n / 256), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	/* the first super-blocks' g, loaded while the first pass runs */
	float gp[NORM_PRE_Q8K][8];
UNROLL
	for (int j = 0; j < NORM_PRE_Q8K; j++)
		sb_lane_load<true>(g, warp + j * ROWS_WARPS, nsb, lane, gp[j]);
	const float scale = rows_add_scale(xr, yr, n, eps, s_warp);
	uint8_t *row = xq + (size_t)blockIdx.x * stride;
	/* NORM_PRE_Q8K super-blocks' x loaded before any store (OUT may alias X) */
	for (int b0 = warp, j0 = 0; b0 < nsb; b0 += NORM_PRE_Q8K * ROWS_WARPS, j0 += NORM_PRE_Q8K) {
		float v[NORM_PRE_Q8K][8];
UNROLL
		for (int j = 0; j < NORM_PRE_Q8K; j++)
			sb_lane_load<false>(xr, b0 + j * ROWS_WARPS, nsb, lane, v[j]);
UNROLL
		for (int j = 0; j < NORM_PRE_Q8K; j++) {
			const int b = b0 + j * ROWS_WARPS; /* the same for every lane of a warp */
			if (b >= nsb)
				continue;
			const int64_t i0 = (int64_t)b * 256 + 8 * lane;
UNROLL
			for (int k = 0; k < 8; k++) {
				const float gi = j0 ? __ldg(&g[i0 + k]) : gp[j][k];
				v[j][k] = __fmul_rn(__fmul_rn(v[j][k], scale), gi);
			}
UNROLL
			for (int k = 0; k < 8; k++)
				o[i0 + k] = v[j][k];
			q8k_warp_store(v[j], lane, b, nsb, (int)n, row);
		}
	}
}

/* cuda_add_rmsnorm_q8, or cuda_rmsnorm_q8 with Y NULL. */
static int rows_norm_q8(float *x, const float *y, const float *g, int32_t T, int64_t n, float eps,
	float *out, uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc)
{
	const size_t need = q8_row_bytes(vec, n);
	if (T < 0 || n <= 0 || n > INT32_MAX || !need || (T && (!x || !g || !out || !xq)) ||
	    stride < need || stride % 16 || (uintptr_t)xq % 16)
		return -EINVAL;
	if (!T)
		return 0;
	if (vec == QT_Q8_K)
		LAUNCH_ON(lc, add_rmsnorm_q8k_kernel, (unsigned)T, ROWS_THREADS, 0, x, y, g, n,
			eps, out, (uint8_t *)xq, stride);
	else
		LAUNCH_ON(lc, add_rmsnorm_q8_kernel, (unsigned)T, ROWS_THREADS, 0, x, y, g, n,
			eps, out, vec == QT_Q8_1 ? 1 : 0, (uint8_t *)xq, stride);
	return rows_launched();
}

extern "C" int cuda_add_rmsnorm_q8(float *x, const float *y, const float *g, int32_t T, int64_t n,
	float eps, float *out, uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc)
{
	if (T > 0 && !y)
		return -EINVAL;
	return rows_norm_q8(x, y, g, T, n, eps, out, vec, xq, stride, lc);
}

extern "C" int cuda_rmsnorm_q8(const float *x, const float *g, int32_t T, int64_t n, float eps,
	float *out, uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc)
{
	/* with no y the kernels only read x */
	return rows_norm_q8(const_cast<float *>(x), NULL, g, T, n, eps, out, vec, xq, stride, lc);
}

/* ---- rope ---- */

/* One block per row: the cos/sin table of its position into dynamic
 * shared memory first (rope.cuh), then every head's pairs. */
static __global__ void rope_kernel(float *x, int32_t n_head, int32_t head_dim, int32_t n_rot,
	const int32_t *__restrict__ pos, rope_angles ra, int neox)
{
	grid_dep_wait();
	DYN_SHARED(float2, cs);
	const int64_t t = blockIdx.x;
	rope_table(cs, pos[t], n_rot / 2, ra);
	__syncthreads();
	rope_rotate(x + t * n_head * head_dim, cs, n_head, head_dim, n_rot / 2, neox);
}

extern "C" int cuda_rope(float *x, int32_t T, int32_t n_head, int32_t head_dim, const int32_t *pos,
	const struct bk_rope *rp, const struct cuda_launch *lc)
{
	if (!rp)
		return -EINVAL;
	const int32_t n_rot = rp->n_rot;
	if (T < 0 || n_head < 0 || head_dim < 0 || n_rot < 0 || n_rot > head_dim || n_rot % 2 ||
	    n_rot > ROPE_MAX_ROT || (rp->style != BK_ROPE_NORMAL && rp->style != BK_ROPE_NEOX) ||
	    (int64_t)n_head * (n_rot / 2) > INT32_MAX)
		return -EINVAL;
	if (!T || !n_head || !n_rot)
		return 0;
	if (!x || !pos)
		return -EINVAL;
	LAUNCH_ON(lc, rope_kernel, (unsigned)T, ROWS_THREADS, (size_t)(n_rot / 2) * sizeof(float2),
		x, n_head, head_dim, n_rot, pos, rope_angles_of(rp, rp->freq_factors),
		rp->style == BK_ROPE_NEOX);
	return rows_launched();
}

/* ---- swiglu, add ---- */

/* silu(A) * U, as the CPU backend: one expression for every kernel here,
 * so the same bits. */
static __device__ __forceinline__ float swiglu_of(float a, float u)
{
	return a / (1.0f + expf(-a)) * u;
}

/* gelu(A) * U, as the CPU backend's gelu_of: x - x / (e^2y + 1), y =
 * sqrt(2/pi) (x + 0.044715 x^3), every rounding spelt out (no FMA). */
static __device__ __forceinline__ float geglu_of(float a, float u)
{
	const float y = __fmul_rn(1.5957691216057308f,
				  __fmul_rn(a, __fadd_rn(1.0f, __fmul_rn(0.044715f, __fmul_rn(a, a)))));
	return __fmul_rn(__fsub_rn(a, __fdiv_rn(a, __fadd_rn(expf(y), 1.0f))), u);
}

/* The gated activation ACT (enum bk_act) of A, times U. */
template <int ACT>
static __device__ __forceinline__ float glu_of(float a, float u)
{
	return ACT == BK_ACT_GELU ? geglu_of(a, u) : swiglu_of(a, u);
}

/* Grid-stride over N; OUT may equal G (each element read before written by one thread). */
template <int ACT>
static __global__ void swiglu_kernel(const float *g, const float *__restrict__ u, int64_t n,
	float *out)
{
	grid_dep_wait();
	const int64_t stride = (int64_t)gridDim.x * ROWS_THREADS;
	for (int64_t k = (int64_t)blockIdx.x * ROWS_THREADS + threadIdx.x; k < n; k += stride) {
		out[k] = glu_of<ACT>(g[k], u[k]);
	}
}

/* swiglu_kernel over T rows of N_IN (a multiple of 32) that also quantizes
 * out's rows as add_rmsnorm_q8_kernel does: one warp per 32-element block,
 * lane i taking element i (ROWS_WARPS blocks per block of the grid). */
template <int ACT>
static __global__ void swiglu_q8_kernel(const float *g, const float *__restrict__ u, int n_in,
	int64_t n_blocks, float *out, int with_sum, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	const int64_t gw = (int64_t)blockIdx.x * ROWS_WARPS + threadIdx.x / 32;
	const int lane = threadIdx.x % 32, nb = n_in / 32;
	if (gw >= n_blocks) /* whole warps only */
		return;
	const int64_t k = gw * 32 + lane, t = gw / nb;
	const float v = glu_of<ACT>(g[k], u[k]);
	out[k] = v;
	q8_block_store(v, lane, (int)(gw % nb), nb, n_in, with_sum, xq + (size_t)t * stride);
}

/* The same into Q8_K (N_IN a multiple of 256): one block per super-block,
 * thread i taking its element i. */
template <int ACT>
static __global__ void swiglu_q8k_kernel(const float *g, const float *__restrict__ u, int n_in,
	float *out, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	__shared__ float s_ax[Q8K_THREADS / 32], s_v[Q8K_THREADS / 32];
	const int nsb = n_in / 256;
	const int64_t t = blockIdx.x / nsb, b = blockIdx.x % nsb;
	const int64_t k = t * n_in + b * 256 + threadIdx.x;
	const float v = glu_of<ACT>(g[k], u[k]);
	out[k] = v;
	q8k_block_store(v, (int)b, nsb, n_in, xq + (size_t)t * stride, s_ax, s_v);
}

static __global__ void add_kernel(float *x, const float *__restrict__ y, int64_t n)
{
	grid_dep_wait();
	const int64_t stride = (int64_t)gridDim.x * ROWS_THREADS;
	for (int64_t k = (int64_t)blockIdx.x * ROWS_THREADS + threadIdx.x; k < n; k += stride)
		x[k] += y[k];
}

static __global__ void scale_kernel(float *x, int64_t n, float sc)
{
	grid_dep_wait();
	const int64_t stride = (int64_t)gridDim.x * ROWS_THREADS;
	for (int64_t k = (int64_t)blockIdx.x * ROWS_THREADS + threadIdx.x; k < n; k += stride)
		x[k] = __fmul_rn(x[k], sc);
}

/* x (T, N) += b (N) on every row. */
static __global__ void add_bias_kernel(float *x, const float *__restrict__ b, int64_t total, int64_t n)
{
	grid_dep_wait();
	const int64_t stride = (int64_t)gridDim.x * ROWS_THREADS;
	for (int64_t k = (int64_t)blockIdx.x * ROWS_THREADS + threadIdx.x; k < total; k += stride)
		x[k] = __fadd_rn(x[k], b[k % n]);
}

static unsigned rows_ew_blocks(int64_t n)
{
	const int64_t b = (n + ROWS_THREADS - 1) / ROWS_THREADS;
	return (unsigned)(b < EW_MAX_BLOCKS ? b : EW_MAX_BLOCKS);
}

extern "C" int cuda_glu(int act, const float *g, const float *u, int64_t n, float *out,
			const struct cuda_launch *lc)
{
	if (n < 0 || (n && (!g || !u || !out)) || (act != BK_ACT_SILU && act != BK_ACT_GELU))
		return -EINVAL;
	if (!n)
		return 0;
	if (act == BK_ACT_GELU)
		LAUNCH_ON(lc, swiglu_kernel<BK_ACT_GELU>, rows_ew_blocks(n), ROWS_THREADS, 0, g, u, n, out);
	else
		LAUNCH_ON(lc, swiglu_kernel<BK_ACT_SILU>, rows_ew_blocks(n), ROWS_THREADS, 0, g, u, n, out);
	return rows_launched();
}

extern "C" int cuda_swiglu(const float *g, const float *u, int64_t n, float *out, const struct cuda_launch *lc)
{
	return cuda_glu(BK_ACT_SILU, g, u, n, out, lc);
}

extern "C" int cuda_glu_q8(int act, const float *g, const float *u, int32_t T, int64_t n_in, float *out,
			   uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc)
{
	const size_t need = q8_row_bytes(vec, n_in);
	if (T < 0 || n_in <= 0 || n_in > INT32_MAX || !need || (T && (!g || !u || !out || !xq)) ||
	    stride < need || stride % 16 || (uintptr_t)xq % 16 || (act != BK_ACT_SILU && act != BK_ACT_GELU))
		return -EINVAL;
	const int64_t n_blocks = (int64_t)T * (n_in / (vec == QT_Q8_K ? 256 : 32));
	const int64_t grid = vec == QT_Q8_K ? n_blocks : (n_blocks + ROWS_WARPS - 1) / ROWS_WARPS;
	if (grid > 0x7fffffff)
		return -EINVAL;
	if (!T)
		return 0;
#define GLU_Q8(ACT)                                                                                    \
	do {                                                                                           \
		if (vec == QT_Q8_K)                                                                    \
			LAUNCH_ON(lc, swiglu_q8k_kernel<ACT>, (unsigned)grid, ROWS_THREADS, 0, g, u,   \
				  (int)n_in, out, (uint8_t *)xq, stride);                              \
		else                                                                                   \
			LAUNCH_ON(lc, swiglu_q8_kernel<ACT>, (unsigned)grid, ROWS_THREADS, 0, g, u,    \
				  (int)n_in, n_blocks, out, vec == QT_Q8_1 ? 1 : 0, (uint8_t *)xq, stride); \
	} while (0)
	if (act == BK_ACT_GELU)
		GLU_Q8(BK_ACT_GELU);
	else
		GLU_Q8(BK_ACT_SILU);
#undef GLU_Q8
	return rows_launched();
}

extern "C" int cuda_swiglu_q8(const float *g, const float *u, int32_t T, int64_t n_in, float *out,
	uint32_t vec, void *xq, size_t stride, const struct cuda_launch *lc)
{
	return cuda_glu_q8(BK_ACT_SILU, g, u, T, n_in, out, vec, xq, stride, lc);
}

extern "C" int cuda_add(float *x, const float *y, int64_t n, const struct cuda_launch *lc)
{
	if (n < 0 || (n && (!x || !y)))
		return -EINVAL;
	if (!n)
		return 0;
	LAUNCH_ON(lc, add_kernel, rows_ew_blocks(n), ROWS_THREADS, 0, x, y, n);
	return rows_launched();
}

extern "C" int cuda_scale(float *x, int64_t n, float sc, const struct cuda_launch *lc)
{
	if (n < 0 || (n && !x))
		return -EINVAL;
	if (!n)
		return 0;
	LAUNCH_ON(lc, scale_kernel, rows_ew_blocks(n), ROWS_THREADS, 0, x, n, sc);
	return rows_launched();
}

extern "C" int cuda_add_bias(float *x, const float *b, int32_t T, int64_t n, const struct cuda_launch *lc)
{
	if (T < 0 || n < 0 || (T && n && (!x || !b)))
		return -EINVAL;
	if (!T || !n)
		return 0;
	LAUNCH_ON(lc, add_bias_kernel, rows_ew_blocks((int64_t)T * n), ROWS_THREADS, 0, x, b, (int64_t)T * n, n);
	return rows_launched();
}
