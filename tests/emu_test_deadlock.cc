/* emu_test_deadlock.cc - planted kernel bugs that the emulator itself
 * reports: a barrier in divergent code, a shuffle whose mask names lanes
 * that exited, half a warp at a barrier and half at a shuffle (each a
 * deadlock on a GPU), and a fiber stack overflow.  Each runs in a child
 * (tests/test_emu_planted) that must abort with a report naming what waits where.
 */
#include "emu_testutil.h"

static void expect_report(const char *mode, int sig, const char *const *needles)
{
	emu_child c = emu_run_prog(emu_test_prog("test_emu_planted"), mode, NULL);
	bool ok = c.signaled && c.sig == sig;
	for (const char *const *n = needles; *n; n++)
		ok = ok && emu_has(c.err, *n);
	if (!ok) {
		fprintf(stderr, "emu_planted %s: exited %d status %d, signal %d (want %d); stderr:\n%s\n",
			mode, c.exited, c.status, c.sig, sig, c.err.c_str());
		test_failures++;
	}
}

int main(void)
{
	static const char *const divergent[] = {
		"deadlock: the block's threads wait at different barriers",
		"kernel divergent_barrier_kernel launched at",
		"emu_planted.cc:",
		"warp 0 lanes 0-31 (threads 0,0,0..31,0,0): wait at __syncthreads (",
		"lanes 0-7 (threads 32,0,0..39,0,0): wait at __syncthreads",
		"lanes 8-31 (threads 40,0,0..63,0,0): wait at __syncthreads",
		NULL,
	};
	expect_report("divergent-barrier", SIGABRT, divergent);
	static const char *const exited[] = {
		"deadlock: no thread of the block can run and 32 have not exited",
		"kernel shfl_exited_kernel",
		"lanes 0-15 (threads 0,0,0..15,0,0): wait at __shfl_xor_sync mask 0xffffffff (",
		"which lacks lanes 16-31",
		"lanes 16-31 (threads 16,0,0..31,0,0): exited",
		"warp 1",
		NULL,
	};
	expect_report("shfl-exited-lane", SIGABRT, exited);
	static const char *const mixed[] = {
		"deadlock: no thread of the block can run",
		"lanes 0-15 (threads 0,0,0..15,0,0): wait at __syncthreads (",
		"lanes 16-31 (threads 16,0,0..31,0,0): wait at __shfl_sync mask 0xffffffff (",
		"thread order forward",
		NULL,
	};
	expect_report("barrier-vs-shfl", SIGABRT, mixed);

	/* The same report in another order names that order and its seed. */
	emu_child c = emu_run_prog(emu_test_prog("test_emu_planted"), "barrier-vs-shfl",
		"CUDA_EMU_ORDER=random:77");
	CHECK(c.signaled && emu_has(c.err, "thread order random:77"));

	/* The guard region stops it; under ASan (--enable-asan) ASan says so. */
	c = emu_run_prog(emu_test_prog("test_emu_planted"), "stack-overflow", NULL);
	if (!(c.signaled && c.sig == SIGSEGV && emu_has(c.err, "stack overflow in a CUDA thread")) &&
		!(!(c.exited && c.status == 0) && emu_has(c.err, "AddressSanitizer: stack-overflow"))) {
		fprintf(stderr, "emu_planted stack-overflow: exited %d status %d signal %d; stderr:\n%s\n",
			c.exited, c.status, c.sig, c.err.c_str());
		test_failures++;
	}

	c = emu_run_prog(emu_test_prog("test_emu_planted"), "ok", NULL);
	if (!(c.exited && c.status == 0)) {
		fprintf(stderr, "emu_planted ok failed:\n%s\n", c.err.c_str());
		test_failures++;
	}
	return test_result();
}
