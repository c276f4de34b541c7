/* test_usock.c - the Unix socket helpers:
 *  - bytes travel with an eventfd and a memfd that work on the other side
 *    and arrive close-on-exec; extra descriptors are closed, truncated ones
 *    refused, none leaked;
 *  - the peer's credentials are our own pid, uid and gid;
 *  - listen replaces a stale socket, refuses a live one, a regular file and
 *    a path too long for sun_path, and applies the mode;
 *  - end of stream reads 0; a send to a closed peer is -EPIPE, not SIGPIPE;
 *    a full non-blocking socket is -EAGAIN;
 *  - a wake channel's waiter can neither write to the signalling end nor
 *    make it blocking: a waiter that never reads makes usock_wake say
 *    -EAGAIN, never block; drain reads every signal at once, and -EPIPE
 *    once the signaller is gone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "testutil.h"
#include "usock.h"

static char dir[64];

static const char *tmp_path(const char *name)
{
	static char buf[4][256];
	static int k;
	char *p = buf[k++ % 4];

	snprintf(p, sizeof buf[0], "%s/%s", dir, name);
	return p;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the DIR's own */
}

/* A connected pair through a listening socket at PATH: *RET_C the client
 * side, *RET_A the accepted side (non-blocking). */
static int connected_pair(const char *path, int *ret_c, int *ret_a)
{
	char err[256];
	int l = usock_listen(path, 0, 4, err, sizeof err);

	if (l < 0) {
		fprintf(stderr, "usock_listen %s: %s\n", path, err);
		return -1;
	}
	*ret_c = usock_connect(path, err, sizeof err);
	*ret_a = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	close(l);
	unlink(path);
	if (*ret_c < 0 || *ret_a < 0) {
		fprintf(stderr, "connect/accept %s: %s\n", path, err);
		return -1;
	}
	return 0;
}

static void test_fds_travel(void)
{
	const char *path = tmp_path("fds.sock");
	int c = -1, a = -1, efd, mfd, got[USOCK_MAX_FDS] = { -1, -1, -1, -1 }, n = -1;
	char buf[16] = { 0 };
	uint64_t x;
	void *m;

	if (connected_pair(path, &c, &a) < 0) {
		test_failures++;
		return;
	}
	CHECK(fcntl(c, F_GETFD) & FD_CLOEXEC);
	efd = eventfd(0, EFD_CLOEXEC);
	mfd = memfd_create("test-usock", MFD_CLOEXEC);
	CHECK(efd >= 0 && mfd >= 0);
	CHECK(ftruncate(mfd, 4096) == 0 && pwrite(mfd, "hello", 5, 100) == 5);

	CHECK_INT_EQ(usock_send(c, "abc", 3, (int[]){ efd, mfd }, 2), 3);
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, got, USOCK_MAX_FDS, &n), 3);
	CHECK(memcmp(buf, "abc", 3) == 0);
	CHECK_INT_EQ(n, 2);
	if (n == 2) {
		for (int i = 0; i < 2; i++) {
			CHECK(got[i] != efd && got[i] != mfd);
			CHECK(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
		}
		/* The same eventfd, both ways. */
		x = 5;
		CHECK(write(got[0], &x, sizeof x) == sizeof x);
		CHECK(read(efd, &x, sizeof x) == sizeof x && x == 5);
		x = 7;
		CHECK(write(efd, &x, sizeof x) == sizeof x);
		CHECK(read(got[0], &x, sizeof x) == sizeof x && x == 7);
		/* The same memory. */
		m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, got[1], 0);
		CHECK(m != MAP_FAILED);
		if (m != MAP_FAILED) {
			CHECK(memcmp((char *)m + 100, "hello", 5) == 0);
			memcpy(m, "back", 4);
			CHECK(pread(mfd, buf, 4, 0) == 4 && memcmp(buf, "back", 4) == 0);
			munmap(m, 4096);
		}
		close(got[0]);
		close(got[1]);
	}
	/* Bytes alone: no descriptors. */
	n = -1;
	CHECK_INT_EQ(usock_send(c, "de", 2, NULL, 0), 2);
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, got, USOCK_MAX_FDS, &n), 2);
	CHECK_INT_EQ(n, 0);
	/* Nothing there: a non-blocking socket says so. */
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, got, USOCK_MAX_FDS, &n), -EAGAIN);
	/* Bad arguments. */
	CHECK_INT_EQ(usock_send(c, "x", 1, (int[]){ efd, efd, efd, efd, efd }, 5), -EINVAL);
	CHECK_INT_EQ(usock_send(c, "x", 0, (int[]){ efd }, 1), -EINVAL);
	CHECK_INT_EQ(usock_send(c, "x", 1, NULL, -1), -EINVAL);
	CHECK_INT_EQ(usock_send(c, "", 0, NULL, 0), 0);
	close(efd);
	close(mfd);
	close(c);
	close(a);
}

/* Descriptors beyond MAXFDS are closed; beyond the control buffer, the
 * whole message is refused.  Neither leaks. */
static void test_extra_fds(void)
{
	const char *path = tmp_path("extra.sock");
	int c = -1, a = -1, got[USOCK_MAX_FDS], n = -1, base, efd[6];
	char buf[8];

	if (connected_pair(path, &c, &a) < 0) {
		test_failures++;
		return;
	}
	for (int i = 0; i < 6; i++)
		efd[i] = eventfd((unsigned)i + 1, EFD_CLOEXEC);
	base = count_fds();

	CHECK_INT_EQ(usock_send(c, "x", 1, efd, 3), 1);
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, got, 1, &n), 1);
	CHECK_INT_EQ(n, 1);
	CHECK_INT_EQ(count_fds(), base + 1);
	if (n == 1) {
		uint64_t x = 0;
		CHECK(read(got[0], &x, sizeof x) == sizeof x && x == 1); /* efd[0]'s counter */
		close(got[0]);
	}
	CHECK_INT_EQ(usock_send(c, "y", 1, efd, 2), 1);
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, NULL, 0, &n), 1);
	CHECK_INT_EQ(n, 0);
	CHECK_INT_EQ(count_fds(), base);

	/* Six descriptors by hand: more than usock_recv has room for. */
	{
		union {
			struct cmsghdr align;
			char buf[CMSG_SPACE(sizeof efd)];
		} u;
		struct iovec iov = { .iov_base = "z", .iov_len = 1 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
				      .msg_controllen = sizeof u.buf };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

		memset(u.buf, 0, sizeof u.buf);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof efd);
		memcpy(CMSG_DATA(cm), efd, sizeof efd);
		CHECK_INT_EQ(sendmsg(c, &msg, MSG_NOSIGNAL), 1);
		n = -7;
		CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, got, USOCK_MAX_FDS, &n), -EBADMSG);
		CHECK_INT_EQ(n, -7); /* untouched on failure */
		CHECK_INT_EQ(count_fds(), base);
	}
	for (int i = 0; i < 6; i++)
		close(efd[i]);
	close(c);
	close(a);
}

static void test_peercred(void)
{
	const char *path = tmp_path("cred.sock");
	int c = -1, a = -1;
	pid_t pid = 0;
	uid_t uid = 0;
	gid_t gid = 0;

	if (connected_pair(path, &c, &a) < 0) {
		test_failures++;
		return;
	}
	CHECK_INT_EQ(usock_peercred(a, &pid, &uid, &gid), 0);
	CHECK_INT_EQ(pid, getpid());
	CHECK_INT_EQ(uid, getuid());
	CHECK_INT_EQ(gid, getgid());
	pid = 0;
	CHECK_INT_EQ(usock_peercred(c, &pid, NULL, NULL), 0);
	CHECK_INT_EQ(pid, getpid());
	close(c);
	close(a);
	CHECK_INT_EQ(usock_peercred(0x7ffffff, &pid, &uid, &gid), -EBADF);
}

static void test_listen(void)
{
	const char *path = tmp_path("listen.sock"), *file = tmp_path("plain");
	char err[256], longp[256];
	struct stat st;
	int l, c, fd;

	/* Mode, non-blocking, close-on-exec. */
	l = usock_listen(path, 0660, 4, err, sizeof err);
	CHECK(l >= 0);
	CHECK(stat(path, &st) == 0 && S_ISSOCK(st.st_mode));
	CHECK_INT_EQ(st.st_mode & 07777, 0660);
	CHECK(fcntl(l, F_GETFL) & O_NONBLOCK);
	CHECK(fcntl(l, F_GETFD) & FD_CLOEXEC);

	/* A live socket is not taken over, and keeps working. */
	err[0] = 0;
	CHECK_INT_EQ(usock_listen(path, 0660, 4, err, sizeof err), -EADDRINUSE);
	CHECK(err[0]);
	c = usock_connect(path, err, sizeof err);
	CHECK(c >= 0);
	fd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	CHECK(fd >= 0);
	close(fd);
	close(c);

	/* Closed without unlinking: stale, replaced. */
	close(l);
	CHECK(access(path, F_OK) == 0);
	CHECK_INT_EQ(usock_connect(path, err, sizeof err), -ECONNREFUSED);
	l = usock_listen(path, 0600, 4, err, sizeof err);
	CHECK(l >= 0);
	CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600);
	c = usock_connect(path, err, sizeof err);
	CHECK(c >= 0);
	close(c);
	close(l);

	/* Bound but never listened on: stale too. */
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		unlink(path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
		CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
		close(fd);
		l = usock_listen(path, 0, 4, err, sizeof err);
		CHECK(l >= 0);
		close(l);
		unlink(path);
	}

	/* A regular file is never removed. */
	fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	close(fd);
	CHECK_INT_EQ(usock_listen(file, 0, 4, err, sizeof err), -EEXIST);
	CHECK(stat(file, &st) == 0 && S_ISREG(st.st_mode));
	unlink(file);

	/* sun_path holds 107 characters and the NUL. */
	{
		size_t room = sizeof ((struct sockaddr_un *)0)->sun_path;
		int k = snprintf(longp, sizeof longp, "%s/", dir);
		memset(longp + k, 'a', sizeof longp - (size_t)k);
		longp[room] = 0;
		CHECK_INT_EQ(usock_listen(longp, 0, 4, err, sizeof err), -ENAMETOOLONG);
		CHECK_INT_EQ(usock_connect(longp, err, sizeof err), -ENAMETOOLONG);
		longp[room - 1] = 0;
		l = usock_listen(longp, 0, 4, err, sizeof err);
		CHECK(l >= 0);
		close(l);
		unlink(longp);
	}
	CHECK_INT_EQ(usock_listen("", 0, 4, err, sizeof err), -EINVAL);
	CHECK_INT_EQ(usock_connect(tmp_path("nobody"), err, sizeof err), -ENOENT);
	CHECK_INT_EQ(usock_listen(tmp_path("no/such/dir"), 0, 4, NULL, 0), -ENOENT);
}

static void test_eof_and_epipe(void)
{
	const char *path = tmp_path("eof.sock");
	int c = -1, a = -1, fds[1], n = -1;
	char buf[65536];
	ssize_t r = 0;

	/* A SIGPIPE would kill the test. */
	signal(SIGPIPE, SIG_DFL);
	if (connected_pair(path, &c, &a) < 0) {
		test_failures++;
		return;
	}
	close(c);
	CHECK_INT_EQ(usock_recv(a, buf, sizeof buf, fds, 1, &n), 0);
	CHECK_INT_EQ(n, 0);
	CHECK_INT_EQ(usock_send(a, "x", 1, NULL, 0), -EPIPE);
	CHECK_INT_EQ(usock_send(a, "x", 1, (int[]){ 0 }, 1), -EPIPE);
	close(a);

	/* A full non-blocking socket: a short count or -EAGAIN, never a block. */
	if (connected_pair(path, &c, &a) < 0) {
		test_failures++;
		return;
	}
	memset(buf, 'q', sizeof buf);
	for (int i = 0; i < 1000; i++) {
		r = usock_send(a, buf, sizeof buf, NULL, 0);
		if (r < 0)
			break;
	}
	CHECK_INT_EQ(r, -EAGAIN);
	close(c);
	close(a);
}

static void test_wake_channel(void)
{
	int w[2], n = 0, r;
	uint64_t v = 0xfffffffffffffffeull;

	CHECK_INT_EQ(usock_wake_pair(w), 0);
	CHECK(fcntl(w[0], F_GETFD) & FD_CLOEXEC);
	CHECK(fcntl(w[1], F_GETFD) & FD_CLOEXEC);
	CHECK_INT_EQ(usock_wake_drain(w[1]), 0);
	/* The waiter turns its end blocking and writes: nothing arrives, and
	 * the signalling end stays non-blocking. */
	CHECK(fcntl(w[1], F_SETFL, fcntl(w[1], F_GETFL) & ~O_NONBLOCK) == 0);
	errno = 0;
	CHECK(send(w[1], &v, sizeof v, MSG_NOSIGNAL) < 0 && errno == EPIPE);
	CHECK(fcntl(w[0], F_GETFL) & O_NONBLOCK);
	CHECK(fcntl(w[1], F_SETFL, fcntl(w[1], F_GETFL) | O_NONBLOCK) == 0);
	/* Signals a waiter never reads fill its buffer, then are refused. */
	while ((r = usock_wake(w[0])) == 0 && n < 1000000)
		n++;
	CHECK_INT_EQ(r, -EAGAIN);
	CHECK(n > 0);
	CHECK_INT_EQ(usock_wake_drain(w[1]), 1);
	CHECK_INT_EQ(usock_wake_drain(w[1]), 0);
	CHECK_INT_EQ(usock_wake(w[0]), 0);
	close(w[0]);
	CHECK_INT_EQ(usock_wake_drain(w[1]), 1);    /* the last signal, then */
	CHECK_INT_EQ(usock_wake_drain(w[1]), -EPIPE); /* the signaller is gone */
	close(w[1]);
	printf("wake channel: %d signals filled an unread one; none blocked\n", n);
}

int main(void)
{
	snprintf(dir, sizeof dir, "/tmp/test_usock.XXXXXX");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_fds_travel();
	test_extra_fds();
	test_peercred();
	test_listen();
	test_eof_and_epipe();
	test_wake_channel();
	rmdir(dir);
	return test_result();
}
