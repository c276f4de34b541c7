/* emu_host.cc - the CUDA emulator's host API: tracked device memory,
 * checked copies, synchronous streams, events, graph capture and replay,
 * errors (last and sticky).
 *
 * Not a driver: device memory is host memory with a ledger, streams run
 * their work at the call, one device.  What it adds over a GPU is checking:
 * every refused call says why on stderr ("cuda-emu: ..."), leaks are
 * listed at exit, copies must match the side each pointer is on.
 */
#include "emu_impl.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <vector>

/* The call-site macros of cuda_runtime.h; the plain functions are below. */
#undef cudaMalloc
#undef cudaFree
#undef cudaMemcpy
#undef cudaMemcpyAsync
#undef cudaMemset
#undef cudaMemsetAsync

struct CUstream_st {
	unsigned flags;              /* cudaStreamNonBlocking or 0 */
	bool capturing;              /* between BeginCapture and EndCapture */
	bool invalidated;            /* the capture failed; EndCapture says so */
	int mode;                    /* enum cudaStreamCaptureMode */
	pthread_t thread;            /* who began the capture */
	struct CUgraph_st *graph;    /* being built; owned until EndCapture */
};

struct CUevent_st {
	unsigned flags;              /* cudaEventDisableTiming etc. */
	bool recorded;
	long long ns;                /* CLOCK_MONOTONIC at the last record */
};

struct CUgraph_st {
	std::vector<cuda_emu::work> nodes; /* in capture order; run in that order */
};

struct CUgraphExec_st {
	std::vector<cuda_emu::work> nodes; /* a copy of the graph's at instantiation */
};

namespace cuda_emu {
namespace {

#define FILL_LIMIT (256u << 20) /* bytes of a new allocation filled with 0xff */
#define FREED_HISTORY 4096      /* freed allocations remembered for messages */
#define DYN_SMEM_DEFAULT (48 * 1024)
#define DYN_SMEM_OPTIN (227 * 1024)

struct alloc {
	size_t size;                 /* bytes asked for */
	const char *file;            /* cudaMalloc's call site */
	int line;
	unsigned long long seq;      /* allocation order, for the leak list */
};

struct freed {
	uintptr_t start;
	size_t size;
	const char *file;            /* cudaFree's call site */
	int line;
};

struct host_state {
	std::map<uintptr_t, alloc> allocs;      /* live device allocations by start */
	std::deque<freed> freed_list;           /* the last FREED_HISTORY frees */
	std::set<void *> host_allocs;           /* cudaMallocHost */
	size_t bytes;                           /* sum of live allocation sizes */
	unsigned long long seq;
	std::set<CUstream_st *> streams;
	std::set<CUevent_st *> events;
	std::set<CUgraph_st *> graphs;
	std::set<CUgraphExec_st *> execs;
	std::map<const void *, int> max_dyn_smem; /* cudaFuncSetAttribute, by kernel */
	cudaError_t sticky;                     /* a device fault; every call returns it */
	bool leak_check_at_exit;
};

static host_state &H()
{
	static host_state *h = new host_state();
	return *h;
}

static thread_local cudaError_t last_error;

/* Records E as the thread's last error when it is one; returns E. */
static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

[[noreturn]] static void called_from_kernel(const char *what)
{
	fprintf(stderr, "cuda-emu: %s called from device code\n", what);
	abort();
}

#define API_ENTER(what) \
	if (in_kernel()) \
		called_from_kernel(what); \
	std::lock_guard<std::mutex> api_guard_(api_lock()); \
	if (H().sticky) \
		return ret(H().sticky)

static std::string site(const char *file, int line)
{
	char b[512];
	if (!file)
		return "(unknown site)";
	snprintf(b, sizeof b, "%s:%d", file, line);
	return b;
}

static std::string describe_ptr(const void *p)
{
	char b[512];
	uintptr_t a = (uintptr_t)p;
	host_state &h = H();
	auto it = h.allocs.upper_bound(a);
	if (it != h.allocs.begin()) {
		--it;
		if (a < it->first + it->second.size) {
			snprintf(b, sizeof b, "%zu bytes into the %zu-byte allocation made at %s",
				(size_t)(a - it->first), it->second.size,
				site(it->second.file, it->second.line).c_str());
			return b;
		}
	}
	for (auto f = h.freed_list.rbegin(); f != h.freed_list.rend(); ++f)
		if (a >= f->start && a < f->start + (f->size ? f->size : 1)) {
			snprintf(b, sizeof b, "in a %zu-byte allocation freed at %s", f->size,
				site(f->file, f->line).c_str());
			return b;
		}
	return "host memory";
}

enum side { SIDE_HOST, SIDE_DEVICE, SIDE_DEVICE_OVERRUN };

static side classify(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	auto it = H().allocs.upper_bound(a);
	if (it == H().allocs.begin())
		return SIDE_HOST;
	--it;
	if (a >= it->first + it->second.size)
		return SIDE_HOST;
	return n <= it->first + it->second.size - a ? SIDE_DEVICE : SIDE_DEVICE_OVERRUN;
}

static const char *kind_name(int kind)
{
	static const char *const n[] = { "HostToHost", "HostToDevice", "DeviceToHost",
		"DeviceToDevice", "Default" };
	return kind >= 0 && kind <= 4 ? n[kind] : "invalid";
}

/* Checks one side of a copy: WANT_DEVICE -1 for either (cudaMemcpyDefault). */
static cudaError_t check_side(const char *role, const void *p, size_t n, int want_device,
	const work &w)
{
	side s = classify(p, n);
	std::string where = site(w.file, w.line);
	if (s == SIDE_DEVICE_OVERRUN) {
		diag("%s(%s) at %s: %s range [%p, +%zu) runs past the end of its allocation (%s)",
			w.what, kind_name(w.memcpy_kind), where.c_str(), role, p, n,
			describe_ptr(p).c_str());
		return cudaErrorInvalidValue;
	}
	if (want_device == 1 && s != SIDE_DEVICE) {
		diag("%s(%s) at %s: %s %p is not device memory (%s)", w.what,
			kind_name(w.memcpy_kind), where.c_str(), role, p, describe_ptr(p).c_str());
		return cudaErrorInvalidValue;
	}
	if (want_device == 0 && s != SIDE_HOST) {
		diag("%s(%s) at %s: %s %p is device memory (%s), not host memory", w.what,
			kind_name(w.memcpy_kind), where.c_str(), role, p, describe_ptr(p).c_str());
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

static cudaError_t check_memcpy(const work &w)
{
	int k = w.memcpy_kind;
	if (k < cudaMemcpyHostToHost || k > cudaMemcpyDefault) {
		diag("%s at %s: %d is not a cudaMemcpyKind", w.what, site(w.file, w.line).c_str(), k);
		return cudaErrorInvalidMemcpyDirection;
	}
	if (w.count == 0)
		return cudaSuccess;
	if (!w.dst || !w.src) {
		diag("%s(%s) at %s: NULL %s", w.what, kind_name(k), site(w.file, w.line).c_str(),
			!w.dst ? "destination" : "source");
		return cudaErrorInvalidValue;
	}
	int dst_dev = k == cudaMemcpyDefault ? -1 : (k == cudaMemcpyHostToDevice ||
		k == cudaMemcpyDeviceToDevice);
	int src_dev = k == cudaMemcpyDefault ? -1 : (k == cudaMemcpyDeviceToHost ||
		k == cudaMemcpyDeviceToDevice);
	cudaError_t e = check_side("destination", w.dst, w.count, dst_dev, w);
	if (!e)
		e = check_side("source", w.src, w.count, src_dev, w);
	if (e)
		return e;
	uintptr_t d = (uintptr_t)w.dst, s = (uintptr_t)w.src;
	if (d < s + w.count && s < d + w.count) {
		diag("%s(%s) at %s: source and destination overlap", w.what, kind_name(k),
			site(w.file, w.line).c_str());
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

static long long now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Does W now.  A kernel fault becomes the sticky error. */
static cudaError_t run_work(const work &w)
{
	switch (w.kind) {
	case work::KERNEL: {
		if (config().fault_at && --config().fault_at == 0) {
			diag("kernel %s launched at %s:%d: the planted device fault (cuda_emu_plant_fault, "
				"CUDA_EMU_FAULT_LAUNCH)", w.launch.name, w.launch.file, w.launch.line);
			set_sticky(cudaErrorLaunchFailure);
			return cudaErrorLaunchFailure;
		}
		cudaError_t e = run_launch(w.launch);
		if (e == cudaErrorLaunchFailure)
			set_sticky(e);
		return e;
	}
	case work::MEMCPY: {
		cudaError_t e = check_memcpy(w);
		if (!e && w.count)
			memcpy(w.dst, w.src, w.count);
		return e;
	}
	case work::MEMSET:
		if (w.count == 0)
			return cudaSuccess;
		if (classify(w.dst, w.count) != SIDE_DEVICE) {
			diag("%s at %s: [%p, +%zu) is not inside one device allocation (%s)", w.what,
				site(w.file, w.line).c_str(), w.dst, w.count, describe_ptr(w.dst).c_str());
			return cudaErrorInvalidValue;
		}
		memset(w.dst, w.value, w.count);
		return cudaSuccess;
	case work::EVENT:
		w.event->recorded = true;
		w.event->ns = now_ns();
		return cudaSuccess;
	case work::HOST_FN:
		return w.fn();
	}
	return cudaErrorUnknown;
}

static bool is_legacy(cudaStream_t s)
{
	return s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/* A capture that forbids "potentially unsafe" calls (a legacy-stream
 * copy, an allocation, a device-wide synchronization) by this thread. */
static CUstream_st *forbidding_capture()
{
	for (CUstream_st *s : H().streams)
		if (s->capturing && (s->mode == cudaStreamCaptureModeGlobal ||
			(s->mode == cudaStreamCaptureModeThreadLocal &&
			pthread_equal(s->thread, pthread_self()))))
			return s;
	return NULL;
}

/* Refuses an unsafe call during a capture, invalidating that capture as
 * CUDA does; returns the error or cudaSuccess. */
static cudaError_t unsafe_call(const char *what, const char *file, int line, cudaError_t err)
{
	CUstream_st *s = forbidding_capture();
	if (!s)
		return cudaSuccess;
	diag("%s at %s: not allowed while stream %p is capturing (mode %d); the capture is "
		"invalidated", what, site(file, line).c_str(), (void *)s, s->mode);
	s->invalidated = true;
	return err;
}

static cudaError_t check_stream(cudaStream_t s)
{
	if (is_legacy(s) || H().streams.count(s))
		return cudaSuccess;
	diag("stream %p is not a live stream", (void *)s);
	return cudaErrorInvalidResourceHandle;
}

static void free_graph_nodes(std::vector<work> &nodes) { nodes.clear(); }

static void report_leaks_at_exit()
{
	cuda_emu_check_leaks();
}

} // namespace

/* For device code (grid_dep_wait_prefetch): a kernel runs while its
 * launch holds the API lock, so nothing changes the allocations meanwhile,
 * and it may not take the lock itself. */
bool device_range(const void *p, size_t n)
{
	return classify(p, n) == SIDE_DEVICE;
}

void set_sticky(cudaError_t e)
{
	if (!H().sticky)
		H().sticky = e;
	last_error = e;
}

cudaError_t sticky_error() { return H().sticky; }

bool device_range(const void *p, size_t n, std::string *why)
{
	if (classify(p, n) == SIDE_DEVICE)
		return true;
	if (why) {
		char b[600];
		snprintf(b, sizeof b, "[%p, +%zu) is not inside one device allocation (%s)", p, n,
			describe_ptr(p).c_str());
		*why = b;
	}
	return false;
}

cudaError_t enqueue(cudaStream_t stream, work &&w)
{
	cudaError_t e = check_stream(stream);
	if (e)
		return e;
	if (is_legacy(stream)) {
		CUstream_st *s = forbidding_capture();
		if (s) {
			diag("%s at %s: work on the legacy stream while stream %p is capturing; the "
				"capture is invalidated", w.what, site(w.file, w.line).c_str(), (void *)s);
			s->invalidated = true;
			return cudaErrorStreamCaptureImplicit;
		}
		return run_work(w);
	}
	if (!stream->capturing)
		return run_work(w);
	if (stream->invalidated)
		return cudaErrorStreamCaptureInvalidated;
	/* Check what can be checked now; the replay checks again. */
	if (w.kind == work::MEMCPY && (e = check_memcpy(w)) != cudaSuccess) {
		stream->invalidated = true;
		return e;
	}
	if (w.kind == work::MEMSET && w.count && classify(w.dst, w.count) != SIDE_DEVICE) {
		diag("%s at %s: [%p, +%zu) is not inside one device allocation (%s)", w.what,
			site(w.file, w.line).c_str(), w.dst, w.count, describe_ptr(w.dst).c_str());
		stream->invalidated = true;
		return cudaErrorInvalidValue;
	}
	stream->graph->nodes.push_back(std::move(w));
	return cudaSuccess;
}

void submit(std::shared_ptr<const kernel_call> call, const void *kernel, const char *name,
	const char *file, int line, dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
{
	if (in_kernel())
		called_from_kernel("a kernel launch");
	std::lock_guard<std::mutex> g(api_lock());
	host_state &h = H();
	if (h.sticky) {
		last_error = h.sticky;
		return;
	}
	unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
	if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
		grid.z > 65535 || !threads || block.x > 1024 || block.y > 1024 || block.z > 64 ||
		threads > 1024) {
		diag("kernel %s launched at %s:%d: invalid configuration grid (%u,%u,%u) block "
			"(%u,%u,%u)", name, file, line, grid.x, grid.y, grid.z, block.x, block.y, block.z);
		last_error = cudaErrorInvalidConfiguration;
		return;
	}
	auto a = h.max_dyn_smem.find(kernel);
	size_t limit = a != h.max_dyn_smem.end() ? (size_t)a->second : DYN_SMEM_DEFAULT;
	if (smem > limit) {
		diag("kernel %s launched at %s:%d: %zu bytes of dynamic shared memory exceed its "
			"limit of %zu (raise it with cudaFuncSetAttribute, at most %d)", name, file, line,
			smem, limit, DYN_SMEM_OPTIN);
		last_error = cudaErrorInvalidValue;
		return;
	}
	work w;
	w.kind = work::KERNEL;
	w.launch = launch_rec{ std::move(call), kernel, name, file, line, grid, block, smem };
	w.what = "kernel launch";
	w.file = file;
	w.line = line;
	cudaError_t e = enqueue(stream, std::move(w));
	if (e)
		last_error = e;
}

cudaError_t copy_symbol(void *symbol, size_t symbol_size, void *host, size_t count, size_t offset,
	int kind, bool to_symbol)
{
	const char *what = to_symbol ? "cudaMemcpyToSymbol" : "cudaMemcpyFromSymbol";
	API_ENTER(what);
	cudaError_t e = unsafe_call(what, NULL, 0, cudaErrorStreamCaptureUnsupported);
	if (e)
		return ret(e);
	if (offset > symbol_size || count > symbol_size - offset) {
		diag("%s: bytes [%zu, +%zu) are outside the %zu-byte symbol", what, offset, count,
			symbol_size);
		return ret(cudaErrorInvalidValue);
	}
	/* The other side: host memory, or device memory for DeviceToDevice. */
	int want_device = kind == cudaMemcpyDeviceToDevice ? 1 : kind == cudaMemcpyDefault ? -1 : 0;
	bool kind_ok = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDefault ||
		kind == (to_symbol ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
	if (!kind_ok)
		return ret(cudaErrorInvalidMemcpyDirection);
	work w;
	w.what = what;
	w.memcpy_kind = kind;
	if (count && (!host || (e = check_side(to_symbol ? "source" : "destination", host, count,
		want_device, w)) != cudaSuccess))
		return ret(host ? e : cudaErrorInvalidValue);
	if (count) {
		if (to_symbol)
			memcpy((char *)symbol + offset, host, count);
		else
			memcpy(host, (char *)symbol + offset, count);
	}
	return cudaSuccess;
}

} // namespace cuda_emu

using namespace cuda_emu;

/* ---- errors ---- */
extern "C" const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
#define N(x) case x: return #x;
	N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
	N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
	N(cudaErrorInvalidPitchValue) N(cudaErrorInvalidSymbol) N(cudaErrorInvalidDevicePointer)
	N(cudaErrorInvalidMemcpyDirection) N(cudaErrorInvalidDeviceFunction) N(cudaErrorNoDevice)
	N(cudaErrorInvalidDevice) N(cudaErrorInvalidKernelImage) N(cudaErrorInvalidResourceHandle)
	N(cudaErrorIllegalState) N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
	N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchTimeout) N(cudaErrorAssert)
	N(cudaErrorLaunchFailure) N(cudaErrorNotPermitted) N(cudaErrorNotSupported)
	N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated)
	N(cudaErrorStreamCaptureMerge) N(cudaErrorStreamCaptureUnmatched)
	N(cudaErrorStreamCaptureUnjoined) N(cudaErrorStreamCaptureIsolation)
	N(cudaErrorStreamCaptureImplicit) N(cudaErrorCapturedEvent)
	N(cudaErrorStreamCaptureWrongThread) N(cudaErrorUnknown)
#undef N
	}
	return "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorStreamCaptureUnsupported:
		return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated:
		return "operation failed due to a previous error during capture";
	case cudaErrorStreamCaptureImplicit:
		return "operation would make the legacy stream depend on a capturing blocking stream";
	case cudaErrorStreamCaptureWrongThread:
		return "attempt to terminate a thread-local capture sequence from another thread";
	default: return cudaGetErrorName(e);
	}
}

extern "C" cudaError_t cudaGetLastError(void)
{
	if (in_kernel())
		called_from_kernel("cudaGetLastError");
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	std::lock_guard<std::mutex> g(api_lock());
	return H().sticky ? H().sticky : e;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
	if (in_kernel())
		called_from_kernel("cudaPeekAtLastError");
	std::lock_guard<std::mutex> g(api_lock());
	return H().sticky ? H().sticky : last_error;
}

/* ---- device ---- */
extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
	if (!count)
		return ret(cudaErrorInvalidValue);
	*count = 1;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
	if (!device)
		return ret(cudaErrorInvalidValue);
	*device = 0;
	return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device)
{
	API_ENTER("cudaSetDevice");
	if (device != 0) {
		diag("cudaSetDevice(%d): the emulator has one device, 0", device);
		return ret(cudaErrorInvalidDevice);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
	if (!p)
		return ret(cudaErrorInvalidValue);
	if (device != 0)
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "llmd CUDA emulator");
	p->totalGlobalMem = config().mem_total;
	p->sharedMemPerBlock = DYN_SMEM_DEFAULT;
	p->regsPerBlock = 65536;
	p->warpSize = 32;
	p->memPitch = 2147483647;
	p->maxThreadsPerBlock = 1024;
	p->maxThreadsDim[0] = 1024;
	p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	p->maxGridSize[0] = 2147483647;
	p->maxGridSize[1] = 65535;
	p->maxGridSize[2] = 65535;
	p->totalConstMem = 65536;
	p->major = 9;
	p->minor = 0;
	p->textureAlignment = 512;
	p->multiProcessorCount = 132;
	p->concurrentKernels = 1;
	p->unifiedAddressing = 1;
	p->memoryBusWidth = 5120;
	p->l2CacheSize = 50 * 1024 * 1024;
	p->maxThreadsPerMultiProcessor = 2048;
	p->sharedMemPerMultiprocessor = 228 * 1024;
	p->regsPerMultiprocessor = 65536;
	p->managedMemory = 1;
	p->sharedMemPerBlockOptin = DYN_SMEM_OPTIN;
	p->maxBlocksPerMultiProcessor = 32;
	p->reservedSharedMemPerBlock = 1024;
	return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	struct cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, device);
	if (e)
		return e;
	if (!value)
		return ret(cudaErrorInvalidValue);
	switch (attr) {
	case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
	case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
	case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
	case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
	case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
	case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
	case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
	case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
	case cudaDevAttrTotalConstantMemory: *value = (int)p.totalConstMem; break;
	case cudaDevAttrWarpSize: *value = p.warpSize; break;
	case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
	case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
	case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
	case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
	case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
		*value = (int)p.sharedMemPerMultiprocessor;
		break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
	default: return ret(cudaErrorInvalidValue);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
	API_ENTER("cudaDeviceSynchronize");
	return ret(unsafe_call("cudaDeviceSynchronize", NULL, 0, cudaErrorStreamCaptureUnsupported));
}

extern "C" cudaError_t cudaDeviceReset(void)
{
	if (in_kernel())
		called_from_kernel("cudaDeviceReset");
	std::lock_guard<std::mutex> g(api_lock());
	host_state &h = H();
	for (auto &a : h.allocs)
		free((void *)a.first);
	h.allocs.clear();
	h.freed_list.clear();
	h.bytes = 0;
	for (CUstream_st *s : h.streams) {
		delete s->graph;
		delete s;
	}
	h.streams.clear();
	for (CUevent_st *e : h.events)
		delete e;
	h.events.clear();
	for (CUgraph_st *gr : h.graphs)
		delete gr;
	h.graphs.clear();
	for (CUgraphExec_st *x : h.execs)
		delete x;
	h.execs.clear();
	h.max_dyn_smem.clear();
	h.sticky = cudaSuccess;
	last_error = cudaSuccess;
	return cudaSuccess;
}

extern "C" cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return ret(cudaErrorInvalidValue);
	*v = 13000;
	return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *v)
{
	return cudaDriverGetVersion(v);
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
	int value)
{
	API_ENTER("cudaFuncSetAttribute");
	if (!func)
		return ret(cudaErrorInvalidDeviceFunction);
	if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
		if (value < 0 || value > DYN_SMEM_OPTIN) {
			diag("cudaFuncSetAttribute: %d bytes of dynamic shared memory exceed the "
				"device's %d", value, DYN_SMEM_OPTIN);
			return ret(cudaErrorInvalidValue);
		}
		H().max_dyn_smem[func] = value;
		return cudaSuccess;
	}
	if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
		return value >= -1 && value <= 100 ? cudaSuccess : ret(cudaErrorInvalidValue);
	return ret(cudaErrorInvalidValue);
}

/* ---- memory ---- */
extern "C" cudaError_t cuda_emu_malloc_at(void **p, size_t size, const char *file, int line)
{
	API_ENTER("cudaMalloc");
	host_state &h = H();
	if (!p)
		return ret(cudaErrorInvalidValue);
	cudaError_t e = unsafe_call("cudaMalloc", file, line, cudaErrorStreamCaptureUnsupported);
	if (e)
		return ret(e);
	if (size == 0) {
		*p = NULL;
		return cudaSuccess;
	}
	if (size > config().mem_total - h.bytes || h.bytes > config().mem_total) {
		diag("cudaMalloc at %s: %zu bytes do not fit: %zu of %zu in use (CUDA_EMU_MEM_MB)",
			site(file, line).c_str(), size, h.bytes, config().mem_total);
		return ret(cudaErrorMemoryAllocation);
	}
	void *m = NULL;
	if (posix_memalign(&m, 256, size) != 0) {
		diag("cudaMalloc at %s: host memory for %zu bytes is exhausted",
			site(file, line).c_str(), size);
		return ret(cudaErrorMemoryAllocation);
	}
	memset(m, 0xff, size < FILL_LIMIT ? size : FILL_LIMIT);
	h.allocs[(uintptr_t)m] = alloc{ size, file, line, ++h.seq };
	h.bytes += size;
	if (!h.leak_check_at_exit) {
		h.leak_check_at_exit = true;
		atexit(report_leaks_at_exit);
	}
	*p = m;
	return cudaSuccess;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t size)
{
	return cuda_emu_malloc_at(p, size, NULL, 0);
}

extern "C" cudaError_t cuda_emu_free_at(void *p, const char *file, int line)
{
	API_ENTER("cudaFree");
	host_state &h = H();
	if (!p)
		return cudaSuccess;
	cudaError_t e = unsafe_call("cudaFree", file, line, cudaErrorStreamCaptureUnsupported);
	if (e)
		return ret(e);
	auto it = h.allocs.find((uintptr_t)p);
	if (it == h.allocs.end()) {
		std::string d = describe_ptr(p);
		diag("cudaFree at %s: %p is not a device allocation (%s)%s", site(file, line).c_str(),
			p, d.c_str(), d.compare(0, 3, "in ") == 0 ? ": a double free" : "");
		return ret(cudaErrorInvalidValue);
	}
	h.freed_list.push_back(freed{ it->first, it->second.size, file, line });
	if (h.freed_list.size() > FREED_HISTORY)
		h.freed_list.pop_front();
	h.bytes -= it->second.size;
	h.allocs.erase(it);
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
	return cuda_emu_free_at(p, NULL, 0);
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t size)
{
	API_ENTER("cudaMallocHost");
	if (!p)
		return ret(cudaErrorInvalidValue);
	void *m = malloc(size ? size : 1);
	if (!m)
		return ret(cudaErrorMemoryAllocation);
	H().host_allocs.insert(m);
	*p = m;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
	API_ENTER("cudaFreeHost");
	if (!p)
		return cudaSuccess;
	if (!H().host_allocs.erase(p)) {
		diag("cudaFreeHost: %p was not allocated with cudaMallocHost", p);
		return ret(cudaErrorInvalidValue);
	}
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	API_ENTER("cudaMemGetInfo");
	if (!free_bytes || !total)
		return ret(cudaErrorInvalidValue);
	*total = config().mem_total;
	*free_bytes = H().bytes < *total ? *total - H().bytes : 0;
	return cudaSuccess;
}

extern "C" cudaError_t cuda_emu_memcpy_at(void *dst, const void *src, size_t count,
	enum cudaMemcpyKind kind, cudaStream_t stream, int async, const char *file, int line)
{
	API_ENTER(async ? "cudaMemcpyAsync" : "cudaMemcpy");
	work w;
	w.kind = work::MEMCPY;
	w.dst = dst;
	w.src = src;
	w.count = count;
	w.memcpy_kind = kind;
	w.what = async ? "cudaMemcpyAsync" : "cudaMemcpy";
	w.file = file;
	w.line = line;
	if (!async) {
		cudaError_t e = unsafe_call("cudaMemcpy", file, line, cudaErrorStreamCaptureImplicit);
		if (e)
			return ret(e);
	}
	return ret(enqueue(async ? stream : NULL, std::move(w)));
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
	enum cudaMemcpyKind kind)
{
	return cuda_emu_memcpy_at(dst, src, count, kind, NULL, 0, NULL, 0);
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
	enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return cuda_emu_memcpy_at(dst, src, count, kind, stream, 1, NULL, 0);
}

extern "C" cudaError_t cuda_emu_memset_at(void *p, int value, size_t count, cudaStream_t stream,
	int async, const char *file, int line)
{
	API_ENTER(async ? "cudaMemsetAsync" : "cudaMemset");
	work w;
	w.kind = work::MEMSET;
	w.dst = p;
	w.count = count;
	w.value = value;
	w.what = async ? "cudaMemsetAsync" : "cudaMemset";
	w.file = file;
	w.line = line;
	if (!async) {
		cudaError_t e = unsafe_call("cudaMemset", file, line, cudaErrorStreamCaptureImplicit);
		if (e)
			return ret(e);
	}
	return ret(enqueue(async ? stream : NULL, std::move(w)));
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t count)
{
	return cuda_emu_memset_at(p, value, count, NULL, 0, NULL, 0);
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
	return cuda_emu_memset_at(p, value, count, stream, 1, NULL, 0);
}

/* ---- streams ---- */
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
	API_ENTER("cudaStreamCreate");
	if (!s || (flags & ~1u))
		return ret(cudaErrorInvalidValue);
	CUstream_st *st = new CUstream_st();
	st->flags = flags;
	H().streams.insert(st);
	*s = st;
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	API_ENTER("cudaStreamDestroy");
	if (is_legacy(s) || !H().streams.erase(s)) {
		diag("cudaStreamDestroy: %p is not a live stream", (void *)s);
		return ret(cudaErrorInvalidResourceHandle);
	}
	delete s->graph;
	delete s;
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	API_ENTER("cudaStreamSynchronize");
	cudaError_t e = check_stream(s);
	if (e)
		return ret(e);
	if (!is_legacy(s) && s->capturing) {
		diag("cudaStreamSynchronize: stream %p is capturing; the capture is invalidated",
			(void *)s);
		s->invalidated = true;
		return ret(cudaErrorStreamCaptureUnsupported);
	}
	return ret(unsafe_call("cudaStreamSynchronize", NULL, 0, cudaErrorStreamCaptureUnsupported));
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
	API_ENTER("cudaStreamQuery");
	cudaError_t e = check_stream(s);
	if (e)
		return ret(e);
	if (!is_legacy(s) && s->capturing)
		return ret(cudaErrorStreamCaptureUnsupported);
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
	API_ENTER("cudaStreamWaitEvent");
	cudaError_t e = check_stream(s);
	if (e)
		return ret(e);
	if (!H().events.count(ev))
		return ret(cudaErrorInvalidResourceHandle);
	return flags ? ret(cudaErrorInvalidValue) : cudaSuccess;
}

/* ---- events ---- */
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
	API_ENTER("cudaEventCreate");
	if (!ev || (flags & ~7u))
		return ret(cudaErrorInvalidValue);
	CUevent_st *e = new CUevent_st();
	e->flags = flags;
	H().events.insert(e);
	*ev = e;
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
	return cudaEventCreateWithFlags(ev, cudaEventDefault);
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
	API_ENTER("cudaEventRecord");
	if (!H().events.count(ev)) {
		diag("cudaEventRecord: %p is not a live event", (void *)ev);
		return ret(cudaErrorInvalidResourceHandle);
	}
	work w;
	w.kind = work::EVENT;
	w.event = ev;
	w.what = "cudaEventRecord";
	w.file = NULL;
	w.line = 0;
	return ret(enqueue(s, std::move(w)));
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
	API_ENTER("cudaEventSynchronize");
	return H().events.count(ev) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t ev)
{
	API_ENTER("cudaEventQuery");
	return H().events.count(ev) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	API_ENTER("cudaEventElapsedTime");
	if (!ms)
		return ret(cudaErrorInvalidValue);
	if (!H().events.count(a) || !H().events.count(b) || !a->recorded || !b->recorded ||
		((a->flags | b->flags) & cudaEventDisableTiming)) {
		diag("cudaEventElapsedTime: both events must be live, recorded and timing");
		return ret(cudaErrorInvalidResourceHandle);
	}
	*ms = (float)((double)(b->ns - a->ns) / 1e6);
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
	API_ENTER("cudaEventDestroy");
	if (!H().events.erase(ev))
		return ret(cudaErrorInvalidResourceHandle);
	delete ev;
	return cudaSuccess;
}

/* ---- graphs ---- */
extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
	API_ENTER("cudaStreamBeginCapture");
	if (is_legacy(s)) {
		diag("cudaStreamBeginCapture: the legacy stream cannot be captured");
		return ret(cudaErrorStreamCaptureUnsupported);
	}
	if (!H().streams.count(s))
		return ret(cudaErrorInvalidResourceHandle);
	if ((int)mode < 0 || (int)mode > 2)
		return ret(cudaErrorInvalidValue);
	if (s->capturing) {
		diag("cudaStreamBeginCapture: stream %p is already capturing", (void *)s);
		return ret(cudaErrorIllegalState);
	}
	s->capturing = true;
	s->invalidated = false;
	s->mode = mode;
	s->thread = pthread_self();
	s->graph = new CUgraph_st();
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
	API_ENTER("cudaStreamEndCapture");
	if (!graph)
		return ret(cudaErrorInvalidValue);
	if (is_legacy(s) || !H().streams.count(s))
		return ret(cudaErrorInvalidResourceHandle);
	if (!s->capturing) {
		diag("cudaStreamEndCapture: stream %p is not capturing", (void *)s);
		return ret(cudaErrorIllegalState);
	}
	if (s->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(s->thread, pthread_self()))
		return ret(cudaErrorStreamCaptureWrongThread);
	s->capturing = false;
	CUgraph_st *g = s->graph;
	s->graph = NULL;
	if (s->invalidated) {
		delete g;
		*graph = NULL;
		return ret(cudaErrorStreamCaptureInvalidated);
	}
	H().graphs.insert(g);
	*graph = g;
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
	API_ENTER("cudaStreamIsCapturing");
	if (!status)
		return ret(cudaErrorInvalidValue);
	cudaError_t e = check_stream(s);
	if (e)
		return ret(e);
	*status = is_legacy(s) || !s->capturing ? cudaStreamCaptureStatusNone :
		s->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
	unsigned long long flags)
{
	API_ENTER("cudaGraphInstantiate");
	if (!exec)
		return ret(cudaErrorInvalidValue);
	if (!H().graphs.count(graph))
		return ret(cudaErrorInvalidResourceHandle);
	(void)flags;
	CUgraphExec_st *x = new CUgraphExec_st();
	x->nodes = graph->nodes;
	H().execs.insert(x);
	*exec = x;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
	API_ENTER("cudaGraphLaunch");
	if (!H().execs.count(exec)) {
		diag("cudaGraphLaunch: %p is not a live executable graph", (void *)exec);
		return ret(cudaErrorInvalidResourceHandle);
	}
	cudaError_t e = check_stream(s);
	if (e)
		return ret(e);
	for (const work &w : exec->nodes) {
		work copy = w;
		if ((e = enqueue(s, std::move(copy))) != cudaSuccess)
			return ret(e);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
	API_ENTER("cudaGraphExecDestroy");
	if (!H().execs.erase(exec))
		return ret(cudaErrorInvalidResourceHandle);
	free_graph_nodes(exec->nodes);
	delete exec;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	API_ENTER("cudaGraphDestroy");
	if (!H().graphs.erase(graph))
		return ret(cudaErrorInvalidResourceHandle);
	free_graph_nodes(graph->nodes);
	delete graph;
	return cudaSuccess;
}

/* ---- the emulator's own controls ---- */
extern "C" size_t cuda_emu_check_leaks(void)
{
	std::lock_guard<std::mutex> g(api_lock());
	host_state &h = H();
	if (h.allocs.empty())
		return 0;
	std::vector<std::pair<unsigned long long, uintptr_t>> order;
	for (auto &a : h.allocs)
		order.push_back({ a.second.seq, a.first });
	std::sort(order.begin(), order.end());
	fprintf(stderr, "cuda-emu: %zu device allocation(s) not freed, %zu bytes:\n",
		h.allocs.size(), h.bytes);
	for (auto &o : order) {
		const alloc &a = h.allocs[o.second];
		fprintf(stderr, "cuda-emu:   %zu bytes at %p, allocated at %s\n", a.size,
			(void *)o.second, site(a.file, a.line).c_str());
	}
	return h.allocs.size();
}

extern "C" size_t cuda_emu_bytes_allocated(void)
{
	std::lock_guard<std::mutex> g(api_lock());
	return H().bytes;
}

extern "C" int cuda_emu_is_device_range(const void *p, size_t size)
{
	std::lock_guard<std::mutex> g(api_lock());
	return classify(p, size) == SIDE_DEVICE;
}

extern "C" void cuda_emu_set_quiet(int quiet)
{
	config().quiet = quiet != 0;
}
