/* llmd.h - the daemon's state: one struct llmd, owned by the event-loop
 * thread, that everything in daemon/main.c, server.c and admin.c hangs off.
 * Start reading here.  The engine thread's state is behind struct worker
 * (worker.h); the two meet only through the worker's queues.
 */
#ifndef LLMD_LLMD_H
#define LLMD_LLMD_H

#include <stdint.h>
#include <sys/types.h>

#include "conf.h"
#include "proto.h"

struct event;
struct event_base;
struct model;
struct worker;
struct conn;
struct http_front;

/* A model the daemon serves, by name.  models[0] is the default one (the
 * one a request that names none gets): model.path's. */
struct llmd_model {
	char name[LLMD_MODEL_NAME_MAX + 1]; /* what requests name it by */
	struct model *model;         /* immutable after load: every thread reads it */
	struct constrain *constrain; /* its compiled grammars; event-loop thread (freed
	                                after the worker) */
	int index;                   /* the worker's index for it (worker_req.model) */
	uint64_t requests_total;     /* accepted for it by the front end */
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
	struct model *model;         /* models[0].model: the default model */
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
