/* worker.c - the engine thread: inbox -> scheduler steps -> rings, notes.
 *
 * Everything below the "engine thread" banner runs on that thread only; the
 * posting functions at the top run on the event loop and touch nothing but
 * the inbox.  A request's records go into its connection's ring in order;
 * when the ring is full they wait in that connection's overflow queue and
 * the connection's requests are held (sched_hold) until the client reads,
 * so no record is ever dropped and no other client waits.
 */
#include "worker.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "constrain.h"
#include "model.h"
#include "proto.h"
#include "ring.h"
#include "usock.h"

#define RATE_SAMPLES 11   /* one a second: tok/s over the last ten seconds */

/* What the event loop posts.  A client's RING_WAKE posts nothing (it only
 * signals the inbox's eventfd: the loop retries every full ring each time
 * round), so the inbox holds at most an ATTACH and a DETACH per connection,
 * a SUBMIT and a CANCEL per live request (the event loop sends one CANCEL
 * a request) and a CANCEL_ALL: the limits on connections and requests
 * bound it, whatever clients send. */
enum work_kind {
	WORK_ATTACH = 1, WORK_DETACH, WORK_SUBMIT, WORK_CANCEL, WORK_CANCEL_ALL,
	WORK_INSTALL,      /* MODEL's engine is ready: WM serves it from now on */
	WORK_FAIL,         /* MODEL could not be loaded: its waiting requests end with MESSAGE */
	WORK_REMOVE,       /* MODEL is to be unloaded, if idle */
};

struct work {
	enum work_kind kind;
	uint32_t conn_id;
	uint64_t gid;                /* WORK_CANCEL */
	struct ring *ring;           /* WORK_ATTACH */
	int wake_fd;                 /* WORK_ATTACH */
	struct worker_req *req;      /* WORK_SUBMIT */
	int model;                   /* WORK_INSTALL, WORK_FAIL, WORK_REMOVE */
	struct wmodel *wm;           /* WORK_INSTALL */
	char *message;               /* WORK_FAIL; owned */
};

/* A queue of items of one type: a growable array swapped out whole by the consumer. */
struct vec {
	void *items;
	size_t n, cap, size;         /* items used, allocated; bytes per item */
};

struct wconn;
struct worker;
struct wmodel;

static void wmodel_free(struct wmodel *wm);

/* A model the engine thread serves: its engine, its scheduler (and KV
 * pool) and its live requests by scheduler slot.  Engine thread, but for
 * what worker_model_prepare sets before it is installed. */
struct wmodel {
	struct worker *w;
	int index;                   /* in worker.models */
	const struct model *m;       /* borrowed */
	struct engine *e;            /* owned */
	struct sched *s;             /* owned */
	struct engine *de;           /* the draft model's engine (worker_set_draft), or NULL;
	                                owned */
	struct wreq **slots;         /* (n_slots) live requests by scheduler slot */
	uint32_t *slot_gen;          /* (n_slots) generation of each slot */
	uint32_t n_slots;
	int dead;                    /* a sticky failure: no more steps; requests fail at once */
};

/* A live request, engine thread. */
struct wreq {
	struct worker_req *r;        /* owned */
	struct wmodel *wm;           /* the model that serves it */
	uint64_t sid;                /* the scheduler's id: slot | generation << 32 */
	struct wconn *conn;
	struct wreq *next, *prev;    /* the connection's live requests */
	double t_recv;
};

/* A connection as the engine thread sees it. */
struct wconn {
	uint32_t conn_id;
	struct ring *ring;           /* producer side; owned; NULL once detached or bad */
	int wake_fd;                 /* signalling end of the client's wake channel; owned;
	                                -1 once detached */
	int dirty;                   /* records pushed since the last signal */
	int bad;                     /* the ring is corrupt: drop everything */
	int full;                    /* records wait in OVERFLOW; requests held */
	uint8_t *overflow;           /* queued records: u16 type, u32 len, payload */
	size_t ov_len, ov_cap, ov_head; /* bytes used, allocated; first unsent byte */
	struct wreq *reqs;           /* live requests (list head) */
	int32_t n_reqs;
	struct wconn *next;          /* all connections */
};

const double worker_hist_le[WORKER_HIST_BUCKETS] = {
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};

struct worker {
	struct worker_hist hist[WORKER_HIST__N]; /* engine thread's; copied into snapshots */
	struct wmodel *models[WORKER_MAX_MODELS]; /* owned, by model index; NULL while a
	                                            model is not loaded; [0] is the default one */
	int n_models;                /* indexes used: 1 + the highest */
	struct vec pending[WORKER_MAX_MODELS]; /* (struct worker_req *) requests for a model
	                                          not loaded yet, in arrival order */
	pthread_t thread;
	int started;
	uint64_t rounds;             /* stepping rounds (engine thread) */
	/* inbox: event loop -> engine thread */
	pthread_mutex_t in_lock;
	struct vec inbox;            /* struct work */
	int in_efd;                  /* signalled on every post */
	atomic_int wake_posted;      /* worker_ring_wake signalled in_efd since the engine
	                                thread last looked at the full rings */
	int stop;                    /* under in_lock: leave once idle */
	/* notes: engine thread -> event loop */
	pthread_mutex_t note_lock;
	struct vec notes;            /* struct worker_note */
	int note_efd;
	/* the published snapshot: engine thread -> event loop */
	pthread_mutex_t snap_lock;
	struct worker_snapshot *snap; /* under snap_lock; holds one reference */
	/* engine thread only */
	struct wconn *conns;
	int32_t n_conns;
	int notes_pending;
	int snap_dirty;              /* something a snapshot shows changed since the last */
	uint64_t gen_unloaded;       /* tokens generated by models since unloaded */
	double rate_t[RATE_SAMPLES];
	uint64_t rate_tok[RATE_SAMPLES];
	int rate_n;
	_Atomic double heartbeat;
	uint8_t rec[PROTO_TOKEN_FIXED + PROTO_MAX_TOKEN_TEXT + PROTO_FINAL_FIXED + PROTO_MAX_ERRMSG];
				     /* record scratch: the largest TOKEN or FINAL fits */
};

static int vec_push(struct vec *v, const void *item)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 64;
		void *p = realloc(v->items, cap * v->size);
		if (!p)
			return -ENOMEM;
		v->items = p;
		v->cap = cap;
	}
	memcpy((char *)v->items + v->n * v->size, item, v->size);
	v->n++;
	return 0;
}

static void efd_signal(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof one);
	(void)r; /* EAGAIN: the counter is already nonzero, the reader will wake */
}

static void efd_clear(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof v);
	(void)r;
}

void worker_req_free(struct worker_req *r)
{
	if (!r)
		return;
	free(r->prompt);
	for (int i = 0; i < r->n_stops; i++)
		free(r->stops[i]);
	free(r->stops);
	constrain_req_free(r->grammar);
	free(r);
}

/* ---- posting (event-loop thread) ---- */

static int post(struct worker *w, const struct work *wk)
{
	int r;
	pthread_mutex_lock(&w->in_lock);
	r = vec_push(&w->inbox, wk);
	pthread_mutex_unlock(&w->in_lock);
	if (r == 0)
		efd_signal(w->in_efd);
	return r;
}

int worker_attach(struct worker *w, uint32_t conn_id, struct ring *ring, int wake_fd)
{
	struct work wk = { .kind = WORK_ATTACH, .conn_id = conn_id, .ring = ring, .wake_fd = wake_fd };
	int r = post(w, &wk);
	if (r < 0) {
		ring_free(ring);
		close(wake_fd);
	}
	return r;
}

int worker_detach(struct worker *w, uint32_t conn_id)
{
	struct work wk = { .kind = WORK_DETACH, .conn_id = conn_id };
	return post(w, &wk);
}

int worker_submit(struct worker *w, struct worker_req *req)
{
	struct work wk = { .kind = WORK_SUBMIT, .conn_id = req->conn_id, .req = req };
	int r = post(w, &wk);
	if (r < 0)
		worker_req_free(req);
	return r;
}

int worker_cancel(struct worker *w, uint64_t gid)
{
	struct work wk = { .kind = WORK_CANCEL, .gid = gid };
	return post(w, &wk);
}

void worker_ring_wake(struct worker *w)
{
	/* However many wakes come, one system call until the engine thread
	 * has been round. */
	if (!atomic_exchange(&w->wake_posted, 1))
		efd_signal(w->in_efd);
}

int worker_cancel_all(struct worker *w)
{
	struct work wk = { .kind = WORK_CANCEL_ALL };
	return post(w, &wk);
}

int worker_note_fd(const struct worker *w)
{
	return w->note_efd;
}

int worker_take_notes(struct worker *w, struct worker_note *out, int max)
{
	int n;
	pthread_mutex_lock(&w->note_lock);
	n = w->notes.n < (size_t)max ? (int)w->notes.n : max;
	if (n > 0) { /* an empty list may have no array yet: no NULL to memcpy */
		memcpy(out, w->notes.items, (size_t)n * sizeof *out);
		memmove(w->notes.items, (struct worker_note *)w->notes.items + n,
			(w->notes.n - (size_t)n) * sizeof *out);
		w->notes.n -= (size_t)n;
	}
	pthread_mutex_unlock(&w->note_lock);
	return n;
}

struct worker_snapshot *worker_snapshot_get(struct worker *w)
{
	struct worker_snapshot *sn;

	pthread_mutex_lock(&w->snap_lock);
	sn = w->snap;
	if (sn)
		atomic_fetch_add(&sn->refs, 1);
	pthread_mutex_unlock(&w->snap_lock);
	return sn;
}

void worker_snapshot_put(struct worker_snapshot *sn)
{
	if (sn && atomic_fetch_sub(&sn->refs, 1) == 1)
		free(sn);
}

double worker_heartbeat(const struct worker *w)
{
	return atomic_load(&((struct worker *)w)->heartbeat);
}

const struct engine *worker_engine(const struct worker *w)
{
	return w->models[0]->e;
}

const struct engine *worker_draft_engine(const struct worker *w)
{
	return w->models[0]->de;
}

const struct engine *worker_model_engine(const struct wmodel *wm)
{
	return wm->e;
}

const struct engine *worker_model_draft_engine(const struct wmodel *wm)
{
	return wm->de;
}

int worker_model_install(struct worker *w, int model, struct wmodel *wm)
{
	struct work wk = { .kind = WORK_INSTALL, .model = model, .wm = wm };
	int r = post(w, &wk);
	if (r < 0)
		worker_model_discard(wm);
	return r;
}

int worker_model_fail(struct worker *w, int model, const char *message)
{
	struct work wk = { .kind = WORK_FAIL, .model = model, .message = strdup(message) };
	int r = wk.message ? post(w, &wk) : -ENOMEM;
	if (r < 0)
		free(wk.message);
	return r;
}

int worker_model_remove(struct worker *w, int model)
{
	struct work wk = { .kind = WORK_REMOVE, .model = model };
	return post(w, &wk);
}

/* ---- engine thread: notes and connections ---- */

static void note(struct worker *w, const struct worker_note *n)
{
	pthread_mutex_lock(&w->note_lock);
	vec_push(&w->notes, n); /* out of memory: the event loop's accounting is off by one */
	pthread_mutex_unlock(&w->note_lock);
	w->notes_pending = 1;
}

static struct wconn *find_conn(struct worker *w, uint32_t conn_id)
{
	for (struct wconn *c = w->conns; c; c = c->next)
		if (c->conn_id == conn_id)
			return c;
	return NULL;
}

static void conn_free_if_done(struct worker *w, struct wconn *c)
{
	if (c->ring || c->n_reqs > 0)
		return;
	for (struct wconn **p = &w->conns; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	free(c->overflow);
	free(c);
	w->n_conns--;
}

/* Drops the ring: nothing more is written for this connection. */
static void conn_close_ring(struct wconn *c)
{
	ring_free(c->ring);
	c->ring = NULL;
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	c->wake_fd = -1;
	c->ov_len = c->ov_head = 0;
	c->full = 0;
}

static void conn_hold(struct wconn *c, int hold)
{
	for (struct wreq *q = c->reqs; q; q = q->next)
		sched_hold(q->wm->s, q->sid, hold);
}

static void conn_cancel_all(struct wconn *c)
{
	for (struct wreq *q = c->reqs; q; q = q->next)
		sched_cancel(q->wm->s, q->sid);
}

static void conn_bad(struct worker *w, struct wconn *c)
{
	struct worker_note n = { .kind = WORKER_NOTE_RING_BAD, .conn_id = c->conn_id };
	if (c->bad)
		return;
	c->bad = 1;
	conn_close_ring(c);
	conn_cancel_all(c);
	note(w, &n);
}

static int overflow_add(struct wconn *c, uint16_t type, const uint8_t *p, size_t len)
{
	size_t need = c->ov_len + 6 + len;
	if (need > c->ov_cap) {
		size_t cap = c->ov_cap ? c->ov_cap : 4096;
		uint8_t *q;
		while (cap < need)
			cap *= 2;
		q = realloc(c->overflow, cap);
		if (!q)
			return -ENOMEM;
		c->overflow = q;
		c->ov_cap = cap;
	}
	memcpy(c->overflow + c->ov_len, &type, 2);
	memcpy(c->overflow + c->ov_len + 2, &(uint32_t){ (uint32_t)len }, 4);
	memcpy(c->overflow + c->ov_len + 6, p, len);
	c->ov_len = need;
	return 0;
}

/* Pushes queued records while they fit.  1 when the queue is empty. */
static int overflow_flush(struct worker *w, struct wconn *c)
{
	while (c->ring && c->ov_head < c->ov_len) {
		uint16_t type;
		uint32_t len;
		int r;
		memcpy(&type, c->overflow + c->ov_head, 2);
		memcpy(&len, c->overflow + c->ov_head + 2, 4);
		r = ring_push(c->ring, type, c->overflow + c->ov_head + 6, len, NULL, 0);
		if (r == -EAGAIN)
			return 0;
		if (r < 0) {
			conn_bad(w, c);
			return 1;
		}
		c->dirty = 1;
		c->ov_head += 6 + (size_t)len;
	}
	c->ov_len = c->ov_head = 0;
	return 1;
}

/* Writes one record for C, in order behind anything already queued. */
static void conn_write(struct worker *w, struct wconn *c, uint16_t type, const uint8_t *p,
		       size_t len)
{
	int r;

	if (!c->ring)
		return;
	if (!c->full) {
		r = ring_push(c->ring, type, p, len, NULL, 0);
		if (r == 0) {
			c->dirty = 1;
			return;
		}
		if (r != -EAGAIN) {
			conn_bad(w, c);
			return;
		}
		c->full = 1;
		conn_hold(c, 1);
	}
	if (overflow_add(c, type, p, len) < 0) /* out of memory: the client cannot be served */
		conn_bad(w, c);
}

static void hist_add(struct worker_hist *h, double s)
{
	int i = 0;

	while (i < WORKER_HIST_BUCKETS && s > worker_hist_le[i])
		i++;
	if (i < WORKER_HIST_BUCKETS)
		h->counts[i]++;
	h->count++;
	h->sum += s;
}

static void write_final(struct worker *w, struct wconn *c, uint64_t client_id, uint32_t finish,
			uint32_t code, const char *msg, const struct sched_usage *u)
{
	struct proto_final f = { .id = client_id, .finish = finish, .code = code };
	ssize_t n;

	if (u) {
		hist_add(&w->hist[WORKER_HIST_QUEUE], u->queue_s);
		if (u->generated_tokens > 0)
			hist_add(&w->hist[WORKER_HIST_TTFT], u->queue_s + u->prefill_s);
		if (u->generated_tokens > 1)
			hist_add(&w->hist[WORKER_HIST_TPOT], u->decode_s / (double)(u->generated_tokens - 1));
		w->snap_dirty = 1;
		f.prompt_tokens = (uint32_t)u->prompt_tokens;
		f.cached_tokens = (uint32_t)u->cached_tokens;
		f.generated_tokens = (uint32_t)u->generated_tokens;
		f.preemptions = (uint32_t)u->preemptions;
		f.queue_us = (uint64_t)(u->queue_s * 1e6);
		f.prefill_us = (uint64_t)(u->prefill_s * 1e6);
		f.decode_us = (uint64_t)(u->decode_s * 1e6);
	}
	if (msg) {
		size_t l = strlen(msg);
		f.message.p = msg;
		f.message.len = (uint32_t)(l < PROTO_MAX_ERRMSG ? l : PROTO_MAX_ERRMSG);
	}
	n = proto_final_encode(w->rec, sizeof w->rec, &f);
	if (n > 0)
		conn_write(w, c, PROTO_REC_FINAL, w->rec, (size_t)n);
}

/* ---- engine thread: requests ---- */

static struct wreq *find_sid(struct wmodel *wm, uint64_t sid)
{
	uint32_t slot = (uint32_t)sid, gen = (uint32_t)(sid >> 32);
	if (slot >= wm->n_slots || !wm->slots[slot] || wm->slot_gen[slot] != gen)
		return NULL;
	return wm->slots[slot];
}

static void wreq_end(struct worker *w, struct wreq *q)
{
	struct wconn *c = q->conn;
	struct worker_note n = { .kind = WORKER_NOTE_DONE, .conn_id = c->conn_id, .gid = q->r->gid };

	q->wm->slots[(uint32_t)q->sid] = NULL;
	if (q->prev)
		q->prev->next = q->next;
	else
		c->reqs = q->next;
	if (q->next)
		q->next->prev = q->prev;
	c->n_reqs--;
	note(w, &n);
	worker_req_free(q->r);
	free(q);
	conn_free_if_done(w, c);
}

static uint32_t finish_code(const struct sched_event *ev)
{
	switch (ev->error) {
	case -E2BIG:
		return PROTO_E_TOOBIG;
	case -EBUSY:
		return PROTO_E_BUSY;
	case -EINVAL:
		return PROTO_E_INVAL;
	default:
		return PROTO_E_INTERNAL;
	}
}

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct wmodel *wm = ctx;
	struct worker *w = wm->w;
	struct wreq *q = find_sid(wm, ev->id);
	static const uint32_t fin[] = { [SCHED_FIN_STOP] = PROTO_FIN_STOP,
					[SCHED_FIN_LENGTH] = PROTO_FIN_LENGTH,
					[SCHED_FIN_CANCELLED] = PROTO_FIN_CANCELLED,
					[SCHED_FIN_ERROR] = PROTO_FIN_ERROR };

	if (!q)
		return;
	if (ev->kind == SCHED_EV_TOKEN) {
		struct proto_token t = { .id = q->r->client_id, .token = ev->token,
					 .logprob = ev->logprob,
					 .text = { ev->text, (uint32_t)ev->text_len } };
		for (int32_t i = 0; i < ev->n_top && i < PROTO_MAX_TOP_LOGPROBS; i++) {
			t.top_ids[i] = ev->top_ids[i];
			t.top_logprobs[i] = ev->top_logprobs[i];
			t.n_top++;
		}
		ssize_t n = proto_token_encode(w->rec, sizeof w->rec, &t);
		if (n > 0)
			conn_write(w, q->conn, PROTO_REC_TOKEN, w->rec, (size_t)n);
		return;
	}
	write_final(w, q->conn, q->r->client_id, fin[ev->finish],
		    ev->finish == SCHED_FIN_ERROR ? finish_code(ev) : 0,
		    ev->finish == SCHED_FIN_ERROR || ev->message ? ev->message : q->r->notice, &ev->usage);
	wreq_end(w, q);
}

static const char *submit_error(int r)
{
	switch (r) {
	case -E2BIG:
		return "the prompt does not fit the context or the KV pool";
	case -EBUSY:
		return "the daemon's queue is full; retry later";
	case -EINVAL:
		return "invalid request parameters";
	default:
		return "cannot queue the request";
	}
}

static void do_submit(struct worker *w, struct worker_req *r)
{
	struct wconn *c = find_conn(w, r->conn_id);
	int in_range = r->model >= 0 && r->model < WORKER_MAX_MODELS;
	struct wmodel *wm = in_range ? w->models[r->model] : NULL;
	struct wreq *q = NULL;
	uint32_t slot;
	int rc = -EBUSY;

	if (c && c->ring && in_range && !wm) {
		/* its model is being loaded: it waits for WORK_INSTALL or WORK_FAIL */
		if (vec_push(&w->pending[r->model], &r) == 0) {
			if (r->model >= w->n_models)
				w->n_models = r->model + 1;
			return;
		}
	}
	if (c && c->ring && (!wm || wm->dead)) {
		struct worker_note n = { .kind = WORKER_NOTE_DONE, .conn_id = r->conn_id, .gid = r->gid };
		write_final(w, c, r->client_id, PROTO_FIN_ERROR, PROTO_E_INTERNAL,
			    wm ? "the engine failed and llmd is restarting" : "no such model", NULL);
		note(w, &n);
		worker_req_free(r);
		return;
	}
	if (!c || !c->ring) { /* the client left (or broke its ring) meanwhile */
		struct worker_note n = { .kind = WORKER_NOTE_DONE, .conn_id = r->conn_id, .gid = r->gid };
		note(w, &n);
		worker_req_free(r);
		return;
	}
	for (slot = 0; slot < wm->n_slots && wm->slots[slot]; slot++)
		;
	if (slot < wm->n_slots && (q = calloc(1, sizeof *q))) {
		const char *const *stops = (const char *const *)r->stops;
		struct sched_request sr = { .client = r->uid, .priority = r->priority,
					    .prompt = r->prompt, .n_prompt = r->n_prompt,
					    .max_tokens = r->max_tokens, .sampling = r->sampling,
					    .stops = stops, .n_stops = r->n_stops,
					    .ignore_eos = r->ignore_eos, .logprobs = r->logprobs,
					    .top_logprobs = r->top_logprobs, .spec = r->spec,
					    .spec_max_draft = r->spec_max_draft,
					    .grammar = r->grammar ? constrain_req_state(r->grammar) : NULL };
		q->sid = sr.id = slot | (uint64_t)++wm->slot_gen[slot] << 32;
		rc = sched_submit(wm->s, &sr);
	}
	if (rc < 0) {
		struct worker_note n = { .kind = WORKER_NOTE_DONE, .conn_id = r->conn_id, .gid = r->gid };
		write_final(w, c, r->client_id, PROTO_FIN_ERROR,
			    rc == -E2BIG ? PROTO_E_TOOBIG : rc == -EINVAL ? PROTO_E_INVAL : PROTO_E_BUSY,
			    submit_error(rc), NULL);
		note(w, &n);
		worker_req_free(r);
		free(q);
		return;
	}
	q->r = r;
	q->wm = wm;
	q->conn = c;
	q->t_recv = clock_s();
	q->next = c->reqs;
	if (c->reqs)
		c->reqs->prev = q;
	c->reqs = q;
	c->n_reqs++;
	wm->slots[slot] = q;
	if (c->full)
		sched_hold(wm->s, q->sid, 1);
}

/* Ends a request that never reached a scheduler with an error FINAL. */
static void end_unqueued(struct worker *w, struct worker_req *r, uint32_t finish, uint32_t code,
			 const char *msg)
{
	struct wconn *c = find_conn(w, r->conn_id);
	struct worker_note n = { .kind = WORKER_NOTE_DONE, .conn_id = r->conn_id, .gid = r->gid };

	if (c && c->ring)
		write_final(w, c, r->client_id, finish, code, msg, NULL);
	note(w, &n);
	worker_req_free(r);
	if (c)
		conn_free_if_done(w, c);
}

static void do_cancel(struct worker *w, uint64_t gid)
{
	for (int k = 0; k < w->n_models; k++) {
		struct wmodel *wm = w->models[k];
		struct vec *p = &w->pending[k];
		for (size_t i = 0; i < p->n; i++) {
			struct worker_req *r = ((struct worker_req **)p->items)[i];
			if (r->gid == gid) {
				memmove((struct worker_req **)p->items + i, (struct worker_req **)p->items + i + 1,
					(p->n - i - 1) * sizeof r);
				p->n--;
				end_unqueued(w, r, PROTO_FIN_CANCELLED, 0, NULL);
				return;
			}
		}
		if (!wm)
			continue;
		for (uint32_t i = 0; i < wm->n_slots; i++)
			if (wm->slots[i] && wm->slots[i]->r->gid == gid) {
				sched_cancel(wm->s, wm->slots[i]->sid); /* held or not, it ends next step */
				return;
			}
	}
}

/* Requests live in every model's scheduler. */
static int32_t live_all(const struct worker *w)
{
	int32_t n = 0;
	for (int k = 0; k < w->n_models; k++)
		n += (w->models[k] ? sched_live(w->models[k]->s) : 0) + (int32_t)w->pending[k].n;
	return n;
}

/* ---- engine thread: snapshots ---- */

struct snap_fill {
	struct wmodel *wm;
	struct worker_snapshot *sn;
	double t;
};

static void snap_add(void *ctx, uint64_t sid, const struct sched_info *in)
{
	struct snap_fill *f = ctx;
	struct wreq *q = find_sid(f->wm, sid);
	struct worker_snap_req *o;

	if (!q || f->sn->n_reqs >= f->sn->cap_reqs)
		return;
	o = &f->sn->reqs[f->sn->n_reqs++];
	o->gid = q->r->gid;
	o->model = f->wm->index;
	o->conn_id = q->conn->conn_id;
	o->client_id = q->r->client_id;
	o->info = *in;
	o->age_s = f->t - q->t_recv;
	o->ring_full = q->conn->full;
}

/* Builds a snapshot of now and makes it the one admin commands read.
 * O(live log live): cheap enough for every step that changed something. */
static void publish(struct worker *w)
{
	int32_t n = live_all(w);
	struct worker_snapshot *sn, *old;
	struct engine *e0 = w->models[0]->e;
	double t = clock_s();

	sn = calloc(1, sizeof *sn + (size_t)n * sizeof sn->reqs[0]);
	if (!sn)
		return; /* the last one stays; the next change tries again */
	atomic_init(&sn->refs, 1);
	sn->t = t;
	sn->cap_reqs = n;
	sched_counters(w->models[0]->s, &sn->c);
	sn->kv_capacity_tokens = engine_kv_capacity(e0);
	engine_device_info(e0, &sn->device);
	engine_graph_stats(e0, &sn->graphs_recorded, &sn->graphs_replayed);
	sn->n_models = w->n_models;
	for (int k = 0; k < w->n_models; k++) {
		struct worker_snap_model *o = &sn->models[k];
		struct wmodel *wm = w->models[k];
		/* an unloaded model's counters start again when it is loaded */
		if (wm) {
			sched_counters(wm->s, &o->c);
			o->kv_capacity_tokens = engine_kv_capacity(wm->e);
			o->live = sched_live(wm->s);
			o->dead = wm->dead;
		}
		o->loaded = wm != NULL;
		o->pending = (int32_t)w->pending[k].n;
		o->live += o->pending;
	}
	memcpy(sn->hist, w->hist, sizeof sn->hist);
	sn->n_conns = w->n_conns;
	if (w->rate_n >= 2) {
		int a = w->rate_n >= RATE_SAMPLES ? w->rate_n % RATE_SAMPLES : 0;
		int b = (w->rate_n - 1) % RATE_SAMPLES;
		double dt = w->rate_t[b] - w->rate_t[a];
		sn->tok_s = dt > 0 ? (double)(w->rate_tok[b] - w->rate_tok[a]) / dt : 0;
	}
	for (int k = 0; k < w->n_models; k++)
		if (w->models[k])
			sched_info_each(w->models[k]->s, snap_add, &(struct snap_fill){ w->models[k], sn, t });
	for (int k = 0; k < w->n_models; k++)
		for (size_t i = 0; i < w->pending[k].n && sn->n_reqs < sn->cap_reqs; i++) {
			const struct worker_req *r = ((struct worker_req **)w->pending[k].items)[i];
			struct worker_snap_req *o = &sn->reqs[sn->n_reqs++];
			memset(o, 0, sizeof *o);
			o->gid = r->gid;
			o->model = k;
			o->conn_id = r->conn_id;
			o->client_id = r->client_id;
			o->info.priority = r->priority;
			o->info.prompt_tokens = r->n_prompt;
			o->loading = 1;
		}
	pthread_mutex_lock(&w->snap_lock);
	old = w->snap;
	w->snap = sn;
	pthread_mutex_unlock(&w->snap_lock);
	worker_snapshot_put(old);
	w->snap_dirty = 0;
}

static void process(struct worker *w, struct work *wk)
{
	struct wconn *c;

	switch (wk->kind) {
	case WORK_ATTACH:
		c = calloc(1, sizeof *c);
		if (!c) {
			struct worker_note n = { .kind = WORKER_NOTE_RING_BAD, .conn_id = wk->conn_id };
			ring_free(wk->ring);
			close(wk->wake_fd);
			note(w, &n);
			return;
		}
		c->conn_id = wk->conn_id;
		c->ring = wk->ring;
		c->wake_fd = wk->wake_fd;
		c->next = w->conns;
		w->conns = c;
		w->n_conns++;
		return;
	case WORK_DETACH:
		if ((c = find_conn(w, wk->conn_id))) {
			conn_close_ring(c);
			conn_cancel_all(c);
			conn_free_if_done(w, c);
		}
		return;
	case WORK_SUBMIT:
		do_submit(w, wk->req);
		return;
	case WORK_CANCEL:
		do_cancel(w, wk->gid);
		return;
	case WORK_CANCEL_ALL:
		for (c = w->conns; c; c = c->next)
			conn_cancel_all(c);
		for (int k = 0; k < WORKER_MAX_MODELS; k++) {
			struct vec *p = &w->pending[k];
			for (size_t i = 0; i < p->n; i++)
				end_unqueued(w, ((struct worker_req **)p->items)[i], PROTO_FIN_CANCELLED, 0, NULL);
			p->n = 0;
		}
		return;
	case WORK_INSTALL: {
		struct vec *p = &w->pending[wk->model];
		struct vec waiting = *p;
		/* made on a loader thread with CPU threads of its own: from now on
		 * the default model's, one set of workers for every model */
		if (w->models[0] && wk->wm != w->models[0]) {
			engine_share_threads(wk->wm->e, w->models[0]->e);
			if (wk->wm->de) /* its draft ran on the model's threads */
				engine_share_threads(wk->wm->de, w->models[0]->e);
		}
		wk->wm->w = w;
		wk->wm->index = wk->model;
		w->models[wk->model] = wk->wm;
		if (wk->model >= w->n_models)
			w->n_models = wk->model + 1;
		*p = (struct vec){ .size = sizeof(struct worker_req *) };
		for (size_t i = 0; i < waiting.n; i++)
			do_submit(w, ((struct worker_req **)waiting.items)[i]);
		free(waiting.items);
		return;
	}
	case WORK_FAIL: {
		struct vec *p = &w->pending[wk->model];
		for (size_t i = 0; i < p->n; i++)
			end_unqueued(w, ((struct worker_req **)p->items)[i], PROTO_FIN_ERROR, PROTO_E_NOMODEL,
				     wk->message);
		p->n = 0;
		free(wk->message);
		return;
	}
	case WORK_REMOVE: {
		struct wmodel *wm = w->models[wk->model];
		struct worker_note n = { .kind = WORKER_NOTE_UNLOADED, .model = wk->model };
		if (wm && sched_live(wm->s) == 0 && w->pending[wk->model].n == 0) {
			struct sched_counters k;
			sched_counters(wm->s, &k);
			w->gen_unloaded += k.generated_tokens; /* tok/s stays continuous */
			w->models[wk->model] = NULL;
			wmodel_free(wm);
		} else {
			n.error = -EBUSY; /* a request came first: it stays loaded */
		}
		note(w, &n);
		return;
	}
	}
}

/* ---- engine thread: the loop ---- */

static void rate_sample(struct worker *w)
{
	double t = clock_s();
	int last = (w->rate_n - 1) % RATE_SAMPLES;
	struct sched_counters c;
	uint64_t gen = 0;

	if (w->rate_n > 0 && t - w->rate_t[last] < 1.0)
		return;
	w->snap_dirty = 1; /* tok/s moves on, busy or not */
	for (int k = 0; k < w->n_models; k++) {
		if (!w->models[k])
			continue;
		sched_counters(w->models[k]->s, &c);
		gen += c.generated_tokens;
	}
	gen += w->gen_unloaded;
	w->rate_t[w->rate_n % RATE_SAMPLES] = t;
	w->rate_tok[w->rate_n % RATE_SAMPLES] = gen;
	w->rate_n++;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct vec batch = { .size = sizeof(struct work) };

	for (;;) {
		int stop, r = 0;

		atomic_store(&w->heartbeat, clock_s());
		pthread_mutex_lock(&w->in_lock);
		struct vec tmp = w->inbox;
		w->inbox = batch;
		batch = tmp;
		stop = w->stop;
		pthread_mutex_unlock(&w->in_lock);
		for (size_t i = 0; i < batch.n; i++)
			process(w, (struct work *)batch.items + i);
		w->snap_dirty |= batch.n > 0;
		batch.n = 0;

		/* Clients that read since we found their ring full may have room
		 * now; a wake from here on signals again. */
		atomic_store(&w->wake_posted, 0);
		for (struct wconn *c = w->conns; c; c = c->next)
			if (c->full && overflow_flush(w, c) && c->ring) {
				c->full = 0;
				conn_hold(c, 0);
				w->snap_dirty = 1;
			}
		if (stop && live_all(w) == 0)
			break;
		/* A step of each model with work, in turn: one model at a time
		 * on the device.  Priority counts across models as within one,
		 * without starving anyone: a model whose most urgent request is
		 * below another busy model's gets a step every other round. */
		int32_t top[WORKER_MAX_MODELS], most = INT32_MIN;
		w->rounds++;
		for (int k = 0; k < w->n_models; k++) {
			struct wmodel *wm = w->models[k];
			top[k] = !wm || sched_live(wm->s) == 0 || wm->dead ? INT32_MIN : sched_top_priority(wm->s);
			if (top[k] > most)
				most = top[k];
		}
		for (int k = 0; k < w->n_models; k++) {
			struct wmodel *wm = w->models[k];
			int rk;
			if (!wm || sched_live(wm->s) == 0 || wm->dead)
				continue;
			if (top[k] < most && (w->rounds & 1)) {
				r = r > 0 ? r : 1; /* it has work: no sleeping */
				continue;
			}
			rk = sched_step(wm->s);
			if (rk < 0) {
				struct worker_note n = { .kind = WORKER_NOTE_FAILED, .error = rk,
							 .sticky = engine_failure_is_sticky(wm->e),
							 .model = k };
				snprintf(n.message, sizeof n.message, "%s", engine_last_error(wm->e));
				note(w, &n);
				if (n.sticky)
					wm->dead = 1;
			}
			w->snap_dirty |= rk != 0;
			if (rk > 0 || (rk < 0 && r == 0))
				r = rk;
		}
		rate_sample(w);
		/* Published before the clients hear of their records, so that one
		 * that read a FINAL and asks for stats sees that request counted. */
		if (w->snap_dirty)
			publish(w);
		for (struct wconn *c = w->conns; c; c = c->next)
			if (c->dirty && c->wake_fd >= 0) {
				usock_wake(c->wake_fd); /* never blocks; a full channel is still a wakeup */
				c->dirty = 0;
			}
		if (w->notes_pending) {
			w->notes_pending = 0;
			efd_signal(w->note_efd);
		}
		if (r <= 0) {
			/* Idle (or only held requests): sleep until posted to. */
			struct pollfd p = { .fd = w->in_efd, .events = POLLIN };
			if (poll(&p, 1, stop ? 10 : 1000) > 0)
				efd_clear(w->in_efd);
		}
	}
	free(batch.items);
	return NULL;
}

/* ---- lifecycle (main thread) ---- */

/* Frees WM (its requests are the caller's to have ended). */
static void wmodel_free(struct wmodel *wm)
{
	if (!wm)
		return;
	sched_free(wm->s);
	for (uint32_t i = 0; wm->slots && i < wm->n_slots; i++)
		if (wm->slots[i]) {
			worker_req_free(wm->slots[i]->r);
			free(wm->slots[i]);
		}
	free(wm->slots);
	free(wm->slot_gen);
	if (wm->e) /* LLMD_CUDA_PROFILE's table, where the backend kept one */
		engine_write_device_profile(wm->e, stderr);
	engine_free(wm->e);
	engine_free(wm->de);
	free(wm);
}

int worker_set_draft(struct worker *w, const struct model *dm, const struct engine_params *ep,
		     char *err, size_t errlen)
{
	if (w->started) {
		snprintf(err, errlen, "the draft model is set once, before the worker starts");
		return -EINVAL;
	}
	return worker_model_set_draft(w->models[0], dm, ep, err, errlen);
}

int worker_model_set_draft(struct wmodel *wm, const struct model *dm, const struct engine_params *ep,
			   char *err, size_t errlen)
{
	struct engine_params dp = *ep;
	int r;

	if (wm->de) {
		snprintf(err, errlen, "the draft model is set once");
		return -EINVAL;
	}
	/* the model's context and KV capacity, on its CPU threads */
	dp.n_ctx = engine_n_ctx(wm->e);
	dp.kv_tokens = engine_kv_capacity(wm->e);
	dp.kv_mib = 0;
	dp.threads_of = wm->e;
	if ((r = engine_new(dm, &dp, &wm->de, err, errlen)) < 0)
		return r;
	if ((r = sched_set_draft(wm->s, wm->de, dm, err, errlen)) < 0) {
		engine_free(wm->de);
		wm->de = NULL;
	}
	return r;
}

int worker_model_prepare(const struct model *m, const struct engine_params *ep,
			 const struct sched_params *sp, struct wmodel **ret, char *err, size_t errlen)
{
	struct wmodel *wm = calloc(1, sizeof *wm);
	int r;

	if (!wm) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	wm->m = m;
	if ((r = engine_new(m, ep, &wm->e, err, errlen)) < 0 ||
	    (r = sched_new(wm->e, m, sp, on_event, wm, &wm->s, err, errlen)) < 0) {
		wmodel_free(wm);
		return r;
	}
	wm->n_slots = (uint32_t)(sp->max_seqs + sp->max_queue);
	wm->slots = calloc(wm->n_slots, sizeof *wm->slots);
	wm->slot_gen = calloc(wm->n_slots, sizeof *wm->slot_gen);
	if (!wm->slots || !wm->slot_gen) {
		wmodel_free(wm);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	*ret = wm;
	return 0;
}

void worker_model_discard(struct wmodel *wm)
{
	wmodel_free(wm);
}

/* Makes and installs MODEL before the thread starts. */
static int add_model(struct worker *w, int model, const struct model *m,
		     const struct engine_params *ep, const struct sched_params *sp, char *err,
		     size_t errlen)
{
	struct wmodel *wm;
	int r;

	if (w->started || model < 0 || model >= WORKER_MAX_MODELS || w->models[model]) {
		snprintf(err, errlen, "no room for model %d (at most %d)", model, WORKER_MAX_MODELS);
		return -E2BIG;
	}
	if ((r = worker_model_prepare(m, ep, sp, &wm, err, errlen)) < 0)
		return r;
	wm->w = w;
	wm->index = model;
	w->models[model] = wm;
	if (model >= w->n_models)
		w->n_models = model + 1;
	publish(w);
	return 0;
}

int worker_new(const struct model *m, const struct engine_params *ep, const struct sched_params *sp,
	       struct worker **ret, char *err, size_t errlen)
{
	struct worker *w = calloc(1, sizeof *w);
	int r;

	if (!w) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	w->in_efd = w->note_efd = -1;
	pthread_mutex_init(&w->in_lock, NULL);
	pthread_mutex_init(&w->note_lock, NULL);
	pthread_mutex_init(&w->snap_lock, NULL);
	w->inbox.size = sizeof(struct work);
	w->notes.size = sizeof(struct worker_note);
	for (int k = 0; k < WORKER_MAX_MODELS; k++)
		w->pending[k].size = sizeof(struct worker_req *);
	w->in_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	w->note_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->in_efd < 0 || w->note_efd < 0) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory or file descriptors");
		goto fail;
	}
	atomic_store(&w->heartbeat, clock_s());
	/* the first model's snapshot gives admin commands something to read
	 * from the start */
	if ((r = add_model(w, 0, m, ep, sp, err, errlen)) < 0)
		goto fail;
	*ret = w;
	return 0;
fail:
	worker_free(w);
	return r;
}

int worker_start(struct worker *w)
{
	int r = pthread_create(&w->thread, NULL, worker_main, w);
	if (r)
		return -r;
	w->started = 1;
	return 0;
}

void worker_free(struct worker *w)
{
	if (!w)
		return;
	if (w->started) {
		struct work wk = { .kind = WORK_CANCEL_ALL };
		pthread_mutex_lock(&w->in_lock);
		vec_push(&w->inbox, &wk);
		w->stop = 1;
		pthread_mutex_unlock(&w->in_lock);
		efd_signal(w->in_efd);
		pthread_join(w->thread, NULL);
	}
	/* Work never processed (posted after the thread left) still owns things. */
	for (size_t i = 0; i < w->inbox.n; i++) {
		struct work *wk = (struct work *)w->inbox.items + i;
		if (wk->kind == WORK_ATTACH) {
			ring_free(wk->ring);
			close(wk->wake_fd);
		} else if (wk->kind == WORK_SUBMIT) {
			worker_req_free(wk->req);
		} else if (wk->kind == WORK_INSTALL) {
			wmodel_free(wk->wm);
		} else if (wk->kind == WORK_FAIL) {
			free(wk->message);
		}
	}
	for (int k = 0; k < WORKER_MAX_MODELS; k++) {
		for (size_t i = 0; i < w->pending[k].n; i++)
			worker_req_free(((struct worker_req **)w->pending[k].items)[i]);
		free(w->pending[k].items);
	}
	free(w->inbox.items);
	free(w->notes.items);
	worker_snapshot_put(w->snap);
	for (int k = 0; k < w->n_models; k++)
		wmodel_free(w->models[k]);
	while (w->conns) {
		struct wconn *c = w->conns;
		w->conns = c->next;
		conn_close_ring(c);
		free(c->overflow);
		free(c);
	}
	if (w->in_efd >= 0)
		close(w->in_efd);
	if (w->note_efd >= 0)
		close(w->note_efd);
	pthread_mutex_destroy(&w->in_lock);
	pthread_mutex_destroy(&w->note_lock);
	pthread_mutex_destroy(&w->snap_lock);
	free(w);
}
