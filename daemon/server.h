/* server.h - the front end on the event-loop thread: the listening socket,
 * client connections as explicit state machines, frame validation, limits,
 * tokenizing requests and posting them to the engine thread, and the
 * engine thread's notes coming back.
 */
#ifndef LLMD_SERVER_H
#define LLMD_SERVER_H

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
};

/* Takes the listening socket FD (non-blocking) and starts accepting; also
 * watches the worker's note fd.  0 or a negative errno.  Event loop. */
int server_start(struct llmd *d, int fd);

/* Stops accepting (closes the listener; the bound socket file is removed). */
void server_stop_listening(struct llmd *d);

/* Closes every connection (their requests are cancelled by the worker). */
void server_close_all(struct llmd *d);

/* Handles the engine thread's notes (requests done, corrupt rings, a
 * failed step) that are waiting; the note eventfd's callback does it too. */
void server_take_notes(struct llmd *d);

/* Requests live over all connections. */
int64_t server_live_requests(const struct llmd *d);

/* The connection with id ID, or NULL. */
struct conn *server_conn(const struct llmd *d, uint32_t id);

/* Sends an ERROR frame; with CLOSE the connection is closed once it is out. */
void server_send_error(struct llmd *d, struct conn *c, uint64_t id, uint32_t code, int close,
		       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Sends a frame already encoded. */
void server_send(struct conn *c, const void *frame, size_t len);

/* Cancels C's live request number I (of c->live): posted to the engine
 * once, however often it is asked for. */
void server_cancel(struct llmd *d, struct conn *c, int32_t i);

/* Called by the event loop's timer (a few times a second): closes
 * connections past limits.hello_timeout_s, frame_timeout_s or
 * idle_timeout_s, and those that will not read their last ERROR, and gives
 * freed memory back to the system after large buffers drained. */
void server_tick(struct llmd *d, double now);

#endif
