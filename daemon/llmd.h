/* llmd.h - the daemon's state: one struct llmd, owned by the event-loop
 * thread, that everything in daemon/main.c, server.c and admin.c hangs off.
 * Start reading here.  The engine thread's state is behind struct worker
 * (worker.h); the two meet only through the worker's queues.
 */
#ifndef LLMD_LLMD_H
#define LLMD_LLMD_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "conf.h"
#include "proto.h"

struct engine_params;
struct event;
struct event_base;
struct sched_params;
struct wmodel;
struct model;
struct worker;
struct conn;
struct http_front;

/* Where a model stands (models.c moves it). */
enum llmd_model_state {
	LLMD_MODEL_UNLOADED = 0,     /* its file is read (tokenizer, template), no engine */
	LLMD_MODEL_LOADING,          /* a loader thread is making its engine */
	LLMD_MODEL_READY,            /* the engine thread serves it */
	LLMD_MODEL_UNLOADING,        /* worker_model_remove posted, its answer not back */
	LLMD_MODEL_FAILED,           /* the last load failed (ERROR says why); a request tries again */
};

/* A model the daemon serves, by name.  models[0] is the default one (the
 * one a request that names none gets): model.path's, always loaded.
 * Event-loop thread, but for the loader fields (models.c). */
struct llmd_model {
	char name[LLMD_MODEL_NAME_MAX + 1]; /* what requests name it by */
	struct model *model;         /* its file: immutable after start, every thread reads it */
	struct model *draft;         /* its draft model's (speculative decoding), or NULL;
	                                owned, but the default model's is llmd.draft_model */
	struct constrain *constrain; /* its compiled grammars; event-loop thread (freed
	                                after the worker) */
	int index;                   /* the worker's index for it (worker_req.model) */
	uint64_t requests_total;     /* accepted for it by the front end */
	enum llmd_model_state state;
	int pinned;                  /* never unloaded (loaded at start) */
	int32_t keep_alive_s;        /* idle this long, it is unloaded; -1 never; 0 at once */
	int reload;                  /* a request came while UNLOADING: load it again after */
	int32_t n_ctx, n_vocab;      /* what its engine has (or will have) */
	int32_t conf_n_ctx;          /* models.NAME.n_ctx, or -1: kv.n_ctx */
	int64_t conf_pool_tokens;    /* models.NAME.pool_tokens, or -1: kv.pool_* */
	uint64_t weight_bytes;       /* its weights */
	uint64_t kv_bytes;           /* its KV pool: the real one when loaded, else the
	                                one expected */
	double t_used;               /* monotonic seconds it last had a request */
	double t_ready;              /* when its last load finished */
	double load_s;               /* how long that load took */
	uint64_t loads;              /* loads finished */
	char error[256];             /* why the last load failed, or "" */
	/* the loader thread's (set before event_active on ev_loaded) */
	struct event *ev_loaded;
	pthread_t loader;
	struct wmodel *prepared;
	int load_rc;
	char load_err[256];
	double t_load_start;
};

/* Requests and connections one user holds (the per-uid limits). */
struct uid_use {
	uid_t uid;
	int32_t conns;               /* open connections */
	int32_t live;                /* requests submitted and not yet done */
};

struct llmd {
	struct llmd_conf cfg;      /* what is in force (reload changes the limits) */
	char config_path[1024];      /* "" when none was read */
	char **overrides;            /* (n_overrides) command-line SECTION.KEY=VALUE, reapplied on reload */
	int n_overrides;
	struct llmd_model models[LLMD_MAX_MODELS]; /* (n_models) */
	int n_models;
	const struct engine_params *ep; /* what every model's engine is made with */
	const struct sched_params *sp;
	uint64_t budget_bytes;       /* memory.budget_mb, or the automatic one: weights and
	                                KV of the models loaded at once */
	struct model *model;         /* models[0].model: the default model */
	struct model *draft_model;   /* spec.draft_model's, or NULL */
	struct worker *worker;       /* the engine thread, serving every model */
	struct constrain *constrain; /* models[0].constrain */
	const char *backend;         /* "cpu" */
	int32_t n_threads;           /* CPU threads the engine uses */
	struct event_base *base;
	struct event *ev_listen, *ev_notes, *ev_tick;
	struct event *ev_sig[4];     /* SIGTERM, SIGINT, SIGHUP, SIGPIPE(ignored) */
	int listen_fd;
	int socket_activated;        /* the fd came from systemd */
	char socket_path[108];       /* what we bound (unlinked at exit), "" when activated */
	struct http_front *http;     /* the HTTP front (http.c), NULL when off */
	char http_socket_path[108];  /* its socket file (unlinked at exit), "" when none */
	/* connections, by slot; a conn id is slot | generation << 16 */
	struct conn **conns;         /* (max_conn_slots) */
	uint16_t *conn_gen;          /* (max_conn_slots) */
	uint32_t max_conn_slots;
	int32_t n_conns;
	struct uid_use *uids;        /* (n_uids) users with connections */
	int32_t n_uids, cap_uids;
	uint64_t next_gid;           /* daemon-wide request ids */
	size_t freed_bytes;          /* connection buffers freed since the last malloc_trim */
	double t_trim;               /* monotonic seconds of the last malloc_trim */
	gid_t admin_gid;             /* cfg.admin_group's gid */
	int have_admin_gid;
	int draining;                /* new requests refused (llmctl drain, SIGTERM) */
	int stopping;                /* SIGTERM/SIGINT seen */
	int cancelled_all;           /* the grace period ran out */
	int fatal;                   /* the engine failed for good: stop, exit non-zero */
	double t_start;              /* monotonic seconds at start */
	double t_stop;               /* when stopping began */
	uint64_t watchdog_usec;      /* 0: no systemd watchdog */
	double t_watchdog;           /* last WATCHDOG=1 */
	/* counters for stats */
	uint64_t conns_total;
	uint64_t requests_total;     /* accepted by the front end */
	uint64_t refused[PROTO_E__MAX]; /* ERROR frames sent, by code */
	uint64_t bad_frames;
};

/* The model named NAME (LEN bytes; a NULL NAME or LEN 0: the default one),
 * or NULL.  Any thread that may read D's models. */
struct llmd_model *llmd_model_find(struct llmd *d, const char *name, size_t len);

#endif
