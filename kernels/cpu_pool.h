/* cpu_pool.h - a persistent pool of worker threads for the CPU kernels.
 *
 * One caller thread (the engine thread) hands a job of N independent tasks to
 * the pool and takes part in it itself; workers claim tasks by an atomic
 * compare-and-swap.  Workers spin briefly between jobs and then sleep on a futex, so
 * a decode step with hundreds of small jobs pays no thread creation and
 * little wake-up latency.  Not for use by more than one caller thread.
 */
#ifndef LLMD_CPU_POOL_H
#define LLMD_CPU_POOL_H

#include <stdint.h>

struct cpu_pool;

/* TASK(ctx, i, worker) runs task I (0 <= i < n) on thread WORKER
 * (0 = the caller, 1..n_threads-1 = workers). */
typedef void (*cpu_task_fn)(void *ctx, int i, int worker);

/* N_THREADS counts the caller: 1 = no extra threads.  Returns 0 or a
 * negative errno. */
int cpu_pool_new(int n_threads, struct cpu_pool **ret);
/* Drops an owner: the last one's call joins the workers.  NULL-safe. */
void cpu_pool_free(struct cpu_pool *p);
/* Adds an owner (cpu_pool_free once more), for a second user of the same
 * caller thread: two engines that one thread steps in turn. */
void cpu_pool_ref(struct cpu_pool *p);

int cpu_pool_threads(const struct cpu_pool *p);

/* Runs FN over tasks 0..N-1 and returns when all are done.  Caller thread
 * only.  N may be smaller than the number of threads. */
void cpu_pool_run(struct cpu_pool *p, cpu_task_fn fn, void *ctx, int n);

/* cpu_pool_run's back-off rule, exposed for its test: whether the caller's
 * wait of WAIT_NS for the workers, after it ran RAN tasks in MINE_NS,
 * means a worker was descheduled rather than busy with a long task. */
int cpu_pool_wait_is_contention(int64_t wait_ns, int64_t mine_ns, int ran);

#endif
