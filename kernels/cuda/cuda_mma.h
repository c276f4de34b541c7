/* cuda_mma.h - the one place for tensor-core (mma.sync, wgmma) and other
 * inline-PTX code in kernels/cuda.
 *
 * Every helper here has two branches: the device one under
 * `#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= <arch>` (inline PTX or
 * <mma.h>), and a portable one in plain CUDA C++ that computes the same
 * result element by element.  The emulator never defines __CUDA_ARCH__, so
 * it runs the portable branch, and a test compares it with the CPU backend;
 * nvcc builds for sm_80 and sm_90 compile the device branch.  A fragment's
 * layout (which lane holds which element) must be the same in both branches,
 * so code around a helper cannot tell them apart.
 *
 * No helper is needed yet; this is the portable branch's shape:
 *
 *   static __device__ __forceinline__ float mma_dot4_f16(__half2 a0, __half2 a1,
 *                                                        __half2 b0, __half2 b1, float c)
 *   {
 *   #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
 *       ... asm volatile("mma.sync.aligned...") ...
 *   #else
 *       return c + __low2float(a0) * __low2float(b0) + ... ;
 *   #endif
 *   }
 */
#ifndef LLMD_CUDA_MMA_H
#define LLMD_CUDA_MMA_H

#include "cuda_compat.h"

#endif
