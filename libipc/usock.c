/* usock.c - Unix stream sockets for the daemon and the client library:
 * listening (with stale-socket recovery), connecting, bytes with file
 * descriptors, peer credentials.  No framing here (proto.h) and no logging.
 */
#include "usock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "errbuf.h"

/* Fills SA with PATH: 0, -EINVAL (empty) or -ENAMETOOLONG. */
static int make_addr(struct sockaddr_un *sa, const char *path)
{
	size_t n = strlen(path);

	if (!n)
		return -EINVAL;
	if (n >= sizeof sa->sun_path)
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, n + 1);
	return 0;
}

/* A socket file at SA: 0 when nobody listens on it (stale), -EADDRINUSE
 * when someone does, another negative errno when we cannot tell. */
static int probe_stale(const struct sockaddr_un *sa)
{
	int fd, rc = -EADDRINUSE;

	/* Non-blocking: a listener with a full backlog answers EAGAIN, not a hang. */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) < 0) {
		if (errno == ECONNREFUSED || errno == ENOENT)
			rc = 0;
		else if (errno != EAGAIN && errno != EINPROGRESS)
			rc = -errno;
	}
	close(fd);
	return rc;
}

int usock_listen(const char *path, mode_t mode, int backlog, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, rc;

	rc = make_addr(&sa, path);
	if (rc < 0) {
		errbuf_set(err, errlen, "%s: %s", path,
			rc == -ENAMETOOLONG ? "socket path too long" : "empty socket path");
		return rc;
	}
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			errbuf_set(err, errlen, "%s exists and is not a socket", path);
			return -EEXIST;
		}
		rc = probe_stale(&sa);
		if (rc == -EADDRINUSE) {
			errbuf_set(err, errlen, "%s: another process is listening on it", path);
			return rc;
		}
		if (rc < 0) {
			errbuf_set(err, errlen, "%s: cannot probe the old socket: %s", path, strerror(-rc));
			return rc;
		}
		if (unlink(path) < 0 && errno != ENOENT) {
			rc = -errno;
			errbuf_set(err, errlen, "%s: cannot remove the stale socket: %s", path,
				strerror(-rc));
			return rc;
		}
	} else if (errno != ENOENT) {
		rc = -errno;
		errbuf_set(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "socket: %s", strerror(-rc));
		return rc;
	}
	if (bind(fd, (const struct sockaddr *)&sa, sizeof sa) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "%s: bind: %s", path, strerror(-rc));
		close(fd);
		return rc;
	}
	/* Before listen(): until then a connect is refused whatever the mode. */
	if (mode && chmod(path, mode) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "%s: chmod %04o: %s", path, (unsigned)mode, strerror(-rc));
		goto fail;
	}
	if (listen(fd, backlog) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "%s: listen: %s", path, strerror(-rc));
		goto fail;
	}
	return fd;
fail:
	unlink(path);
	close(fd);
	return rc;
}

int usock_connect(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	int fd, rc;

	rc = make_addr(&sa, path);
	if (rc < 0) {
		errbuf_set(err, errlen, "%s: %s", path,
			rc == -ENAMETOOLONG ? "socket path too long" : "empty socket path");
		return rc;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "socket: %s", strerror(-rc));
		return rc;
	}
	/* An interrupted AF_UNIX connect leaves the socket unconnected: retry. */
	while (connect(fd, (const struct sockaddr *)&sa, sizeof sa) < 0) {
		if (errno == EINTR)
			continue;
		rc = -errno;
		errbuf_set(err, errlen, "%s: connect: %s", path, strerror(-rc));
		close(fd);
		return rc;
	}
	return fd;
}

/* Room for USOCK_MAX_FDS descriptors, aligned for struct cmsghdr. */
union usock_cmsg {
	struct cmsghdr align;
	char buf[CMSG_SPACE(sizeof(int) * USOCK_MAX_FDS)];
};

ssize_t usock_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	union usock_cmsg c;
	ssize_t n;

	if (nfds < 0 || nfds > USOCK_MAX_FDS || (nfds && (!fds || !len)))
		return -EINVAL;
	if (nfds) {
		struct cmsghdr *cm;

		memset(&c, 0, sizeof c);
		msg.msg_control = c.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

ssize_t usock_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *ret_nfds)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	union usock_cmsg c;
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = c.buf,
		.msg_controllen = sizeof c.buf,
	};
	struct cmsghdr *cm;
	int got = 0;
	ssize_t n;

	if (maxfds < 0 || (maxfds && !fds))
		return -EINVAL;
	do
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		size_t k;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
		    cm->cmsg_len < CMSG_LEN(0))
			continue;
		k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int x;

			memcpy(&x, CMSG_DATA(cm) + i * sizeof(int), sizeof x);
			if (got < maxfds)
				fds[got++] = x;
			else
				close(x);
		}
	}
	if (msg.msg_flags & MSG_CTRUNC) {
		while (got > 0)
			close(fds[--got]);
		return -EBADMSG;
	}
	if (ret_nfds)
		*ret_nfds = got;
	else
		while (got > 0)
			close(fds[--got]);
	return n;
}

int usock_peercred(int fd, pid_t *ret_pid, uid_t *ret_uid, gid_t *ret_gid)
{
	struct ucred cr;
	socklen_t n = sizeof cr;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) < 0)
		return -errno;
	if (n != sizeof cr)
		return -EPROTO;
	if (ret_pid)
		*ret_pid = cr.pid;
	if (ret_uid)
		*ret_uid = cr.uid;
	if (ret_gid)
		*ret_gid = cr.gid;
	return 0;
}

/* ---- wake channels ---- */

int usock_wake_pair(int ret[2])
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	/* Nothing the waiter writes may queue up on our side. */
	if (shutdown(sv[0], SHUT_RD) < 0) {
		int e = errno;
		close(sv[0]);
		close(sv[1]);
		return -e;
	}
	ret[0] = sv[0];
	ret[1] = sv[1];
	return 0;
}

int usock_wake(int fd)
{
	static const uint8_t one[USOCK_WAKE_BYTES] = { 1 };

	return send(fd, one, sizeof one, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

int usock_wake_drain(int fd)
{
	uint8_t buf[512];
	int got = 0;

	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n > 0) {
			got = 1;
			if ((size_t)n < sizeof buf)
				return 1;
			continue;
		}
		if (n == 0)
			return got ? 1 : -EPIPE;
		if (errno == EINTR)
			continue;
		return errno == EAGAIN ? got : -errno;
	}
}
