/* cuda_bench.h - what the GPU benchmarks (tools/cuda_mm_bench.cc,
 * tools/cuda_ops_bench.cc) share: CK(call), a CUDA runtime call that ends
 * the program with its error and the call's text.  Each defines BENCH_NAME
 * (its program name) before it includes this. */
#ifndef LLMD_CUDA_BENCH_H
#define LLMD_CUDA_BENCH_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CK(call)                                                                                \
	do {                                                                                    \
		cudaError_t e_ = (call);                                                        \
		if (e_ != cudaSuccess) {                                                        \
			fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #call, cudaGetErrorString(e_)); \
			exit(1);                                                                \
		}                                                                               \
	} while (0)

#endif
