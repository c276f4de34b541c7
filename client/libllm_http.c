/* libllm_http.c - libllm over an OpenAI-compatible HTTP API (see
 * libllm_http.h), with libcurl's multi interface: a request is one
 * streaming POST (/completions, or /chat/completions for messages) whose
 * server-sent events become the same LLM_EV_TOKEN and LLM_EV_DONE events
 * the rings give.  Only the thread in llm_next_event drives the transfers;
 * llm_submit and llm_cancel leave their work in lists and wake it
 * (through an eventfd in llm_fd's epoll), because a curl multi handle is one thread's at a
 * time.
 */
#include "libllm_http.h"

#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "proto.h"

#define MAX_LINE (4u << 20)            /* one server-sent event */
#define MAX_ERRBODY 4096               /* what an error answer may say */

struct qev {                           /* an event waiting for llm_next_event */
	struct qev *next;
	struct llm_event ev;
	char *text;                        /* ev.text / ev.message, owned */
};

struct xfer {                          /* one request */
	struct xfer *next;                 /* hh->xfers' list */
	struct llm_http *hh;               /* the handle's state it belongs to */
	uint64_t id;                       /* the libllm request id its events carry */
	CURL *e;                           /* owned; its private pointer is this xfer */
	struct curl_slist *hd;             /* owned request headers */
	char *body;                        /* owned JSON body (curl does not copy it) */
	int added;                         /* in the multi handle */
	int cancel;                        /* llm_cancel asked */
	char *line;                        /* the event being read */
	size_t n_line, cap_line;
	char err[MAX_ERRBODY + 1];         /* the start of the answer, for errors */
	size_t n_err;
	int finish;                        /* enum llm_finish from finish_reason; 0: none yet */
	int stream_error;                  /* an error event came in the stream */
	char stream_msg[PROTO_MAX_ERRMSG + 1];
	uint32_t prompt_tokens, cached_tokens, generated_tokens;
	uint32_t tokens_seen;
};

struct llm_http {
	CURLM *m;
	char base[1024];                   /* ".../v1", no trailing slash */
	char unix_path[108];               /* "" for TCP */
	char auth[600];                    /* "Authorization: Bearer KEY" or "" */
	char model[257];
	struct xfer *xfers;                /* live requests */
	struct qev *q, *q_tail;            /* events to deliver, in order */
	char *cur;                         /* the delivered event's text */
	int epfd;                          /* llm_fd(): curl's sockets and evfd */
	int evfd;                          /* readable while events wait or work was left */
	int tfd;                           /* a timerfd: curl's next timeout */
};

/* curl's timer, as a timerfd in llm_fd's epoll (-1: none, 0: at once). */
static int on_timer(CURLM *m, long ms, void *arg)
{
	struct llm_http *hh = arg;
	struct itimerspec its = { 0 };
	(void)m;

	if (ms >= 0) {
		if (ms == 0)
			ms = 1;
		its.it_value.tv_sec = ms / 1000;
		its.it_value.tv_nsec = (ms % 1000) * 1000000;
	}
	timerfd_settime(hh->tfd, 0, &its, NULL);
	return 0;
}

/* llm_fd stays readable while something waits for llm_next_event. */
static void signal_ready(struct llm_http *hh)
{
	uint64_t one = 1;
	(void)!write(hh->evfd, &one, sizeof one);
}

static void clear_ready(struct llm_http *hh)
{
	uint64_t v;
	(void)!read(hh->evfd, &v, sizeof v);
}

/* curl tells which of its sockets to watch: they go in llm_fd's epoll. */
static int on_socket(CURL *e, curl_socket_t s, int what, void *arg, void *socketp)
{
	struct llm_http *hh = arg;
	struct epoll_event ev = { .data.fd = s };
	(void)e;
	(void)socketp;

	if (what == CURL_POLL_REMOVE) {
		epoll_ctl(hh->epfd, EPOLL_CTL_DEL, s, NULL);
		return 0;
	}
	ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
	if (epoll_ctl(hh->epfd, EPOLL_CTL_MOD, s, &ev) < 0)
		epoll_ctl(hh->epfd, EPOLL_CTL_ADD, s, &ev);
	return 0;
}

static int curl_ready;
static pthread_mutex_t curl_ready_lock = PTHREAD_MUTEX_INITIALIZER;

#define set_msg errbuf_set

/* ---- events ---- */

static void push_ev(struct llm_http *hh, const struct llm_event *ev, const char *text, size_t len)
{
	struct qev *q = calloc(1, sizeof *q);

	if (!q)
		return;
	q->ev = *ev;
	q->text = malloc(len + 1);
	if (q->text) {
		memcpy(q->text, text, len);
		q->text[len] = 0;
	} else {
		len = 0;
	}
	if (ev->kind == LLM_EV_TOKEN)
		q->ev.text_len = len;
	if (hh->q_tail)
		hh->q_tail->next = q;
	else
		hh->q = q;
	hh->q_tail = q;
}

static void push_token(struct xfer *x, int32_t token, float logprob, const char *text, size_t len)
{
	struct llm_event ev = { .kind = LLM_EV_TOKEN, .id = x->id, .token = token, .logprob = logprob };

	x->tokens_seen++;
	push_ev(x->hh, &ev, text, len);
}

/* The HTTP status of a refusal as the daemon's error code (libllm(3)). */
static int code_of_status(long status)
{
	switch (status) {
	case 400:
		return PROTO_E_INVAL;
	case 401:
	case 403:
		return PROTO_E_PERM;
	case 404:
		return PROTO_E_NOTFOUND;
	case 413:
		return PROTO_E_TOOBIG;
	case 429:
		return PROTO_E_LIMIT;
	case 503:
		return PROTO_E_DRAINING;
	default:
		return PROTO_E_INTERNAL;
	}
}

/* A refusal's code: its status's, but nomodel for a 404 of
 * {"error": {"code": "model_not_found"}} (OpenAI's and llmd's answer to a
 * model they do not serve), as llmd's socket says it. */
static int code_of_refusal(long status, const char *body, size_t len)
{
	json_object *o = status == 404 && len ? json_tokener_parse(body) : NULL, *e, *c;
	int code = code_of_status(status);

	if (o && json_object_object_get_ex(o, "error", &e) && json_object_is_type(e, json_type_object) &&
	    json_object_object_get_ex(e, "code", &c) && json_object_is_type(c, json_type_string) &&
	    !strcmp(json_object_get_string(c), "model_not_found"))
		code = PROTO_E_NOMODEL;
	json_object_put(o);
	return code;
}

/* An error answer's message: OpenAI's {"error": {"message"}}, or the text. */
static void error_message(const char *body, size_t len, long status, char *out, size_t outlen)
{
	json_object *o = len ? json_tokener_parse(body) : NULL, *e, *m;

	if (o && json_object_object_get_ex(o, "error", &e)) {
		if (json_object_is_type(e, json_type_object) && json_object_object_get_ex(e, "message", &m))
			set_msg(out, outlen, "HTTP %ld: %s", status, json_object_get_string(m));
		else
			set_msg(out, outlen, "HTTP %ld: %s", status, json_object_get_string(e));
	} else {
		set_msg(out, outlen, "HTTP %ld: %.*s", status, (int)(len > 300 ? 300 : len), body);
	}
	json_object_put(o);
}

/* One "data: {...}" event of a stream. */
static void on_data(struct xfer *x, const char *data)
{
	json_object *o, *v, *ch, *c0, *ids = NULL, *lps = NULL;
	const char *text = NULL, *fin = NULL;
	size_t tlen = 0;

	if (!strcmp(data, "[DONE]"))
		return;
	if (!(o = json_tokener_parse(data)))
		return;
	if (json_object_object_get_ex(o, "error", &v) && v) {
		json_object *m;
		x->stream_error = 1;
		set_msg(x->stream_msg, sizeof x->stream_msg, "%s",
			json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "message", &m)
				? json_object_get_string(m) : json_object_get_string(v));
	}
	if (json_object_object_get_ex(o, "usage", &v) && v && json_object_is_type(v, json_type_object)) {
		json_object *n, *det;
		if (json_object_object_get_ex(v, "prompt_tokens", &n))
			x->prompt_tokens = (uint32_t)json_object_get_int(n);
		if (json_object_object_get_ex(v, "completion_tokens", &n))
			x->generated_tokens = (uint32_t)json_object_get_int(n);
		if (json_object_object_get_ex(v, "prompt_tokens_details", &det) && det &&
		    json_object_object_get_ex(det, "cached_tokens", &n))
			x->cached_tokens = (uint32_t)json_object_get_int(n);
	}
	if (json_object_object_get_ex(o, "choices", &ch) && json_object_is_type(ch, json_type_array) &&
	    json_object_array_length(ch) > 0 && (c0 = json_object_array_get_idx(ch, 0))) {
		json_object *delta;
		if (json_object_object_get_ex(c0, "text", &v) && v) {
			text = json_object_get_string(v);
			tlen = (size_t)json_object_get_string_len(v);
		} else if (json_object_object_get_ex(c0, "delta", &delta) && delta &&
			   json_object_object_get_ex(delta, "content", &v) && v) {
			text = json_object_get_string(v);
			tlen = (size_t)json_object_get_string_len(v);
		}
		if (json_object_object_get_ex(c0, "token_ids", &v) && json_object_is_type(v, json_type_array))
			ids = v;
		if (json_object_object_get_ex(c0, "logprobs", &v) && v) {
			json_object *c;
			if (json_object_object_get_ex(v, "content", &c) && json_object_is_type(c, json_type_array))
				lps = c; /* chat: [{token, logprob}] */
			else if (json_object_object_get_ex(v, "token_logprobs", &c) &&
				 json_object_is_type(c, json_type_array))
				lps = c; /* completions: [logprob] */
		}
		if (json_object_object_get_ex(c0, "finish_reason", &v) && v)
			fin = json_object_get_string(v);
	}
	/* One event a token where the ids say how many (the logprobs then go
	 * with them, the text with the last); else one event for the text. */
	size_t n_ids = ids ? json_object_array_length(ids) : 0;
	if (n_ids) {
		for (size_t i = 0; i < n_ids; i++) {
			float lp = 0;
			if (lps && i < json_object_array_length(lps)) {
				json_object *e = json_object_array_get_idx(lps, i), *l;
				lp = (float)(json_object_is_type(e, json_type_object) &&
						     json_object_object_get_ex(e, "logprob", &l)
					     ? json_object_get_double(l) : json_object_get_double(e));
			}
			push_token(x, json_object_get_int(json_object_array_get_idx(ids, i)), lp,
				   i + 1 == n_ids && text ? text : "", i + 1 == n_ids && text ? tlen : 0);
		}
	} else if (text && tlen) {
		float lp = 0;
		if (lps && json_object_array_length(lps) > 0) {
			json_object *e = json_object_array_get_idx(lps, 0), *l;
			lp = (float)(json_object_is_type(e, json_type_object) && json_object_object_get_ex(e, "logprob", &l)
					     ? json_object_get_double(l) : json_object_get_double(e));
		}
		push_token(x, -2, lp, text, tlen); /* -2: the server gave no ids */
	}
	if (fin)
		x->finish = !strcmp(fin, "length") ? LLM_FINISH_LENGTH : LLM_FINISH_STOP;
	json_object_put(o);
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
	struct xfer *x = arg;
	size_t n = size * nmemb;

	for (size_t k = 0; k < n; k++) {
		char c = p[k];
		if (x->n_err < MAX_ERRBODY)
			x->err[x->n_err++] = c;
		if (c == '\n') {
			if (x->n_line && x->line[x->n_line - 1] == '\r')
				x->n_line--;
			if (x->line) {
				x->line[x->n_line] = 0;
				if (!strncmp(x->line, "data:", 5))
					on_data(x, x->line + 5 + (x->line[5] == ' '));
			}
			x->n_line = 0;
			continue;
		}
		if (x->n_line + 1 >= x->cap_line) {
			size_t cap = x->cap_line ? x->cap_line * 2 : 4096;
			char *nl = cap <= MAX_LINE ? realloc(x->line, cap) : NULL;
			if (!nl)
				return 0; /* an event too large: the transfer fails */
			x->line = nl;
			x->cap_line = cap;
		}
		x->line[x->n_line++] = c;
	}
	return n;
}

/* ---- transfers ---- */

static void xfer_free(struct xfer *x)
{
	if (!x)
		return;
	if (x->e) {
		if (x->added)
			curl_multi_remove_handle(x->hh->m, x->e);
		curl_easy_cleanup(x->e);
	}
	curl_slist_free_all(x->hd);
	free(x->body);
	free(x->line);
	free(x);
}

static void xfer_unlink(struct llm_http *hh, struct xfer *x)
{
	for (struct xfer **pp = &hh->xfers; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			return;
		}
}

/* X is over: its DONE event, then it goes. */
static void xfer_done(struct xfer *x, CURLcode cr)
{
	struct llm_http *hh = x->hh;
	struct llm_event ev = { .kind = LLM_EV_DONE, .id = x->id };
	char msg[PROTO_MAX_ERRMSG + 64] = "";
	long status = 0;

	curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &status);
	if (x->cancel) {
		ev.finish = LLM_FINISH_CANCELLED;
	} else if (cr != CURLE_OK) {
		ev.finish = LLM_FINISH_ERROR;
		ev.error_code = PROTO_E_INTERNAL;
		set_msg(msg, sizeof msg, "%s: %s", hh->base, curl_easy_strerror(cr));
	} else if (status != 200) {
		ev.finish = LLM_FINISH_ERROR;
		x->err[x->n_err] = 0;
		ev.error_code = code_of_refusal(status, x->err, x->n_err);
		error_message(x->err, x->n_err, status, msg, sizeof msg);
	} else if (x->stream_error) {
		ev.finish = LLM_FINISH_ERROR;
		ev.error_code = PROTO_E_INTERNAL;
		set_msg(msg, sizeof msg, "%s", x->stream_msg);
	} else {
		ev.finish = x->finish ? x->finish : LLM_FINISH_STOP;
	}
	ev.prompt_tokens = x->prompt_tokens;
	ev.cached_tokens = x->cached_tokens;
	ev.generated_tokens = x->generated_tokens ? x->generated_tokens : x->tokens_seen;
	push_ev(hh, &ev, msg, strlen(msg));
	xfer_unlink(hh, x);
	xfer_free(x);
}

/* G as the body's response_format (JSON, a schema) or "grammar" (GBNF):
 * 0, or -EINVAL when a schema's text is not JSON. */
static int add_grammar(json_object *o, const struct llm_grammar *g)
{
	json_object *rf, *js, *schema;

	if (!g)
		return 0;
	if (g->kind == LLM_GRAMMAR_GBNF) {
		json_object_object_add(o, "grammar", json_object_new_string(g->text));
		return 0;
	}
	rf = json_object_new_object();
	if (g->kind == LLM_GRAMMAR_JSON) {
		json_object_object_add(rf, "type", json_object_new_string("json_object"));
	} else {
		if (!(schema = json_tokener_parse(g->text))) {
			json_object_put(rf);
			return -EINVAL;
		}
		js = json_object_new_object();
		json_object_object_add(js, "name", json_object_new_string("output"));
		json_object_object_add(js, "schema", schema);
		json_object_object_add(js, "strict", json_object_new_boolean(!!(g->flags & LLM_GRAMMAR_STRICT)));
		json_object_object_add(rf, "type", json_object_new_string("json_schema"));
		json_object_object_add(rf, "json_schema", js);
	}
	json_object_object_add(o, "response_format", rf);
	return 0;
}

static char *request_body(struct llm_http *hh, const struct llm_request *r, const struct llm_grammar *g,
			  const char *model, const int32_t *keep_alive, uint32_t max_draft)
{
	json_object *o = json_object_new_object(), *so = json_object_new_object();
	char *s;

	if (!model || !*model)
		model = hh->model;
	if (*model)
		json_object_object_add(o, "model", json_object_new_string(model));
	if (keep_alive) /* Ollama's, which llmd takes too */
		json_object_object_add(o, "keep_alive", json_object_new_int(*keep_alive));
	if (max_draft) /* llama-server's name, which llmd takes too */
		json_object_object_add(o, "speculative.n_max", json_object_new_int((int32_t)max_draft));
	if (r->messages) {
		static const char *const roles[] = { "", "system", "user", "assistant" };
		json_object *msgs = json_object_new_array();
		for (int i = 0; i < r->n_messages; i++) {
			json_object *m = json_object_new_object();
			json_object_object_add(m, "role", json_object_new_string(roles[r->messages[i].role]));
			json_object_object_add(m, "content", json_object_new_string(r->messages[i].content));
			json_object_array_add(msgs, m);
		}
		json_object_object_add(o, "messages", msgs);
		if (r->flags & LLM_LOGPROBS)
			json_object_object_add(o, "logprobs", json_object_new_boolean(1));
	} else {
		json_object_object_add(o, "prompt", json_object_new_string(r->prompt));
		if (r->flags & LLM_LOGPROBS)
			json_object_object_add(o, "logprobs", json_object_new_int(0));
	}
	json_object_object_add(o, "max_tokens", json_object_new_int(r->max_tokens));
	json_object_object_add(o, "temperature", json_object_new_double(r->temperature));
	json_object_object_add(o, "top_p", json_object_new_double(r->top_p));
	/* the extensions only where they do something, for strict servers */
	if (r->top_k > 0)
		json_object_object_add(o, "top_k", json_object_new_int(r->top_k));
	if (r->min_p > 0)
		json_object_object_add(o, "min_p", json_object_new_double(r->min_p));
	if (r->repeat_penalty != 1.0f)
		json_object_object_add(o, "repetition_penalty", json_object_new_double(r->repeat_penalty));
	if (r->presence_penalty != 0)
		json_object_object_add(o, "presence_penalty", json_object_new_double(r->presence_penalty));
	if (r->frequency_penalty != 0)
		json_object_object_add(o, "frequency_penalty", json_object_new_double(r->frequency_penalty));
	if (r->has_seed)
		json_object_object_add(o, "seed", json_object_new_int64((int64_t)r->seed));
	if (r->priority)
		json_object_object_add(o, "priority", json_object_new_int(r->priority));
	if (r->flags & LLM_IGNORE_EOS)
		json_object_object_add(o, "ignore_eos", json_object_new_boolean(1));
	if (r->flags & (LLM_SPEC_NGRAM | LLM_SPEC_OFF | LLM_SPEC_DRAFT)) /* llmd's extension */
		json_object_object_add(o, "speculative", json_object_new_string(
			r->flags & LLM_SPEC_NGRAM ? "ngram" : r->flags & LLM_SPEC_DRAFT ? "draft" : "off"));
	if (r->n_stops) {
		json_object *st = json_object_new_array();
		for (int i = 0; i < r->n_stops; i++)
			json_object_array_add(st, json_object_new_string(r->stops[i]));
		json_object_object_add(o, "stop", st);
	}
	json_object_object_add(o, "stream", json_object_new_boolean(1));
	if (add_grammar(o, g) < 0) {
		json_object_put(o);
		json_object_put(so);
		return NULL;
	}
	json_object_object_add(so, "include_usage", json_object_new_boolean(1));
	json_object_object_add(o, "stream_options", so);
	json_object_object_add(o, "return_token_ids", json_object_new_boolean(1));
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	return s;
}

/* A curl handle for PATH under the base URL, with the socket and key. */
static CURL *easy_for(struct llm_http *hh, const char *path, struct curl_slist **hd)
{
	char url[1200];
	CURL *e = curl_easy_init();

	if (!e)
		return NULL;
	snprintf(url, sizeof url, "%s%s", hh->base, path);
	curl_easy_setopt(e, CURLOPT_URL, url);
	if (hh->unix_path[0])
		curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, hh->unix_path);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
	*hd = curl_slist_append(NULL, "Content-Type: application/json");
	if (*hd && hh->auth[0])
		*hd = curl_slist_append(*hd, hh->auth);
	if (*hd)
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, *hd);
	return e;
}

int llm_http_submit(struct llm_http *hh, const struct llm_request *r, const struct llm_grammar *g,
		    const char *model, const int32_t *keep_alive, uint32_t max_draft, uint64_t id, char *msg,
		    size_t msglen)
{
	struct xfer *x;

	if (g && g->kind == LLM_GRAMMAR_JSON_SCHEMA) {
		json_object *schema = json_tokener_parse(g->text);
		if (!schema) {
			set_msg(msg, msglen, "the JSON schema is not JSON");
			return -EINVAL;
		}
		json_object_put(schema);
	}
	x = calloc(1, sizeof *x);
	if (!x || !(x->body = request_body(hh, r, g, model, keep_alive, max_draft)) ||
	    !(x->e = easy_for(hh, r->messages ? "/chat/completions" : "/completions", &x->hd)) || !x->hd) {
		free(x ? x->body : NULL);
		if (x && x->e)
			curl_easy_cleanup(x->e);
		curl_slist_free_all(x ? x->hd : NULL);
		free(x);
		set_msg(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	x->hh = hh;
	x->id = id;
	curl_easy_setopt(x->e, CURLOPT_POSTFIELDS, x->body);
	curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(x->e, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(x->e, CURLOPT_PRIVATE, x);
	x->next = hh->xfers;
	hh->xfers = x;
	signal_ready(hh); /* the thread in llm_next_event adds it */
	return 0;
}

int llm_http_cancel(struct llm_http *hh, uint64_t id)
{
	for (struct xfer *x = hh->xfers; x; x = x->next)
		if (x->id == id) {
			x->cancel = 1;
			signal_ready(hh);
			return 0;
		}
	return -ENOENT;
}

/* Adds new transfers, ends cancelled ones, lets curl act on the sockets
 * and timer that are ready (llm_fd's epoll, polled without waiting), and
 * moves the finished transfers' DONEs to the queue.  The caller holds the
 * handle: no other thread is in curl. */
static int pump(struct llm_http *hh, char *msg, size_t msglen)
{
	struct epoll_event evs[64];
	struct xfer *x, *next;
	CURLMsg *cm;
	int running, left, n, added = 0;

	for (x = hh->xfers; x; x = next) {
		next = x->next;
		if (x->cancel) {
			xfer_done(x, CURLE_OK);
		} else if (!x->added) {
			if (curl_multi_add_handle(hh->m, x->e) != CURLM_OK) {
				set_msg(msg, msglen, "curl: cannot add a transfer");
				return -ENOMEM;
			}
			x->added = 1;
			added = 1;
		}
	}
	if (added)
		curl_multi_socket_action(hh->m, CURL_SOCKET_TIMEOUT, 0, &running);
	n = epoll_wait(hh->epfd, evs, 64, 0);
	for (int i = 0; i < n; i++) {
		int fd = evs[i].data.fd;
		if (fd == hh->evfd) {
			clear_ready(hh);
		} else if (fd == hh->tfd) {
			uint64_t expirations;
			(void)!read(hh->tfd, &expirations, sizeof expirations);
			curl_multi_socket_action(hh->m, CURL_SOCKET_TIMEOUT, 0, &running);
		} else {
			int how = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
				  (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
				  (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
			curl_multi_socket_action(hh->m, fd, how, &running);
		}
	}
	while ((cm = curl_multi_info_read(hh->m, &left))) {
		if (cm->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(cm->easy_handle, CURLINFO_PRIVATE, (char **)&x);
		xfer_done(x, cm->data.result);
	}
	return 0;
}

int llm_http_next_event(struct llm_http *hh, struct llm_event *ev, int timeout_ms,
			pthread_mutex_t *lock, char *msg, size_t msglen)
{
	struct timespec t0;
	int r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	free(hh->cur);
	hh->cur = NULL;
	for (;;) {
		struct timespec t;
		long waited, wait;

		if (!hh->q && (r = pump(hh, msg, msglen)) < 0)
			return r;
		if (hh->q)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t);
		waited = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (timeout_ms >= 0 && waited >= timeout_ms)
			return 0;
		wait = timeout_ms < 0 ? 1000 : timeout_ms - waited;
		/* only this thread touches the multi handle; others may submit
		 * or cancel meanwhile, and wake it through evfd */
		struct pollfd pf = { .fd = hh->epfd, .events = POLLIN };
		pthread_mutex_unlock(lock);
		poll(&pf, 1, (int)wait);
		pthread_mutex_lock(lock);
	}
	struct qev *q = hh->q;
	hh->q = q->next;
	if (!hh->q)
		hh->q_tail = NULL;
	*ev = q->ev;
	hh->cur = q->text;
	if (ev->kind == LLM_EV_TOKEN) {
		ev->text = hh->cur ? hh->cur : "";
	} else {
		ev->text = "";
		ev->text_len = 0;
		ev->message = hh->cur ? hh->cur : "";
	}
	free(q);
	if (hh->q)
		signal_ready(hh);
	return 1;
}

int llm_http_fd(struct llm_http *hh)
{
	return hh->epfd;
}

/* ---- the handle ---- */

static size_t on_models(char *p, size_t size, size_t nmemb, void *arg)
{
	struct xfer *x = arg;
	size_t n = size * nmemb, take = n < MAX_ERRBODY - x->n_err ? n : MAX_ERRBODY - x->n_err;

	memcpy(x->err + x->n_err, p, take);
	x->n_err += take;
	return n;
}

int llm_http_open(const char *url, const char *key, struct llm_http **ret, struct llm_info *info,
		  char *msg, size_t msglen)
{
	struct llm_http *hh;
	struct xfer probe = { 0 };
	CURLcode cr;
	long status = 0;
	size_t n;

	pthread_mutex_lock(&curl_ready_lock);
	if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) == 0)
		curl_ready = 1;
	pthread_mutex_unlock(&curl_ready_lock);
	if (!curl_ready) {
		set_msg(msg, msglen, "curl_global_init failed");
		return -EIO;
	}
	if (!(hh = calloc(1, sizeof *hh))) {
		set_msg(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	hh->tfd = -1;
	hh->epfd = epoll_create1(EPOLL_CLOEXEC);
	hh->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	hh->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	struct epoll_event eev = { .events = EPOLLIN }, tev = { .events = EPOLLIN };
	eev.data.fd = hh->evfd;
	tev.data.fd = hh->tfd;
	if (hh->epfd < 0 || hh->evfd < 0 || hh->tfd < 0 ||
	    epoll_ctl(hh->epfd, EPOLL_CTL_ADD, hh->evfd, &eev) < 0 ||
	    epoll_ctl(hh->epfd, EPOLL_CTL_ADD, hh->tfd, &tev) < 0 || !(hh->m = curl_multi_init())) {
		set_msg(msg, msglen, "cannot make the event fds: %s", strerror(errno));
		llm_http_close(hh);
		return -ENOMEM;
	}
	curl_multi_setopt(hh->m, CURLMOPT_SOCKETFUNCTION, on_socket);
	curl_multi_setopt(hh->m, CURLMOPT_SOCKETDATA, hh);
	curl_multi_setopt(hh->m, CURLMOPT_TIMERFUNCTION, on_timer);
	curl_multi_setopt(hh->m, CURLMOPT_TIMERDATA, hh);
	if (!strncmp(url, "unix:", 5)) {
		if (strlen(url + 5) >= sizeof hh->unix_path || !url[5]) {
			set_msg(msg, msglen, "%s: a socket path of 1 to 107 bytes after unix:", url);
			llm_http_close(hh);
			return -EINVAL;
		}
		snprintf(hh->unix_path, sizeof hh->unix_path, "%s", url + 5);
		snprintf(hh->base, sizeof hh->base, "http://llmd/v1");
	} else if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
		snprintf(hh->base, sizeof hh->base, "%s", url);
	} else {
		set_msg(msg, msglen, "%s: not an http:// or https:// URL, or unix:PATH", url);
		llm_http_close(hh);
		return -EINVAL;
	}
	n = strlen(hh->base);
	while (n > 0 && hh->base[n - 1] == '/')
		hh->base[--n] = 0;
	if (key && *key)
		snprintf(hh->auth, sizeof hh->auth, "Authorization: Bearer %.500s", key);

	/* GET /models: the URL, the key and the model, checked at once */
	probe.hh = hh;
	probe.e = easy_for(hh, "/models", &probe.hd);
	if (!probe.e) {
		llm_http_close(hh);
		set_msg(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	curl_easy_setopt(probe.e, CURLOPT_WRITEFUNCTION, on_models);
	curl_easy_setopt(probe.e, CURLOPT_WRITEDATA, &probe);
	curl_easy_setopt(probe.e, CURLOPT_TIMEOUT, 30L);
	cr = curl_easy_perform(probe.e);
	curl_easy_getinfo(probe.e, CURLINFO_RESPONSE_CODE, &status);
	probe.err[probe.n_err] = 0;
	curl_easy_cleanup(probe.e);
	curl_slist_free_all(probe.hd);
	if (cr != CURLE_OK || status != 200) {
		char why[PROTO_MAX_ERRMSG + 64];
		if (cr != CURLE_OK)
			set_msg(why, sizeof why, "%s", curl_easy_strerror(cr));
		else
			error_message(probe.err, probe.n_err, status, why, sizeof why);
		set_msg(msg, msglen, "cannot use %s%s%s: %s", url, hh->unix_path[0] ? "" : "",
			"", why);
		llm_http_close(hh);
		return cr != CURLE_OK ? -ECONNREFUSED : status == 401 || status == 403 ? -EACCES : -EIO;
	}
	memset(info, 0, sizeof *info);
	json_object *o = json_tokener_parse(probe.err), *data, *m0, *v;
	if (o && json_object_object_get_ex(o, "data", &data) && json_object_is_type(data, json_type_array) &&
	    json_object_array_length(data) > 0 && (m0 = json_object_array_get_idx(data, 0))) {
		if (json_object_object_get_ex(m0, "id", &v))
			snprintf(hh->model, sizeof hh->model, "%s", json_object_get_string(v));
		if (json_object_object_get_ex(m0, "n_ctx", &v)) /* llmd's */
			info->n_ctx = (uint32_t)json_object_get_int(v);
	}
	json_object_put(o);
	snprintf(info->model, sizeof info->model, "%s", hh->model);
	snprintf(info->backend, sizeof info->backend, "http");
	/* the server applies its own template to /chat/completions */
	snprintf(info->chat_template, sizeof info->chat_template, "server");
	info->max_inflight = 1024;
	*ret = hh;
	return 0;
}

void llm_http_close(struct llm_http *hh)
{
	if (!hh)
		return;
	while (hh->xfers) {
		struct xfer *x = hh->xfers;
		hh->xfers = x->next;
		xfer_free(x);
	}
	while (hh->q) {
		struct qev *q = hh->q;
		hh->q = q->next;
		free(q->text);
		free(q);
	}
	free(hh->cur);
	if (hh->m)
		curl_multi_cleanup(hh->m);
	if (hh->epfd >= 0)
		close(hh->epfd);
	if (hh->evfd >= 0)
		close(hh->evfd);
	if (hh->tfd >= 0)
		close(hh->tfd);
	free(hh);
}
