/* cuda_compat.h - the one header every .cu file under kernels/cuda includes
 * first: it makes the same source build with nvcc and, for tests, as C++
 * against the CUDA emulator's stand-in headers (g++ -x c++ -I kernels/cuda/emu).
 *
 * Three rules keep that possible (and launches safe to overlap), and a
 * test (tests/emu_layout.sh) fails on any .cu or header under kernels/cuda
 * that breaks them:
 *   - every launch goes through LAUNCH() (or LAUNCH_PDL()): no raw triple
 *     chevrons;
 *   - dynamic shared memory is declared with DYN_SHARED(): no raw
 *     `extern __shared__`;
 *   - every kernel's body begins with grid_dep_wait() (cuda_mma.h), or
 *     grid_dep_wait_prefetch(), which asks L2 for some of its data first.
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

/* UNROLL before a loop of constant trip count unrolls it (its arrays stay
 * in registers); UNROLL4 unrolls one of any trip count by 4 (so that the
 * loads of 4 iterations issue before the first's arithmetic waits on
 * them); ROLLED keeps one rolled.  g++ (the emulator) knows none of these
 * pragmas: all are empty there. */
#define UNROLL _Pragma("unroll")
#define UNROLL4 _Pragma("unroll 4")
#define ROLLED _Pragma("unroll 1")

/* A launch of K as LAUNCH's; with PDL (programmatic dependent launch, sm_90
 * and up), through cudaLaunchKernelEx with programmatic stream
 * serialization, so that K's blocks may start before its predecessor's
 * have all finished: every kernel's first statement is grid_dep_wait()
 * (cuda_mma.h), which holds it until the predecessor has completed and its
 * writes are visible. */
template <typename... P, typename... A>
static inline void cuda_compat_launch(int pdl, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
	cudaStream_t st, A &&...args)
{
	if (!pdl) {
		k<<<grid, block, smem, st>>>(static_cast<A &&>(args)...);
		return;
	}
	cudaLaunchAttribute attr[1];
	attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	attr[0].val.programmaticStreamSerializationAllowed = 1;
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = st;
	cfg.attrs = attr;
	cfg.numAttrs = 1;
	cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
}

/* LAUNCH(kernel, grid, block, smem_bytes, stream, args...): a kernel launch;
 * check it with cudaGetLastError() as usual.  A template kernel whose
 * arguments hold a comma goes in parentheses: LAUNCH((k<float, 4>), ...). */
#define LAUNCH(kernel, grid, block, smem, stream, ...) \
	cuda_compat_launch(0, kernel, (grid), (block), (smem), (stream), ##__VA_ARGS__)

/* LAUNCH_PDL(pdl, kernel, ...): LAUNCH, overlapping the kernel before it in
 * the stream when PDL is not 0 (the launchers: cuda_launch_pdl(), cuda_ops.h). */
#define LAUNCH_PDL(pdl, kernel, grid, block, smem, stream, ...) \
	cuda_compat_launch((pdl), kernel, (grid), (block), (smem), (stream), ##__VA_ARGS__)

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

/* The emulator runs every launch after the one before: PDL changes nothing. */
#define LAUNCH_PDL(pdl, kernel, grid, block, smem, stream, ...) \
	::cuda_emu::launch(#kernel, __FILE__, __LINE__, kernel, (grid), (block), (smem), (stream), \
		##__VA_ARGS__)

/* The emulator backs it with an allocation of exactly the launch's size, so
 * ASan reports an overrun; every block finds it filled with 0xff bytes. */
#define DYN_SHARED(type, name) type *name = reinterpret_cast<type *>(::cuda_emu::dyn_shared())

#define UNROLL
#define UNROLL4
#define ROLLED

#endif

#endif
