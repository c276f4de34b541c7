/* llmctl.c - the admin CLI of llmd: status, ps, models, cancel, stats (text,
 * JSON, Prometheus), drain, resume, reload and top.  It sends one ADMIN
 * frame per command through libllm and renders the daemon's JSON answer; it
 * holds no state of its own.
 */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <config.h>

#include "clock.h"
#include "llm.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

static int json_out;
static const char *socket_path;
static unsigned timeout_s = 5;  /* --timeout: llmd answers admin commands at once */
static volatile sig_atomic_t interrupted;
static volatile sig_atomic_t resized;   /* top: SIGWINCH came */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: llmctl [--socket PATH] [--json] COMMAND [ARGS]\n"
		"Commands:\n"
		"  status              model, backend, uptime, KV pool, prefix cache, queue, tok/s\n"
		"  ps                  live requests (yours only, unless you are an admin)\n"
		"  models              the models served: state, context, memory, requests\n"
		"                      (* marks the default one)\n"
		"  load NAME           load model NAME now (admin; requests load it anyway)\n"
		"  unload NAME         unload model NAME, once its requests end (admin)\n"
		"  cancel ID           cancel request ID (from ps)\n"
		"  stats [--prometheus] counters as text, JSON (--json) or Prometheus text\n"
		"  drain               stop taking new requests; in-flight ones finish (admin)\n"
		"  resume              take new requests again (admin)\n"
		"  reload              re-read llmd.conf and apply its limits (admin)\n"
		"  top [-i SECONDS] [-n COUNT]  status and ps, refreshed\n"
		"Options:\n"
		"  -S, --socket PATH   daemon socket (default $LLMD_SOCKET, then " LLM_DEFAULT_SOCKET ")\n"
		"  -j, --json          print the daemon's JSON answer\n"
		"  -T, --timeout SECONDS  give up on a daemon that does not answer (default 5)\n"
		"  -h, --help, --version\n"
		"Exit status: 0 ok, 1 the daemon refused or failed the command, 2 usage,\n"
		"3 cannot reach the daemon.\n");
}

static void on_alarm(int sig);

/* ---- talking to the daemon ---- */

static struct llm *h;

static int connect_daemon(void)
{
	char err[256];
	const char *path = socket_path;
	int r;

	signal(SIGALRM, on_alarm);
	alarm(timeout_s); /* a daemon that accepts but never answers HELLO */
	r = llm_connect(path, 4096, &h, err, sizeof err);
	alarm(0);
	if (r < 0) {
		/* libllm's message names the socket already */
		fprintf(stderr, "llmctl: %s%s\n", err,
			r == -ENOENT || r == -ECONNREFUSED ? " (is llmd running?)" : "");
		return EXIT_CONNECT;
	}
	return 0;
}

/* Runs CMD; on success *RET is the parsed answer. */
static int admin(const char *cmd, const char *arg, json_object **ret)
{
	char *body = NULL;
	int r;

	signal(SIGALRM, on_alarm);
	alarm(timeout_s);
	r = llm_admin(h, cmd, arg, &body);
	alarm(0);

	if (r < 0) {
		fprintf(stderr, "llmctl: %s: %s\n", cmd, llm_errmsg(h));
		return r == -EPIPE || r == -ECONNRESET ? EXIT_CONNECT : EXIT_FAILED;
	}
	*ret = json_tokener_parse(body);
	if (!*ret) {
		fprintf(stderr, "llmctl: %s: the daemon's answer is not JSON\n", cmd);
		free(body);
		return EXIT_FAILED;
	}
	if (json_out)
		printf("%s\n", body);
	free(body);
	return 0;
}

static json_object *get(json_object *o, const char *path)
{
	char key[64];
	while (o && *path) {
		size_t n = strcspn(path, ".");
		snprintf(key, sizeof key, "%.*s", (int)n, path);
		if (!json_object_object_get_ex(o, key, &o))
			return NULL;
		path += n + (path[n] == '.');
	}
	return o;
}

static int64_t geti(json_object *o, const char *path)
{
	return json_object_get_int64(get(o, path));
}

static double getd(json_object *o, const char *path)
{
	return json_object_get_double(get(o, path));
}

static const char *gets_(json_object *o, const char *path)
{
	const char *s = json_object_get_string(get(o, path));
	return s ? s : "";
}

static void fmt_age(double s, char *out, size_t len)
{
	if (s < 60)
		snprintf(out, len, "%.1fs", s);
	else if (s < 3600)
		snprintf(out, len, "%dm%02ds", (int)s / 60, (int)s % 60);
	else if (s < 86400)
		snprintf(out, len, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
	else
		snprintf(out, len, "%dd%02dh", (int)s / 86400, (int)s % 86400 / 3600);
}

/* ---- rendering ---- */

static void print_status(FILE *out, json_object *j)
{
	char up[32];
	fmt_age(getd(j, "uptime_s"), up, sizeof up);
	fprintf(out, "model        %s (%s, %s)\n", gets_(j, "model"), *gets_(j, "architecture") ?
		gets_(j, "architecture") : "?", gets_(j, "model_path"));
	fprintf(out, "backend      %s, %lld threads, context %lld tokens, chat template %s%s%s%s\n",
	       gets_(j, "backend"), (long long)geti(j, "threads"), (long long)geti(j, "n_ctx"),
	       *gets_(j, "chat_template") ? gets_(j, "chat_template") : "none",
	       *gets_(j, "chat_family") ? " (" : "", gets_(j, "chat_family"), *gets_(j, "chat_family") ? ")" : "");
	if (*gets_(j, "chat_note"))
		fprintf(out, "chat         %s\n", gets_(j, "chat_note"));
	if (geti(j, "device.memory_total_bytes") > 0)
		fprintf(out, "device       %s (#%lld), %.1f of %.1f GiB free, graphs: %lld decode steps "
		       "recorded, %lld replayed\n", gets_(j, "device.name"),
		       (long long)geti(j, "device.index"), geti(j, "device.memory_free_bytes") / 1073741824.0,
		       geti(j, "device.memory_total_bytes") / 1073741824.0,
		       (long long)geti(j, "device.graphs_recorded"),
		       (long long)geti(j, "device.graphs_replayed"));
	else
		fprintf(out, "device       %s\n", gets_(j, "device.name"));
	fprintf(out, "state        %s, up %s, llmd %s, pid %lld\n", gets_(j, "state"), up,
	       gets_(j, "version"), (long long)geti(j, "pid"));
	fprintf(out, "kv pool      %.1f%% used: %lld of %lld blocks (%lld tokens each), %lld cached, %s, "
	       "%lld tokens in all\n",
	       getd(j, "kv.used_pct"), (long long)geti(j, "kv.used_blocks"),
	       (long long)geti(j, "kv.blocks"), (long long)geti(j, "kv.block_tokens"),
	       (long long)geti(j, "kv.cached_blocks"), gets_(j, "kv.type"),
	       (long long)geti(j, "kv.capacity_tokens"));
	fprintf(out, "prefix cache %s, hit rate %.1f%% (%lld prompt tokens from cache)\n",
	       json_object_get_boolean(get(j, "prefix_cache.enabled")) ? "on" : "off",
	       100.0 * getd(j, "prefix_cache.hit_rate"), (long long)geti(j, "prefix_cache.hit_tokens"));
	fprintf(out, "queue        %lld waiting, %lld running\n", (long long)geti(j, "queue.waiting"),
	       (long long)geti(j, "queue.running"));
	if (geti(j, "step.budget_ms") > 0)
		fprintf(out, "steps        last %.1f ms (predicted %.1f), budget %lld ms while streams decode: "
		       "%lld prefills cut, %lld steps over\n", getd(j, "step.last_ms"),
		       getd(j, "step.last_predicted_ms"), (long long)geti(j, "step.budget_ms"),
		       (long long)geti(j, "step.budget_cuts"), (long long)geti(j, "step.budget_overruns"));
	else
		fprintf(out, "steps        last %.1f ms, no time budget\n", getd(j, "step.last_ms"));
	fprintf(out, "throughput   %.1f tok/s (last 10 s), %lld tokens generated, %lld requests\n",
	       getd(j, "tok_s"), (long long)geti(j, "generated_tokens"),
	       (long long)geti(j, "requests_total"));
	fprintf(out, "clients      %lld connections, %lld requests live\n", (long long)geti(j, "connections"),
	       (long long)geti(j, "requests_live"));
}

static void print_ps(FILE *out, json_object *j)
{
	json_object *arr = get(j, "requests");
	size_t n = arr ? json_object_array_length(arr) : 0;

	fprintf(out, "%8s %7s %6s %-15s %-9s %4s %4s %6s %6s %8s\n", "ID", "PID", "UID", "COMMAND", "STATE",
	       "QPOS", "PRIO", "PROMPT", "GEN", "AGE");
	for (size_t i = 0; i < n; i++) {
		json_object *r = json_object_array_get_idx(arr, i);
		char age[32], st[16], qpos[16];
		fmt_age(getd(r, "age_s"), age, sizeof age);
		snprintf(st, sizeof st, "%s%s", gets_(r, "state"),
			 json_object_get_boolean(get(r, "ring_full")) ? "*" : "");
		if (geti(r, "queue_pos"))
			snprintf(qpos, sizeof qpos, "%lld", (long long)geti(r, "queue_pos"));
		else
			snprintf(qpos, sizeof qpos, "-");
		fprintf(out, "%8lld %7lld %6lld %-15.15s %-9s %4s %4lld %6lld %6lld %8s\n",
		       (long long)geti(r, "id"), (long long)geti(r, "pid"), (long long)geti(r, "uid"),
		       gets_(r, "command"), st, qpos, (long long)geti(r, "priority"),
		       (long long)geti(r, "prompt_tokens"), (long long)geti(r, "generated_tokens"), age);
	}
	if (n == 0)
		fprintf(out, "(no requests)\n");
}

/* NAME, STATE, ARCH, CTX, WEIGHTS and KV (MiB), LIVE, TOTAL, PATH; "-" for
 * a field the daemon left out, then the error of each model that failed. */
static void print_models(FILE *out, json_object *j)
{
	json_object *arr = get(j, "models");
	const char *def = gets_(j, "default");
	size_t n = arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
	int wname = 4, warch = 4;
	char num[5][32];                /* CTX, LIVE, TOTAL, WEIGHTS, KV */

	for (size_t i = 0; i < n; i++) {
		json_object *m = json_object_array_get_idx(arr, i);
		int a = (int)strlen(gets_(m, "name")) + 1, b = (int)strlen(gets_(m, "arch"));
		wname = a > wname ? a : wname;
		warch = b > warch ? b : warch;
	}
	fprintf(out, "%-*s %-9s %-*s %6s %8s %8s %5s %7s %7s %s\n", wname, "NAME", "STATE", warch, "ARCH",
		"CTX", "WEIGHTS", "KV", "LIVE", "TOTAL", "IDLE", "PATH");
	for (size_t i = 0; i < n; i++) {
		json_object *m = json_object_array_get_idx(arr, i);
		static const char *const ints[] = { "n_ctx", "live", "requests_total" };
		static const char *const mibs[] = { "weights_mib", "kv_mib" };
		const char *name = gets_(m, "name"), *state = gets_(m, "state"), *arch = gets_(m, "arch");
		const char *path = gets_(m, "path");
		char shown[300], idle[32] = "-";

		snprintf(shown, sizeof shown, "%s%s", *name ? name : "-", *def && !strcmp(name, def) ? "*" : "");
		for (int k = 0; k < 3; k++)
			if (get(m, ints[k]))
				snprintf(num[k], sizeof num[k], "%lld", (long long)geti(m, ints[k]));
			else
				snprintf(num[k], sizeof num[k], "-");
		for (int k = 0; k < 2; k++)
			if (get(m, mibs[k]))
				snprintf(num[3 + k], sizeof num[3 + k], "%.1f", getd(m, mibs[k]));
			else
				snprintf(num[3 + k], sizeof num[3 + k], "-");
		/* how long a loaded model has been idle (its keep-alive counts from then) */
		if (!strcmp(state, "ready") && get(m, "idle_s") && geti(m, "live") == 0)
			snprintf(idle, sizeof idle, "%.0fs", getd(m, "idle_s"));
		fprintf(out, "%-*s %-9s %-*s %6s %8s %8s %5s %7s %7s %s\n", wname, shown, *state ? state : "-",
			warch, *arch ? arch : "-", num[0], num[3], num[4], num[1], num[2], idle,
			*path ? path : "-");
	}
	if (n == 0)
		fprintf(out, "(no models)\n");
	if (get(j, "budget_mib"))
		fprintf(out, "memory: %.1f of %.1f MiB in use (memory.budget_mb)\n", getd(j, "in_use_mib"),
			getd(j, "budget_mib"));
	for (size_t i = 0; i < n; i++) {
		json_object *m = json_object_array_get_idx(arr, i);

		if (*gets_(m, "error"))
			fprintf(out, "%s: %s: %s\n", *gets_(m, "name") ? gets_(m, "name") : "-",
				*gets_(m, "state") ? gets_(m, "state") : "error", gets_(m, "error"));
	}
}

static void show_models(json_object *j)
{
	print_models(stdout, j);
}

static void show_status(json_object *j)
{
	print_status(stdout, j);
}

static void show_ps(json_object *j)
{
	print_ps(stdout, j);
}

/* The counters as text; the histograms as their count and mean.  (The
 * Prometheus text is the daemon's: stats prometheus.) */
static void print_stats(json_object *j)
{
	json_object_object_foreach(j, key, val)
	{
		if (!strcmp(key, "histograms")) {
			json_object_object_foreach(val, name, hv)
			{
				json_object *n, *sum;
				int64_t cnt = json_object_object_get_ex(hv, "count", &n) ? json_object_get_int64(n) : 0;
				double s = json_object_object_get_ex(hv, "sum", &sum) ? json_object_get_double(sum) : 0;
				printf("%-36s %lld, mean %.4f s\n", name, (long long)cnt, cnt ? s / (double)cnt : 0);
			}
			continue;
		}
		if (!strcmp(key, "per_model")) { /* {metric: {model: value}} */
			json_object_object_foreach(val, metric, by)
			{
				json_object_object_foreach(by, name, v2)
				{
					char label[160];
					snprintf(label, sizeof label, "%s{%s}", metric, name);
					printf("%-36s %lld\n", label, (long long)json_object_get_int64(v2));
				}
			}
			continue;
		}
		if (json_object_get_type(val) == json_type_object) { /* errors_by_code */
			json_object_object_foreach(val, k2, v2)
			printf("%-36s %lld\n", k2, (long long)json_object_get_int64(v2));
			continue;
		}
		if (json_object_get_type(val) == json_type_double)
			printf("%-36s %.3f\n", key, json_object_get_double(val));
		else
			printf("%-36s %lld\n", key, (long long)json_object_get_int64(val));
	}
}

/* ---- commands ---- */

static int simple(const char *cmd, const char *arg, void (*render)(json_object *))
{
	json_object *j;
	int r = admin(cmd, arg, &j);
	if (r)
		return r;
	if (!json_out)
		render(j);
	json_object_put(j);
	return 0;
}

static void render_cancel(json_object *j)
{
	printf("cancelled request %lld\n", (long long)geti(j, "cancelled"));
}

static void render_model_state(json_object *j)
{
	printf("model %s: %s", gets_(j, "name"), gets_(j, "state"));
	if (get(j, "note"))
		printf(" (%s)", gets_(j, "note"));
	printf("\n");
}

static void render_state(json_object *j)
{
	printf("llmd is %s", gets_(j, "state"));
	if (get(j, "requests_live"))
		printf(" (%lld requests still in flight)", (long long)geti(j, "requests_live"));
	printf("\n");
}

static void render_reload(json_object *j)
{
	printf("reloaded %s: %s\n", gets_(j, "reloaded"), gets_(j, "note"));
}

/* An answer that never comes (a wedged daemon) must not hang a script. */
static void on_alarm(int sig)
{
	static const char msg[] = "llmctl: no answer from llmd within --timeout seconds "
				  "(is it wedged? try journalctl -u llmd)\n";
	(void)sig;
	(void)!write(STDERR_FILENO, msg, sizeof msg - 1);
	_exit(EXIT_CONNECT);
}

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void on_sigwinch(int sig)
{
	(void)sig;
	resized = 1;
}

/* The terminal's width in columns, or 0 when stdout is not a terminal. */
static int tty_columns(void)
{
	struct winsize ws;
	if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) < 0)
		return 0;
	return ws.ws_col;
}

/* Writes TEXT's lines to stdout, each cut to COLS columns (a character a
 * column) and ended with an ellipsis where it was longer; COLS 0: whole. */
static void put_fitted(const char *text, int cols)
{
	while (*text) {
		const char *nl = strchr(text, '\n'), *end = nl ? nl : text + strlen(text), *p = text;
		int w = 0;

		for (; p < end && (!cols || w < cols); p++)
			w += ((unsigned char)*p & 0xc0) != 0x80;
		while (p < end && ((unsigned char)*p & 0xc0) == 0x80)
			p++; /* the rest of the last character */
		if (p < end) {
			/* too wide: COLS - 1 characters and the ellipsis */
			for (w = 0, p = text; w < cols - 1; p++)
				w += ((unsigned char)*p & 0xc0) != 0x80;
			while (((unsigned char)*p & 0xc0) == 0x80)
				p++;
			fwrite(text, 1, (size_t)(p - text), stdout);
			fputs("\u2026", stdout);
		} else {
			fwrite(text, 1, (size_t)(end - text), stdout);
		}
		if (nl)
			fputc('\n', stdout);
		text = nl ? nl + 1 : end;
	}
}

static int cmd_top(int argc, char **argv)
{
	sigset_t block, unblocked;
	struct sigaction sa;
	double interval = 1.0;
	long count = -1;
	int opt, cols;

	optind = 1;
	while ((opt = getopt(argc, argv, "i:n:j")) != -1) {
		if (opt == 'i')
			interval = atof(optarg);
		else if (opt == 'n')
			count = atol(optarg);
		else if (opt == 'j')
			json_out = 1;
		else
			return EXIT_USAGE;
	}
	if (optind < argc) {
		fprintf(stderr, "llmctl: top: unexpected argument '%s'\n", argv[optind]);
		return EXIT_USAGE;
	}
	if (interval < 0.1)
		interval = 0.1;
	signal(SIGINT, on_sigint);
	/* A resized terminal ends the wait and redraws. */
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_sigwinch;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGWINCH, &sa, NULL);
	sigemptyset(&block);
	sigaddset(&block, SIGWINCH);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &unblocked);
	cols = tty_columns();
	for (long i = 0; (count < 0 || i < count) && !interrupted; i++) {
		json_object *st, *ps;
		int r = admin("status", NULL, &st);
		if (r)
			return r;
		if ((r = admin("ps", NULL, &ps))) {
			json_object_put(st);
			return r;
		}
		if (!json_out) {
			char *frame = NULL;
			size_t len = 0;
			FILE *f = open_memstream(&frame, &len);
			if (!f) {
				fprintf(stderr, "llmctl: top: out of memory\n");
				json_object_put(st);
				json_object_put(ps);
				return EXIT_FAILED;
			}
			print_status(f, st);
			fprintf(f, "\n");
			print_ps(f, ps);
			fclose(f);
			if (cols)
				printf("\033[H\033[2J");
			put_fitted(frame, cols);
			fflush(stdout);
			free(frame);
		}
		json_object_put(st);
		json_object_put(ps);
		if (count < 0 || i + 1 < count) {
			/* SIGWINCH and SIGINT are blocked but here, where ppoll lets
			 * them in atomically: one that came while the frame was
			 * drawn ends the wait at once instead of being missed. */
			double end = clock_s() + interval;
			while (!resized && !interrupted && clock_s() < end) {
				double left = end - clock_s();
				struct timespec ts = { (time_t)left, (long)((left - (time_t)left) * 1e9) };
				ppoll(NULL, 0, &ts, &unblocked);
			}
		}
		if (resized) {
			resized = 0;
			cols = tty_columns();
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 1 },
		{ NULL, 0, NULL, 0 },
	};
	const char *cmd;
	int opt, r;

	/* Options before the command; the command's own after it. */
	while ((opt = getopt_long(argc, argv, "+S:jT:h", lopts, NULL)) != -1) {
		switch (opt) {
		case 'S':
			socket_path = optarg;
			break;
		case 'T': {
			char *end;
			long t = strtol(optarg, &end, 10);
			if (*end || end == optarg || t < 1 || t > 3600) {
				fprintf(stderr, "llmctl: --timeout takes 1 to 3600 seconds, not '%s'\n",
					optarg);
				return EXIT_USAGE;
			}
			timeout_s = (unsigned)t;
			break;
		}
		case 'j':
			json_out = 1;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case 1:
			printf("llmctl %s\n", PACKAGE_VERSION);
			return EXIT_OK;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[optind];
	argc -= optind;
	argv += optind;
	/* --json may also follow the command (llmctl stats --json). */
	int prometheus = 0;
	const char *arg = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(cmd, "top")) {
			if (!strcmp(argv[i], "--json"))
				argv[i] = "-j";
			continue; /* top parses its own options */
		}
		if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "-j"))
			json_out = 1;
		else if (!strcmp(argv[i], "--prometheus") && !strcmp(cmd, "stats"))
			prometheus = 1;
		else if (!strcmp(cmd, "cancel") && !arg &&
			 (argv[i][0] != '-' || (argv[i][1] >= '0' && argv[i][1] <= '9')))
			arg = argv[i]; /* "-1" too: refused below as no request id */
		else if ((!strcmp(cmd, "load") || !strcmp(cmd, "unload")) && !arg && argv[i][0] != '-')
			arg = argv[i];
		else {
			fprintf(stderr, "llmctl: %s: unexpected argument '%s'\n", cmd, argv[i]);
			return EXIT_USAGE;
		}
	}
	if (prometheus)
		json_out = 0;
	if (!strcmp(cmd, "cancel") && !arg) {
		fprintf(stderr, "llmctl: cancel needs a request id (see llmctl ps)\n");
		return EXIT_USAGE;
	}
	if (!strcmp(cmd, "cancel") && (!*arg || arg[strspn(arg, "0123456789")])) {
		fprintf(stderr, "llmctl: cancel needs a request id, a number from llmctl ps, not '%s'\n",
			arg);
		return EXIT_USAGE;
	}
	if ((!strcmp(cmd, "load") || !strcmp(cmd, "unload")) && !arg) {
		fprintf(stderr, "llmctl: %s needs a model's name (see llmctl models)\n", cmd);
		return EXIT_USAGE;
	}
	static const char *const known[] = { "status", "ps", "models", "load", "unload", "cancel",
					     "stats", "drain", "resume", "reload", "top", NULL };
	int ok = 0;
	for (int i = 0; known[i]; i++)
		ok |= !strcmp(known[i], cmd);
	if (!ok) {
		fprintf(stderr, "llmctl: unknown command '%s' (try llmctl --help)\n", cmd);
		return EXIT_USAGE;
	}
	if ((r = connect_daemon()))
		return r;

	if (!strcmp(cmd, "status"))
		r = simple("status", NULL, show_status);
	else if (!strcmp(cmd, "ps"))
		r = simple("ps", NULL, show_ps);
	else if (!strcmp(cmd, "models"))
		r = simple("models", NULL, show_models);
	else if (!strcmp(cmd, "cancel"))
		r = simple("cancel", arg, render_cancel);
	else if (!strcmp(cmd, "load") || !strcmp(cmd, "unload"))
		r = simple(cmd, arg, render_model_state);
	else if (!strcmp(cmd, "drain") || !strcmp(cmd, "resume"))
		r = simple(cmd, NULL, render_state);
	else if (!strcmp(cmd, "reload"))
		r = simple("reload", NULL, render_reload);
	else if (!strcmp(cmd, "top"))
		r = cmd_top(argc, argv);
	else { /* stats */
		json_object *j, *text;
		if (!(r = admin("stats", prometheus ? "prometheus" : NULL, &j))) {
			if (prometheus && json_object_object_get_ex(j, "prometheus", &text))
				fputs(json_object_get_string(text), stdout);
			else if (!json_out)
				print_stats(j);
			json_object_put(j);
		}
	}
	llm_close(h);
	return r;
}
