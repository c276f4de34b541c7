/* cuda_compat.h - the one header every .cu file under kernels/cuda includes
 * first: it makes the same source build with nvcc and, for tests, as C++
 * against the CUDA emulator's stand-in headers (g++ -x c++ -I kernels/cuda/emu).
 *
 * Two rules keep that possible, and a test (tests/emu_layout.sh) fails
 * on any .cu or header under kernels/cuda that breaks them:
 *   - every launch goes through LAUNCH(): no raw triple chevrons;
 *   - dynamic shared memory is declared with DYN_SHARED(): no raw
 *     `extern __shared__`.
 * Tensor-core and inline-PTX code lives in cuda_mma.h only, behind a
 * portable branch the emulator runs.  No spin-waits and no implicit warp
 * lockstep: the emulator schedules threads only at barriers and collectives
 * and would hang on the first and expose the second.
 */
#ifndef LLMD_CUDA_COMPAT_H
#define LLMD_CUDA_COMPAT_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>

#ifdef __CUDACC__

/* LAUNCH(kernel, grid, block, smem_bytes, stream, args...): a kernel launch;
 * check it with cudaGetLastError() as usual.  A template kernel whose
 * arguments hold a comma goes in parentheses: LAUNCH((k<float, 4>), ...). */
#define LAUNCH(kernel, grid, block, smem, stream, ...) \
	kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)

/* DYN_SHARED(type, name): inside a kernel, `type *name` pointing at the
 * launch's dynamic shared memory (16-byte aligned; one buffer per launch,
 * whatever type each kernel views it as). */
#define DYN_SHARED(type, name) \
	extern __shared__ __align__(16) unsigned char cuda_compat_dyn_smem_[]; \
	type *name = reinterpret_cast<type *>(cuda_compat_dyn_smem_)

#else /* the emulator */

#ifndef CUDA_EMU
#error "cuda_compat.h: outside nvcc, build with -I kernels/cuda/emu (the CUDA emulator)"
#endif

/* Copies the arguments (converted to the kernel's parameter types), then
 * runs the grid at once, or records it when STREAM is capturing. */
#define LAUNCH(kernel, grid, block, smem, stream, ...) \
	::cuda_emu::launch(#kernel, __FILE__, __LINE__, kernel, (grid), (block), (smem), (stream), \
		##__VA_ARGS__)

/* The emulator backs it with an allocation of exactly the launch's size, so
 * ASan reports an overrun; every block finds it filled with 0xff bytes. */
#define DYN_SHARED(type, name) type *name = reinterpret_cast<type *>(::cuda_emu::dyn_shared())

#endif

#endif
