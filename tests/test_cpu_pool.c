/* test_cpu_pool.c - the CPU worker pool runs every task of every job
 * exactly once, after a long wait for a worker (one descheduled by a busy
 * machine) runs the next jobs on the caller alone, and keeps using workers
 * whose tasks are merely long, and lives as long as its last owner.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "cpu_pool.h"
#include "testutil.h"

struct count_job {
	atomic_int *hits;       /* (n) runs of each task */
	atomic_int by_worker;   /* tasks run by a worker thread (not the caller) */
	int slow_ms;            /* > 0: workers sleep this long in each task */
	atomic_int started;     /* a worker has begun a task */
};

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

static void count_task(void *ctx, int i, int worker)
{
	struct count_job *j = ctx;
	atomic_fetch_add(&j->hits[i], 1);
	if (worker) {
		atomic_fetch_add(&j->by_worker, 1);
		atomic_store(&j->started, 1);
		if (j->slow_ms)
			sleep_ms(j->slow_ms);
	} else if (j->slow_ms) {
		/* leave the other task to a worker: wait (at most 2 s, on a
		 * loaded machine too) until one has begun it */
		for (int t = 0; t < 2000 && !atomic_load(&j->started); t++)
			sleep_ms(1);
	}
}

static void test_exactly_once(int threads)
{
	struct cpu_pool *p;
	enum { N = 997 };
	static atomic_int hits[N];

	CHECK_INT_EQ(cpu_pool_new(threads, &p), 0);
	CHECK_INT_EQ(cpu_pool_threads(p), threads);
	for (int job = 0; job < 200; job++) {
		int n = 1 + job * 5 % N;
		struct count_job j = { hits, 0, 0, 0 };
		for (int i = 0; i < n; i++)
			atomic_store(&hits[i], 0);
		cpu_pool_run(p, count_task, &j, n);
		for (int i = 0; i < n; i++)
			if (atomic_load(&hits[i]) != 1) {
				CHECK_INT_EQ(atomic_load(&hits[i]), 1);
				break;
			}
	}
	cpu_pool_free(p);
}

/* A pool with two owners (two engines one thread steps) runs on after the
 * first lets go; the second's cpu_pool_free joins it. */
static void test_two_owners(void)
{
	struct cpu_pool *p;
	static atomic_int hits[64];
	struct count_job j = { hits, 0, 0, 0 };

	CHECK_INT_EQ(cpu_pool_new(2, &p), 0);
	cpu_pool_ref(p);
	cpu_pool_free(p);
	cpu_pool_run(p, count_task, &j, 64);
	for (int i = 0; i < 64; i++)
		CHECK_INT_EQ(atomic_load(&hits[i]), 1);
	cpu_pool_free(p);
}

static void test_backs_off_after_a_slow_worker(void)
{
	struct cpu_pool *p;
	atomic_int hits[64];

	CHECK_INT_EQ(cpu_pool_new(2, &p), 0);
	/* a worker stuck 200 ms in its task, as a descheduled one would be */
	struct count_job slow = { hits, 0, 200, 0 };
	cpu_pool_run(p, count_task, &slow, 2);
	CHECK_INT_EQ(atomic_load(&slow.by_worker), 1);
	/* the next jobs run on the caller alone, every task still once */
	for (int job = 0; job < 10; job++) {
		struct count_job j = { hits, 0, 0, 0 };
		for (int i = 0; i < 64; i++)
			atomic_store(&hits[i], 0);
		cpu_pool_run(p, count_task, &j, 64);
		CHECK_INT_EQ(atomic_load(&j.by_worker), 0);
		for (int i = 0; i < 64; i++)
			CHECK_INT_EQ(atomic_load(&hits[i]), 1);
	}
	cpu_pool_free(p);
}

/* Long tasks (a big prefill's) make the caller wait for a worker that is
 * only busy: that is no reason to leave it idle afterwards. */
static void even_tasks(void *ctx, int i, int worker)
{
	struct count_job *j = ctx;
	atomic_fetch_add(&j->hits[i], 1);
	if (worker)
		atomic_fetch_add(&j->by_worker, 1);
	sleep_ms(j->slow_ms + (worker ? 2 : 0));
}

static void test_long_tasks_keep_the_workers(void)
{
	struct cpu_pool *p;
	atomic_int hits[8];
	int with_worker = 0;

	CHECK_INT_EQ(cpu_pool_new(2, &p), 0);
	for (int job = 0; job < 20; job++) {
		/* the caller's tasks take 4 ms, a worker's 6: it waits ~2 ms */
		struct count_job j = { hits, 0, 4, 0 };
		for (int i = 0; i < 8; i++)
			atomic_store(&hits[i], 0);
		cpu_pool_run(p, even_tasks, &j, 2);
		for (int i = 0; i < 2; i++)
			CHECK_INT_EQ(atomic_load(&hits[i]), 1);
		with_worker += job > 0 && atomic_load(&j.by_worker) == 1;
	}
	/* A loaded machine (a parallel test run) may keep the worker from a
	 * job now and then; a back-off after the first long wait would keep
	 * it from all of them. */
	if (with_worker < 10)
		fprintf(stderr, "the worker took part in %d of 19 jobs of long tasks\n", with_worker);
	CHECK(with_worker >= 10);
	cpu_pool_free(p);
}

/* The rule itself: a wait is contention when it is long and longer than
 * three of the caller's own tasks. */
static void test_contention_rule(void)
{
	CHECK(cpu_pool_wait_is_contention(19000000, 1000000, 1));   /* 19 ms after a 1 ms task */
	CHECK(cpu_pool_wait_is_contention(600000, 200000, 20));     /* 0.6 ms after 10 us tasks */
	CHECK(!cpu_pool_wait_is_contention(2000000, 4000000, 1));   /* 2 ms after a 4 ms task: busy */
	CHECK(!cpu_pool_wait_is_contention(5000000, 8000000, 4));   /* 5 ms after 2 ms tasks */
	CHECK(!cpu_pool_wait_is_contention(400000, 1000, 100));     /* under 0.5 ms */
	CHECK(cpu_pool_wait_is_contention(1000000, 0, 0));          /* the caller ran nothing */
}

int main(void)
{
	test_exactly_once(1);
	test_exactly_once(2);
	test_exactly_once(4);
	test_two_owners();
	test_backs_off_after_a_slow_worker();
	test_long_tasks_keep_the_workers();
	test_contention_rule();
	return test_result();
}
