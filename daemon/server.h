/* server.h - the front end on the event-loop thread: the listening socket,
 * client connections as explicit state machines, frame validation, limits,
 * tokenizing requests and posting them to the engine thread, and the
 * engine thread's notes coming back.
 */
#ifndef LLMD_SERVER_H
#define LLMD_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "llmd.h"

struct worker_req;

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

/* Sends an ERROR frame; with CLOSE the connection is closed once it is out. */
void server_send_error(struct llmd *d, struct conn *c, uint64_t id, uint32_t code, int close,
		       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Puts C (its uid, gid, pid and is_admin set) in the connection table,
 * counted against limits.max_connections and connections_per_uid: 0, or
 * PROTO_E_LIMIT with the reason in MSG (C is then not in the table). */
uint32_t server_conn_add(struct llmd *d, struct conn *c, char *msg, size_t msglen);

/* Takes C out of the table: its requests cancelled by the worker, its
 * accounting released, C freed.  Its socket is the caller's to close. */
void server_conn_remove(struct llmd *d, struct conn *c);

/* Checks S, a request from connection C, as a SUBMIT frame is checked
 * (draining, the per-connection and per-user limits, the sampler's
 * parameters, max_tokens, the prompt's size and UTF-8, the chat template),
 * tokenizes its prompt and builds the engine's request.  0 with *RET, or an
 * enum proto_err with the reason in MSG.  Posts nothing. */
uint32_t server_make_request(struct llmd *d, struct conn *c, const struct proto_submit *s,
			     struct worker_req **ret, char *msg, size_t msglen);

/* Gives R a daemon id, records it live on C (and its user) and posts it to
 * the engine thread, which owns it from then on (also on failure: 0 or
 * PROTO_E_INTERNAL with MSG). */
uint32_t server_post_request(struct llmd *d, struct conn *c, struct worker_req *r, char *msg,
			     size_t msglen);

/* Sends a frame already encoded. */
void server_send(struct conn *c, const void *frame, size_t len);

/* Called by the event loop's timer (a few times a second): closes
 * connections past limits.hello_timeout_s, frame_timeout_s or
 * idle_timeout_s, and those that will not read their last ERROR, and gives
 * freed memory back to the system after large buffers drained. */
void server_tick(struct llmd *d, double now);

#endif
