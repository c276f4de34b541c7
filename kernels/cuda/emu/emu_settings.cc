/* emu_settings.cc - what every file of the CUDA emulator leans on: its
 * settings (the environment first, then the cuda_emu_* calls), the one API
 * lock, and diagnostics.  Nothing here runs kernels or tracks memory: the
 * scheduler (emu.cc) and the host API (emu_host.cc) build on it.
 */
#include "emu_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

namespace cuda_emu {

static thread_local char last_diag[1024];

/* ---- settings ---- */
settings &config()
{
	static settings *s = [] {
		settings *c = new settings();
		c->order = CUDA_EMU_ORDER_FORWARD;
		c->seed = 1;
#ifdef EMU_ASAN
		c->stack_bytes = 1024 * 1024;
#else
		c->stack_bytes = 256 * 1024;
#endif
		c->mem_total = 16384ull << 20;
		const char *e = getenv("CUDA_EMU_ORDER");
		if (e && *e) {
			if (!strcmp(e, "reverse"))
				c->order = CUDA_EMU_ORDER_REVERSE;
			else if (!strncmp(e, "random", 6) && (e[6] == 0 || e[6] == ':')) {
				c->order = CUDA_EMU_ORDER_RANDOM;
				c->seed = e[6] ? strtoull(e + 7, NULL, 0) :
					(unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
			} else if (strcmp(e, "forward") != 0)
				fprintf(stderr, "cuda-emu: CUDA_EMU_ORDER=%s is not forward, reverse or "
					"random[:seed]; using forward\n", e);
		}
		if ((e = getenv("CUDA_EMU_MEM_MB")) && atoll(e) > 0)
			c->mem_total = (size_t)atoll(e) << 20;
		if ((e = getenv("CUDA_EMU_FAULT_LAUNCH")) && atoll(e) > 0)
			c->fault_at = (unsigned long long)atoll(e);
		if ((e = getenv("CUDA_EMU_STACK_KB")) && atoll(e) > 0)
			c->stack_bytes = (size_t)atoll(e) << 10;
		c->quiet = (e = getenv("CUDA_EMU_QUIET")) && *e && strcmp(e, "0") != 0;
		return c;
	}();
	return *s;
}

std::mutex &api_lock()
{
	static std::mutex *m = new std::mutex();
	return *m;
}

void diag(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_diag, sizeof last_diag, fmt, ap);
	va_end(ap);
	if (!config().quiet)
		fprintf(stderr, "cuda-emu: %s\n", last_diag);
}

} // namespace cuda_emu

using namespace cuda_emu;

extern "C" const char *cuda_emu_last_diagnostic(void)
{
	return last_diag;
}
