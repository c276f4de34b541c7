/* emu_test_asan.cc - out-of-bounds shared memory in a kernel is caught by
 * AddressSanitizer when the emulator and the kernel are built with it:
 * a static __shared__ array (a global with redzones) and DYN_SHARED memory
 * (an allocation of exactly the launch's size).  tests/test_emu_planted_asan is
 * built by a make rule; without ASan it is a stub that exits 77.
 */
#include "emu_testutil.h"

static void expect_asan(const char *mode, const char *kind, const char *func)
{
	emu_child c = emu_run_prog(emu_test_prog("test_emu_planted_asan"), mode, NULL);
	bool ok = !(c.exited && c.status == 0) && emu_has(c.err, "ERROR: AddressSanitizer") &&
		emu_has(c.err, kind) && emu_has(c.err, func);
	if (!ok) {
		fprintf(stderr, "emu_planted_asan %s: exited %d status %d signal %d; stderr:\n%s\n", mode,
			c.exited, c.status, c.sig, c.err.c_str());
		test_failures++;
	}
}

int main(void)
{
	emu_child probe = emu_run_prog(emu_test_prog("test_emu_planted_asan"), "probe", NULL);
	if (probe.exited && probe.status == TEST_SKIP) {
		fprintf(stderr, "%s", probe.err.c_str());
		return TEST_SKIP;
	}
	CHECK(probe.exited && probe.status == 0);
	expect_asan("shared-oob", "global-buffer-overflow", "shared_oob_kernel");
	expect_asan("dyn-shared-oob", "heap-buffer-overflow", "dyn_oob_kernel");
	/* And correct kernels, every order, fibers switching, run clean. */
	const char *const orders[] = { "CUDA_EMU_ORDER=forward", "CUDA_EMU_ORDER=reverse",
		"CUDA_EMU_ORDER=random:3" };
	for (const char *o : orders) {
		emu_child c = emu_run_prog(emu_test_prog("test_emu_planted_asan"), "ok", o);
		if (!(c.exited && c.status == 0)) {
			fprintf(stderr, "emu_planted_asan ok (%s) failed:\n%s\n", o, c.err.c_str());
			test_failures++;
		}
	}
	return test_result();
}
