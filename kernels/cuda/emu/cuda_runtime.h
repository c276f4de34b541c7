/* cuda_runtime.h - the emulator's stand-in for the CUDA runtime header.
 *
 * Found instead of the toolkit's one through -I kernels/cuda/emu, so that
 * .cu source compiles as C++ (g++ -x c++) and host code as C.  The host API
 * part is C; the device part (qualifiers, built-in variables, intrinsics,
 * the launch) is C++ only and lives in cuda_emu_device.h.  Enum values match
 * the toolkit's; only what llmd's kernels and backend use is declared.  Not a
 * CUDA implementation: streams are synchronous, there is one device.
 */
#ifndef LLMD_CUDA_EMU_RUNTIME_H
#define LLMD_CUDA_EMU_RUNTIME_H

#include <stddef.h>

#include "cuda_emu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes (values as in the toolkit's driver_types.h) ---- */
typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidPitchValue = 12,
	cudaErrorInvalidSymbol = 13,
	cudaErrorInvalidDevicePointer = 17,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInvalidDeviceFunction = 98,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidKernelImage = 200,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalState = 401,
	cudaErrorNotReady = 600,
	cudaErrorIllegalAddress = 700,
	cudaErrorLaunchOutOfResources = 701,
	cudaErrorLaunchTimeout = 702,
	cudaErrorAssert = 710,
	cudaErrorLaunchFailure = 719,
	cudaErrorNotPermitted = 800,
	cudaErrorNotSupported = 801,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorStreamCaptureMerge = 902,
	cudaErrorStreamCaptureUnmatched = 903,
	cudaErrorStreamCaptureUnjoined = 904,
	cudaErrorStreamCaptureIsolation = 905,
	cudaErrorStreamCaptureImplicit = 906,
	cudaErrorCapturedEvent = 907,
	cudaErrorStreamCaptureWrongThread = 908,
	cudaErrorUnknown = 999,
} cudaError_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};

enum cudaStreamCaptureStatus {
	cudaStreamCaptureStatusNone = 0,
	cudaStreamCaptureStatusActive = 1,
	cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
	cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

enum cudaDeviceAttr {
	cudaDevAttrMaxThreadsPerBlock = 1,
	cudaDevAttrMaxBlockDimX = 2,
	cudaDevAttrMaxBlockDimY = 3,
	cudaDevAttrMaxBlockDimZ = 4,
	cudaDevAttrMaxGridDimX = 5,
	cudaDevAttrMaxGridDimY = 6,
	cudaDevAttrMaxGridDimZ = 7,
	cudaDevAttrMaxSharedMemoryPerBlock = 8,
	cudaDevAttrTotalConstantMemory = 9,
	cudaDevAttrWarpSize = 10,
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrL2CacheSize = 38,
	cudaDevAttrMaxThreadsPerMultiProcessor = 39,
	cudaDevAttrComputeCapabilityMajor = 75,
	cudaDevAttrComputeCapabilityMinor = 76,
	cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

/* ---- handles ---- */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* ---- vector types (sizes and alignments as in vector_types.h) ---- */
#ifdef __cplusplus
#define CUDA_EMU_ALIGN(n) alignas(n)
#define CUDA_EMU_DEFAULT(v) = v
#else
#define CUDA_EMU_ALIGN(n) _Alignas(n)
#define CUDA_EMU_DEFAULT(v)
#endif
#define CUDA_EMU_VEC2(T, name, al) \
	typedef struct name { CUDA_EMU_ALIGN(al) T x; T y; } name; \
	static inline name make_##name(T x, T y) { name v; v.x = x; v.y = y; return v; }
#define CUDA_EMU_VEC3(T, name) \
	typedef struct name { T x, y, z; } name; \
	static inline name make_##name(T x, T y, T z) { name v; v.x = x; v.y = y; v.z = z; return v; }
#define CUDA_EMU_VEC4(T, name, al) \
	typedef struct name { CUDA_EMU_ALIGN(al) T x; T y, z, w; } name; \
	static inline name make_##name(T x, T y, T z, T w) \
	{ name v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
CUDA_EMU_VEC2(signed char, char2, 2)
CUDA_EMU_VEC2(unsigned char, uchar2, 2)
CUDA_EMU_VEC4(signed char, char4, 4)
CUDA_EMU_VEC4(unsigned char, uchar4, 4)
CUDA_EMU_VEC2(short, short2, 4)
CUDA_EMU_VEC2(unsigned short, ushort2, 4)
CUDA_EMU_VEC4(short, short4, 8)
CUDA_EMU_VEC4(unsigned short, ushort4, 8)
CUDA_EMU_VEC2(int, int2, 8)
CUDA_EMU_VEC3(int, int3)
CUDA_EMU_VEC4(int, int4, 16)
CUDA_EMU_VEC2(unsigned int, uint2, 8)
CUDA_EMU_VEC3(unsigned int, uint3)
CUDA_EMU_VEC4(unsigned int, uint4, 16)
CUDA_EMU_VEC2(float, float2, 8)
CUDA_EMU_VEC3(float, float3)
CUDA_EMU_VEC4(float, float4, 16)
CUDA_EMU_VEC2(double, double2, 16)
CUDA_EMU_VEC2(long long, longlong2, 16)
CUDA_EMU_VEC2(unsigned long long, ulonglong2, 16)
#undef CUDA_EMU_VEC2
#undef CUDA_EMU_VEC3
#undef CUDA_EMU_VEC4

/* Launch dimensions; unset ones are 1, as in CUDA. */
#ifdef __cplusplus
struct dim3 {
	unsigned int x, y, z;
	constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
		: x(vx), y(vy), z(vz) {}
	constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
	constexpr operator uint3() const { return uint3{x, y, z}; }
};
#else
typedef struct dim3 { unsigned int x, y, z; } dim3;
#endif

/* A plausible H100 (sm 9.0); field names as in the CUDA 13 struct, only the
 * ones that exist there, so code written against it builds with nvcc. */
struct cudaDeviceProp {
	char name[256];              /* "llmd CUDA emulator" */
	size_t totalGlobalMem;       /* bytes; CUDA_EMU_MEM_MB */
	size_t sharedMemPerBlock;    /* 48 KiB without opt-in */
	int regsPerBlock;
	int warpSize;                /* 32 */
	size_t memPitch;
	int maxThreadsPerBlock;      /* 1024 */
	int maxThreadsDim[3];        /* 1024, 1024, 64 */
	int maxGridSize[3];          /* 2^31 - 1, 65535, 65535 */
	size_t totalConstMem;
	int major;                   /* 9 */
	int minor;                   /* 0 */
	size_t textureAlignment;
	int multiProcessorCount;     /* 132 */
	int integrated;
	int concurrentKernels;
	int unifiedAddressing;
	int memoryBusWidth;          /* bits */
	int l2CacheSize;             /* bytes */
	int maxThreadsPerMultiProcessor;
	size_t sharedMemPerMultiprocessor; /* 228 KiB */
	int regsPerMultiprocessor;
	int managedMemory;
	size_t sharedMemPerBlockOptin;     /* 227 KiB, the H100's opt-in limit */
	int maxBlocksPerMultiProcessor;
	size_t reservedSharedMemPerBlock;
};

/* ---- the host API; every failing call also sets the thread's last error ---- */
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
/* Returns and clears the last error; a sticky one (a kernel fault) stays. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
/* Frees every allocation and handle and clears a sticky error. */
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* Device memory is host memory the emulator tracks (pointer, size, call
 * site), 256-byte aligned, filled with 0xff bytes (NaN) when allocated. */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
/* Refused (cudaErrorInvalidValue) when a side named device is not inside
 * one allocation, a side named host is device memory, or they overlap. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
	enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);

/* The same calls with their call site; the macros below route through them
 * so that leak and error reports name the caller's file and line. */
cudaError_t cuda_emu_malloc_at(void **devPtr, size_t size, const char *file, int line);
cudaError_t cuda_emu_free_at(void *devPtr, const char *file, int line);
cudaError_t cuda_emu_memcpy_at(void *dst, const void *src, size_t count,
	enum cudaMemcpyKind kind, cudaStream_t stream, int async, const char *file, int line);
cudaError_t cuda_emu_memset_at(void *devPtr, int value, size_t count,
	cudaStream_t stream, int async, const char *file, int line);
#define cudaMalloc(p, size) cuda_emu_malloc_at((void **)(p), (size), __FILE__, __LINE__)
#define cudaFree(p) cuda_emu_free_at((p), __FILE__, __LINE__)
#define cudaMemcpy(dst, src, n, kind) \
	cuda_emu_memcpy_at((dst), (src), (n), (kind), (cudaStream_t)0, 0, __FILE__, __LINE__)
#define cudaMemcpyAsync(dst, src, n, kind, stream) \
	cuda_emu_memcpy_at((dst), (src), (n), (kind), (stream), 1, __FILE__, __LINE__)
#define cudaMemset(p, v, n) cuda_emu_memset_at((p), (v), (n), (cudaStream_t)0, 0, __FILE__, __LINE__)
#define cudaMemsetAsync(p, v, n, stream) \
	cuda_emu_memset_at((p), (v), (n), (stream), 1, __FILE__, __LINE__)

/* Streams run their work at the call; they exist for handle checks and
 * graph capture. */
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

/* Events record CLOCK_MONOTONIC when their record runs. */
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* Capture records kernel launches, memcpys, memsets, event records and
 * cuBLAS calls made on the stream (kernel arguments by value, host memory by
 * pointer, as CUDA does); a launch of the instantiated graph replays them. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *graphExec, cudaGraph_t graph,
	unsigned long long flags CUDA_EMU_DEFAULT(0));
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

#ifdef __cplusplus
}
#include "cuda_emu_device.h"
#endif

#endif
