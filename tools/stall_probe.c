/* stall_probe.c - measures what a long prompt costs the other clients of a
 * running llmd: a stream's gaps between tokens and the time `status` takes
 * while another connection's prompt of N words is prefilled, and how soon
 * the engine lets go of a client that vanished.  A measuring tool (like
 * llm-bench), not a test: it asserts nothing and prints JSON.
 *
 *   stall_probe --socket PATH [--words N] [--vanish]
 */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "llm.h"

#define MAX_TOKENS 4000 /* tokens of the stream we time (under limits.max_tokens) */

static struct llm *connect_or_die(const char *sock)
{
	struct llm *h = NULL;
	char err[256];
	if (llm_connect(sock, 0, &h, err, sizeof err) < 0) {
		fprintf(stderr, "stall_probe: %s\n", err);
		exit(1);
	}
	return h;
}

/* A prompt of N words, the same every run. */
static char *words_prompt(int n)
{
	static const char *const w[] = { "river", "stone", "garden", "light", "quiet", "market",
					 "window", "silver", "morning", "paper", "engine", "cloud",
					 "forest", "bridge", "yellow", "table", "winter", "music",
					 "number", "ocean", "letter", "candle", "mountain", "road" };
	size_t cap = (size_t)n * 10 + 1, len = 0;
	uint32_t seed = 7;
	char *p = malloc(cap);

	if (!p)
		exit(1);
	p[0] = 0;
	for (int i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		len += (size_t)snprintf(p + len, cap - len, "%s%s", i ? " " : "",
					w[(seed >> 16) % (sizeof w / sizeof w[0])]);
	}
	return p;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The value at fraction Q of the N sorted values V. */
static double quantile(const double *v, int n, double q)
{
	return n ? v[(int)floor(q * (n - 1))] : 0;
}

/* ---- a stream, read on its own thread ---- */

struct stream {
	struct llm *h;
	double t[MAX_TOKENS];        /* when each token came */
	int n;                       /* tokens so far; written by the reader, read by main */
	int stop;                    /* main asks the reader to leave */
};

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	struct llm_event ev;

	while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		int r = llm_next_event(s->h, &ev, 50);
		if (r < 0 || (r == 1 && ev.kind == LLM_EV_DONE))
			break;
		if (r == 1 && ev.token >= 0 && s->n < MAX_TOKENS) {
			s->t[s->n] = clock_s();
			__atomic_store_n(&s->n, s->n + 1, __ATOMIC_RELEASE);
		}
	}
	return NULL;
}

static double status_s(struct llm *h, json_object **ret)
{
	char *body = NULL;
	double t0 = clock_s();
	if (llm_admin(h, "status", NULL, &body) < 0)
		return -1;
	t0 = clock_s() - t0;
	if (ret)
		*ret = json_tokener_parse(body);
	free(body);
	return t0;
}

/* ---- head-of-line: a stream while a long prompt is prefilled ---- */

static void probe_stall(const char *sock, int words, json_object *out)
{
	struct stream *a = calloc(1, sizeof *a);
	struct llm *b = connect_or_die(sock), *adm = connect_or_die(sock);
	static double gaps[MAX_TOKENS], st[100000];
	struct llm_request r;
	struct llm_event ev;
	char *prompt = words_prompt(words);
	uint64_t ida, idb;
	uint32_t prompt_tokens = 0;
	int ng = 0, ns = 0, done = 0;
	pthread_t th;
	double t0, t1;

	a->h = connect_or_die(sock);
	llm_request_init(&r);
	r.prompt = "Once upon a time";
	r.max_tokens = MAX_TOKENS;
	r.temperature = 0;
	r.flags = LLM_IGNORE_EOS;
	if (llm_submit(a->h, &r, &ida) < 0) {
		fprintf(stderr, "stall_probe: %s\n", llm_errmsg(a->h));
		exit(1);
	}
	pthread_create(&th, NULL, stream_main, a);
	while (__atomic_load_n(&a->n, __ATOMIC_ACQUIRE) < 16)
		usleep(1000);
	llm_request_init(&r);
	r.prompt = prompt;
	r.max_tokens = 1;
	r.temperature = 0;
	t0 = clock_s();
	if (llm_submit(b, &r, &idb) < 0) {
		fprintf(stderr, "stall_probe: %s\n", llm_errmsg(b));
		exit(1);
	}
	while (!done) {
		int k = llm_next_event(b, &ev, 100);
		if (k < 0) {
			fprintf(stderr, "stall_probe: %s\n", llm_errmsg(b));
			exit(1);
		}
		if (k == 1 && ev.kind == LLM_EV_DONE) {
			done = 1;
			prompt_tokens = ev.prompt_tokens;
			if (ev.finish == LLM_FINISH_ERROR)
				fprintf(stderr, "stall_probe: the long prompt failed: %s\n", ev.message);
		}
		if (ns < 100000)
			st[ns++] = status_s(adm, NULL);
	}
	t1 = clock_s();
	__atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	for (int i = 1; i < a->n; i++)
		if (a->t[i] > t0 && a->t[i - 1] < t1)
			gaps[ng++] = a->t[i] - a->t[i - 1];
	qsort(gaps, (size_t)ng, sizeof *gaps, cmp_dbl);
	qsort(st, (size_t)ns, sizeof *st, cmp_dbl);
	json_object_object_add(out, "words", json_object_new_int(words));
	json_object_object_add(out, "prompt_tokens", json_object_new_int64(prompt_tokens));
	json_object_object_add(out, "prefill_s", json_object_new_double(t1 - t0));
	json_object_object_add(out, "stream_tokens_meanwhile", json_object_new_int(ng));
	json_object_object_add(out, "gap_worst_s", json_object_new_double(ng ? gaps[ng - 1] : 0));
	json_object_object_add(out, "gap_p99_s", json_object_new_double(quantile(gaps, ng, 0.99)));
	json_object_object_add(out, "gap_p50_s", json_object_new_double(quantile(gaps, ng, 0.5)));
	json_object_object_add(out, "status_calls", json_object_new_int(ns));
	json_object_object_add(out, "status_worst_s", json_object_new_double(ns ? st[ns - 1] : 0));
	json_object_object_add(out, "status_p99_s", json_object_new_double(quantile(st, ns, 0.99)));
	llm_close(a->h);
	llm_close(b);
	llm_close(adm);
	free(a);
	free(prompt);
}

/* ---- a client that vanishes mid-stream ---- */

/* Seconds from a client's hang-up until ps no longer shows its request and
 * no KV block is in use. */
static void probe_vanish(const char *sock, json_object *out)
{
	struct llm *v = connect_or_die(sock), *adm = connect_or_die(sock);
	struct llm_request r;
	struct llm_event ev;
	uint64_t id;
	int tokens = 0;
	double t0, t = -1;

	llm_request_init(&r);
	r.prompt = "Once upon a time";
	r.max_tokens = 4000;
	r.flags = LLM_IGNORE_EOS;
	if (llm_submit(v, &r, &id) < 0)
		exit(1);
	while (tokens < 16 && llm_next_event(v, &ev, 1000) == 1)
		tokens += ev.kind == LLM_EV_TOKEN;
	t0 = clock_s();
	llm_close(v);
	while (clock_s() - t0 < 30) {
		json_object *js = NULL, *kv = NULL, *used = NULL, *q = NULL, *run = NULL, *wait = NULL;
		int idle;
		if (status_s(adm, &js) < 0 || !js)
			break;
		idle = json_object_object_get_ex(js, "kv", &kv) &&
		       json_object_object_get_ex(kv, "used_blocks", &used) &&
		       json_object_object_get_ex(js, "queue", &q) &&
		       json_object_object_get_ex(q, "running", &run) &&
		       json_object_object_get_ex(q, "waiting", &wait) &&
		       json_object_get_int(used) == 0 && json_object_get_int(run) == 0 &&
		       json_object_get_int(wait) == 0;
		json_object_put(js);
		if (idle) {
			t = clock_s() - t0;
			break;
		}
		usleep(200);
	}
	json_object_object_add(out, "vanished_client_freed_s", json_object_new_double(t));
	llm_close(adm);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "words", required_argument, NULL, 'w' },
		{ "vanish", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *sock = getenv("LLMD_SOCKET");
	int words = 0, vanish = 0, o;
	json_object *out = json_object_new_object();

	while ((o = getopt_long(argc, argv, "S:w:vh", opts, NULL)) != -1) {
		switch (o) {
		case 'S':
			sock = optarg;
			break;
		case 'w':
			words = atoi(optarg);
			break;
		case 'v':
			vanish = 1;
			break;
		default:
			fprintf(o == 'h' ? stdout : stderr,
				"usage: stall_probe --socket PATH [--words N] [--vanish]\n"
				"  --words N   a stream's token gaps and status times while a prompt of\n"
				"              N words is prefilled on another connection\n"
				"  --vanish    how soon a client's hang-up frees its request's blocks\n");
			return o == 'h' ? 0 : 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	if (!words && !vanish)
		words = 4000;
	if (words > 0)
		probe_stall(sock, words, out);
	if (vanish)
		probe_vanish(sock, out);
	printf("%s\n", json_object_to_json_string_ext(out, JSON_C_TO_STRING_PLAIN));
	json_object_put(out);
	return 0;
}
