/* bench_start.h - the starting gun of llm-bench's client threads
 * (bench_socket.c, bench_http.c): every client waits for it, then submits,
 * so that all requests arrive at the same instant.
 */
#ifndef LLMD_BENCH_START_H
#define LLMD_BENCH_START_H

#include <pthread.h>

struct start {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int state;                    /* 0 wait, 1 go, -1 give up */
};

#define START_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 }

/* Waits for the gun: 1 go, -1 give up. */
static inline int start_wait(struct start *s)
{
	int st;
	pthread_mutex_lock(&s->lock);
	while (s->state == 0)
		pthread_cond_wait(&s->cond, &s->lock);
	st = s->state;
	pthread_mutex_unlock(&s->lock);
	return st;
}

static inline void start_fire(struct start *s, int state)
{
	pthread_mutex_lock(&s->lock);
	s->state = state;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

#endif
