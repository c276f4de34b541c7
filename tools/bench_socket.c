/* bench_socket.c - llm-bench --socket and --url: N clients, each on its
 * own connection and thread, submit at the same instant through libllm and
 * read their tokens (from their rings, or over an OpenAI-compatible HTTP
 * API with llm_connect_url); times are taken where the client sees them.
 * Measuring only: it checks nothing about the tokens.
 */
#include "bench_socket.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "llm.h"

/* The starting gun: every client waits for it, then submits. */
struct start {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int state;                    /* 0 wait, 1 go, -1 give up */
};

#define START_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 }

/* Waits for the gun: 1 go, -1 give up. */
static int start_wait(struct start *s)
{
	int st;
	pthread_mutex_lock(&s->lock);
	while (s->state == 0)
		pthread_cond_wait(&s->cond, &s->lock);
	st = s->state;
	pthread_mutex_unlock(&s->lock);
	return st;
}

static void start_fire(struct start *s, int state)
{
	pthread_mutex_lock(&s->lock);
	s->state = state;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

struct client {
	const struct bench_socket_params *p;
	int i;
	struct llm *h;
	struct start *go;
	double t_end;
	struct bench_socket_seq *seq;
	int rc;
	char err[256];
};

static void *client_main(void *arg)
{
	struct client *c = arg;
	const struct bench_socket_params *p = c->p;
	struct llm_request r;
	struct llm_message msgs[2];
	struct llm_event ev;
	int n_msgs = 0, cap = p->max_tokens + 1;
	double t_submit, t_first = 0, t_last = 0;
	uint64_t id;

	llm_request_init(&r);
	if (p->chat) {
		if (p->system)
			msgs[n_msgs++] = (struct llm_message){ LLM_ROLE_SYSTEM, p->system };
		msgs[n_msgs++] = (struct llm_message){ LLM_ROLE_USER, p->prompts[c->i] };
		r.messages = msgs;
		r.n_messages = n_msgs;
	} else {
		r.prompt = p->prompts[c->i];
	}
	r.max_tokens = p->max_tokens;
	r.temperature = p->temperature;
	r.top_k = p->top_k;
	r.top_p = p->top_p;
	r.min_p = p->min_p;
	r.has_seed = 1;
	r.seed = p->seed + (uint64_t)c->i;
	r.flags = (p->ignore_eos ? LLM_IGNORE_EOS : 0) | p->spec_flags;
	c->seq->gen = malloc((size_t)cap * sizeof *c->seq->gen);

	if (start_wait(c->go) < 0)
		return NULL;
	t_submit = clock_s();
	struct llm_grammar g = { (enum llm_grammar_kind)p->grammar_kind, 0, p->grammar_text };
	if (!c->seq->gen || (c->rc = llm_submit_grammar(c->h, &r, p->grammar_kind ? &g : NULL, &id)) < 0) {
		snprintf(c->err, sizeof c->err, "submit: %s", c->seq->gen ? llm_errmsg(c->h) : "out of memory");
		c->rc = c->rc ? c->rc : -ENOMEM;
		return NULL;
	}
	for (;;) {
		int k = llm_next_event(c->h, &ev, 120000);
		if (k <= 0) {
			c->rc = k ? k : -ETIMEDOUT;
			snprintf(c->err, sizeof c->err, "reading events: %s",
				 k ? llm_errmsg(c->h) : "no event for 120 s");
			return NULL;
		}
		if (ev.kind == LLM_EV_TOKEN) {
			if (ev.token == -1)
				continue; /* text released at the end, no token */
			t_last = clock_s();
			if (!t_first)
				t_first = t_last;
			/* -2: a server of the HTTP API that gives no ids */
			if (ev.token >= 0 && c->seq->n_ids < cap)
				c->seq->gen[c->seq->n_ids++] = ev.token;
			c->seq->n_gen++;
			continue;
		}
		if ((int)ev.generated_tokens > c->seq->n_gen)
			c->seq->n_gen = (int)ev.generated_tokens; /* a server that sent several a chunk */
		c->seq->finish = ev.finish;
		c->seq->prompt_tokens = ev.prompt_tokens;
		c->seq->cached_tokens = ev.cached_tokens;
		c->seq->queue_ms = ev.queue_ms;
		c->seq->prefill_ms = ev.prefill_ms;
		if (ev.finish == LLM_FINISH_ERROR) {
			c->rc = -EIO;
			snprintf(c->err, sizeof c->err, "the daemon failed the request: %s",
				 ev.message ? ev.message : "?");
		}
		break;
	}
	c->t_end = clock_s();
	c->seq->ttft_s = (t_first ? t_first : c->t_end) - t_submit;
	c->seq->decode_s = t_first ? t_last - t_first : 0;
	return NULL;
}

int bench_socket_run(const struct bench_socket_params *p, struct bench_socket_result *ret,
		     char *err, size_t errlen)
{
	struct client *cs = calloc((size_t)p->n, sizeof *cs);
	pthread_t *th = calloc((size_t)p->n, sizeof *th);
	struct start go = START_INIT;
	int started = 0, rc = 0;
	double t0, t_end = 0;

	memset(ret, 0, sizeof *ret);
	ret->seqs = calloc((size_t)p->n, sizeof *ret->seqs);
	ret->n = p->n;
	if (!cs || !th || !ret->seqs) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	/* Connect everyone first: the handshake is not part of the workload. */
	for (int i = 0; i < p->n; i++) {
		cs[i] = (struct client){ .p = p, .i = i, .go = &go, .seq = &ret->seqs[i] };
		rc = p->url ? llm_connect_url(p->url, p->api_key, &cs[i].h, err, errlen)
			    : llm_connect(p->socket, 0, &cs[i].h, err, errlen);
		if (rc < 0)
			goto out;
		if ((p->model_name && (rc = llm_set_model(cs[i].h, p->model_name)) < 0) ||
		    (rc = llm_set_max_draft(cs[i].h, p->max_draft)) < 0) {
			snprintf(err, errlen, "%s", llm_errmsg(cs[i].h));
			goto out;
		}
	}
	for (; started < p->n; started++)
		if (pthread_create(&th[started], NULL, client_main, &cs[started]) != 0)
			break;
	if (started < p->n) {
		snprintf(err, errlen, "cannot start %d client threads", p->n);
		rc = -EAGAIN;
		start_fire(&go, -1);
		for (int i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		goto out;
	}
	t0 = clock_s();
	start_fire(&go, 1);
	for (int i = 0; i < p->n; i++) {
		pthread_join(th[i], NULL);
		if (cs[i].rc < 0 && rc == 0) {
			rc = cs[i].rc;
			snprintf(err, errlen, "client %d: %s", i, cs[i].err);
		}
		if (cs[i].t_end > t_end)
			t_end = cs[i].t_end;
		ret->generated += ret->seqs[i].n_gen;
	}
	ret->wall_s = t_end - t0;
out:
	for (int i = 0; cs && i < p->n; i++)
		llm_close(cs[i].h);
	free(cs);
	free(th);
	return rc;
}

void bench_socket_result_free(struct bench_socket_result *r)
{
	if (!r || !r->seqs)
		return;
	for (int i = 0; i < r->n; i++)
		free(r->seqs[i].gen);
	free(r->seqs);
	r->seqs = NULL;
}
