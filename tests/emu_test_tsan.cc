/* emu_test_tsan.cc - a missing __syncthreads between one thread's write to
 * shared memory and another's read is reported by ThreadSanitizer as a data
 * race, through the emulator's use of TSan's fiber API; so is relying on a
 * shuffle to order memory.  Correct kernels (barriers, __syncwarp, atomics)
 * run clean.  tests/test_emu_planted_tsan is built by a make rule; it is a stub
 * exiting 77 without TSan, and the test skips where TSan cannot run.
 */
#include "emu_testutil.h"

/* (TSan sleeps a second at exit by default, for threads that we do not have.) */
static emu_child run(const char *mode, const char *env)
{
	return emu_run_prog(emu_test_prog("test_emu_planted_tsan"), mode,
		"TSAN_OPTIONS=atexit_sleep_ms=0 halt_on_error=0 exitcode=66", env);
}

static void expect_race(const char *mode, const char *func)
{
	emu_child c = run(mode, NULL);
	bool ok = c.exited && c.status == 66 && emu_has(c.err, "WARNING: ThreadSanitizer: data race") &&
		emu_has(c.err, func);
	if (!ok) {
		fprintf(stderr, "emu_planted_tsan %s: exited %d status %d signal %d; stderr:\n%s\n", mode,
			c.exited, c.status, c.sig, c.err.c_str());
		test_failures++;
	}
}

int main(void)
{
	emu_child probe = run("probe", NULL);
	if (!(probe.exited && probe.status == 0)) {
		fprintf(stderr, "TSan cannot run here (status %d, signal %d):\n%s\n", probe.status,
			probe.sig, probe.err.c_str());
		return TEST_SKIP;
	}
	expect_race("missing-syncthreads", "neighbour_kernel");
	expect_race("shfl-is-no-barrier", "warp_neighbour_kernel");
	const char *const orders[] = { "CUDA_EMU_ORDER=forward", "CUDA_EMU_ORDER=reverse",
		"CUDA_EMU_ORDER=random:3" };
	for (const char *o : orders) {
		emu_child c = run("ok", o);
		if (!(c.exited && c.status == 0) || emu_has(c.err, "ThreadSanitizer")) {
			fprintf(stderr, "emu_planted_tsan ok (%s): status %d; stderr:\n%s\n", o, c.status,
				c.err.c_str());
			test_failures++;
		}
	}
	return test_result();
}
