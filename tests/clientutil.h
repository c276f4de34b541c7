/* clientutil.h - what the integration tests use to talk to a running llmd:
 * libllm clients that generate and run admin commands, and raw sockets that
 * speak (or break) the wire protocol frame by frame.  Header-only, on top
 * of daemonutil.h.
 */
#ifndef LLMD_CLIENTUTIL_H
#define LLMD_CLIENTUTIL_H

#include <json-c/json.h>

#include "daemonutil.h"
#include "llm.h"
#include "proto.h"
#include "usock.h"

static inline struct llm *client(const struct tdaemon *d, uint32_t ring)
{
	struct llm *h = NULL;
	char err[256];
	if (llm_connect(d->sock, ring, &h, err, sizeof err) < 0) {
		fprintf(stderr, "llm_connect %s: %s\n", d->sock, err);
		return NULL;
	}
	return h;
}

struct gen {
	int32_t ids[512];
	int n;
	enum llm_finish finish;
	int error_code;
	uint32_t prompt_tokens;
	char text[4096];
	char message[256];           /* the DONE's message: an error, or a notice */
	double t_done;
};

/* Reads events of request ID until its DONE (other ids are ignored). */
static inline int wait_done(struct llm *h, uint64_t id, struct gen *g, int timeout_ms)
{
	struct llm_event ev;
	double t0 = clock_s();
	size_t tl = strlen(g->text);

	while ((clock_s() - t0) * 1000 < timeout_ms) {
		int r = llm_next_event(h, &ev, 200);
		if (r < 0)
			return r;
		if (r == 0 || ev.id != id)
			continue;
		if (ev.kind == LLM_EV_TOKEN) {
			if (ev.token >= 0 && g->n < 512)
				g->ids[g->n++] = ev.token;
			if (tl + ev.text_len < sizeof g->text) {
				memcpy(g->text + tl, ev.text, ev.text_len);
				tl += ev.text_len;
				g->text[tl] = 0;
			}
		} else {
			g->finish = ev.finish;
			g->error_code = ev.error_code;
			g->prompt_tokens = ev.prompt_tokens;
			snprintf(g->message, sizeof g->message, "%s", ev.message);
			g->t_done = clock_s();
			return 1;
		}
	}
	return 0;
}

static inline int generate(struct llm *h, const char *prompt, int max_tokens, float temp,
			   uint64_t seed, struct gen *g)
{
	struct llm_request r;
	uint64_t id;

	memset(g, 0, sizeof *g);
	llm_request_init(&r);
	r.prompt = prompt;
	r.max_tokens = max_tokens;
	r.temperature = temp;
	r.has_seed = 1;
	r.seed = seed;
	if (llm_submit(h, &r, &id) < 0)
		return -1;
	return wait_done(h, id, g, 60000) == 1 ? 0 : -1;
}

static inline json_object *admin_json(struct llm *h, const char *cmd, const char *arg)
{
	char *body = NULL;
	json_object *j;
	if (llm_admin(h, cmd, arg, &body) < 0)
		return NULL;
	j = json_tokener_parse(body);
	free(body);
	return j;
}

static inline int64_t jint(json_object *j, const char *a, const char *b)
{
	json_object *o = NULL;
	if (!json_object_object_get_ex(j, a, &o))
		return -1;
	if (b && !json_object_object_get_ex(o, b, &o))
		return -1;
	return json_object_get_int64(o);
}

static inline double jdbl(json_object *j, const char *k)
{
	json_object *o = NULL;
	return json_object_object_get_ex(j, k, &o) ? json_object_get_double(o) : -1;
}

/* Waits until ps is empty and no KV block is in use: the idle level. */
static inline int wait_idle(const struct tdaemon *d)
{
	struct llm *h = NULL;
	int ok = 0;
	for (double t0 = clock_s(); clock_s() - t0 < 20 && !ok; tsleep_ms(50)) {
		if (!h && llm_connect(d->sock, 4096, &h, NULL, 0) < 0)
			continue; /* closed connections may still count against the uid */
		json_object *st = admin_json(h, "status", NULL), *ps = admin_json(h, "ps", NULL);
		json_object *arr = NULL;
		if (st && ps && json_object_object_get_ex(ps, "requests", &arr))
			ok = json_object_array_length(arr) == 0 && jint(st, "kv", "used_blocks") == 0;
		json_object_put(st);
		json_object_put(ps);
	}
	llm_close(h);
	return ok;
}

static inline int raw_connect(const struct tdaemon *d)
{
	char err[128];
	return usock_connect(d->sock, err, sizeof err);
}

/* Reads frames until EOF or SECONDS; returns the code of the first ERROR
 * frame seen (0 if none) and sets *CLOSED when the daemon closed the stream. */
static inline int read_error_within(int fd, double seconds, int *closed)
{
	static uint8_t buf[PROTO_MAX_FRAME];
	size_t have = 0;
	int code = 0;
	*closed = 0;
	for (double t0 = clock_s(); clock_s() - t0 < seconds;) {
		struct pollfd p = { fd, POLLIN, 0 };
		struct proto_frame f;
		ssize_t n;
		if (poll(&p, 1, 50) <= 0)
			continue;
		n = read(fd, buf + have, sizeof buf - have);
		if (n <= 0) {
			*closed = 1;
			break;
		}
		have += (size_t)n;
		while ((n = proto_frame_parse(buf, have, &f)) > 0) {
			struct proto_error e;
			if (f.type == PROTO_ERROR && !code && proto_decode_error(&f, &e) == 0)
				code = (int)e.code;
			memmove(buf, buf + n, have - (size_t)n);
			have -= (size_t)n;
		}
	}
	return code;
}

static inline int read_error(int fd, int *closed)
{
	return read_error_within(fd, 3, closed);
}

static inline void send_all(int fd, const void *p, size_t n)
{
	(void)!send(fd, p, n, MSG_NOSIGNAL);
}

static inline int hello(int fd, uint32_t version, uint32_t ring)
{
	uint8_t buf[64];
	struct proto_hello h = { .version = version, .ring_bytes = ring };
	ssize_t n = proto_encode_hello(buf, sizeof buf, &h);
	send_all(fd, buf, (size_t)n);
	return 0;
}

static inline void still_serving(const struct tdaemon *d, const char *after)
{
	struct llm *h = client(d, 0);
	struct gen g;
	int ok = h && generate(h, "Hello", 8, 0, 1, &g) == 0 && g.n > 0;
	if (!ok)
		fprintf(stderr, "after %s the daemon no longer serves\n", after);
	CHECK(ok);
	llm_close(h);
}

#endif
