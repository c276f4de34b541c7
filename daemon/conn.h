/* conn.h - a client connection's state and the daemon's table of them
 * (struct llmd's conns), with the questions the server and admin ask of it:
 * which connection has this id, which request has this daemon id, how many
 * are live; and a request's cancellation posted to the engine.  No I/O:
 * reading and writing connections is server.c's.  Event-loop thread.
 */
#ifndef LLMD_CONN_H
#define LLMD_CONN_H

#include <stdint.h>
#include <sys/types.h>

#include "llmd.h"

enum conn_state {
	CONN_HELLO = 1,      /* waiting for HELLO */
	CONN_READY = 2,      /* ring attached; requests accepted */
	CONN_CLOSING = 3,    /* an error was sent; closing once it is written */
};

/* A request a connection has live (submitted, not yet done). */
struct conn_req {
	uint64_t client_id;          /* the client's id */
	uint64_t gid;                /* the daemon's */
	int cancel_posted;           /* its CANCEL went to the engine (once is enough) */
};

struct conn {
	uint32_t id;                 /* slot | generation << 16 */
	int fd;
	struct bufferevent *bev;     /* owns FD */
	enum conn_state state;
	pid_t pid;                   /* SO_PEERCRED at accept */
	uid_t uid;
	gid_t gid;
	char comm[32];               /* /proc/PID/comm, best effort */
	int is_admin;                /* root, the daemon's own user, or admin_group */
	double t_connect;            /* monotonic seconds */
	double t_frame;              /* monotonic seconds of the last whole frame (or the connect) */
	double t_partial;            /* since when part of a frame has waited for the rest; 0: none */
	double t_closing;            /* when it became CONN_CLOSING */
	int read_paused;             /* over limits.output_kib of unread replies: not read until
	                                they drain to half of it */
	struct conn_req *live;       /* (n_live) requests in flight */
	int32_t n_live, cap_live;
	uint64_t requests;           /* submitted over the connection's life */
	int http;                    /* an HTTP request's entry (http.c): no socket, no bev;
	                                http.c reads its ring and ends it */
};

/* The connection with id ID, or NULL. */
struct conn *conn_lookup(const struct llmd *d, uint32_t id);

/* Index in C's live requests of the client's request CLIENT_ID, or -1. */
int conn_find_live(const struct conn *c, uint64_t client_id);

/* The connection with the live request of daemon id GID, its index in
 * *RET_I; NULL when no connection has it live. */
struct conn *conn_find_gid(const struct llmd *d, uint64_t gid, int32_t *ret_i);

/* Requests live over all connections. */
int64_t conn_live_total(const struct llmd *d);

/* Cancels C's live request number I (of c->live): posted to the engine
 * once, however often it is asked for. */
void conn_cancel(struct llmd *d, struct conn *c, int32_t i);

#endif
