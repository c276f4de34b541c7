/* emu_selftest.h - a few small kernels that exercise the CUDA emulator:
 * what tests/emu_test_selftest.cc checks and tests/emu_nvcc.sh compiles
 * with nvcc.  Not part of the backend.
 *
 * Every function takes device pointers, launches on STREAM and returns 0 or
 * a negative errno (-EINVAL for bad sizes, -EIO when the launch failed).
 */
#ifndef LLMD_EMU_SELFTEST_H
#define LLMD_EMU_SELFTEST_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[b] = sum of x[b * 256 .. b * 256 + 255] (n_blocks blocks of 256, shared memory). */
int emu_selftest_block_sum(const float *x, int n_blocks, float *out, cudaStream_t stream);

/* out[w] = sum of x[w * 32 .. w * 32 + 31] (n_warps warps, __shfl_xor_sync). */
int emu_selftest_warp_sum(const float *x, int n_warps, float *out, cudaStream_t stream);

/* *out = sum of a[i] * b[i] over n int8 (n a multiple of 4, __dp4a, atomicAdd). */
int emu_selftest_dot_i8(const int8_t *a, const int8_t *b, int n, int *out, cudaStream_t stream);

/* hist[v] += number of bytes equal to v in x[0..n) (hist: 256 counters). */
int emu_selftest_histogram(const uint8_t *x, int n, unsigned *hist, cudaStream_t stream);

/* out[r * n + i] = x[r * n + n - 1 - i]: each row reversed through dynamic
 * shared memory (n <= 1024). */
int emu_selftest_reverse_rows(const float *x, int rows, int n, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
