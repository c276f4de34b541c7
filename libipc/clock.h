/* clock.h - the one clock of llmd: CLOCK_MONOTONIC, in the unit a caller
 * needs.  Header-only, below everything (libipc includes nothing of ours),
 * so the kernels, the engine, the daemon, the clients and the tools all
 * time things the same way.  Any thread.
 */
#ifndef LLMD_CLOCK_H
#define LLMD_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic nanoseconds (an arbitrary origin: only differences mean anything). */
static inline int64_t clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Monotonic microseconds (sd_notify's MONOTONIC_USEC). */
static inline uint64_t clock_us(void)
{
	return (uint64_t)clock_ns() / 1000;
}

/* Monotonic milliseconds (poll timeouts, deadlines). */
static inline int64_t clock_ms(void)
{
	return clock_ns() / 1000000;
}

/* Monotonic seconds (durations, rates, ages). */
static inline double clock_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
