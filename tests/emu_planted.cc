/* emu_planted.cc - kernels with planted bugs, one per mode, that the CUDA
 * emulator must catch; run as a child by test_emu_deadlock, test_emu_asan
 * and test_emu_tsan (this file is built plain, with ASan and with TSan).
 * Also "ok": correct kernels of the same shapes, which must pass clean.
 * Exit 0 when the kernel ran without being stopped, 2 for a bad mode.
 */
#include "cuda_compat.h"

#include <stdio.h>
#include <string.h>

#define N 64

/* Threads 0-39 wait at one barrier, 40-63 at another: a barrier in
 * divergent code, which never completes on a GPU. */
static __global__ void divergent_barrier_kernel(int *out)
{
	__shared__ int s[N];
	s[threadIdx.x] = 1;
	if (threadIdx.x < 40)
		__syncthreads();
	else
		__syncthreads();
	out[threadIdx.x] = s[N - 1 - threadIdx.x];
}

/* Lanes 16-31 have returned, yet the shuffle's mask names them. */
static __global__ void shfl_exited_kernel(int *out)
{
	if (threadIdx.x % 32 >= 16)
		return;
	out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

/* Half a warp at __syncthreads, the other half at a full-warp shuffle. */
static __global__ void barrier_vs_shfl_kernel(int *out)
{
	int v = threadIdx.x;
	if (threadIdx.x < 16)
		__syncthreads();
	else
		v = __shfl_sync(0xffffffffu, v, 0);
	out[threadIdx.x] = v;
}

/* One past the end of a static __shared__ array. */
static __global__ void shared_oob_kernel(const float *x, float *out)
{
	__shared__ float s[N];
	s[threadIdx.x + (threadIdx.x == N - 1)] = x[threadIdx.x];
	__syncthreads();
	out[threadIdx.x] = s[threadIdx.x];
}

/* One past the end of the dynamic shared memory the launch asked for. */
static __global__ void dyn_oob_kernel(const float *x, float *out)
{
	DYN_SHARED(float, s);
	s[threadIdx.x + 1] = x[threadIdx.x];
	__syncthreads();
	out[threadIdx.x] = s[threadIdx.x];
}

/* Each thread writes its slot and reads its neighbour's: with the barrier
 * (SYNC) correct, without it a race on shared memory. */
static __global__ void neighbour_kernel(int sync, const float *x, float *out)
{
	__shared__ float s[N];
	s[threadIdx.x] = x[threadIdx.x];
	if (sync)
		__syncthreads();
	out[threadIdx.x] = s[(threadIdx.x + 1) % N];
}

/* The same within a warp: __syncwarp orders shared memory (no race), a
 * shuffle does not (a race: CUDA says shuffles imply no memory barrier). */
static __global__ void warp_neighbour_kernel(int use_syncwarp, const float *x, float *out)
{
	__shared__ float s[N];
	s[threadIdx.x] = x[threadIdx.x];
	if (use_syncwarp)
		__syncwarp();
	else
		(void)__shfl_sync(0xffffffffu, 0, 0);
	out[threadIdx.x] = s[(threadIdx.x & ~31u) + ((threadIdx.x + 1) & 31)];
}

/* Correct patterns TSan must accept: a reduction with barriers, atomics, a
 * shuffle reduction, data handed from one block to the next launch. */
static __global__ void clean_kernel(const float *x, float *out, int *count)
{
	__shared__ float s[N];
	const int t = threadIdx.x;
	s[t] = x[blockIdx.x * N + t];
	__syncthreads();
	for (int stride = N / 2; stride > 0; stride /= 2) {
		if (t < stride)
			s[t] += s[t + stride];
		__syncthreads();
	}
	float w = x[blockIdx.x * N + t];
	for (int off = 16; off > 0; off /= 2)
		w += __shfl_xor_sync(0xffffffffu, w, off);
	atomicAdd(count, 1);
	if (t == 0)
		out[blockIdx.x] = s[0] + w;
}

static int deep(int n, volatile char *sink)
{
	volatile char pad[4096];
	pad[0] = (char)n;
	*sink = pad[0];
	return n > 0 ? deep(n - 1, sink) + pad[0] : 0;
}

/* Recursion far past the fiber's stack: the guard page must stop it. */
static __global__ void stack_overflow_kernel(int *out)
{
	volatile char sink;
	out[threadIdx.x] = deep(1 << 20, &sink);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	float hx[4 * N];
	for (int i = 0; i < 4 * N; i++)
		hx[i] = (float)i;
	float *x = NULL, *out = NULL;
	int *iout = NULL;
	if (!strcmp(mode, "probe"))
		return 0;
	cudaMalloc(&x, sizeof hx);
	cudaMalloc(&out, sizeof hx);
	cudaMalloc(&iout, N * sizeof(int));
	cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
	cudaMemset(iout, 0, N * sizeof(int));

	if (!strcmp(mode, "divergent-barrier"))
		LAUNCH(divergent_barrier_kernel, 1, N, 0, 0, iout);
	else if (!strcmp(mode, "shfl-exited-lane"))
		LAUNCH(shfl_exited_kernel, 1, N, 0, 0, iout);
	else if (!strcmp(mode, "barrier-vs-shfl"))
		LAUNCH(barrier_vs_shfl_kernel, 1, 32, 0, 0, iout);
	else if (!strcmp(mode, "shared-oob"))
		LAUNCH(shared_oob_kernel, 1, N, 0, 0, x, out);
	else if (!strcmp(mode, "dyn-shared-oob"))
		LAUNCH(dyn_oob_kernel, 1, N, N * sizeof(float), 0, x, out);
	else if (!strcmp(mode, "missing-syncthreads"))
		LAUNCH(neighbour_kernel, 1, N, 0, 0, 0, x, out);
	else if (!strcmp(mode, "shfl-is-no-barrier"))
		LAUNCH(warp_neighbour_kernel, 1, N, 0, 0, 0, x, out);
	else if (!strcmp(mode, "stack-overflow"))
		LAUNCH(stack_overflow_kernel, 1, 1, 0, 0, iout);
	else if (!strcmp(mode, "ok")) {
		for (int rep = 0; rep < 2; rep++) {
			LAUNCH(neighbour_kernel, 1, N, 0, 0, 1, x, out);
			LAUNCH(warp_neighbour_kernel, 1, N, 0, 0, 1, x, out);
			LAUNCH(clean_kernel, 4, N, 0, 0, x, out, iout);
			LAUNCH(neighbour_kernel, 1, N, 0, 0, 1, out, x);
		}
		int count = 0;
		cudaMemcpy(&count, iout, sizeof count, cudaMemcpyDeviceToHost);
		if (count != 2 * 4 * N) {
			fprintf(stderr, "emu_planted ok: count %d\n", count);
			return 1;
		}
	} else {
		fprintf(stderr, "emu_planted: unknown mode \"%s\"\n", mode);
		return 2;
	}
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		e = cudaGetLastError();
	cudaFree(x);
	cudaFree(out);
	cudaFree(iout);
	if (e != cudaSuccess) {
		fprintf(stderr, "emu_planted %s: %s\n", mode, cudaGetErrorString(e));
		return 1;
	}
	return 0;
}
