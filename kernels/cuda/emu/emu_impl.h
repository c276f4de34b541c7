/* emu_impl.h - what the CUDA emulator's own files share: the scheduler's
 * entry for running a grid (emu.cc), stream work and device-memory checks
 * (emu_host.cc), settings, the API lock and diagnostics (emu_settings.cc).
 * Not for kernels or callers.
 */
#ifndef LLMD_CUDA_EMU_IMPL_H
#define LLMD_CUDA_EMU_IMPL_H

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_runtime.h"

namespace cuda_emu {

/* ---- settings (environment first, then the cuda_emu_* calls), emu_settings.cc ---- */
struct settings {
	enum cuda_emu_order order; /* thread order */
	unsigned long long seed;   /* random order's seed */
	size_t stack_bytes;        /* per fiber */
	size_t mem_total;          /* bytes cudaMemGetInfo reports */
	bool quiet;                /* no diagnostic lines */
	unsigned long long fault_at; /* kernel runs until a planted fault: the
	                                fault_at-th from now fails; 0 = none */
};
/* Read from the environment at the first call; change under api_lock(). */
settings &config();

/* Every host API call holds it, and a whole kernel launch runs under it. */
std::mutex &api_lock();

/* Prints "cuda-emu: <message>" on stderr (unless quiet) and keeps it as the
 * calling thread's last diagnostic. */
void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the scheduler (emu.cc) ---- */
/* One kernel launch as submitted, and as a captured graph keeps it. */
struct launch_rec {
	std::shared_ptr<const kernel_call> call; /* kernel + arguments by value */
	const void *kernel = nullptr;            /* its address (attributes) */
	const char *name = "";                   /* the kernel as written at LAUNCH */
	const char *file = "";                   /* the LAUNCH's site */
	int line = 0;
	dim3 grid, block;
	size_t smem = 0;                         /* dynamic shared memory, bytes */
};

/* Runs every block of L, one after another, on the calling thread; returns
 * cudaSuccess or cudaErrorLaunchFailure after a __trap().  A deadlock or an
 * invalid collective prints a report and aborts the process.  The caller
 * holds api_lock() and has checked L's configuration. */
cudaError_t run_launch(const launch_rec &l);

/* True while this OS thread runs kernel code (a fiber). */
bool in_kernel();

/* ---- stream work (emu_host.cc) ---- */
/* A piece of stream work: run at once, or kept as a node of a graph. */
struct work {
	enum kind { KERNEL, MEMCPY, MEMSET, EVENT, HOST_FN } kind = KERNEL;
	launch_rec launch = {};            /* KERNEL */
	void *dst = nullptr;               /* MEMCPY, MEMSET */
	const void *src = nullptr;         /* MEMCPY */
	size_t count = 0;                  /* MEMCPY, MEMSET: bytes */
	int memcpy_kind = 0;               /* MEMCPY: enum cudaMemcpyKind */
	int value = 0;                     /* MEMSET */
	cudaEvent_t event = nullptr;       /* EVENT */
	std::function<cudaError_t()> fn;   /* HOST_FN: a library call (cuBLAS) */
	const char *what = "";             /* the API call, for messages */
	const char *file = nullptr;        /* its call site when known */
	int line = 0;
};

/* Runs W on STREAM now, or appends it to STREAM's capture; the caller holds
 * api_lock().  Returns the call's error (not yet recorded as the last one). */
cudaError_t enqueue(cudaStream_t stream, work &&w);

/* True when [P, P + N) lies inside one live cudaMalloc allocation; else
 * false with the reason in *WHY.  Caller holds api_lock(). */
bool device_range(const void *p, size_t n, std::string *why);

/* Makes E the sticky error every later call returns (a device fault). */
void set_sticky(cudaError_t e);

/* The sticky error, or cudaSuccess. */
cudaError_t sticky_error();

} // namespace cuda_emu

#endif
