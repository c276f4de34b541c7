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
 *   grid_dep_wait    the first statement of every kernel: waits for the
 *                    kernel before it in the stream when the launch let
 *                    the two overlap, then lets the next one launch
 *                    (griddepcontrol, sm_90).
 *   grid_dep_wait_prefetch
 *                    the same, after asking L2 for data the kernel will
 *                    read (prefetch.global.L2, sm_80+).
 */
#ifndef LLMD_CUDA_MMA_H
#define LLMD_CUDA_MMA_H

#include "cuda_compat.h"

#include <stdint.h> /* uintptr_t (grid_dep_wait_prefetch) */

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
 * one has every lane publish its fragments in shared memory, then read the
 * row and column pieces it needs (two __syncwarp rather than 32 shuffles:
 * the emulator switches fibers at each) and take dp4a dot products. */
static __device__ __forceinline__ void mma_s8_m16n8k32(int d[4], const int a[4], const int b[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
	/* the warp's fragments through shared memory: one rendezvous to
	 * publish them, one before the next call may overwrite them */
	__shared__ int mma_frag[32][32][6]; /* [warp][lane]: a[0..3], b[0..1] */
	const unsigned tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
	const int lane = (int)(tid % 32), w = (int)(tid / 32 % 32), g = lane / 4, q = lane % 4;
	for (int i = 0; i < 4; i++)
		mma_frag[w][lane][i] = a[i];
	mma_frag[w][lane][4] = b[0];
	mma_frag[w][lane][5] = b[1];
	__syncwarp();
	for (int k = 0; k < 4; k++) { /* the pieces at k = 4k.. and 16+4k.. */
		const int *r = mma_frag[w][4 * g + k], *c0 = mma_frag[w][4 * (2 * q) + k],
			  *c1 = mma_frag[w][4 * (2 * q + 1) + k];
		d[0] = __dp4a(r[2], c0[5], __dp4a(r[0], c0[4], d[0]));
		d[1] = __dp4a(r[2], c1[5], __dp4a(r[0], c1[4], d[1]));
		d[2] = __dp4a(r[3], c0[5], __dp4a(r[1], c0[4], d[2]));
		d[3] = __dp4a(r[3], c1[5], __dp4a(r[1], c1[4], d[3]));
	}
	__syncwarp();
#endif
}

/* Holds the calling thread until the grids its launch depends on have
 * completed and their writes are visible (at once when the launch was an
 * ordinary one), then lets the kernel after it in the stream launch.  A
 * launch with programmatic stream serialization (LAUNCH_PDL,
 * cuda_compat.h) may start once every block of the kernel before it has
 * passed this point, so every kernel calls it before anything else: the
 * next kernel's blocks take SMs as this one's drain, and still read
 * nothing before it has finished.  The emulator runs launches one after
 * another: nothing to wait for. */
static __device__ __forceinline__ void grid_dep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* grid_dep_wait, after the calling warp has asked L2 for the BYTES bytes at
 * P (nothing when P is NULL or BYTES 0): data the kernel will read that the
 * kernels before it do not write, weights say, so that a launch overlapping
 * its predecessor's tail (LAUNCH_PDL) has its first reads on their way
 * while it waits.  A prefetch changes no value.  Every lane of the warp
 * calls it with the same P and BYTES (lane i the 128-byte lines i, i + 32,
 * ... from P's line); [P, P + BYTES) lies in one allocation, which the
 * emulator checks (a launch that breaks it traps).  It may be a kernel's
 * first statement in grid_dep_wait's place (tests/emu_layout.sh). */
static __device__ __forceinline__ void grid_dep_wait_prefetch(const void *p, int bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	if (p && bytes > 0) {
		const char *end = static_cast<const char *>(p) + bytes;
		for (const char *l = reinterpret_cast<const char *>((uintptr_t)p & ~(uintptr_t)127) +
				     128 * (threadIdx.x % 32);
		     l < end; l += 32 * 128)
			asm volatile("prefetch.global.L2 [%0];" ::"l"(l));
	}
#elif defined(CUDA_EMU)
	if (p && bytes > 0 && !::cuda_emu::device_range(p, (size_t)bytes))
		__trap();
#endif
	grid_dep_wait();
}

#endif
