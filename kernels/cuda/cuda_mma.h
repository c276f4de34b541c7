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
 * Helpers:
 *   mma_s8_m16n8k32  D += A * B on signed bytes, int32 sums (sm_80+).
 */
#ifndef LLMD_CUDA_MMA_H
#define LLMD_CUDA_MMA_H

#include "cuda_compat.h"

/* D = A * B + D for one 16 x 8 tile over k = 32, signed bytes into int32:
 * mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, all 32 lanes of the warp
 * together (every lane calls it, converged).  Lane 4g + q holds, in PTX's
 * fragment layout for this shape (each int: 4 bytes, the lowest k first):
 *   A (16 x 32, by rows):    a[0] = A[g][4q..4q+3],       a[1] = A[g+8][4q..4q+3],
 *                            a[2] = A[g][16+4q..16+4q+3], a[3] = A[g+8][16+4q..16+4q+3]
 *   B (32 x 8, by columns):  b[0] = B[4q..4q+3][g],       b[1] = B[16+4q..16+4q+3][g]
 *   D (16 x 8):              d[0] = D[g][2q], d[1] = D[g][2q+1], d[2] = D[g+8][2q], d[3] = D[g+8][2q+1]
 * The sums are exact (32 products of at most 128 * 128 each), so both
 * branches give the same integers whatever order they add in.  The portable
 * one fetches the row and column pieces this lane needs from their lanes
 * with 32 shuffles and takes dp4a dot products. */
static __device__ __forceinline__ void mma_s8_m16n8k32(int d[4], const int a[4], const int b[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
	const unsigned full = 0xffffffffu;
	const int lane = (int)(threadIdx.x % 32), g = lane / 4, q = lane % 4;
	for (int k = 0; k < 4; k++) { /* the pieces at k = 4k.. and 16+4k.. */
		const int la = 4 * g + k, lb0 = 4 * (2 * q) + k, lb1 = 4 * (2 * q + 1) + k;
		const int r0 = __shfl_sync(full, a[0], la), r1 = __shfl_sync(full, a[1], la);
		const int r2 = __shfl_sync(full, a[2], la), r3 = __shfl_sync(full, a[3], la);
		const int c00 = __shfl_sync(full, b[0], lb0), c01 = __shfl_sync(full, b[1], lb0);
		const int c10 = __shfl_sync(full, b[0], lb1), c11 = __shfl_sync(full, b[1], lb1);
		d[0] = __dp4a(r2, c01, __dp4a(r0, c00, d[0]));
		d[1] = __dp4a(r2, c11, __dp4a(r0, c10, d[1]));
		d[2] = __dp4a(r3, c01, __dp4a(r1, c00, d[2]));
		d[3] = __dp4a(r3, c11, __dp4a(r1, c10, d[3]));
	}
#endif
}

#endif
