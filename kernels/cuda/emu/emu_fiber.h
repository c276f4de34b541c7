/* emu_fiber.h - stackful fibers for the CUDA emulator: one per CUDA thread.
 *
 * A fiber owns an mmap'd stack with a guard region below it, so an overflow
 * faults.  Switching is a hand-written register swap on x86-64 (no syscall,
 * no signal mask) and swapcontext elsewhere.  Every switch is announced to
 * ASan (__sanitizer_{start,finish}_switch_fiber) and to TSan
 * (__tsan_switch_to_fiber, without synchronization: happens-before between
 * fibers is the caller's business).  Internal to the emulator; one OS thread
 * drives a set of fibers at a time.
 */
#ifndef LLMD_CUDA_EMU_FIBER_H
#define LLMD_CUDA_EMU_FIBER_H

#include <stddef.h>

/* Which sanitizer the emulator is built with (GCC and clang spellings). */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(EMU_ASAN)
#define EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(EMU_TSAN)
#define EMU_TSAN 1
#endif
#endif

#if !defined(__x86_64__) || defined(EMU_FIBER_UCONTEXT)
#define EMU_FIBER_USE_UCONTEXT 1
#include <ucontext.h>
#endif

struct emu_fiber {
	void *sp;               /* saved stack pointer while switched out (x86-64) */
	char *map;              /* the mmap'd region, guard included; NULL for a host context */
	size_t map_size;        /* bytes */
	char *stack_lo;         /* usable stack, just above the guard */
	size_t stack_size;      /* bytes */
	void *asan_fake_stack;  /* ASan's fake-stack handle while switched out */
	void *tsan_fiber;       /* TSan's context for this fiber (or the host thread's) */
	int dirty;              /* left in the middle of a function: unpoison it all on reuse */
#ifdef EMU_FIBER_USE_UCONTEXT
	ucontext_t uc;
#endif
};

/* Bytes of the guard region below each stack. */
#define EMU_FIBER_GUARD (64 * 1024)

/* Makes F a fiber with a stack of STACK_SIZE bytes (rounded up to pages).
 * Returns 0 or a negative errno; F is left safe to destroy either way. */
int emu_fiber_init(struct emu_fiber *f, size_t stack_size);

/* Makes F stand for the calling OS thread's own context, the one fibers are
 * switched from and back to. */
void emu_fiber_init_host(struct emu_fiber *f);

/* Unmaps F's stack and drops its TSan context.  NULL-safe for half-built ones. */
void emu_fiber_destroy(struct emu_fiber *f);

/* Makes the next switch to F begin ENTRY on a fresh stack.  ENTRY must start
 * with emu_fiber_entered() and must never return: it ends with
 * emu_fiber_exit(). */
void emu_fiber_start(struct emu_fiber *f, void (*entry)(void));

/* Saves the running context in FROM and resumes TO; returns when something
 * switches back to FROM. */
void emu_fiber_switch(struct emu_fiber *from, struct emu_fiber *to);

/* The first call of a fiber's ENTRY: completes the switch that started it. */
void emu_fiber_entered(void);

/* Leaves FROM for good (its ASan fake stack is released) and resumes TO. */
[[noreturn]] void emu_fiber_exit(struct emu_fiber *from, struct emu_fiber *to);

/* 1 when ADDR lies in the guard region of a fiber stack made by this
 * module (for the stack-overflow message). */
int emu_fiber_is_guard(const void *addr);

#endif
