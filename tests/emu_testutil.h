/* emu_testutil.h - helpers the CUDA emulator's tests share (C++): run a
 * check in every thread order, and run a program in a child process with
 * its stderr captured.
 *
 * The kernel tests (test_cuda_rows, _attention, _matmul) also build under
 * nvcc for a real GPU (tests/gpu_kernel_tests.sh, .ci/gpu-bundle): there
 * the device has one thread order of its own and no leak tracker, so
 * for_each_order runs a check once ("device") and cuda_emu_check_leaks
 * says 0.
 */
#ifndef LLMD_EMU_TESTUTIL_H
#define LLMD_EMU_TESTUTIL_H

#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "testutil.h"

/* A device buffer of N elements, filled with byte FILL; freed with it. */
template <typename T>
struct dbuf {
	T *d = nullptr;
	size_t n;
	explicit dbuf(size_t n_, int fill = 0) : n(n_)
	{
		CHECK_INT_EQ(cudaMalloc(&d, n * sizeof(T)), cudaSuccess);
		CHECK_INT_EQ(cudaMemset(d, fill, n * sizeof(T)), cudaSuccess);
	}
	~dbuf() { CHECK_INT_EQ(cudaFree(d), cudaSuccess); }
	dbuf(const dbuf &) = delete;
	dbuf &operator=(const dbuf &) = delete;
	std::vector<T> get() const
	{
		std::vector<T> h(n);
		CHECK_INT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
		return h;
	}
	void put(const std::vector<T> &h)
	{
		CHECK(h.size() == n);
		CHECK_INT_EQ(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
	}
};

#ifndef CUDA_EMU /* nvcc, a real device */
static inline size_t cuda_emu_check_leaks(void)
{
	return 0;
}

/* Before main: no device, nothing to test (exit 77, as test_cuda_device). */
__attribute__((constructor)) static void emu_test_need_device(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("SKIP: the CUDA runtime sees no device: %s\n",
			e != cudaSuccess ? cudaGetErrorString(e) : "none");
		exit(TEST_SKIP);
	}
}

static inline void for_each_order(const std::function<void(const char *)> &fn)
{
	int before = test_failures;
	fn("device");
	if (test_failures != before)
		fprintf(stderr, "  (on the device)\n");
}
#else
/* The orders every kernel test runs in: forward, reverse and two seeds. */
static const struct emu_test_order {
	enum cuda_emu_order order;
	unsigned long long seed;
	const char *name;
} emu_test_orders[] = {
	{ CUDA_EMU_ORDER_FORWARD, 0, "forward" },
	{ CUDA_EMU_ORDER_REVERSE, 0, "reverse" },
	{ CUDA_EMU_ORDER_RANDOM, 1, "random:1" },
	{ CUDA_EMU_ORDER_RANDOM, 20240611, "random:20240611" },
};

/* Calls FN(order name) once per order, with that order set; failures name
 * the order. */
static inline void for_each_order(const std::function<void(const char *)> &fn)
{
	for (const emu_test_order &o : emu_test_orders) {
		cuda_emu_set_order(o.order, o.seed);
		int before = test_failures;
		fn(o.name);
		if (test_failures != before)
			fprintf(stderr, "  (in thread order %s)\n", o.name);
	}
	cuda_emu_set_order(CUDA_EMU_ORDER_FORWARD, 0);
}
#endif

/* Kernel launches FN makes: the emulator counts them; -1 on a device
 * (unchecked there). */
static inline long long launches_of(const std::function<void()> &fn)
{
#ifdef CUDA_EMU
	unsigned long long l0, l1, sw;
	cuda_emu_stats(&l0, &sw);
	fn();
	cuda_emu_stats(&l1, &sw);
	return (long long)(l1 - l0);
#else
	fn();
	return -1;
#endif
}

/* Whether GOT (RoPE on the device) matches WANT (the CPU's) for inputs of
 * magnitude at most XMAX.  On the emulator, sinf/cosf are the host's: the
 * same bits.  On a GPU, CUDA's sinf/cosf (<= 2 ulp, CUDA C Programming
 * Guide) and glibc's (<= 1 ulp) leave each of c and s within 3 ulp of 1
 * (3.6e-7) of the CPU's, so x0 c - x1 s moves by at most 2 XMAX 3.6e-7 plus
 * its own rounding: within 8 FLT_EPSILON XMAX (1.9e-6 at XMAX 2) of the
 * CPU's, where a wrong angle, pair or sign moves it by O(XMAX).  The ulp
 * distance would mislead: x0 c - x1 s cancels.  *ERR gets the largest
 * absolute difference. */
static inline bool rope_matches(const std::vector<float> &got, const std::vector<float> &want, float xmax,
	double *err)
{
	*err = 0;
	if (got.size() != want.size())
		return false;
	bool same = true;
	for (size_t i = 0; i < got.size(); i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= *err)) /* a NaN sticks */
			*err = d;
		same = same && memcmp(&got[i], &want[i], sizeof(float)) == 0;
	}
#ifdef CUDA_EMU
	(void)xmax;
	return same;
#else
	(void)same;
	return *err <= 8.0 * FLT_EPSILON * xmax;
#endif
}

/* How a child ended and what it wrote on stderr. */
struct emu_child {
	bool exited;       /* normal exit: status is the exit code */
	int status;
	bool signaled;     /* killed: sig is the signal */
	int sig;
	std::string err;   /* its stderr */
};

/* Runs FN in a forked child (its stderr captured, stdout discarded) and
 * waits for it; FN's return value is the exit code. */
static inline emu_child emu_run_child_fn(const std::function<int()> &fn)
{
	emu_child r = { false, -1, false, 0, std::string() };
	int p[2];
	if (pipe(p) != 0)
		return r;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return r;
	if (pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);
		dup2(devnull, 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		exit(fn());
	}
	close(p[1]);
	char buf[4096];
	ssize_t n;
	while ((n = read(p[0], buf, sizeof buf)) > 0)
		r.err.append(buf, (size_t)n);
	close(p[0]);
	int st;
	waitpid(pid, &st, 0);
	r.exited = WIFEXITED(st);
	r.status = r.exited ? WEXITSTATUS(st) : -1;
	r.signaled = WIFSIGNALED(st);
	r.sig = r.signaled ? WTERMSIG(st) : 0;
	return r;
}

/* Path of a program built in tests/ ($LLMD_BUILDDIR/tests/NAME). */
static inline std::string emu_test_prog(const char *name)
{
	const char *b = getenv("LLMD_BUILDDIR");
	return std::string(b ? b : ".") + "/tests/" + name;
}

/* Runs PROG MODE in a child with extra environment ENV and ENV2 ("K=V" or NULL). */
static inline emu_child emu_run_prog(const std::string &prog, const char *mode, const char *env,
	const char *env2 = NULL)
{
	return emu_run_child_fn([&]() {
		if (env)
			putenv(strdup(env));
		if (env2)
			putenv(strdup(env2));
		execl(prog.c_str(), prog.c_str(), mode, (char *)NULL);
		perror(prog.c_str());
		return 127;
	});
}

static inline bool emu_has(const std::string &s, const char *what)
{
	return s.find(what) != std::string::npos;
}

#endif
