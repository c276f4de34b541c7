/* emu_test_runtime.cc - the emulator's checked host API: allocation ledger
 * and leak report, cudaMemcpy/cudaMemset refusals with CUDA's error codes,
 * cudaFree of what is not an allocation, launch configuration errors, the
 * sticky error after __trap() and after a planted fault, streams, events,
 * graph capture and replay, grid_dep_wait_prefetch's range check.
 */
#include "cuda_compat.h"
#include "cuda_mma.h"

#include <math.h>
#include <stdint.h>

#include <vector>

#include "emu_testutil.h"

static void expect_diag(const char *what)
{
	const char *d = cuda_emu_last_diagnostic();
	if (!strstr(d, what)) {
		fprintf(stderr, "last diagnostic \"%s\" lacks \"%s\"\n", d, what);
		test_failures++;
	}
}

static void test_device()
{
	int n = 0, dev = -1, v = 0;
	CHECK_INT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
	CHECK_INT_EQ(n, 1);
	CHECK_INT_EQ(cudaGetDevice(&dev), cudaSuccess);
	CHECK_INT_EQ(dev, 0);
	CHECK_INT_EQ(cudaSetDevice(0), cudaSuccess);
	CHECK_INT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	struct cudaDeviceProp p;
	CHECK_INT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
	CHECK_STR_EQ(p.name, "llmd CUDA emulator");
	CHECK_INT_EQ(p.major, 9);
	CHECK_INT_EQ(p.minor, 0);
	CHECK_INT_EQ(p.multiProcessorCount, 132);
	CHECK_INT_EQ(p.warpSize, 32);
	CHECK_INT_EQ(p.sharedMemPerBlock, 48 * 1024);
	CHECK(p.sharedMemPerBlockOptin > 200 * 1024);
	CHECK_INT_EQ(p.totalGlobalMem, 64ull << 20); /* CUDA_EMU_MEM_MB=64, set in main */
	CHECK_INT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
	CHECK_INT_EQ(v, 132);
	CHECK_INT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
	CHECK_INT_EQ(v, (int)p.sharedMemPerBlockOptin);
	CHECK_STR_EQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
	CHECK_STR_EQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
}

static void test_malloc_ledger()
{
	size_t free0, total, free1;
	CHECK_INT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
	CHECK_INT_EQ(total, 64ull << 20);
	unsigned char *a = NULL;
	CHECK_INT_EQ(cudaMalloc(&a, 1000), cudaSuccess);
	CHECK(a && (uintptr_t)a % 256 == 0);
	CHECK_INT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK_INT_EQ(free0 - free1, 1000);
	CHECK_INT_EQ(cuda_emu_bytes_allocated(), 1000);
	CHECK(cuda_emu_is_device_range(a, 1000));
	CHECK(cuda_emu_is_device_range(a + 999, 1));
	CHECK(!cuda_emu_is_device_range(a + 1, 1000));
	/* New device memory holds 0xff bytes (NaN), never zeros by luck. */
	unsigned char h[1000];
	CHECK_INT_EQ(cudaMemcpy(h, a, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(h[0] == 0xff && h[999] == 0xff);
	void *big = NULL;
	CHECK_INT_EQ(cudaMalloc(&big, 65ull << 20), cudaErrorMemoryAllocation);
	expect_diag("do not fit");
	CHECK_INT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 1);
	CHECK_INT_EQ(cudaFree(a), cudaSuccess);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	CHECK_INT_EQ(cudaFree(NULL), cudaSuccess);
}

static void test_free_checks()
{
	char host[64];
	char *a = NULL;
	CHECK_INT_EQ(cudaMalloc(&a, 128), cudaSuccess);
	CHECK_INT_EQ(cudaFree(host), cudaErrorInvalidValue);
	expect_diag("is not a device allocation (host memory)");
	CHECK_INT_EQ(cudaFree(a + 16), cudaErrorInvalidValue);
	expect_diag("16 bytes into the 128-byte allocation made at");
	CHECK_INT_EQ(cudaFree(a), cudaSuccess);
	CHECK_INT_EQ(cudaFree(a), cudaErrorInvalidValue);
	expect_diag("a double free");
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

static void test_memcpy_checks()
{
	float *d = NULL, *d2 = NULL;
	float h[16] = { 0 }, h2[16];
	CHECK_INT_EQ(cudaMalloc(&d, sizeof h), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&d2, sizeof h), cudaSuccess);
	for (int i = 0; i < 16; i++)
		h[i] = (float)i;
	CHECK_INT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(d2, d, sizeof h, cudaMemcpyDeviceToDevice), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(h2, d2, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(memcmp(h, h2, sizeof h) == 0);
	CHECK_INT_EQ(cudaMemcpy(h2, d, sizeof h, cudaMemcpyDefault), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(h2, h, sizeof h, cudaMemcpyHostToHost), cudaSuccess);

	/* Each side must be where the kind says. */
	CHECK_INT_EQ(cudaMemcpy(h2, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	expect_diag("destination");
	expect_diag("is not device memory");
	CHECK_INT_EQ(cudaMemcpy(d, d2, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	expect_diag("source");
	expect_diag("is device memory");
	CHECK_INT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemcpy(h2, d, sizeof h, cudaMemcpyHostToHost), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
	/* And inside one allocation. */
	CHECK_INT_EQ(cudaMemcpy(d + 1, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	expect_diag("runs past the end of its allocation");
	CHECK_INT_EQ(cudaMemcpy(h2, d + 8, 9 * sizeof(float), cudaMemcpyDeviceToHost),
		cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemcpy(h2, d + 8, 9 * sizeof(float), cudaMemcpyDefault), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemcpy(d, d + 4, 8 * sizeof(float), cudaMemcpyDeviceToDevice),
		cudaErrorInvalidValue);
	expect_diag("overlap");
	CHECK_INT_EQ(cudaMemcpy(d, h, sizeof h, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
	CHECK_INT_EQ(cudaMemcpy(NULL, h, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemcpy(d, h, 0, cudaMemcpyHostToDevice), cudaSuccess);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

	CHECK_INT_EQ(cudaMemset(d, 0, sizeof h), cudaSuccess);
	CHECK_INT_EQ(cudaMemset(d + 1, 0, sizeof h), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemset(h2, 0, sizeof h), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaMemsetAsync(d, 0, sizeof h, (cudaStream_t)0x1234), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaFree(d), cudaSuccess);
	/* A freed allocation is named as such. */
	CHECK_INT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	expect_diag("freed at");
	CHECK_INT_EQ(cudaFree(d2), cudaSuccess);
	cudaGetLastError();
}

/* The at-exit report lists what was never freed, with its call site. */
static void test_leak_report_at_exit()
{
	emu_child c = emu_run_child_fn([]() {
		void *p = NULL, *q = NULL;
		cudaMalloc(&p, 4096);
		cudaMalloc(&q, 12);
		return 0;
	});
	CHECK(c.exited && c.status == 0);
	if (!emu_has(c.err, "2 device allocation(s) not freed, 4108 bytes") ||
		!emu_has(c.err, "4096 bytes at") || !emu_has(c.err, "emu_test_runtime.cc:")) {
		fprintf(stderr, "leak report was:\n%s\n", c.err.c_str());
		test_failures++;
	}
}

/* ---- launches ---- */
static __global__ void fill_kernel(float *x, int n, float v)
{
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = v + i;
}

static __global__ void dyn_kernel(float *out, int n)
{
	DYN_SHARED(float, s);
	const int t = threadIdx.x;
	out[t] = s[t]; /* what a block finds there: the 0xff fill */
	__syncthreads();
	s[t] = (float)t;
	__syncthreads();
	out[n + t] = s[n - 1 - t];
}

static void test_launch_errors()
{
	dbuf<float> x(64);
	LAUNCH(fill_kernel, 1, 1025, 0, 0, x.d, 64, 1.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	expect_diag("invalid configuration");
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	LAUNCH(fill_kernel, 0, 32, 0, 0, x.d, 64, 1.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	LAUNCH(fill_kernel, 1, dim3(8, 8, 65), 0, 0, x.d, 64, 1.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
	LAUNCH(fill_kernel, 1, 32, 0, (cudaStream_t)0x1234, x.d, 64, 1.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);

	/* Beyond 48 KiB of dynamic shared memory needs the attribute. */
	dbuf<float> out(2 * 64);
	LAUNCH(dyn_kernel, 1, 64, 64 * 1024, 0, out.d, 64);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
	expect_diag("cudaFuncSetAttribute");
	CHECK_INT_EQ(cudaFuncSetAttribute(dyn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
		300 * 1024), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorInvalidValue); /* failed calls set it too */
	CHECK_INT_EQ(cudaFuncSetAttribute(dyn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
		64 * 1024), cudaSuccess);
	LAUNCH(dyn_kernel, 1, 64, 64 * 1024, 0, out.d, 64);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	std::vector<float> h = out.get();
	for (int t = 0; t < 64; t++) {
		CHECK(isnan(h[t]));
		CHECK(h[64 + t] == (float)(63 - t));
	}
}

static __global__ void trap_kernel(int *x)
{
	atomicAdd(x, 1);
	if (threadIdx.x == 5 && blockIdx.x == 1)
		__trap();
	__syncthreads();
}

static void test_trap_is_sticky()
{
	int *x = NULL;
	CHECK_INT_EQ(cudaMalloc(&x, sizeof *x), cudaSuccess);
	CHECK_INT_EQ(cudaMemset(x, 0, sizeof *x), cudaSuccess);
	LAUNCH(trap_kernel, 4, 32, 0, 0, x);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
	expect_diag("__trap()");
	/* Sticky: every later call fails the same way. */
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
	void *p = NULL;
	CHECK_INT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
	CHECK_INT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
	LAUNCH(fill_kernel, 1, 32, 0, 0, (float *)x, 1, 0.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
	/* Until the device is reset, which frees everything. */
	CHECK_INT_EQ(cudaDeviceReset(), cudaSuccess);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cuda_emu_bytes_allocated(), 0);
	CHECK_INT_EQ(cudaMalloc(&p, 16), cudaSuccess);
	CHECK_INT_EQ(cudaFree(p), cudaSuccess);
}

/* grid_dep_wait_prefetch (cuda_mma.h): a prefetch changes nothing, but
 * one that reaches past its allocation traps on the emulator (on a GPU it
 * would ask L2 for another buffer's lines, or none). */
static __global__ void prefetch_kernel(const float *p, int bytes, float *out)
{
	grid_dep_wait_prefetch(p, bytes);
	out[threadIdx.x] = 1.0f;
}

static void test_prefetch_range()
{
	float *x = NULL, *out = NULL;
	CHECK_INT_EQ(cudaMalloc(&x, 1000), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&out, 32 * sizeof(float)), cudaSuccess);
	LAUNCH(prefetch_kernel, 1, 32, 0, 0, (const float *)x, 1000, out); /* all of it */
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	LAUNCH(prefetch_kernel, 1, 32, 0, 0, (const float *)(x + 10), 960, out);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	LAUNCH(prefetch_kernel, 1, 32, 0, 0, (const float *)NULL, 1000, out); /* NULL: nothing */
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	LAUNCH(prefetch_kernel, 1, 32, 0, 0, (const float *)(x + 10), 961, out); /* a byte past */
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
	expect_diag("__trap()");
	CHECK_INT_EQ(cudaDeviceReset(), cudaSuccess);
	CHECK_INT_EQ(cuda_emu_bytes_allocated(), 0);
}

/* A planted fault: the Nth launch from the plant fails as a trap would,
 * sticky until the reset; the launches before it run. */
static void test_planted_fault()
{
	float *x = NULL;
	float h[32];
	CHECK_INT_EQ(cudaMalloc(&x, sizeof h), cudaSuccess);
	cuda_emu_plant_fault(2);
	LAUNCH(fill_kernel, 1, 32, 0, 0, x, 32, 1.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(h[31] == 32.0f);
	LAUNCH(fill_kernel, 1, 32, 0, 0, x, 32, 5.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
	expect_diag("planted device fault");
	CHECK_INT_EQ(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost), cudaErrorLaunchFailure);
	CHECK_INT_EQ(cudaDeviceReset(), cudaSuccess);
	/* it fired once: later launches run */
	CHECK_INT_EQ(cudaMalloc(&x, sizeof h), cudaSuccess);
	LAUNCH(fill_kernel, 1, 32, 0, 0, x, 32, 2.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	/* and 0 removes one planted before it fires */
	cuda_emu_plant_fault(1);
	cuda_emu_plant_fault(0);
	LAUNCH(fill_kernel, 1, 32, 0, 0, x, 32, 3.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(h[0] == 3.0f);
	CHECK_INT_EQ(cudaFree(x), cudaSuccess);
}

/* ---- __constant__ memory ---- */
static __constant__ float coef[4];

static __global__ void poly_kernel(const float *x, float *y, int n)
{
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = coef[0] + x[i] * (coef[1] + x[i] * (coef[2] + x[i] * coef[3]));
}

static void test_constant_symbol()
{
	const float c[4] = { 1, 2, 3, 4 };
	float back[4] = { 0 };
	CHECK_INT_EQ(cudaMemcpyToSymbol(coef, c, sizeof c), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpyFromSymbol(back, coef, sizeof back), cudaSuccess);
	CHECK(memcmp(back, c, sizeof c) == 0);
	CHECK_INT_EQ(cudaMemcpyToSymbol(coef, c, sizeof c, 4), cudaErrorInvalidValue);
	expect_diag("outside the 16-byte symbol");
	CHECK_INT_EQ(cudaMemcpyToSymbol(coef, c, 4, 0, cudaMemcpyDeviceToHost),
		cudaErrorInvalidMemcpyDirection);
	cudaGetLastError();
	dbuf<float> x(8), y(8);
	x.put({ 0, 1, 2, 3, -1, -2, 0.5f, 10 });
	LAUNCH(poly_kernel, 1, 32, 0, 0, x.d, y.d, 8);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	std::vector<float> h = y.get(), in = x.get();
	for (int i = 0; i < 8; i++) {
		float v = in[i];
		CHECK(h[i] == 1 + v * (2 + v * (3 + v * 4)));
	}
}

/* ---- streams and events ---- */
static void test_streams_events()
{
	cudaStream_t s = NULL;
	cudaEvent_t a = NULL, b = NULL, untimed = NULL, never = NULL;
	CHECK_INT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	CHECK_INT_EQ(cudaEventCreate(&a), cudaSuccess);
	CHECK_INT_EQ(cudaEventCreate(&b), cudaSuccess);
	CHECK_INT_EQ(cudaEventCreate(&never), cudaSuccess);
	CHECK_INT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
	dbuf<float> x(4096);
	CHECK_INT_EQ(cudaEventRecord(a, s), cudaSuccess);
	LAUNCH(fill_kernel, 16, 256, 0, s, x.d, 4096, 2.0f);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cudaEventRecord(b, s), cudaSuccess);
	CHECK_INT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
	CHECK_INT_EQ(cudaEventSynchronize(b), cudaSuccess);
	CHECK_INT_EQ(cudaStreamSynchronize(s), cudaSuccess);
	CHECK_INT_EQ(cudaStreamQuery(s), cudaSuccess);
	CHECK_INT_EQ(cudaStreamWaitEvent(s, a, 0), cudaSuccess);
	float ms = -1;
	CHECK_INT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
	CHECK(ms > 0.0f && ms < 60000.0f);
	CHECK_INT_EQ(cudaEventElapsedTime(&ms, a, never), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
	CHECK(x.get()[4095] == 4097.0f);
	CHECK_INT_EQ(cudaEventDestroy(a), cudaSuccess);
	CHECK_INT_EQ(cudaEventDestroy(a), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaEventDestroy(b), cudaSuccess);
	CHECK_INT_EQ(cudaEventDestroy(never), cudaSuccess);
	CHECK_INT_EQ(cudaEventDestroy(untimed), cudaSuccess);
	CHECK_INT_EQ(cudaStreamDestroy(s), cudaSuccess);
	CHECK_INT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
	cudaGetLastError();
}

/* ---- graphs ---- */
static __global__ void axpb_kernel(const float *x, float a, float b, float *y, int n)
{
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = a * x[i] + b;
}

static void test_graph_capture_replay()
{
	const int n = 300;
	cudaStream_t s;
	CHECK_INT_EQ(cudaStreamCreate(&s), cudaSuccess);
	std::vector<float> in(n), out(n, -1.0f);
	for (int i = 0; i < n; i++)
		in[i] = (float)i;
	dbuf<float> dx(n), dy(n);
	float a = 2.0f, b = 1.0f;
	cudaEvent_t ev;
	CHECK_INT_EQ(cudaEventCreate(&ev), cudaSuccess);

	enum cudaStreamCaptureStatus st;
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK_INT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
	CHECK_INT_EQ(st, cudaStreamCaptureStatusActive);
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorIllegalState);
	CHECK_INT_EQ(cudaMemcpyAsync(dx.d, in.data(), n * sizeof(float), cudaMemcpyHostToDevice, s),
		cudaSuccess);
	LAUNCH(axpb_kernel, (n + 127) / 128, 128, 0, s, dx.d, a, b, dy.d, n);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	CHECK_INT_EQ(cudaEventRecord(ev, s), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpyAsync(out.data(), dy.d, n * sizeof(float), cudaMemcpyDeviceToHost, s),
		cudaSuccess);
	cudaGraph_t g = NULL;
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK(g != NULL);
	CHECK(out[0] == -1.0f); /* captured, not run */
	CHECK_INT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
	CHECK_INT_EQ(st, cudaStreamCaptureStatusNone);

	cudaGraphExec_t x = NULL;
	CHECK_INT_EQ(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
	CHECK_INT_EQ(cudaGraphDestroy(g), cudaSuccess); /* the exec keeps its own copy */
	/* Host memory is read at replay; kernel arguments were taken at capture. */
	for (int rep = 1; rep <= 3; rep++) {
		for (int i = 0; i < n; i++)
			in[i] = (float)(i * rep);
		a = 100.0f; /* not seen: captured by value */
		CHECK_INT_EQ(cudaGraphLaunch(x, s), cudaSuccess);
		CHECK_INT_EQ(cudaStreamSynchronize(s), cudaSuccess);
		int bad = 0;
		for (int i = 0; i < n; i++)
			bad += out[i] != 2.0f * (float)(i * rep) + 1.0f;
		CHECK_INT_EQ(bad, 0);
	}
	float ms;
	CHECK_INT_EQ(cudaEventElapsedTime(&ms, ev, ev), cudaSuccess);
	CHECK_INT_EQ(cudaGraphExecDestroy(x), cudaSuccess);
	CHECK_INT_EQ(cudaGraphExecDestroy(x), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaGraphLaunch(x, s), cudaErrorInvalidResourceHandle);
	CHECK_INT_EQ(cudaEventDestroy(ev), cudaSuccess);
	CHECK_INT_EQ(cudaStreamDestroy(s), cudaSuccess);
	cudaGetLastError();
}

/* What CUDA forbids during a capture fails, and the capture with it. */
static void test_graph_capture_misuse()
{
	cudaStream_t s;
	cudaGraph_t g = (cudaGraph_t)0x1;
	CHECK_INT_EQ(cudaStreamCreate(&s), cudaSuccess);
	CHECK_INT_EQ(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal),
		cudaErrorStreamCaptureUnsupported);
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);

	void *p = NULL;
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
	expect_diag("capturing");
	enum cudaStreamCaptureStatus st;
	CHECK_INT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
	CHECK_INT_EQ(st, cudaStreamCaptureStatusInvalidated);
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
	CHECK(g == NULL);

	float h[4] = { 0 };
	dbuf<float> d(4);
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(d.d, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorStreamCaptureImplicit);
	LAUNCH(fill_kernel, 1, 32, 0, 0, d.d, 4, 0.0f); /* the legacy stream */
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit);
	CHECK_INT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

	/* A bad copy inside the capture is refused there. */
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpyAsync(h, h, sizeof h, cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

	/* Relaxed mode lets this thread allocate. */
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&p, 64), cudaSuccess);
	CHECK_INT_EQ(cudaFree(p), cudaSuccess);
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK_INT_EQ(cudaGraphDestroy(g), cudaSuccess);
	CHECK_INT_EQ(cudaStreamDestroy(s), cudaSuccess);
	cudaGetLastError();
}

int main(void)
{
	setenv("CUDA_EMU_MEM_MB", "64", 1);
	test_device();
	test_malloc_ledger();
	test_free_checks();
	test_memcpy_checks();
	test_leak_report_at_exit();
	test_launch_errors();
	test_constant_symbol();
	test_streams_events();
	test_graph_capture_replay();
	test_graph_capture_misuse();
	test_trap_is_sticky();
	test_planted_fault();
	test_prefetch_range();
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
