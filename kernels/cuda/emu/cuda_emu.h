/* cuda_emu.h - the controls of llmd's CUDA emulator, callable from C.
 *
 * The emulator runs our CUDA kernels' own source on the CPU: one fiber per
 * CUDA thread, barriers and warp collectives scheduled exactly, a checked
 * host API.  It is a test tool, not a backend: it prints a diagnostic line
 * ("cuda-emu: ...") on stderr for every call it refuses and aborts with a
 * report on a kernel bug it can see (deadlock, bad collective).  Everything
 * here is also reachable through <cuda_runtime.h> from the stand-in headers.
 *
 * Environment, read at the first call:
 *   CUDA_EMU_ORDER=forward|reverse|random[:seed]  thread order (default forward)
 *   CUDA_EMU_MEM_MB=N       device memory cudaMemGetInfo reports (default 16384)
 *   CUDA_EMU_STACK_KB=N     stack per CUDA thread (default 256; 1024 under ASan)
 *   CUDA_EMU_QUIET=1        no diagnostic lines (the last one is still kept)
 *   CUDA_EMU_FAULT_LAUNCH=N the Nth kernel run of the process fails like a
 *                           device fault (see cuda_emu_plant_fault)
 */
#ifndef LLMD_CUDA_EMU_H
#define LLMD_CUDA_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The order in which a block's runnable threads are picked: forward and
 * reverse go round-robin by linear thread index, random draws uniformly
 * among the runnable ones from a seeded generator. */
enum cuda_emu_order {
	CUDA_EMU_ORDER_FORWARD = 0,
	CUDA_EMU_ORDER_REVERSE = 1,
	CUDA_EMU_ORDER_RANDOM = 2,
};

/* Sets the thread order for the following launches; SEED matters for
 * random only.  Any host thread, between launches. */
void cuda_emu_set_order(enum cuda_emu_order order, unsigned long long seed);

/* The current order; its seed in *RET_SEED when not NULL. */
enum cuda_emu_order cuda_emu_get_order(unsigned long long *ret_seed);

/* Prints every live cudaMalloc allocation (pointer, size, call site) on
 * stderr and returns how many there are.  Also run at exit. */
size_t cuda_emu_check_leaks(void);

/* Bytes currently allocated with cudaMalloc. */
size_t cuda_emu_bytes_allocated(void);

/* 1 when [P, P + SIZE) lies inside one live cudaMalloc allocation, else 0. */
int cuda_emu_is_device_range(const void *p, size_t size);

/* Plants a device fault: the Nth kernel run from now (1 = the next launch,
 * or graph node, to run) does not run and fails as a kernel that trapped
 * would: cudaErrorLaunchFailure, sticky until cudaDeviceReset.  0 removes a
 * planted fault.  For tests of what a caller does when the device fails
 * mid-work.  Any host thread, between launches. */
void cuda_emu_plant_fault(unsigned long long n);

/* Stops (1) or resumes (0) printing diagnostic lines. */
void cuda_emu_set_quiet(int quiet);

/* The last diagnostic line of this host thread ("" when none), valid until
 * its next emulator call. */
const char *cuda_emu_last_diagnostic(void);

/* Kernel launches and fibers switched since the process started: a measure
 * of the emulator's own work, for tests and benchmarks. */
void cuda_emu_stats(unsigned long long *ret_launches, unsigned long long *ret_switches);

#ifdef __cplusplus
}
#endif

#endif
