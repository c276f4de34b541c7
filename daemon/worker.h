/* worker.h - the engine thread: it owns the engine, the scheduler and the
 * KV pool, runs steps while there is work, and writes every request's token
 * and final records into its client's shared-memory ring.
 *
 * The event-loop thread talks to it only through the worker_* calls below,
 * which post to a mutex-guarded inbox and signal an eventfd; the worker
 * answers with notes (request done, a client's ring is corrupt, the engine
 * failed) on a second queue whose eventfd the event loop watches, and
 * publishes a snapshot of its state after every step that changed it, which
 * admin commands read without waiting for the engine.  Connections are named by the event loop's conn ids, requests by
 * daemon-wide ids (gid) that the event loop assigns.
 */
#ifndef LLMD_WORKER_H
#define LLMD_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "engine.h"
#include "sampler.h"
#include "sched.h"

#define WORKER_MAX_MODELS 8      /* models one engine thread serves */

struct constrain_req;
struct model;
struct ring;
struct wmodel;
struct worker;

/* A request handed to the engine thread; the worker owns it after
 * worker_submit (free it with worker_req_free if you never post it). */
struct worker_req {
	uint64_t gid;                /* daemon-wide id, unique for the daemon's life */
	uint32_t conn_id;            /* whose ring gets the records */
	uint64_t client_id;          /* the client's id, echoed in records */
	uint32_t uid;                /* the scheduler's fairness key */
	int model;                   /* which model serves it (index of worker_model_install; 0: the default) */
	int32_t priority;
	int32_t *prompt;             /* (n_prompt) token ids; owned */
	int32_t n_prompt;
	int32_t max_tokens;
	struct sampler_params sampling;
	char **stops;                /* (n_stops) NUL-terminated; owned */
	int n_stops;
	int ignore_eos, logprobs;
	int32_t spec;                /* SCHED_SPEC_*: speculative decoding (0: the daemon's) */
	int32_t spec_max_draft;      /* tokens it proposes a step at most (0: the daemon's) */
	int32_t top_logprobs;        /* alternatives with each token (<= PROTO_MAX_TOP_LOGPROBS) */
	struct constrain_req *grammar; /* what constrains the output, or NULL; owned
	                                  (freed with the request, on the engine thread) */
	char notice[96];             /* for the client in the FINAL record (a clamped
	                                priority); "" when none */
};

void worker_req_free(struct worker_req *r); /* NULL-safe */

enum worker_note_kind {
	WORKER_NOTE_DONE = 1,     /* request GID of CONN_ID has its final record written (or dropped) */
	WORKER_NOTE_RING_BAD = 2, /* CONN_ID's client scribbled on its ring: close it */
	WORKER_NOTE_FAILED = 4,   /* a step failed with ERROR; running requests got error records;
	                             STICKY: the engine thread serves nothing more */
	WORKER_NOTE_UNLOADED = 8, /* worker_model_remove's answer for MODEL: ERROR 0, its engine
	                             is freed; -EBUSY, a request came first and it stays */
};

/* A latency histogram of finished requests, Prometheus-style: COUNTS[i]
 * those of at most worker_hist_le[i] seconds (not cumulative), COUNT all
 * of them (the last bucket is +Inf), SUM their seconds. */
#define WORKER_HIST_BUCKETS 15
extern const double worker_hist_le[WORKER_HIST_BUCKETS];

struct worker_hist {
	uint64_t counts[WORKER_HIST_BUCKETS];
	uint64_t count;
	double sum;
};

enum worker_hist_kind {
	WORKER_HIST_TTFT,            /* submit to first token (queue + prefill) */
	WORKER_HIST_TPOT,            /* decode time over generated tokens - 1 */
	WORKER_HIST_QUEUE,           /* submit to admission */
	WORKER_HIST__N,
};

struct worker_snap_req {
	uint64_t gid;
	int model;                   /* its model's index */
	uint32_t conn_id;
	uint64_t client_id;
	struct sched_info info;
	double age_s;                /* since the worker received it */
	int ring_full;               /* held because the client's ring is full */
	int loading;                 /* waits for its model to be loaded (INFO is zero but
	                                for the prompt's length) */
};

/* One model's part of a snapshot. */
struct worker_snap_model {
	struct sched_counters c;
	int64_t kv_capacity_tokens;
	int32_t live;                /* requests queued or running, or waiting for the
	                                model to be loaded */
	int32_t pending;             /* of them, waiting for the model to be loaded */
	int loaded;                  /* the engine thread holds its engine */
	int dead;                    /* its engine failed for good */
};

/* The engine's state as of its last step, shared read-only by the engine
 * thread and the event loop (reference counted).  C, KV_CAPACITY_TOKENS,
 * DEVICE and the graph counts are the default model's (models[0]). */
struct worker_snapshot {
	_Atomic int refs;            /* worker_snapshot_get's references, and the worker's */
	double t;                    /* monotonic seconds when it was taken */
	struct sched_counters c;
	double tok_s;                /* generated tokens/s over the last ten seconds */
	int64_t kv_capacity_tokens;
	struct bk_device_info device; /* what the engine runs on */
	uint64_t graphs_recorded;    /* decode steps recorded as CUDA graphs */
	uint64_t graphs_replayed;    /* and replayed from them */
	struct worker_hist hist[WORKER_HIST__N]; /* every request that finished with usage */
	struct worker_snap_model models[WORKER_MAX_MODELS]; /* (n_models) */
	int n_models;
	int32_t n_conns;             /* connections with a ring attached */
	int32_t n_reqs, cap_reqs;    /* live requests; entries allocated */
	struct worker_snap_req reqs[]; /* (n_reqs) */
};

struct worker_note {
	enum worker_note_kind kind;
	uint32_t conn_id;
	uint64_t gid;
	int error;                   /* WORKER_NOTE_FAILED: negative errno */
	int sticky;                  /* WORKER_NOTE_FAILED: the backend is unusable now */
	int model;                   /* WORKER_NOTE_FAILED, _UNLOADED: which model */
	char message[256];           /* WORKER_NOTE_FAILED: the backend's account of it */
};

/* Creates the engine and the scheduler for M (which must outlive the
 * worker) without starting the thread.  0 or a negative errno with a
 * message.  Main thread. */
int worker_new(const struct model *m, const struct engine_params *ep, const struct sched_params *sp,
	       struct worker **ret, char *err, size_t errlen);

/* Models by index (what worker_req.model names, < WORKER_MAX_MODELS).  A
 * request for a model the engine thread does not hold waits for it: the
 * event loop loads models (worker_model_prepare, on any thread: that is
 * the slow part) and hands them over (worker_model_install), or gives up
 * (worker_model_fail), and unloads idle ones (worker_model_remove).  The
 * event loop keeps what it needs to know of a model (its n_ctx, its KV
 * pool's size) itself: the engine thread frees a removed model's engine. */

/* Makes M's engine (its KV pool, its weights where the device wants a
 * copy) and scheduler, not yet served.  0 with *RET, or a negative errno
 * with a message.  Any thread; M must outlive the worker. */
int worker_model_prepare(const struct model *m, const struct engine_params *ep,
			 const struct sched_params *sp, struct wmodel **ret, char *err, size_t errlen);
/* The engine of a prepared model (before it is installed), and its draft
 * model's (worker_model_set_draft) or NULL. */
const struct engine *worker_model_engine(const struct wmodel *wm);
const struct engine *worker_model_draft_engine(const struct wmodel *wm);
/* Gives a prepared model a draft model for speculative decoding: DM (which
 * must outlive the worker) on an engine of EP's settings with the model's
 * context, KV capacity and CPU threads.  Before it is installed.  0, or a
 * negative errno with a message (another vocabulary, no memory for it). */
int worker_model_set_draft(struct wmodel *wm, const struct model *dm, const struct engine_params *ep,
			   char *err, size_t errlen);
/* Frees a prepared model never installed.  NULL-safe. */
void worker_model_discard(struct wmodel *wm);
/* Posts WM to serve MODEL (not held now); the requests waiting for it go
 * to its scheduler.  The worker owns WM from now on, even on failure.  0
 * or -ENOMEM. */
int worker_model_install(struct worker *w, int model, struct wmodel *wm);
/* Ends the requests waiting for MODEL with error nomodel and MESSAGE. */
int worker_model_fail(struct worker *w, int model, const char *message);
/* Frees MODEL's engine if nothing runs or waits on it when the engine
 * thread gets to it; a WORKER_NOTE_UNLOADED says which happened. */
int worker_model_remove(struct worker *w, int model);

/* Starts the engine thread.  0 or a negative errno. */
int worker_start(struct worker *w);

/* Cancels what is left, stops and joins the thread (if started), frees
 * everything.  NULL-safe.  Main thread. */
void worker_free(struct worker *w);

/* The default model's engine (model 0, never removed). */
const struct engine *worker_engine(const struct worker *w);
/* The default model's draft model's engine (worker_set_draft), or NULL. */
const struct engine *worker_draft_engine(const struct worker *w);

/* Gives the default model a draft model for speculative decoding (spec.mode
 * draft), as worker_model_set_draft does.  Before worker_start.  0, or a
 * negative errno with a message. */
int worker_set_draft(struct worker *w, const struct model *dm, const struct engine_params *ep,
		     char *err, size_t errlen);

/* Posting, from the event-loop thread.  Each returns 0 or -ENOMEM. */

/* Hands CONN_ID's ring (producer side) and the signalling end of its wake
 * channel (usock_wake_pair) to the engine thread, which owns and frees
 * them from now on, even on failure.  The engine thread only ever signals
 * it with usock_wake, which cannot block. */
int worker_attach(struct worker *w, uint32_t conn_id, struct ring *ring, int wake_fd);
/* The connection is gone: its requests are cancelled, its ring freed. */
int worker_detach(struct worker *w, uint32_t conn_id);
/* Takes R (and everything it owns), even on failure. */
int worker_submit(struct worker *w, struct worker_req *r);
int worker_cancel(struct worker *w, uint64_t gid);
/* A client read its ring after the worker found it full: the engine thread
 * retries every full ring.  Posts nothing, so a flood of wakes costs one
 * wakeup and no memory. */
void worker_ring_wake(struct worker *w);
/* Cancels every live request (shutdown after the grace period). */
int worker_cancel_all(struct worker *w);

/* The eventfd that becomes readable when notes are waiting.  The event loop
 * reads it (to clear it) and then calls worker_take_notes. */
int worker_note_fd(const struct worker *w);
/* Moves up to MAX notes into OUT; returns how many. */
int worker_take_notes(struct worker *w, struct worker_note *out, int max);

/* The last published snapshot, with a reference the caller drops with
 * worker_snapshot_put; NULL only when memory ran out at the start.  Never
 * waits for a step.  Any thread. */
struct worker_snapshot *worker_snapshot_get(struct worker *w);
void worker_snapshot_put(struct worker_snapshot *sn); /* NULL-safe */

/* Monotonic seconds of the engine thread's last loop iteration (it wakes at
 * least once a second when idle): the watchdog's proof of life. */
double worker_heartbeat(const struct worker *w);

#endif
