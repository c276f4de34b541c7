/* norm_q8.cuh - a row's RMSNorm by one block, with the residual add before
 * it and the quantization for the next matmul after it: rows.cu's norm
 * kernels (a block of NORM_THREADS threads a row) and the matmul launch
 * that ends in the same add + norm (matmul.cu, mm_norm_tail: its blocks
 * have NORM_THREADS / V threads, each playing V of the NORM_THREADS).
 *
 * The bits depend on the order of the sum of squares, so every caller
 * keeps NORM_THREADS' order whatever its block: virtual thread u takes
 * elements u, u + NORM_THREADS, ... in that order; its virtual warp
 * (u / 32) sums the 32 by an xor butterfly; the block adds the
 * NORM_WARPS warps' sums in order.  Thread i of a block of
 * NORM_THREADS / V plays the virtual threads i + j * (NORM_THREADS / V),
 * j < V: its lane is their lane, and its warp w plays virtual warps
 * w + j * (NORM_WARPS / V).  So a row has the same bits from either
 * kernel.  Each virtual thread writes x and out at its own elements in
 * the Q8_0/Q8_1 pass too (element e = 32 * block + lane, blocks going to
 * the virtual warps in turn), so OUT may equal X or Y; the Q8_K pass
 * reads x (and writes out) after the sum's barrier, which also makes the
 * elements other threads added visible. */
#ifndef LLMD_NORM_Q8_CUH
#define LLMD_NORM_Q8_CUH

#include "quant_q8.cuh"

#define NORM_THREADS 256 /* the threads whose order every norm's sum keeps */
#define NORM_WARPS (NORM_THREADS / 32)

/* Sum over the block of one double per virtual thread (PART[j] virtual
 * thread j's of this thread); every thread gets it.  S_WARP: shared
 * memory for NORM_WARPS doubles, free again once every thread has read
 * the sum (a caller that reuses it first waits at a barrier). */
template <int V>
static __device__ __forceinline__ double norm_block_sum(const double *part, double *s_warp)
{
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
UNROLL
	for (int j = 0; j < V; j++) {
		double v = part[j];
		for (int off = 16; off > 0; off /= 2)
			v += __shfl_xor_sync(0xffffffffu, v, off);
		if (lane == 0)
			s_warp[warp + j * (NORM_WARPS / V)] = v;
	}
	__syncthreads();
	double sum = 0;
	for (int i = 0; i < NORM_WARPS; i++)
		sum += s_warp[i];
	return sum;
}

/* Y's element I, read through L2 only when CG (Y written by other blocks
 * of the same launch: mm_norm_tail). */
template <bool CG>
static __device__ __forceinline__ float norm_ld(const float *y, int64_t i)
{
	return CG ? __ldcg(&y[i]) : y[i];
}

/* The first pass over a row: x += y, then the scale
 * 1 / sqrt(mean(x^2) + eps), the squares summed in double (as ggml and
 * the CPU).  B elements a virtual thread loads before their stores (x may
 * alias y: otherwise each load would wait for the store before it).
 * Y NULL: rmsnorm's pass, which only reads x. */
template <int V, int B, bool CG>
static __device__ __forceinline__ float norm_add_scale(float *xr, const float *yr, int64_t n, float eps,
	double *s_warp)
{
	const int us = NORM_THREADS / V; /* from one of a thread's virtual threads to the next */
	double part[V];
UNROLL
	for (int j = 0; j < V; j++)
		part[j] = 0;
	for (int64_t i0 = threadIdx.x; i0 < n; i0 += (int64_t)B * NORM_THREADS) {
		float v[V][B], w[V][B];
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int k = 0; k < B; k++) {
				const int64_t i = i0 + j * us + (int64_t)k * NORM_THREADS;
				v[j][k] = i < n ? xr[i] : 0.0f;
				w[j][k] = yr && i < n ? norm_ld<CG>(yr, i) : 0.0f;
			}
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int k = 0; k < B; k++) {
				const int64_t i = i0 + j * us + (int64_t)k * NORM_THREADS;
				if (i >= n)
					break;
				if (yr) {
					v[j][k] += w[j][k];
					xr[i] = v[j][k];
				}
				part[j] += (double)__fmul_rn(v[j][k], v[j][k]);
			}
	}
	const double sum = norm_block_sum<V>(part, s_warp);
	return 1.0f / sqrtf((float)(sum / (double)n) + eps);
}

/* A row of N (a multiple of 32) normed: x += y (Y not NULL), out =
 * x / rms(x) * g, and out quantized into Q8_0 or Q8_1 (WITH_SUM) blocks
 * at ROW, as the matmul's quantizer would (quant_q8.cuh).  B as for
 * norm_add_scale; P blocks a virtual warp whose g it loads before the
 * first pass (in registers through it), and whose x it loads at once
 * after it, for each of its virtual warps; P 0: one block at a time, no g
 * early. */
template <int V, int B, int P, bool CG>
static __device__ __forceinline__ void norm_row_q8(float *xr, const float *yr, const float *__restrict__ g,
	int64_t n, float eps, float *o, int with_sum, uint8_t *row, double *s_warp)
{
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nb = (int)(n / 32);
	const int ws = NORM_WARPS / V; /* from one of a warp's virtual warps to the next */
	const int np = P ? P : 1;      /* blocks at once */
	float gp[V][P ? P : 1];
UNROLL
	for (int j = 0; j < V; j++)
UNROLL
		for (int p = 0; p < P; p++) {
			const int b = warp + j * ws + p * NORM_WARPS;
			gp[j][p] = b < nb ? __ldg(&g[(int64_t)b * 32 + lane]) : 0.0f;
		}
	const float scale = norm_add_scale<V, B, CG>(xr, yr, n, eps, s_warp);
	/* a round: NP blocks of each of the thread's virtual warps, every x
	 * loaded before any store (OUT may alias X) */
	for (int b0 = warp, p0 = 0; b0 < nb; b0 += np * NORM_WARPS, p0 += np) {
		float xv[V][P ? P : 1];
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int p = 0; p < np; p++) {
				const int b = b0 + j * ws + p * NORM_WARPS;
				xv[j][p] = b < nb ? xr[(int64_t)b * 32 + lane] : 0.0f;
			}
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int p = 0; p < np; p++) {
				const int b = b0 + j * ws + p * NORM_WARPS; /* the same for every lane of a warp */
				if (b >= nb)
					continue;
				const int64_t i = (int64_t)b * 32 + lane;
				const float gi = P && !p0 ? gp[j][p] : __ldg(&g[i]);
				const float v = __fmul_rn(__fmul_rn(xv[j][p], scale), gi);
				o[i] = v;
				q8_block_store(v, lane, b, nb, (int)n, with_sum, row);
			}
	}
}

/* The same into Q8_K super-blocks (N a multiple of 256): each virtual warp
 * takes super-blocks in turn, lane l its elements 8l..8l+7
 * (q8k_warp_store); P super-blocks a virtual warp as for norm_row_q8. */
template <int V, int B, int P, bool CG>
static __device__ __forceinline__ void norm_row_q8k(float *xr, const float *yr, const float *__restrict__ g,
	int64_t n, float eps, float *o, uint8_t *row, double *s_warp)
{
	const int nsb = (int)(n / 256), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int ws = NORM_WARPS / V, np = P ? P : 1;
	float gp[V][P ? P : 1][8];
UNROLL
	for (int j = 0; j < V; j++)
UNROLL
		for (int p = 0; p < P; p++) {
			const int b = warp + j * ws + p * NORM_WARPS;
UNROLL
			for (int k = 0; k < 8; k++)
				gp[j][p][k] = b < nsb ? __ldg(&g[(int64_t)b * 256 + 8 * lane + k]) : 0.0f;
		}
	const float scale = norm_add_scale<V, B, CG>(xr, yr, n, eps, s_warp);
	/* a round as norm_row_q8's */
	for (int b0 = warp, p0 = 0; b0 < nsb; b0 += np * NORM_WARPS, p0 += np) {
		float v[V][P ? P : 1][8];
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int p = 0; p < np; p++) {
				const int b = b0 + j * ws + p * NORM_WARPS;
UNROLL
				for (int k = 0; k < 8; k++)
					v[j][p][k] = b < nsb ? xr[(int64_t)b * 256 + 8 * lane + k] : 0.0f;
			}
UNROLL
		for (int j = 0; j < V; j++)
UNROLL
			for (int p = 0; p < np; p++) {
				const int b = b0 + j * ws + p * NORM_WARPS; /* the same for every lane of a warp */
				if (b >= nsb)
					continue;
				const int64_t i0 = (int64_t)b * 256 + 8 * lane;
UNROLL
				for (int k = 0; k < 8; k++) {
					const float gi = P && !p0 ? gp[j][p][k] : __ldg(&g[i0 + k]);
					v[j][p][k] = __fmul_rn(__fmul_rn(v[j][p][k], scale), gi);
				}
UNROLL
				for (int k = 0; k < 8; k++)
					o[i0 + k] = v[j][p][k];
				q8k_warp_store(v[j][p], lane, b, nsb, (int)n, row);
			}
	}
}

#endif
