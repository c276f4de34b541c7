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

/* Handles the engine thread's notes (requests done, corrupt rings,
 * snapshots) that are waiting; the note eventfd's callback does it too. */
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

#endif
