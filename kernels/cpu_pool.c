/* cpu_pool.c - persistent worker threads with spin-then-futex hand-off.
 *
 * Not a general thread pool: one caller, one job at a time, tasks claimed
 * from an atomic counter.  The caller works on the job too, so a pool of one
 * thread simply runs the tasks inline.
 *
 * On a machine shared with other busy programs a worker can be descheduled
 * in the middle of a task, and the caller then waits a scheduler time slice
 * for it at every job: decode fell tenfold below one thread's speed.  So a
 * caller that had to wait long runs the next jobs alone, as many as doubles
 * with each such wait, and tries the workers again after them.
 */
#include "cpu_pool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_SPIN 20000     /* polls before an idle worker sleeps (~1 ms) */
#define POOL_WAIT_SPIN 4000 /* polls before the caller yields while waiting */
#define POOL_SLOW_NS 500000 /* a wait for workers this long (0.5 ms) means contention */
#define POOL_SOLO_MIN 64    /* jobs run alone after the first slow wait */
#define POOL_SOLO_MAX 16384 /* ... and at most, after repeated ones */

struct cpu_pool {
	int n_threads;            /* caller + workers */
	pthread_t *threads;       /* (n_threads - 1) */
	/* The job, written by the caller before it bumps gen. */
	cpu_task_fn fn;
	void *ctx;
	int n_tasks;
	_Alignas(64) atomic_uint gen;  /* job generation; futex word workers wait on */
	_Alignas(64) atomic_int next;  /* next unclaimed task */
	_Alignas(64) atomic_int done;  /* tasks finished */
	atomic_int active;        /* workers still inside the current job */
	atomic_int sleeping;      /* workers blocked in futex wait */
	atomic_int quit;          /* set by cpu_pool_free */
	/* Caller only: */
	int solo_left;            /* jobs still to run on the caller alone */
	int solo_next;            /* length of the next such run; 0 = POOL_SOLO_MIN */
};

struct worker_arg {
	struct cpu_pool *pool;
	int id;
};

static void futex_wait(atomic_uint *addr, unsigned val)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static void run_tasks(struct cpu_pool *p, int worker)
{
	int n = p->n_tasks;
	for (;;) {
		int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (i >= n)
			break;
		p->fn(p->ctx, i, worker);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
	}
}

static void *worker_main(void *arg)
{
	struct worker_arg *wa = arg;
	struct cpu_pool *p = wa->pool;
	int id = wa->id;
	unsigned seen = 0;

	free(wa);
	for (;;) {
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
			if (atomic_load_explicit(&p->quit, memory_order_relaxed))
				return NULL;
			if (++spins < POOL_SPIN) {
				cpu_relax();
				continue;
			}
			atomic_fetch_add(&p->sleeping, 1);
			if (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
				futex_wait(&p->gen, seen);
			atomic_fetch_sub(&p->sleeping, 1);
			spins = 0;
		}
		seen = g;
		if (atomic_load_explicit(&p->quit, memory_order_relaxed))
			return NULL;
		run_tasks(p, id);
		atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
	}
}

int cpu_pool_new(int n_threads, struct cpu_pool **ret)
{
	struct cpu_pool *p;
	int i;

	if (n_threads < 1 || n_threads > 1024)
		return -EINVAL;
	p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->n_threads = 1;
	p->threads = calloc((size_t)n_threads, sizeof *p->threads);
	if (!p->threads)
		goto fail;
	for (i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (!wa)
			goto fail;
		wa->pool = p;
		wa->id = i;
		if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
			free(wa);
			goto fail;
		}
		p->n_threads++;
	}
	*ret = p;
	return 0;
fail:
	cpu_pool_free(p);
	return -ENOMEM;
}

void cpu_pool_free(struct cpu_pool *p)
{
	int i;

	if (!p)
		return;
	atomic_store(&p->quit, 1);
	atomic_fetch_add(&p->gen, 1);
	futex_wake_all(&p->gen);
	for (i = 0; i < p->n_threads - 1; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	free(p);
}

int cpu_pool_threads(const struct cpu_pool *p)
{
	return p->n_threads;
}

void cpu_pool_run(struct cpu_pool *p, cpu_task_fn fn, void *ctx, int n)
{
	int workers = p->n_threads - 1;

	if (n <= 0)
		return;
	if (workers == 0 || n == 1 || p->solo_left > 0) {
		if (workers && n > 1)
			p->solo_left--;
		for (int i = 0; i < n; i++)
			fn(ctx, i, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n_tasks = n;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store_explicit(&p->active, workers, memory_order_relaxed);
	atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleeping check */
	if (atomic_load(&p->sleeping))
		futex_wake_all(&p->gen);
	run_tasks(p, 0);
	/* Every worker must leave run_tasks before the next job rewrites
	 * fn/ctx/n_tasks, not only finish the tasks.  On a machine with more
	 * runnable threads than cores a worker may be descheduled: after a
	 * short spin, yield the core instead of burning it. */
	struct timespec t0 = { 0, 0 };
	for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n ||
			    atomic_load_explicit(&p->active, memory_order_acquire) > 0; spins++) {
		if (spins < POOL_WAIT_SPIN) {
			cpu_relax();
			continue;
		}
		if (spins == POOL_WAIT_SPIN)
			clock_gettime(CLOCK_MONOTONIC, &t0);
		sched_yield();
	}
	if (t0.tv_sec || t0.tv_nsec) {
		struct timespec t1;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
		if (ns >= POOL_SLOW_NS) {
			p->solo_left = p->solo_next ? p->solo_next : POOL_SOLO_MIN;
			p->solo_next = p->solo_left < POOL_SOLO_MAX / 2 ? 2 * p->solo_left : POOL_SOLO_MAX;
			return;
		}
	}
	/* a job without a long wait: the next slow one starts the back-off over */
	p->solo_next = 0;
}
