/* test_systemd.c - llmd as systemd runs it:
 *  - with NOTIFY_SOCKET set, it sends STATUS= while loading, READY=1 once
 *    the model is loaded and the socket listens, RELOADING=1 then READY=1 on
 *    SIGHUP, STOPPING=1 on SIGTERM, in that order, and WATCHDOG=1 beats
 *    while serving when WATCHDOG_USEC asks for them;
 *  - under systemd-socket-activate it serves on the socket it is passed
 *    (sd_listen_fds) instead of binding one, and the HTTP API on a second
 *    one named "http" (FileDescriptorName=http, as llmd-http.socket has);
 *  - the unit files pass `systemd-analyze verify` where it is available.
 */
#include "daemonutil.h"
#include "llm.h"

static int notify_socket(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (strlen(path) >= sizeof a.sun_path)
		return -1;
	memcpy(a.sun_path, path, strlen(path) + 1);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0)
		return -1;
	return fd;
}

/* Appends every datagram that arrives within MS to LOG. */
static void drain_notify(int fd, char *log, size_t cap, int ms)
{
	for (double t0 = clock_s(); (clock_s() - t0) * 1000 < ms;) {
		struct pollfd p = { fd, POLLIN, 0 };
		char buf[1024];
		ssize_t n;
		if (poll(&p, 1, 50) <= 0)
			continue;
		n = recv(fd, buf, sizeof buf - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = 0;
		for (char *s = buf; *s; s++)
			if (*s == '\n')
				*s = '|';
		snprintf(log + strlen(log), cap - strlen(log), "%s;", buf);
	}
}

static int generate_ok(const char *sock)
{
	struct llm *h = NULL;
	struct llm_request r;
	struct llm_event ev;
	uint64_t id;
	int tokens = 0, done = 0;

	if (llm_connect(sock, 0, &h, NULL, 0) < 0)
		return 0;
	llm_request_init(&r);
	r.prompt = "Once upon a time";
	r.max_tokens = 8;
	r.temperature = 0;
	if (llm_submit(h, &r, &id) == 0)
		while (!done && llm_next_event(h, &ev, 10000) == 1) {
			tokens += ev.kind == LLM_EV_TOKEN;
			done = ev.kind == LLM_EV_DONE && ev.finish != LLM_FINISH_ERROR;
		}
	llm_close(h);
	return done && tokens > 0;
}

static void test_notify(const char *model)
{
	struct tdaemon d;
	char npath[128], env_notify[160], log[8192] = "";
	char *envp[] = { env_notify, "WATCHDOG_USEC=400000", "PATH=/usr/bin:/bin", NULL };
	int nfd;

	char dir[64];
	snprintf(dir, sizeof dir, "/tmp/llmd-notify.XXXXXX");
	if (!mkdtemp(dir)) {
		test_failures++;
		return;
	}
	snprintf(npath, sizeof npath, "%s/notify", dir);
	snprintf(env_notify, sizeof env_notify, "NOTIFY_SOCKET=%s", npath);
	nfd = notify_socket(npath);
	CHECK(nfd >= 0);
	if (tdaemon_start_with(&d, NULL, model, NULL, envp, 1) < 0) {
		test_failures++;
		return;
	}
	drain_notify(nfd, log, sizeof log, 300);
	CHECK(generate_ok(d.sock));
	kill(d.pid, SIGHUP);
	drain_notify(nfd, log, sizeof log, 500);
	CHECK(generate_ok(d.sock));
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	drain_notify(nfd, log, sizeof log, 200);
	printf("notify: %s\n", log);
	{
		const char *st = strstr(log, "STATUS=loading"), *ready = strstr(log, "READY=1");
		const char *reload = strstr(log, "RELOADING=1");
		const char *ready2 = reload ? strstr(reload, "READY=1") : NULL;
		const char *stop = strstr(log, "STOPPING=1");
		CHECK(st && ready && st < ready);
		CHECK(reload && ready < reload && ready2);
		CHECK(stop && ready2 && ready2 < stop);
		/* WATCHDOG_USEC=400000: a beat at least every 200 ms while serving */
		const char *wd = strstr(log, "WATCHDOG=1");
		CHECK(wd && ready < wd && wd < stop);
	}
	close(nfd);
	unlink(npath);
	rmdir(dir);
}

static int have(const char *prog)
{
	char path[256];
	const char *dirs[] = { "/usr/bin", "/bin", "/usr/sbin", "/sbin", NULL };
	for (int i = 0; dirs[i]; i++) {
		snprintf(path, sizeof path, "%s/%s", dirs[i], prog);
		if (access(path, X_OK) == 0)
			return 1;
	}
	return 0;
}

/* GET /health on the HTTP socket PATH: whether it answers 200. */
static int http_health_ok(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	const char *req = "GET /health HTTP/1.0\r\nHost: llmd\r\n\r\n";
	char buf[512];
	ssize_t n, got = 0;
	int fd;

	if (strlen(path) >= sizeof a.sun_path)
		return 0;
	memcpy(a.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
	    write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	while (got < (ssize_t)sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - (size_t)got)) > 0)
		got += n;
	close(fd);
	buf[got] = 0;
	return !strncmp(buf, "HTTP/1.0 200", 12) || !strncmp(buf, "HTTP/1.1 200", 12);
}

/* llmd under systemd-socket-activate: it serves on the socket it is
 * passed, and with WITH_HTTP on a second one named "http" (as
 * llmd-http.socket passes it) the HTTP API, binding neither of its own. */
static void test_socket_activation(const char *model, int with_http)
{
	struct tdaemon d;
	char listen1[160], listen2[160], sock[128], hsock[128];
	const char *prefix[] = { "systemd-socket-activate", listen1, with_http ? listen2 : NULL,
				 "--fdname=llmd:http", NULL };
	const char *what = with_http ? "socket activation with http" : "socket activation";

	if (!have("systemd-socket-activate")) {
		printf("%s: systemd-socket-activate is absent, skipped\n", what);
		return;
	}
	/* The socket paths must be known before the daemon starts: use the
	 * temp dir tdaemon_start_with makes (it makes it before forking). */
	memset(&d, 0, sizeof d);
	snprintf(d.dir, sizeof d.dir, "/tmp/llmd-act.XXXXXX");
	if (!mkdtemp(d.dir)) {
		test_failures++;
		return;
	}
	snprintf(sock, sizeof sock, "%s/act.sock", d.dir);
	snprintf(hsock, sizeof hsock, "%s/act-http.sock", d.dir);
	snprintf(listen1, sizeof listen1, "--listen=%s", sock);
	snprintf(listen2, sizeof listen2, "--listen=%s", hsock);
	rmdir(d.dir);
	/* llmd also gets --socket (its own dir's path): with a passed socket it
	 * must bind neither that one nor the HTTP one beside it. */
	if (tdaemon_start_with(&d, prefix, model, NULL, NULL, 0) < 0) {
		test_failures++;
		return;
	}
	/* systemd-socket-activate listens first and starts llmd on the first
	 * connection; the connection waits in the backlog meanwhile. */
	for (double t0 = clock_s(); clock_s() - t0 < 20 && !tconnect_ok(sock); tsleep_ms(20))
		;
	CHECK(generate_ok(sock));
	if (with_http)
		CHECK(http_health_ok(hsock));
	char own_http[160];
	snprintf(own_http, sizeof own_http, "%.*s-http.sock", (int)strlen(d.sock) - 5, d.sock);
	CHECK(access(d.sock, F_OK) != 0);
	CHECK(access(own_http, F_OK) != 0);
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	unlink(sock);
	unlink(hsock);
	printf("%s: llmd served on the socket%s systemd-socket-activate passed\n", what,
	       with_http ? "s (native and http)" : "");
}

static void test_units(void)
{
	char cmd[4096], out[8192];
	const char *b = tbuilddir();

	if (!have("systemd-analyze")) {
		printf("units: systemd-analyze is absent, skipped\n");
		return;
	}
	/* Verify copies whose ExecStart points at the built binary. */
	snprintf(cmd, sizeof cmd,
		 "set -e; d=$(mktemp -d); cp '%s/etc/llmd.socket' '%s/etc/llmd-http.socket' \"$d/\"; "
		 "sed 's|^ExecStart=[^ ]*|ExecStart=%s/llmd|' '%s/etc/llmd.service' > \"$d/llmd.service\"; "
		 "cd \"$d\"; systemd-analyze verify --man=no ./llmd.socket ./llmd-http.socket ./llmd.service 2>&1 | "
		 "grep -v -e 'Failed to create /init.scope' -e 'not supported in this environment' "
		 "-e 'Failed to setup working directory' -e 'DBus' -e 'bus' || true; rm -rf \"$d\"",
		 b, b, b, b);
	const char *argv[] = { "/bin/sh", "-c", cmd, NULL };
	CHECK_INT_EQ(trun(argv, NULL, out, sizeof out), 0);
	if (out[0])
		fprintf(stderr, "systemd-analyze verify:\n%s", out);
	CHECK(out[0] == 0);
	printf("units: systemd-analyze verify passes for llmd.socket, llmd-http.socket and llmd.service\n");
}

int main(void)
{
	const char *dir = getenv("LLMD_MODELS_DIR") ? getenv("LLMD_MODELS_DIR") : "../shared/models";
	char model[4096];

	snprintf(model, sizeof model, "%s/stories260K.gguf", dir);
	signal(SIGPIPE, SIG_IGN);
	test_units();
	if (access(model, R_OK) != 0) {
		printf("SKIP: %s is absent\n", model);
		return test_failures ? 1 : TEST_SKIP;
	}
	test_notify(model);
	test_socket_activation(model, 0);
	test_socket_activation(model, 1);
	return test_result();
}
