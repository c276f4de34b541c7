/* daemonutil.h - integration tests start the real llmd on a temporary
 * socket and run the real CLIs: helpers to start and stop it and to run a
 * program capturing its output.  Binaries come from $LLMD_BUILDDIR.
 */
#ifndef LLMD_DAEMONUTIL_H
#define LLMD_DAEMONUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "clock.h"
#include "testutil.h"

extern char **environ;

struct tdaemon {
	pid_t pid;
	char dir[64];                /* temporary directory (socket, log) */
	char sock[128];
	char log[128];
};

static inline void tsleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static inline const char *tbuilddir(void)
{
	const char *b = getenv("LLMD_BUILDDIR");
	return b ? b : ".";
}

static inline void tdaemon_print_log(const struct tdaemon *d)
{
	char buf[4096];
	int fd = open(d->log, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	if (fd < 0)
		return;
	fprintf(stderr, "---- %s ----\n", d->log);
	while ((n = read(fd, buf, sizeof buf)) > 0)
		fwrite(buf, 1, (size_t)n, stderr);
	close(fd);
}

/* Up to CAP-1 bytes of D's log, NUL-terminated. */
static inline const char *tdaemon_read_log(const struct tdaemon *d, char *buf, size_t cap)
{
	int fd = open(d->log, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? 0 : read(fd, buf, cap - 1);

	buf[n > 0 ? n : 0] = 0;
	if (fd >= 0)
		close(fd);
	return buf;
}

static inline int tconnect_ok(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), r;
	if (strlen(path) >= sizeof a.sun_path) {
		close(fd);
		return 0;
	}
	memcpy(a.sun_path, path, strlen(path) + 1);
	r = connect(fd, (struct sockaddr *)&a, sizeof a);
	close(fd);
	return r == 0;
}

/* Starts llmd with the model and extra arguments (NULL-terminated), f32 KV
 * (the golden references used it) on the CPU backend (the same tokens and
 * pool on every machine; device tests name theirs) unless EXTRA says
 * otherwise; waits until the socket answers when WAIT_SOCKET.  PREFIX_ARGV
 * (may be NULL) runs llmd under another program (systemd-socket-activate).
 * 0 or -1 (the log is printed). */
static inline int tdaemon_start_with(struct tdaemon *d, const char *const *prefix_argv,
				     const char *model, const char *const *extra, char *const *envp,
				     int wait_socket)
{
	const char *argv[64];
	char bin[1024];
	int n = 0;

	snprintf(d->dir, sizeof d->dir, "/tmp/llmd-test.XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	chmod(d->dir, 0755); /* the unprivileged-client test connects as nobody */
	snprintf(d->sock, sizeof d->sock, "%s/llmd.sock", d->dir);
	snprintf(d->log, sizeof d->log, "%s/llmd.log", d->dir);
	snprintf(bin, sizeof bin, "%s/llmd", tbuilddir());
	for (; prefix_argv && *prefix_argv; prefix_argv++)
		argv[n++] = *prefix_argv;
	argv[n++] = bin;
	argv[n++] = "--foreground";
	argv[n++] = "--socket";
	argv[n++] = d->sock;
	argv[n++] = "--model";
	argv[n++] = model;
	argv[n++] = "--kv-type";
	argv[n++] = "f32";
	argv[n++] = "--threads";
	argv[n++] = "2";
	argv[n++] = "--set";
	argv[n++] = "device.backend=cpu";
	for (; extra && *extra && n < 62; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	d->pid = fork();
	if (d->pid < 0)
		return -1;
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execve(argv[0], (char *const *)argv, envp ? envp : environ);
		if (prefix_argv)
			execvpe(argv[0], (char *const *)argv, envp ? envp : environ);
		_exit(127);
	}
	if (!wait_socket)
		return 0;
	for (double t0 = clock_s(); clock_s() - t0 < 60;) {
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			fprintf(stderr, "llmd exited early (status %d)\n", st);
			tdaemon_print_log(d);
			d->pid = 0;
			return -1;
		}
		if (tconnect_ok(d->sock))
			return 0;
		tsleep_ms(20);
	}
	fprintf(stderr, "llmd did not listen within 60 s\n");
	tdaemon_print_log(d);
	return -1;
}

static inline int tdaemon_start(struct tdaemon *d, const char *model, const char *const *extra)
{
	return tdaemon_start_with(d, NULL, model, extra, NULL, 1);
}

/* SIGTERM, then waits (up to 30 s) for it to exit.  Returns its exit
 * status (0 expected), or -1 when it had to be killed or died of a signal. */
static inline int tdaemon_stop(struct tdaemon *d)
{
	char path[256];
	int st = 0, r = -1;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		for (double t0 = clock_s(); clock_s() - t0 < 30; tsleep_ms(10))
			if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
				r = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
				break;
			}
		if (r == -1 && !WIFSIGNALED(st)) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
		}
		if (r != 0)
			tdaemon_print_log(d);
	}
	d->pid = 0;
	unlink(d->log);
	unlink(d->sock);
	snprintf(path, sizeof path, "%s/notify", d->dir);
	unlink(path);
	rmdir(d->dir);
	return r;
}

/* Runs ARGV (argv[0] a path) with INPUT on stdin (NULL: /dev/null),
 * captures up to CAP-1 bytes of stdout into OUT (NUL-terminated).  Returns
 * the exit status, or -1. */
static inline int trun(const char *const *argv, const char *input, char *out, size_t cap)
{
	int in[2], outp[2], st;
	size_t got = 0;
	pid_t pid;

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(outp[1], 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(outp[1]);
	if (input)
		(void)!write(in[1], input, strlen(input));
	close(in[1]);
	for (;;) {
		ssize_t n = read(outp[0], out + got, cap - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
		if (got == cap - 1)
			break;
	}
	out[got] = 0;
	close(outp[0]);
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
