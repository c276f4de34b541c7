/* bench_http.c - llm-bench's --url mode: the --socket workload through an
 * OpenAI-compatible HTTP server (llmd's HTTP front, llama-server, vLLM),
 * one streaming request and one thread per simulated client, with libcurl.
 * Each client posts /completions (or /chat/completions with --chat) with
 * stream and stream_options.include_usage, and times the server-sent
 * events: the first text is the first token; the usage chunk, where the
 * server sends one, counts the tokens (else each text event counts one).
 */
#include "bench_socket.h"

#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_start.h"
#include "clock.h"

struct hclient {
	const struct bench_socket_params *p;
	int i;
	struct start *go;
	struct bench_socket_seq *seq;
	char line[65536];               /* the event being read */
	size_t n_line;
	int events;                     /* text events seen */
	int usage_tokens;               /* -1 until a usage chunk came */
	int done;                       /* data: [DONE] */
	double t_submit, t_first, t_last, t_end;
	long status;
	char body[512];                 /* the start of a non-200 answer */
	size_t n_body;
	int rc;
	char err[1536];
};

/* One "data: ..." line of the stream. */
static void on_event(struct hclient *c, const char *data)
{
	json_object *o, *ch, *c0, *v, *u;
	const char *text = NULL;

	if (!strcmp(data, "[DONE]")) {
		c->done = 1;
		return;
	}
	if (!(o = json_tokener_parse(data)))
		return;
	if (json_object_object_get_ex(o, "usage", &u) && u &&
	    json_object_object_get_ex(u, "completion_tokens", &v))
		c->usage_tokens = json_object_get_int(v);
	if (json_object_object_get_ex(o, "choices", &ch) && json_object_is_type(ch, json_type_array) &&
	    json_object_array_length(ch) > 0 && (c0 = json_object_array_get_idx(ch, 0))) {
		json_object *delta;
		if (json_object_object_get_ex(c0, "text", &v))
			text = json_object_get_string(v);
		else if (json_object_object_get_ex(c0, "delta", &delta) &&
			 json_object_object_get_ex(delta, "content", &v))
			text = json_object_get_string(v);
	}
	if (text && text[0]) {
		c->t_last = clock_s();
		if (!c->t_first)
			c->t_first = c->t_last;
		c->events++;
	}
	json_object_put(o);
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct hclient *c = arg;
	size_t n = size * nmemb;

	for (size_t k = 0; k < n; k++) {
		char ch = ptr[k];
		if (c->n_body < sizeof c->body - 1)
			c->body[c->n_body++] = ch;
		if (ch == '\n') {
			c->line[c->n_line] = 0;
			if (c->n_line && c->line[c->n_line - 1] == '\r')
				c->line[--c->n_line] = 0;
			if (!strncmp(c->line, "data:", 5))
				on_event(c, c->line + 5 + (c->line[5] == ' '));
			c->n_line = 0;
		} else if (c->n_line < sizeof c->line - 1) {
			c->line[c->n_line++] = ch;
		}
	}
	return n;
}

/* The request body: the prompt as bench_socket sends it. */
static char *request_body(const struct bench_socket_params *p, int i)
{
	json_object *o = json_object_new_object(), *so = json_object_new_object();
	char *s;

	if (p->model)
		json_object_object_add(o, "model", json_object_new_string(p->model));
	if (p->chat) {
		json_object *msgs = json_object_new_array(), *m;
		if (p->system) {
			m = json_object_new_object();
			json_object_object_add(m, "role", json_object_new_string("system"));
			json_object_object_add(m, "content", json_object_new_string(p->system));
			json_object_array_add(msgs, m);
		}
		m = json_object_new_object();
		json_object_object_add(m, "role", json_object_new_string("user"));
		json_object_object_add(m, "content", json_object_new_string(p->prompts[i]));
		json_object_array_add(msgs, m);
		json_object_object_add(o, "messages", msgs);
	} else {
		json_object_object_add(o, "prompt", json_object_new_string(p->prompts[i]));
	}
	json_object_object_add(o, "max_tokens", json_object_new_int(p->max_tokens));
	json_object_object_add(o, "temperature", json_object_new_double(p->temperature));
	json_object_object_add(o, "top_k", json_object_new_int(p->top_k));
	json_object_object_add(o, "top_p", json_object_new_double(p->top_p));
	json_object_object_add(o, "min_p", json_object_new_double(p->min_p));
	json_object_object_add(o, "seed", json_object_new_int64((int64_t)(p->seed + (uint64_t)i)));
	if (p->ignore_eos)
		json_object_object_add(o, "ignore_eos", json_object_new_boolean(1));
	json_object_object_add(o, "stream", json_object_new_boolean(1));
	json_object_object_add(so, "include_usage", json_object_new_boolean(1));
	json_object_object_add(o, "stream_options", so);
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	return s;
}

static void *hclient_main(void *arg)
{
	struct hclient *c = arg;
	const struct bench_socket_params *p = c->p;
	char url[1024], auth[512];
	struct curl_slist *hd = NULL;
	char *body = request_body(p, c->i);
	CURL *e = curl_easy_init();
	CURLcode cr;

	c->usage_tokens = -1;
	snprintf(url, sizeof url, "%s%s", p->url, p->chat ? "/chat/completions" : "/completions");
	hd = curl_slist_append(hd, "Content-Type: application/json");
	if (p->api_key) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", p->api_key);
		hd = curl_slist_append(hd, auth);
	}
	if (e && body && hd) {
		curl_easy_setopt(e, CURLOPT_URL, url);
		if (p->unix_socket)
			curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, p->unix_socket);
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, hd);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_TIMEOUT, 600L);
	}
	if (start_wait(c->go) < 0)
		goto out;
	if (!e || !body || !hd) {
		c->rc = -ENOMEM;
		snprintf(c->err, sizeof c->err, "out of memory");
		goto out;
	}
	c->t_submit = clock_s();
	cr = curl_easy_perform(e);
	c->t_end = clock_s();
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &c->status);
	if (cr != CURLE_OK) {
		c->rc = -EIO;
		snprintf(c->err, sizeof c->err, "%s: %s", url, curl_easy_strerror(cr));
	} else if (c->status != 200) {
		c->rc = -EIO;
		c->body[c->n_body] = 0;
		snprintf(c->err, sizeof c->err, "%s: HTTP %ld: %.180s", url, c->status, c->body);
	} else if (!c->done) {
		c->rc = -EIO;
		snprintf(c->err, sizeof c->err, "%s: the stream ended without data: [DONE]", url);
	}
	c->seq->n_gen = c->usage_tokens >= 0 ? c->usage_tokens : c->events;
	c->seq->ttft_s = (c->t_first ? c->t_first : c->t_end) - c->t_submit;
	c->seq->decode_s = c->t_first ? c->t_last - c->t_first : 0;
out:
	curl_slist_free_all(hd);
	if (e)
		curl_easy_cleanup(e);
	free(body);
	return NULL;
}

int bench_http_run(const struct bench_socket_params *p, struct bench_socket_result *ret, char *err,
		   size_t errlen)
{
	static int curl_ready;
	pthread_t *th = calloc((size_t)p->n, sizeof *th);
	struct hclient *cs = calloc((size_t)p->n, sizeof *cs);
	struct start go = START_INIT;
	int started = 0, rc = 0;
	double t0 = 0, t1 = 0;

	memset(ret, 0, sizeof *ret);
	ret->n = p->n;
	ret->seqs = calloc((size_t)p->n, sizeof *ret->seqs);
	if (!th || !cs || !ret->seqs) {
		free(th);
		free(cs);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) == 0)
		curl_ready = 1;
	for (; started < p->n; started++) {
		cs[started] = (struct hclient){ .p = p, .i = started, .go = &go, .seq = &ret->seqs[started] };
		if (pthread_create(&th[started], NULL, hclient_main, &cs[started]) != 0)
			break;
	}
	if (started < p->n) {
		start_fire(&go, -1);
		for (int i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		free(th);
		free(cs);
		snprintf(err, errlen, "cannot start %d client threads", p->n);
		return -EAGAIN;
	}
	t0 = clock_s();
	start_fire(&go, 1);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	t1 = clock_s();
	for (int i = 0; i < p->n; i++) {
		if (cs[i].rc && !rc) {
			rc = cs[i].rc;
			snprintf(err, errlen, "client %d: %s", i, cs[i].err);
		}
		ret->generated += ret->seqs[i].n_gen;
		if (cs[i].t_end > t1)
			t1 = cs[i].t_end;
	}
	ret->wall_s = t1 - t0;
	free(th);
	free(cs);
	return rc;
}
