/* emu_selftest.cu - small kernels that exercise the CUDA emulator's
 * barriers, shuffles, dp4a, atomics and dynamic shared memory; also the
 * smallest example of the kernels/cuda layout (static kernels, extern "C"
 * launchers, LAUNCH and DYN_SHARED).  Not part of the backend.
 */
#include "cuda_compat.h"
#include "cuda_mma.h"

#include <errno.h>

#include "emu_selftest.h"

#define BLOCK_SUM_THREADS 256

/* Tree reduction of one 256-element slice per block in shared memory. */
static __global__ void block_sum_kernel(const float *__restrict__ x, float *__restrict__ out)
{
	grid_dep_wait();
	__shared__ float s[BLOCK_SUM_THREADS];
	const int t = threadIdx.x;
	s[t] = x[blockIdx.x * BLOCK_SUM_THREADS + t];
	__syncthreads();
	for (int stride = BLOCK_SUM_THREADS / 2; stride > 0; stride /= 2) {
		if (t < stride)
			s[t] += s[t + stride];
		__syncthreads();
	}
	if (t == 0)
		out[blockIdx.x] = s[0];
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int off = 16; off > 0; off /= 2)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

/* One warp per 32 elements; every lane ends with the sum, lane 0 stores it. */
static __global__ void warp_sum_kernel(const float *__restrict__ x, int n_warps,
	float *__restrict__ out)
{
	grid_dep_wait();
	const int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
	const int lane = threadIdx.x % 32;
	if (w >= n_warps) /* whole warps only: the mask below names all 32 lanes */
		return;
	const float v = warp_sum(x[w * 32 + lane]);
	if (lane == 0)
		out[w] = v;
}

/* Each thread takes 4 int8 pairs with one __dp4a; a warp reduces, lane 0 adds. */
static __global__ void dot_i8_kernel(const int *__restrict__ a, const int *__restrict__ b,
	int n4, int *__restrict__ out)
{
	grid_dep_wait();
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	int v = i < n4 ? __dp4a(__ldg(&a[i]), __ldg(&b[i]), 0) : 0;
	for (int off = 16; off > 0; off /= 2)
		v += __shfl_down_sync(0xffffffffu, v, off);
	if (threadIdx.x % 32 == 0)
		atomicAdd(out, v);
}

/* A block-private histogram in shared memory, merged with global atomics. */
static __global__ void histogram_kernel(const uint8_t *__restrict__ x, int n,
	unsigned *__restrict__ hist)
{
	grid_dep_wait();
	__shared__ unsigned local[256];
	for (int i = threadIdx.x; i < 256; i += blockDim.x)
		local[i] = 0;
	__syncthreads();
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
		atomicAdd(&local[x[i]], 1u);
	__syncthreads();
	for (int i = threadIdx.x; i < 256; i += blockDim.x)
		if (local[i])
			atomicAdd(&hist[i], local[i]);
}

/* One block per row: the row goes into dynamic shared memory and back out
 * reversed. */
static __global__ void reverse_rows_kernel(const float *__restrict__ x, int n,
	float *__restrict__ out)
{
	grid_dep_wait();
	DYN_SHARED(float, row);
	const float *src = x + (size_t)blockIdx.x * n;
	float *dst = out + (size_t)blockIdx.x * n;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		row[i] = src[i];
	__syncthreads();
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		dst[i] = row[n - 1 - i];
}

static int launched(void)
{
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

extern "C" int emu_selftest_block_sum(const float *x, int n_blocks, float *out,
	cudaStream_t stream)
{
	if (n_blocks <= 0)
		return -EINVAL;
	LAUNCH(block_sum_kernel, n_blocks, BLOCK_SUM_THREADS, 0, stream, x, out);
	return launched();
}

extern "C" int emu_selftest_warp_sum(const float *x, int n_warps, float *out,
	cudaStream_t stream)
{
	if (n_warps <= 0)
		return -EINVAL;
	const int threads = 128;
	const int blocks = (n_warps * 32 + threads - 1) / threads;
	LAUNCH(warp_sum_kernel, blocks, threads, 0, stream, x, n_warps, out);
	return launched();
}

extern "C" int emu_selftest_dot_i8(const int8_t *a, const int8_t *b, int n, int *out,
	cudaStream_t stream)
{
	if (n <= 0 || n % 4)
		return -EINVAL;
	const int n4 = n / 4, threads = 64;
	const int blocks = (n4 + threads - 1) / threads;
	if (cudaMemsetAsync(out, 0, sizeof *out, stream) != cudaSuccess)
		return -EIO;
	LAUNCH(dot_i8_kernel, blocks, threads, 0, stream, (const int *)a, (const int *)b, n4, out);
	return launched();
}

extern "C" int emu_selftest_histogram(const uint8_t *x, int n, unsigned *hist,
	cudaStream_t stream)
{
	if (n <= 0)
		return -EINVAL;
	const int threads = 96;
	int blocks = (n + threads - 1) / threads;
	if (blocks > 8)
		blocks = 8;
	LAUNCH(histogram_kernel, blocks, threads, 0, stream, x, n, hist);
	return launched();
}

extern "C" int emu_selftest_reverse_rows(const float *x, int rows, int n, float *out,
	cudaStream_t stream)
{
	if (rows <= 0 || n <= 0 || n > 1024)
		return -EINVAL;
	const int threads = n < 128 ? 32 : 128;
	LAUNCH(reverse_rows_kernel, rows, threads, n * sizeof(float), stream, x, n, out);
	return launched();
}
