/* cpu_pool.c - persistent worker threads with spin-then-futex hand-off.
 *
 * Not a general thread pool: one caller, one job at a time, tasks claimed
 * from an atomic counter.  The caller works on the job too, so a pool of one
 * thread simply runs the tasks inline.
 *
 * On a machine shared with other busy programs a worker can be descheduled
 * in the middle of a task, and the caller then waits a scheduler time slice
 * for it at every job: decode fell tenfold below one thread's speed.  So a
 * caller that had to wait long (longer than a few of its own tasks took: a
 * worker busy with a long task is no sign of contention) runs the next jobs
 * alone, as many as doubles with each such wait, and tries the workers
 * again after them.
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

#include "clock.h"
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_SPIN 20000     /* polls before an idle worker sleeps (~1 ms) */
#define POOL_WAIT_SPIN 4000 /* polls before the caller yields while waiting */
#define POOL_SLOW_NS 500000 /* a wait for workers this long (0.5 ms, and three of the
			      caller's tasks) means contention */
#define POOL_SOLO_MIN 64    /* jobs run alone after the first slow wait */
#define POOL_SOLO_MAX 16384 /* ... and at most, after repeated ones */

struct cpu_pool {
	int n_threads;            /* caller + workers */
	pthread_t *threads;       /* (n_threads - 1) */
	/* The job, written by the caller before it publishes claim; read by a
	 * worker only after it claimed a task of it, so it cannot change then. */
	cpu_task_fn fn;
	void *ctx;
	_Alignas(64) atomic_uint gen;  /* job generation; futex word workers wait on */
	/* The job's tasks (high half) and the next unclaimed one (low half):
	 * a claim is a compare-and-swap, so a worker late from an earlier job
	 * claims nothing of it, and the caller never waits for one. */
	_Alignas(64) _Atomic uint64_t claim;
	_Alignas(64) atomic_int done;  /* tasks finished */
	atomic_int sleeping;      /* workers blocked in futex wait */
	atomic_int quit;          /* set by cpu_pool_free */
	atomic_int refs;          /* owners: cpu_pool_new's and cpu_pool_ref's */
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

/* The tasks this thread claims; how many. */
static int run_tasks(struct cpu_pool *p, int worker)
{
	int ran = 0;
	uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
	for (;;) {
		if ((uint32_t)c >= (uint32_t)(c >> 32))
			break;
		if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
							   memory_order_acquire))
			continue;
		p->fn(p->ctx, (int)(uint32_t)c, worker);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
		ran++;
		c = atomic_load_explicit(&p->claim, memory_order_acquire);
	}
	return ran;
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
	atomic_init(&p->refs, 1);
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

void cpu_pool_ref(struct cpu_pool *p)
{
	atomic_fetch_add(&p->refs, 1);
}

void cpu_pool_free(struct cpu_pool *p)
{
	int i;

	if (!p || atomic_fetch_sub(&p->refs, 1) > 1)
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

/* A worker still inside a task as long as the caller's own take is only
 * busy (big batches have tasks of milliseconds): contention means a wait
 * of POOL_SLOW_NS and longer than three of the caller's tasks. */
int cpu_pool_wait_is_contention(int64_t wait_ns, int64_t mine_ns, int ran)
{
	return wait_ns >= POOL_SLOW_NS && wait_ns > 3 * (mine_ns / (ran > 0 ? ran : 1));
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
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store_explicit(&p->claim, (uint64_t)n << 32, memory_order_release);
	atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleeping check */
	if (atomic_load(&p->sleeping))
		futex_wake_all(&p->gen);
	int64_t start = clock_ns();
	int ran = run_tasks(p, 0);
	int64_t mine = clock_ns() - start;
	/* Every task must be finished before the next job rewrites fn/ctx.
	 * On a machine with more runnable threads than cores a worker may be
	 * descheduled in one: after a short spin, yield the core instead of
	 * burning it. */
	int64_t t0 = 0;
	for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; spins++) {
		if (spins < POOL_WAIT_SPIN) {
			cpu_relax();
			continue;
		}
		if (spins == POOL_WAIT_SPIN)
			t0 = clock_ns();
		sched_yield();
	}
	if (t0 && cpu_pool_wait_is_contention(clock_ns() - t0, mine, ran)) {
		p->solo_left = p->solo_next ? p->solo_next : POOL_SOLO_MIN;
		p->solo_next = p->solo_left < POOL_SOLO_MAX / 2 ? 2 * p->solo_left : POOL_SOLO_MAX;
		return;
	}
	/* a job without a long wait: the next slow one starts the back-off over */
	p->solo_next = 0;
}
