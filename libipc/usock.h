/* usock.h - Unix stream socket helpers shared by the daemon and the client
 * library: listen, connect, frames with file descriptors (SCM_RIGHTS), the
 * peer's credentials.  No logging; errors are negative errnos with a
 * message where one helps.  Every fd is created close-on-exec.
 */
#ifndef LLMD_USOCK_H
#define LLMD_USOCK_H

#include <stddef.h>
#include <sys/types.h>

#define USOCK_MAX_FDS 4

/* Binds and listens on PATH (non-blocking).  A stale socket file nobody
 * listens on is replaced; a live one gives -EADDRINUSE; a non-socket file
 * at PATH gives -EEXIST.  MODE (e.g. 0660) is applied to the socket file
 * when nonzero.  Returns the listening fd or a negative errno. */
int usock_listen(const char *path, mode_t mode, int backlog, char *err, size_t errlen);

/* Connects to PATH (blocking).  Returns the fd or a negative errno. */
int usock_connect(const char *path, char *err, size_t errlen);

/* Sends LEN bytes and, with the first byte, NFDS (<= USOCK_MAX_FDS) file
 * descriptors.  Returns bytes sent (possibly fewer than LEN on a non-blocking
 * socket) or a negative errno (-EAGAIN, -EPIPE...).  Never raises SIGPIPE. */
ssize_t usock_send(int fd, const void *buf, size_t len, const int *fds, int nfds);

/* Receives up to LEN bytes and any file descriptors that came with them (at
 * most MAXFDS are kept, the rest closed; all are close-on-exec).  *RET_NFDS
 * gets the count.  Returns bytes read, 0 at end of stream, or a negative
 * errno; -EBADMSG when the descriptors were truncated. */
ssize_t usock_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *ret_nfds);

/* The peer's pid, uid and gid (SO_PEERCRED).  0 or a negative errno. */
int usock_peercred(int fd, pid_t *ret_pid, uid_t *ret_uid, gid_t *ret_gid);

/* ---- wake channels: one side signals, the other waits ----
 *
 * A socket pair, not a shared eventfd: the two ends are separate open file
 * descriptions, so the waiter (a client, given its end with SCM_RIGHTS) can
 * neither change the signaller's blocking mode nor write to it, and a
 * signal is a send with MSG_DONTWAIT, which never blocks whatever anyone
 * did to either end.  Each signal is USOCK_WAKE_BYTES bytes (the waiter may
 * read them 8 at a time, as an eventfd's counter); a waiter that never
 * reads only fills its own socket buffer, and signals then fail quietly. */
#define USOCK_WAKE_BYTES 8

/* Makes a wake channel: RET[0] the signalling end (its read side shut, so
 * nothing written at the other end is ever queued), RET[1] the waiting end,
 * both non-blocking and close-on-exec.  0 or a negative errno. */
int usock_wake_pair(int ret[2]);

/* Signals through the signalling end FD.  Never blocks and never raises
 * SIGPIPE: 0, or a negative errno (-EAGAIN when the waiter has not read
 * its earlier signals, -EPIPE when it closed its end) that callers may
 * ignore, since the waiter has wakeups pending or is gone. */
int usock_wake(int fd);

/* Empties the waiting end FD (or an eventfd).  Returns 1 when signals were
 * waiting, 0 when none were, -EPIPE when the signalling end is closed (the
 * end will be readable for ever: stop polling it), or another negative errno. */
int usock_wake_drain(int fd);

#endif
