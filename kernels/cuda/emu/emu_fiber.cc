/* emu_fiber.cc - the CUDA emulator's fibers: guarded stacks and the switch.
 *
 * Not a general coroutine library: no scheduling here, no per-fiber
 * arguments (the caller keeps its own "current" pointer), nothing is freed
 * behind the caller's back.
 */
#include "emu_fiber.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* ---- the register swap ---- */
#ifndef EMU_FIBER_USE_UCONTEXT
/* Saves the callee-saved registers, MXCSR and the x87 control word on the
 * current stack, stores the stack pointer in *SAVE_SP, loads NEW_SP and
 * restores the same from there.  A fresh stack is laid out by
 * emu_fiber_start() so that the final ret enters the fiber's entry. */
extern "C" void emu_fiber_swap(void **save_sp, void *new_sp);
asm(".text\n"
	".p2align 4\n"
	".globl emu_fiber_swap\n"
	".hidden emu_fiber_swap\n"
	".type emu_fiber_swap, @function\n"
	"emu_fiber_swap:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size emu_fiber_swap, .-emu_fiber_swap\n");
#endif

/* ---- guard regions, for the stack-overflow message ---- */
#define GUARDS_MAX 4096
static char *guards[GUARDS_MAX]; /* lowest address of each guard region */
static int n_guards;             /* written under the emulator's lock */

int emu_fiber_is_guard(const void *addr)
{
	int n = __atomic_load_n(&n_guards, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n; i++) {
		const char *g = __atomic_load_n(&guards[i], __ATOMIC_RELAXED);
		if (g && (const char *)addr >= g && (const char *)addr < g + EMU_FIBER_GUARD)
			return 1;
	}
	return 0;
}

/* ---- the host stack, as ASan last reported it ---- */
#ifdef EMU_ASAN
static __thread const void *host_stack_lo;
static __thread size_t host_stack_size;
#endif

int emu_fiber_init(struct emu_fiber *f, size_t stack_size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	memset(f, 0, sizeof *f);
	stack_size = (stack_size + page - 1) / page * page;
	void *m = mmap(NULL, stack_size + EMU_FIBER_GUARD, PROT_READ | PROT_WRITE,
		MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (m == MAP_FAILED)
		return -errno;
	if (mprotect(m, EMU_FIBER_GUARD, PROT_NONE) != 0) {
		int e = -errno;
		munmap(m, stack_size + EMU_FIBER_GUARD);
		return e;
	}
	f->map = (char *)m;
	f->map_size = stack_size + EMU_FIBER_GUARD;
	f->stack_lo = f->map + EMU_FIBER_GUARD;
	f->stack_size = stack_size;
	int slot = __atomic_load_n(&n_guards, __ATOMIC_RELAXED);
	if (slot < GUARDS_MAX) {
		__atomic_store_n(&guards[slot], f->map, __ATOMIC_RELAXED);
		__atomic_store_n(&n_guards, slot + 1, __ATOMIC_RELEASE);
	}
#ifdef EMU_TSAN
	f->tsan_fiber = __tsan_create_fiber(0);
#endif
	return 0;
}

void emu_fiber_init_host(struct emu_fiber *f)
{
	memset(f, 0, sizeof *f);
#ifdef EMU_TSAN
	f->tsan_fiber = __tsan_get_current_fiber();
#endif
}

void emu_fiber_destroy(struct emu_fiber *f)
{
	if (!f || !f->map)
		return;
	int n = __atomic_load_n(&n_guards, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n; i++)
		if (guards[i] == f->map)
			__atomic_store_n(&guards[i], (char *)NULL, __ATOMIC_RELAXED);
#ifdef EMU_TSAN
	if (f->tsan_fiber)
		__tsan_destroy_fiber(f->tsan_fiber);
#endif
#ifdef EMU_ASAN
	__asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
	munmap(f->map, f->map_size);
	f->map = NULL;
}

void emu_fiber_start(struct emu_fiber *f, void (*entry)(void))
{
#ifdef EMU_ASAN
	/* A finished fiber leaves poison only in its entry's frame at the top; one
	 * abandoned mid-call (a trap, a deadlock) leaves it anywhere. */
	size_t top = f->dirty || f->stack_size < 16384 ? f->stack_size : 16384;
	__asan_unpoison_memory_region(f->stack_lo + f->stack_size - top, top);
#endif
	f->dirty = 0;
	f->asan_fake_stack = NULL;
#ifdef EMU_FIBER_USE_UCONTEXT
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack_lo;
	f->uc.uc_stack.ss_size = f->stack_size;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, entry, 0);
#else
	uint32_t ctl[2];
	asm volatile("stmxcsr %0" : "=m"(ctl[0]));
	asm volatile("fnstcw %0" : "=m"(ctl[1]));
	void **sp = (void **)(((uintptr_t)(f->stack_lo + f->stack_size)) & ~(uintptr_t)15);
	*--sp = NULL;            /* entry's return address: there is none */
	*--sp = (void *)entry;   /* where the first swap returns to */
	for (int i = 0; i < 6; i++)
		*--sp = NULL;    /* rbp rbx r12 r13 r14 r15 */
	--sp;
	memcpy(sp, &ctl[0], 4);  /* mxcsr, then the x87 control word */
	memcpy((char *)sp + 4, &ctl[1], 4);
	f->sp = sp;
#endif
}

/* The switch and the final exit are not instrumented by TSan: an exit's
 * function entry would never be matched on the fiber's shadow stack, which
 * would then grow with every block the fiber runs. */
#ifdef EMU_TSAN
#define TSAN_UNSEEN __attribute__((no_sanitize("thread")))
#else
#define TSAN_UNSEEN
#endif

TSAN_UNSEEN static inline void swap_to(struct emu_fiber *from, struct emu_fiber *to)
{
#ifdef EMU_FIBER_USE_UCONTEXT
#ifdef EMU_TSAN
	__tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
	swapcontext(&from->uc, &to->uc);
#else
	void *sp = to->sp; /* read before TSan believes TO is running */
#ifdef EMU_TSAN
	__tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
	emu_fiber_swap(&from->sp, sp);
#endif
}

#ifdef EMU_ASAN
static void asan_finish(struct emu_fiber *self)
{
	const void *lo;
	size_t size;
	__sanitizer_finish_switch_fiber(self ? self->asan_fake_stack : NULL, &lo, &size);
	if (!self || self->map) { /* a fiber resumed: it came from the host */
		host_stack_lo = lo;
		host_stack_size = size;
	}
}
static void asan_start(void **fake, struct emu_fiber *to)
{
	if (to->map)
		__sanitizer_start_switch_fiber(fake, to->stack_lo, to->stack_size);
	else
		__sanitizer_start_switch_fiber(fake, host_stack_lo, host_stack_size);
}
#endif

void emu_fiber_switch(struct emu_fiber *from, struct emu_fiber *to)
{
#ifdef EMU_ASAN
	asan_start(&from->asan_fake_stack, to);
#endif
	swap_to(from, to);
#ifdef EMU_ASAN
	asan_finish(from);
#endif
}

void emu_fiber_entered(void)
{
#ifdef EMU_ASAN
	asan_finish(NULL);
#endif
}

TSAN_UNSEEN void emu_fiber_exit(struct emu_fiber *from, struct emu_fiber *to)
{
#ifdef EMU_ASAN
	asan_start(NULL, to);
#endif
	swap_to(from, to);
	__builtin_unreachable();
}
