/* http.c - the OpenAI-compatible HTTP front (see http.h).  A request's
 * JSON becomes a struct proto_submit, the same thing a SUBMIT frame
 * decodes to, and goes through server_make_request/server_post_request on a
 * connection-table entry of its own; the engine thread writes its tokens
 * into a ring of ours, which this file reads when the ring's wake channel
 * fires and turns into one JSON response or server-sent events.
 */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "chat.h"
#include "clock.h"
#include "conn.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "ring.h"
#include "server.h"
#include "tokenizer.h"
#include "toolcall.h"
#include "usock.h"
#include "utf8.h"
#include "worker.h"

#define HTTP_RING_BYTES (64u << 10)    /* a request's ring: the event loop drains it at once */
#define HTTP_MAX_HEADERS (16u << 10)
#define HTTP_MAX_TOKENIZE 65536        /* ids /detokenize takes */
#define HTTP_JSON_DEPTH 32

/* TCP clients' identities: a key of [http] keys_file a pseudo-user, so
 * that the per-user limits and fair shares hold per key. */
#define HTTP_KEY_UID_BASE 0xfff00000u
#define HTTP_MAX_KEYS 4096

struct http_req;
struct http_front;

struct http_key {
	char name[28];                 /* "key:" and it fit a connection's comm */
	char key[256];                 /* NUL-terminated, 16..255 bytes */
};

/* One evhttp and what its clients are: the Unix socket's (SO_PEERCRED) or
 * TCP's (a Bearer key each request). */
struct http_listener {
	struct llmd *d;                /* the daemon it serves */
	int tcp;                       /* 1: requests need a key; 0: peers have SO_PEERCRED */
	struct evhttp *eh;             /* owned; NULL when this listener is not used */
	struct evhttp_bound_socket *bound; /* the listening socket (evhttp's); NULL once stopped */
};

/* Who asks. */
struct http_who {
	uid_t uid;                     /* the peer's, or a key's pseudo-uid */
	gid_t gid;                     /* the peer's, or -1 */
	pid_t pid;                     /* the peer's, or 0 */
	int admin_ok;                  /* may be an admin (a Unix peer in the admin group) */
	char name[32];                 /* "http:COMM", or "key:NAME" */
};

struct http_front {
	struct http_listener unix_l, tcp_l;
	struct http_key *keys;         /* (n_keys) [http] keys_file's */
	int n_keys;
	struct http_req *reqs;         /* generating requests, a doubly linked list */
	uint64_t next_id;
	char model_id[1024];           /* /v1/models' id: the file's name less .gguf */
	int64_t created;               /* when llmd started, for "created" */
	uint64_t requests_total, by_status[6]; /* by status class: 1xx..5xx */
};

/* A generating request (chat or completion): its HTTP request, its
 * connection-table entry and its ring. */
struct http_req {
	struct http_req *prev, *next;
	struct llmd *d;
	struct evhttp_request *req;    /* NULL once the client has gone */
	struct evhttp_connection *evcon;
	struct conn *c;                /* our table entry; its id names the ring to the worker */
	struct ring *ring;             /* consumer side */
	int wake_fd;                   /* the waiting end of the ring's wake channel */
	struct event *ev_wake;
	struct event *ev_closed;       /* the client's socket closed (evhttp does not read it
	                                  while a request waits for its answer) */
	struct llmd_model *lm;         /* the model that answers */
	int chat, stream, include_usage, logprobs;
	int n_top;                     /* alternatives asked for with each token */
	int want_ids;                  /* return_token_ids (vLLM's extension) */
	json_object *ids;              /* the generated ids since the last choice sent */
	int started;                   /* stream: the 200 and the first chunk are out */
	char id[48];                   /* "chatcmpl-..." / "cmpl-..." */
	int64_t created;
	struct evbuffer *text;         /* without stream: the answer so far */
	json_object *lp;               /* with logprobs: chat's content list, or
	                                  completions' {tokens, token_logprobs, text_offset} */
	size_t text_off;               /* completions' text_offset so far */
	/* tool calling (chat with tools): the output is parsed for calls */
	int tools;                     /* 1: tools were offered (tool_choice not none) */
	enum toolcall_style tool_style; /* the template's syntax for calls */
	json_object *tool_defs;        /* the request's tools (a reference), to check
	                                  parsed calls' names */
	struct evbuffer *all;          /* stream with tools: the whole output so far */
	size_t sent;                   /* ... of which this many bytes went out as content */
};

/* ---- small helpers ---- */

static struct json_object *jstr_n(const char *s, size_t n)
{
	return json_object_new_string_len(s, (int)n);
}

static void evb_put(void *b, const void *p, size_t n)
{
	evbuffer_add(b, p, n);
}

/* Adds PRE, O's JSON text with its line separators escaped (utf8_json_put:
 * a token may well be U+2028) and POST to B. */
static void add_json(struct evbuffer *b, const char *pre, json_object *o, const char *post)
{
	evbuffer_add(b, pre, strlen(pre));
	utf8_json_put(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE),
		      evb_put, b);
	evbuffer_add(b, post, strlen(post));
}

static void count_status(struct llmd *d, int status)
{
	d->http->requests_total++;
	if (status >= 100 && status < 600)
		d->http->by_status[status / 100]++;
}

/* Sends OBJ (consumed) as the JSON response with STATUS. */
static void reply_json(struct llmd *d, struct evhttp_request *req, int status, json_object *obj)
{
	struct evbuffer *b = evbuffer_new();
	const char *reason = status == 200 ? "OK" : NULL;

	count_status(d, status);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
	if (b && obj)
		add_json(b, "", obj, "\n");
	evhttp_send_reply(req, status, reason, b);
	if (b)
		evbuffer_free(b);
	json_object_put(obj);
}

static const char *error_type(int status)
{
	switch (status) {
	case 400:
	case 413:
		return "invalid_request_error";
	case 401:
		return "authentication_error";
	case 404:
		return "not_found_error";
	case 429:
		return "rate_limit_error";
	case 503:
		return "service_unavailable";
	default:
		return "server_error";
	}
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static json_object *error_obj(int status, const char *param, const char *code, const char *msg)
{
	json_object *e = json_object_new_object(), *o = json_object_new_object();

	json_object_object_add(e, "message", json_object_new_string(msg));
	json_object_object_add(e, "type", json_object_new_string(error_type(status)));
	json_object_object_add(e, "param", param ? json_object_new_string(param) : NULL);
	json_object_object_add(e, "code", code ? json_object_new_string(code) : NULL);
	json_object_object_add(o, "error", e);
	return o;
}

static void reply_error(struct llmd *d, struct evhttp_request *req, int status, const char *param,
			const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void reply_error(struct llmd *d, struct evhttp_request *req, int status, const char *param,
			const char *code, const char *fmt, ...)
{
	char msg[PROTO_MAX_ERRMSG + 1];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (status == 429 || status == 503)
		evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
	reply_json(d, req, status, error_obj(status, param, code, msg));
}

/* The HTTP status of an engine or front-end error code. */
static int status_of(uint32_t code)
{
	switch (code) {
	case PROTO_E_INVAL:
	case PROTO_E_NOTEMPLATE:
		return 400;
	case PROTO_E_TOOBIG:
		return 413;
	case PROTO_E_LIMIT:
	case PROTO_E_BUSY:
		return 429;
	case PROTO_E_DRAINING:
		return 503;
	case PROTO_E_NOMODEL:
		return 404;
	default:
		return 500;
	}
}

/* ---- reading the request's JSON ---- */

/* Parses the body as one JSON object: it, or NULL after a 400. */
static json_object *read_body(struct llmd *d, struct evhttp_request *req)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t len = evbuffer_get_length(in);
	const char *p = len ? (const char *)evbuffer_pullup(in, (ev_ssize_t)len) : "";
	struct json_tokener *tok = json_tokener_new_ex(HTTP_JSON_DEPTH);
	json_object *o = NULL;
	enum json_tokener_error jerr = json_tokener_error_parse_eof;

	if (!tok) {
		reply_error(d, req, 500, NULL, NULL, "out of memory");
		return NULL;
	}
	if (len) {
		o = json_tokener_parse_ex(tok, p, (int)len);
		jerr = json_tokener_get_error(tok);
		if (jerr == json_tokener_success) {
			/* only white space may follow the object */
			for (size_t i = json_tokener_get_parse_end(tok); i < len; i++)
				if (!strchr(" \t\r\n", p[i])) {
					jerr = json_tokener_error_parse_unexpected;
					break;
				}
		}
	}
	json_tokener_free(tok);
	if (jerr != json_tokener_success || !o) {
		json_object_put(o);
		reply_error(d, req, 400, NULL, "invalid_json", "the body is not valid JSON: %s",
			    len ? json_tokener_error_desc(jerr) : "it is empty");
		return NULL;
	}
	if (!json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		reply_error(d, req, 400, NULL, "invalid_json", "the body must be a JSON object");
		return NULL;
	}
	return o;
}

/* A field of the request: NULL when absent or null (OpenAI's optional
 * fields may be null). */
static json_object *field(json_object *o, const char *key)
{
	json_object *v = NULL;
	return json_object_object_get_ex(o, key, &v) && v && !json_object_is_type(v, json_type_null) ? v : NULL;
}

/* Why a request's JSON is refused: the field (OpenAI's "param") and what
 * is wrong with it. */
struct params_err {
	char param[64];                /* "temperature", "messages[2].content"; "" for none */
	char msg[PROTO_MAX_ERRMSG + 1];
};

static int bad(struct params_err *pe, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int bad(struct params_err *pe, const char *param, const char *fmt, ...)
{
	va_list ap;

	snprintf(pe->param, sizeof pe->param, "%s", param);
	va_start(ap, fmt);
	vsnprintf(pe->msg, sizeof pe->msg, fmt, ap);
	va_end(ap);
	return -1;
}

static int get_num(json_object *o, const char *key, double lo, double hi, float *out,
		   struct params_err *pe)
{
	json_object *v = field(o, key);
	double x;

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
		return bad(pe, key, "%s must be a number", key);
	x = json_object_get_double(v);
	if (!(x >= lo && x <= hi))
		return bad(pe, key, "%s must be in [%g, %g], not %g", key, lo, hi, x);
	*out = (float)x;
	return 0;
}

static int get_int(json_object *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
		   struct params_err *pe)
{
	json_object *v = field(o, key);
	int64_t x;

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_int))
		return bad(pe, key, "%s must be an integer", key);
	errno = 0;
	x = json_object_get_int64(v);
	if (errno || x < lo || x > hi)
		return bad(pe, key, "%s must be in %lld..%lld", key, (long long)lo, (long long)hi);
	*out = x;
	return 0;
}

static int get_bool(json_object *o, const char *key, int *out, struct params_err *pe)
{
	json_object *v = field(o, key);

	if (!v)
		return 0;
	if (!json_object_is_type(v, json_type_boolean))
		return bad(pe, key, "%s must be true or false", key);
	*out = json_object_get_boolean(v);
	return 0;
}

static struct proto_str pstr(json_object *s)
{
	return (struct proto_str){ json_object_get_string(s), (uint32_t)json_object_get_string_len(s) };
}

/* A chat message's content: a string, or a list of {"type": "text",
 * "text": ...} parts (joined; other parts are refused).  The joined text of
 * several parts is kept in KEEP (an array the request owns). */
static int message_content(json_object *m, int i, json_object *keep, struct proto_str *out,
			   struct params_err *pe)
{
	json_object *c = field(m, "content");
	char param[64];

	snprintf(param, sizeof param, "messages[%d].content", i);
	if (!c) {
		*out = (struct proto_str){ "", 0 };
		return 0;
	}
	if (json_object_is_type(c, json_type_string)) {
		*out = pstr(c);
		return 0;
	}
	if (!json_object_is_type(c, json_type_array))
		return bad(pe, param, "%s must be a string or a list of text parts", param);
	struct evbuffer *b = evbuffer_new();
	if (!b)
		return bad(pe, param, "out of memory");
	for (size_t k = 0; k < json_object_array_length(c); k++) {
		json_object *part = json_object_array_get_idx(c, k), *t;
		const char *type = json_object_is_type(part, json_type_object) && (t = field(part, "type")) &&
					   json_object_is_type(t, json_type_string)
				   ? json_object_get_string(t) : NULL;
		if (!type || strcmp(type, "text") || !(t = field(part, "text")) ||
		    !json_object_is_type(t, json_type_string)) {
			evbuffer_free(b);
			return bad(pe, param, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts are "
				   "supported (this model reads text)", param, k);
		}
		evbuffer_add(b, json_object_get_string(t), (size_t)json_object_get_string_len(t));
	}
	json_object *joined = json_object_new_string_len((const char *)evbuffer_pullup(b, -1),
							 (int)evbuffer_get_length(b));
	evbuffer_free(b);
	json_object_array_add(keep, joined);
	*out = pstr(joined);
	return 0;
}

static int parse_messages(json_object *body, json_object *keep, struct proto_submit *s,
			  struct proto_message *msgs, struct params_err *pe)
{
	json_object *ms = field(body, "messages");

	if (!ms || !json_object_is_type(ms, json_type_array) || json_object_array_length(ms) == 0)
		return bad(pe, "messages", "messages must be a non-empty list");
	if (json_object_array_length(ms) > PROTO_MAX_MESSAGES)
		return bad(pe, "messages", "at most %d messages", PROTO_MAX_MESSAGES);
	s->n_messages = (uint32_t)json_object_array_length(ms);
	for (uint32_t i = 0; i < s->n_messages; i++) {
		json_object *m = json_object_array_get_idx(ms, i), *r;
		const char *role;
		if (!json_object_is_type(m, json_type_object) || !(r = field(m, "role")) ||
		    !json_object_is_type(r, json_type_string))
			return bad(pe, "messages", "messages[%u] must be an object with a string role", i);
		role = json_object_get_string(r);
		if (!strcmp(role, "system") || !strcmp(role, "developer"))
			msgs[i].role = PROTO_ROLE_SYSTEM;
		else if (!strcmp(role, "user"))
			msgs[i].role = PROTO_ROLE_USER;
		else if (!strcmp(role, "assistant"))
			msgs[i].role = PROTO_ROLE_ASSISTANT;
		else
			return bad(pe, "messages", "messages[%u].role '%s' is not system, developer, user, "
				   "assistant or tool", i, role);
		if (message_content(m, (int)i, keep, &msgs[i].content, pe) < 0)
			return -1;
	}
	s->messages = msgs;
	s->flags |= PROTO_SUBMIT_CHAT;
	return 0;
}

static int parse_prompt(json_object *body, struct proto_submit *s, struct params_err *pe)
{
	json_object *p = field(body, "prompt");

	if (p && json_object_is_type(p, json_type_array) && json_object_array_length(p) == 1 &&
	    json_object_is_type(json_object_array_get_idx(p, 0), json_type_string))
		p = json_object_array_get_idx(p, 0);
	if (!p || !json_object_is_type(p, json_type_string))
		return bad(pe, "prompt", "prompt must be a string (or a list of one string)");
	s->prompt = pstr(p);
	return 0;
}

/* The sampling and length parameters both endpoints share, OpenAI's
 * defaults where a field is absent (temperature 1, top_p 1, no top_k or
 * min_p) and the extensions vLLM and llama-server share. */
static int parse_common(struct llmd *d, struct http_req *hr, json_object *body, struct proto_submit *s,
			struct proto_str *stops, struct params_err *pe)
{
	int64_t n = 1, mt = d->cfg.max_tokens, seed = 0, top_k = 0, prio = 0, top_lp = 0;
	int b = 0;
	json_object *v;

	s->temperature = 1.0f;
	s->top_p = 1.0f;
	s->min_p = 0.0f;
	s->repeat_penalty = 1.0f;
	s->repeat_last_n = 64;
	if ((v = field(body, "model")) && !json_object_is_type(v, json_type_string))
		return bad(pe, "model", "model must be a string");
	if (get_int(body, "n", 1, 1 << 20, &n, pe) < 0)
		return -1;
	if (n != 1)
		return bad(pe, "n", "n must be 1: llmd generates one choice a request (send %lld requests)",
			   (long long)n);
	if (get_int(body, "max_tokens", 1, INT32_MAX, &mt, pe) < 0 ||
	    get_int(body, "max_completion_tokens", 1, INT32_MAX, &mt, pe) < 0)
		return -1;
	if (mt > d->cfg.max_tokens)
		return bad(pe, field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
			   "max_tokens %lld is over this server's limit of %d (limits.max_tokens)",
			   (long long)mt, d->cfg.max_tokens);
	s->max_tokens = (int32_t)mt;
	if (get_num(body, "temperature", 0, 100, &s->temperature, pe) < 0 ||
	    get_num(body, "top_p", 0, 1, &s->top_p, pe) < 0 ||
	    get_num(body, "min_p", 0, 1, &s->min_p, pe) < 0 ||
	    get_num(body, "presence_penalty", -2, 2, &s->presence_penalty, pe) < 0 ||
	    get_num(body, "frequency_penalty", -2, 2, &s->frequency_penalty, pe) < 0 ||
	    get_num(body, "repetition_penalty", 1e-3, 100, &s->repeat_penalty, pe) < 0 ||
	    get_int(body, "top_k", -1, 1 << 20, &top_k, pe) < 0 ||
	    get_int(body, "seed", INT64_MIN, INT64_MAX, &seed, pe) < 0 ||
	    get_int(body, "priority", -1000000, 1000000, &prio, pe) < 0)
		return -1;
	if (s->top_p <= 0)
		return bad(pe, "top_p", "top_p must be in (0, 1]");
	s->top_k = (int32_t)top_k;
	s->priority = (int32_t)prio;
	if (field(body, "seed")) {
		s->seed = (uint64_t)seed;
		s->flags |= PROTO_SUBMIT_SEED;
	}
	if (get_bool(body, "ignore_eos", &b, pe) < 0 || get_bool(body, "return_token_ids", &hr->want_ids, pe) < 0)
		return -1;
	if (b)
		s->flags |= PROTO_SUBMIT_IGNORE_EOS;
	if ((v = field(body, "speculative"))) { /* llmd's extension */
		const char *sv = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
		if (!strcmp(sv, "ngram"))
			s->flags |= PROTO_SUBMIT_SPEC_NGRAM;
		else if (!strcmp(sv, "off"))
			s->flags |= PROTO_SUBMIT_SPEC_OFF;
		else if (!strcmp(sv, "draft"))
			s->flags |= PROTO_SUBMIT_SPEC_DRAFT;
		else
			return bad(pe, "speculative", "speculative must be \"ngram\", \"draft\" or \"off\"");
	}
	/* llama-server's name for it: tokens proposed a step at most */
	int64_t n_max = 0;
	if (get_int(body, "speculative.n_max", 1, PROTO_MAX_DRAFT, &n_max, pe) < 0)
		return -1;
	if (n_max) {
		s->max_draft = (uint32_t)n_max;
		s->flags |= PROTO_SUBMIT_MAX_DRAFT;
	}
	if (get_bool(body, "stream", &hr->stream, pe) < 0)
		return -1;
	if ((v = field(body, "stream_options"))) {
		if (!json_object_is_type(v, json_type_object))
			return bad(pe, "stream_options", "stream_options must be an object");
		if (get_bool(v, "include_usage", &hr->include_usage, pe) < 0)
			return -1;
	}
	/* logprobs: chat's is a boolean (top_logprobs the alternatives), the
	 * completions' an integer count of alternatives */
	if ((v = field(body, "logprobs"))) {
		if (hr->chat) {
			if (get_bool(body, "logprobs", &hr->logprobs, pe) < 0 ||
			    get_int(body, "top_logprobs", 0, 20, &top_lp, pe) < 0)
				return -1;
		} else {
			if (get_int(body, "logprobs", 0, 5, &top_lp, pe) < 0)
				return -1;
			hr->logprobs = 1;
		}
	}
	if (!hr->logprobs && top_lp > 0)
		return bad(pe, "top_logprobs", "top_logprobs needs logprobs: true");
	if (!hr->logprobs && field(body, "top_logprobs") && !field(body, "logprobs"))
		return bad(pe, "top_logprobs", "top_logprobs needs logprobs: true");
	if (hr->logprobs) {
		s->flags |= PROTO_SUBMIT_LOGPROBS;
		s->top_logprobs = (uint32_t)top_lp;
		hr->n_top = (int)top_lp;
	}
	if ((v = field(body, "stop"))) {
		if (json_object_is_type(v, json_type_string)) {
			stops[0] = pstr(v);
			s->n_stops = 1;
		} else if (json_object_is_type(v, json_type_array) &&
			   json_object_array_length(v) <= PROTO_MAX_STOPS) {
			for (size_t i = 0; i < json_object_array_length(v); i++) {
				json_object *e = json_object_array_get_idx(v, i);
				if (!json_object_is_type(e, json_type_string))
					return bad(pe, "stop", "stop[%zu] must be a string", i);
				stops[s->n_stops++] = pstr(e);
			}
		} else {
			return bad(pe, "stop", "stop must be a string or a list of at most %d strings",
				   PROTO_MAX_STOPS);
		}
		for (uint32_t i = 0; i < s->n_stops; i++)
			if (stops[i].len == 0 || stops[i].len > PROTO_MAX_STOP_LEN)
				return bad(pe, "stop", "each stop string must have 1..%d bytes",
					   PROTO_MAX_STOP_LEN);
		s->stops = stops;
	}
	if (!hr->chat && (v = field(body, "echo")) && json_object_get_boolean(v))
		return bad(pe, "echo", "echo is not supported");
	if (!hr->chat && (v = field(body, "best_of")) && json_object_get_int64(v) > 1)
		return bad(pe, "best_of", "best_of must be 1");
	if (!hr->chat && (v = field(body, "suffix")) && json_object_get_string_len(v) > 0)
		return bad(pe, "suffix", "suffix (fill in the middle) is not supported");
	return 0;
}

/* What constrains the output: OpenAI's response_format (text, json_object,
 * json_schema with its schema and strict), or llama-server's extensions, a
 * GBNF "grammar" or a top-level "json_schema".  The schema goes on as text
 * (json-c's, valid while BODY lives); its compile errors come back from
 * server_make_request. */
static int parse_format(json_object *body, struct proto_submit *s, struct params_err *pe)
{
	json_object *rf = field(body, "response_format"), *g = field(body, "grammar"),
		    *js = field(body, "json_schema"), *schema = NULL, *v;
	int given = (rf != NULL) + (g != NULL) + (js != NULL), strict = 0;
	const char *type;

	if (given > 1)
		return bad(pe, rf ? "response_format" : "grammar",
			   "give one of response_format, grammar and json_schema");
	if (g) {
		if (!json_object_is_type(g, json_type_string) || json_object_get_string_len(g) == 0)
			return bad(pe, "grammar", "grammar must be GBNF text");
		s->grammar_kind = PROTO_GRAMMAR_GBNF;
		s->grammar = pstr(g);
	} else if (js) {
		schema = js;
	} else if (rf) {
		if (!json_object_is_type(rf, json_type_object) ||
		    !(v = field(rf, "type")) || !json_object_is_type(v, json_type_string))
			return bad(pe, "response_format", "response_format must be an object with a type");
		type = json_object_get_string(v);
		if (!strcmp(type, "text"))
			return 0;
		if (!strcmp(type, "json_object")) {
			/* llama-server's form: a schema right in response_format */
			if ((schema = field(rf, "schema")))
				goto schema;
			s->grammar_kind = PROTO_GRAMMAR_JSON_OBJECT;
		} else if (!strcmp(type, "json_schema")) {
			json_object *o = field(rf, "json_schema");
			if (!o || !json_object_is_type(o, json_type_object))
				return bad(pe, "response_format",
					   "response_format.json_schema must be an object with a schema");
			if (!(v = field(o, "name")) || !json_object_is_type(v, json_type_string))
				return bad(pe, "response_format", "response_format.json_schema.name must be "
					   "a string");
			if ((v = field(o, "strict"))) {
				if (!json_object_is_type(v, json_type_boolean))
					return bad(pe, "response_format",
						   "response_format.json_schema.strict must be a boolean");
				strict = json_object_get_boolean(v);
			}
			if (!(schema = field(o, "schema"))) /* OpenAI: no schema, any JSON */
				s->grammar_kind = PROTO_GRAMMAR_JSON_OBJECT;
		} else {
			return bad(pe, "response_format", "response_format.type '%s' is not text, "
				   "json_object or json_schema", type);
		}
	} else {
		return 0;
	}
schema:
	if (schema) {
		size_t len;
		const char *txt;
		if (!json_object_is_type(schema, json_type_object) &&
		    !json_object_is_type(schema, json_type_boolean))
			return bad(pe, js ? "json_schema" : "response_format",
				   "the JSON schema must be an object (or a boolean)");
		txt = json_object_to_json_string_length(schema, JSON_C_TO_STRING_PLAIN, &len);
		if (!txt)
			return bad(pe, js ? "json_schema" : "response_format", "out of memory");
		s->grammar_kind = PROTO_GRAMMAR_JSON_SCHEMA;
		s->grammar = (struct proto_str){ txt, (uint32_t)len };
		s->grammar_flags = strict ? PROTO_GRAMMAR_STRICT : 0;
	}
	if (s->grammar.len > PROTO_MAX_GRAMMAR)
		return bad(pe, g ? "grammar" : js ? "json_schema" : "response_format",
			   "the %s is %u bytes, over the limit of %u", g ? "grammar" : "schema",
			   s->grammar.len, PROTO_MAX_GRAMMAR);
	s->flags |= PROTO_SUBMIT_GRAMMAR;
	return 0;
}

/* Chat with tools: when the body offers tools, or its messages carry tool
 * calls or results, the conversation is rendered here through the
 * template's tool support (chat_render_json) and goes on as a plain
 * prompt; a required or named tool_choice adds the grammar of a call.
 * Returns 1 with *RET_PROMPT (malloc'd) and maybe *RET_GBNF set, 0 when
 * the request has nothing of tools (parse_messages takes it), -1 after
 * bad(). */
static int parse_tools(struct llmd *d, struct http_req *hr, json_object *body, struct proto_submit *s,
		       char **ret_prompt, char **ret_gbnf, struct params_err *pe)
{
	json_object *tools = field(body, "tools"), *ms = field(body, "messages"), *v, *msgs = NULL;
	enum toolcall_choice choice = TOOLCALL_AUTO;
	const char *name = NULL;
	int parallel = 1, uses = tools != NULL, rc;
	char err[400] = "";
	const struct chat_template *t = &hr->lm->model->chat;

	if (ms && json_object_is_type(ms, json_type_array))
		for (size_t i = 0; i < json_object_array_length(ms) && !uses; i++) {
			json_object *m = json_object_array_get_idx(ms, i), *r;
			uses = json_object_is_type(m, json_type_object) &&
			       (field(m, "tool_calls") || ((r = field(m, "role")) &&
							   json_object_is_type(r, json_type_string) &&
							   !strcmp(json_object_get_string(r), "tool")));
		}
	if (!uses) {
		if (field(body, "tool_choice"))
			return bad(pe, "tool_choice", "tool_choice needs tools");
		return 0;
	}
	if (tools && (!json_object_is_type(tools, json_type_array) || json_object_array_length(tools) == 0))
		return bad(pe, "tools", "tools must be a non-empty list of functions");
	if (tools && toolcall_tools_check(tools, err, sizeof err) < 0)
		return bad(pe, "tools", "%s", err);
	if (toolcall_choice_parse(field(body, "tool_choice"), &choice, &name, err, sizeof err) < 0)
		return bad(pe, "tool_choice", "%s", err);
	if (!tools && choice != TOOLCALL_AUTO && choice != TOOLCALL_NONE)
		return bad(pe, "tool_choice", "tool_choice needs tools");
	if (get_bool(body, "parallel_tool_calls", &parallel, pe) < 0)
		return -1;
	if (!(v = field(body, "parallel_tool_calls")))
		parallel = 1;
	if (!t->kind)
		return bad(pe, "messages", "model %s has no chat template llmd knows", hr->lm->name);
	if (!ms || !json_object_is_type(ms, json_type_array) || json_object_array_length(ms) == 0)
		return bad(pe, "messages", "messages must be a non-empty list");
	if (json_object_array_length(ms) > PROTO_MAX_MESSAGES)
		return bad(pe, "messages", "at most %d messages", PROTO_MAX_MESSAGES);
	/* OpenAI's "developer" is the templates' "system" */
	if (json_object_deep_copy(ms, &msgs, NULL) < 0)
		return bad(pe, "messages", "out of memory");
	for (size_t i = 0; i < json_object_array_length(msgs); i++) {
		json_object *m = json_object_array_get_idx(msgs, i), *r;
		if (!json_object_is_type(m, json_type_object) || !(r = field(m, "role")) ||
		    !json_object_is_type(r, json_type_string)) {
			json_object_put(msgs);
			return bad(pe, "messages", "messages[%zu] must be an object with a string role", i);
		}
		const char *role = json_object_get_string(r);
		if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") &&
		    strcmp(role, "assistant") && strcmp(role, "tool")) {
			int rb = bad(pe, "messages", "messages[%zu].role '%s' is not system, developer, user, "
				     "assistant or tool", i, role);
			json_object_put(msgs);
			return rb;
		}
		if (!strcmp(role, "developer"))
			json_object_object_add(m, "role", json_object_new_string("system"));
	}
	rc = chat_render_json(t, msgs, choice == TOOLCALL_NONE ? NULL : tools, 1, ret_prompt, err, sizeof err);
	json_object_put(msgs);
	if (rc < 0)
		return bad(pe, "messages", "%s", rc == -ENOMEM ? "out of memory" :
			   err[0] ? err : "the chat template cannot render this conversation");
	/* a forced call's grammar; with auto, GENERIC's answer (calls or a
	 * response) unless response_format asks for something else */
	if (choice == TOOLCALL_REQUIRED || choice == TOOLCALL_NAMED ||
	    (choice == TOOLCALL_AUTO && tools && t->tool_style == TOOLCALL_GENERIC &&
	     !(s->flags & PROTO_SUBMIT_GRAMMAR))) {
		if (s->flags & PROTO_SUBMIT_GRAMMAR) {
			free(*ret_prompt);
			*ret_prompt = NULL;
			return bad(pe, "tool_choice", "a required or named tool_choice constrains the output "
				   "itself: it does not go with response_format or grammar");
		}
		rc = toolcall_grammar(t->tool_style, tools, choice, name, parallel, ret_gbnf, err, sizeof err);
		if (rc < 0) {
			free(*ret_prompt);
			*ret_prompt = NULL;
			return bad(pe, rc == -EINVAL && name ? "tool_choice" : "tools", "%s",
				   rc == -ENOMEM ? "out of memory" : err);
		}
		s->flags |= PROTO_SUBMIT_GRAMMAR;
		s->grammar_kind = PROTO_GRAMMAR_GBNF;
		s->grammar_flags = 0;
		s->grammar = (struct proto_str){ *ret_gbnf, (uint32_t)strlen(*ret_gbnf) };
	}
	s->prompt = (struct proto_str){ *ret_prompt, (uint32_t)strlen(*ret_prompt) };
	hr->tools = tools && choice != TOOLCALL_NONE;
	hr->tool_style = t->tool_style;
	hr->tool_defs = hr->tools ? json_object_get(tools) : NULL;
	return 1;
}

/* ---- the model ---- */

/* The model a request's "model" names: a served model's name (the
 * default one also by its file's name less .gguf, its GGUF name or its
 * path); none or "" is the default model.  NULL when none is called that. */
static struct llmd_model *model_named(struct llmd *d, json_object *v)
{
	const char *name;
	struct llmd_model *lm;

	if (!v || !json_object_is_type(v, json_type_string) || !json_object_get_string_len(v))
		return llmd_model_find(d, NULL, 0);
	name = json_object_get_string(v);
	if ((lm = llmd_model_find(d, name, strlen(name))))
		return lm;
	if (!strcmp(name, d->http->model_id) || !strcmp(name, d->model->name) ||
	    !strcmp(name, d->model->path))
		return llmd_model_find(d, NULL, 0);
	return NULL;
}

/* Ollama's keep_alive: seconds (a number, or a string "30s", "5m",
 * "1h"), -1 (or any negative) for ever, 0 to unload when idle.  0 and the
 * seconds in *RET, or -1 (not one of those). */
static int parse_keep_alive(json_object *v, int32_t *ret)
{
	double x;
	char *end;

	if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
		x = json_object_get_double(v);
	} else if (json_object_is_type(v, json_type_string)) {
		const char *t = json_object_get_string(v);
		x = strtod(t, &end);
		if (end == t)
			return -1;
		if (!strcmp(end, "h"))
			x *= 3600;
		else if (!strcmp(end, "m"))
			x *= 60;
		else if (*end && strcmp(end, "s"))
			return -1;
	} else {
		return -1;
	}
	if (!(x == x))
		return -1;
	*ret = x < 0 ? -1 : x > (1 << 30) ? (1 << 30) : (int32_t)x;
	return 0;
}

/* Replies 404 for a model not served here, naming those that are. */
static void reply_no_model(struct llmd *d, struct evhttp_request *req, json_object *v)
{
	char names[512] = "";

	for (int i = 0; i < d->n_models; i++) {
		size_t l = strlen(names);
		snprintf(names + l, sizeof names - l, "%s'%s'", i ? ", " : "", d->models[i].name);
	}
	reply_error(d, req, 404, "model", "model_not_found",
		    "the model '%.100s' is not served here; GET /v1/models lists %s",
		    json_object_get_string(v), names);
}

/* ---- generating requests ---- */

static void on_request(struct evhttp_request *req, void *arg);
static void on_wake(evutil_socket_t fd, short what, void *arg);
static void on_client_gone(struct evhttp_connection *evcon, void *arg);
static void on_client_closed(evutil_socket_t fd, short what, void *arg);

/* Stops watching for the client's going: HR's answer is out, or it went. */
static void unwatch_client(struct http_req *hr)
{
	if (hr->evcon)
		evhttp_connection_set_closecb(hr->evcon, NULL, NULL);
	hr->evcon = NULL;
	if (hr->ev_closed)
		event_free(hr->ev_closed);
	hr->ev_closed = NULL;
}

/* Ends HR: its table entry goes (cancelling its engine request if it still
 * runs), its ring is unmapped, and HR is freed.  Its HTTP request must be
 * answered or gone already. */
static void req_end(struct http_req *hr)
{
	struct http_front *h = hr->d->http;

	unwatch_client(hr);
	if (hr->c)
		server_conn_remove(hr->d, hr->c);
	if (hr->ev_wake)
		event_free(hr->ev_wake);
	if (hr->wake_fd >= 0)
		close(hr->wake_fd);
	ring_free(hr->ring);
	if (hr->text)
		evbuffer_free(hr->text);
	if (hr->all)
		evbuffer_free(hr->all);
	json_object_put(hr->tool_defs);
	json_object_put(hr->lp);
	json_object_put(hr->ids);
	if (hr->prev)
		hr->prev->next = hr->next;
	else
		h->reqs = hr->next;
	if (hr->next)
		hr->next->prev = hr->prev;
	free(hr);
}

/* Makes HR's table entry, ring and wake channel, attached to the engine
 * thread.  0, or an HTTP status after replying. */
static int req_open(struct llmd *d, struct http_req *hr, const struct http_who *who)
{
	struct ring *prod = NULL;
	char err[256];
	int wake[2] = { -1, -1 }, dupfd, r;
	uint32_t code;
	struct conn *c = calloc(1, sizeof *c);

	if (!c) {
		reply_error(d, hr->req, 500, NULL, NULL, "out of memory");
		return 500;
	}
	c->fd = -1;
	c->uid = who->uid;
	c->gid = who->gid;
	c->pid = who->pid;
	c->http = 1;
	snprintf(c->comm, sizeof c->comm, "%s", who->name);
	c->is_admin = who->admin_ok && admin_allowed(d, who->uid, who->gid);
	c->t_connect = c->t_frame = clock_s();
	if ((code = server_conn_add(d, c, err, sizeof err))) {
		free(c);
		d->refused[code]++;
		reply_error(d, hr->req, 429, NULL, "rate_limit_exceeded", "%s", err);
		return 429;
	}
	hr->c = c;
	c->state = CONN_READY;
	if (ring_create(HTTP_RING_BYTES, &prod, err, sizeof err) < 0 ||
	    (r = usock_wake_pair(wake)) < 0 || (dupfd = dup(ring_fd(prod))) < 0) {
		ring_free(prod);
		if (wake[0] >= 0) {
			close(wake[0]);
			close(wake[1]);
		}
		reply_error(d, hr->req, 500, NULL, NULL, "cannot make the request's ring");
		return 500;
	}
	r = ring_attach(dupfd, &hr->ring, err, sizeof err);
	close(dupfd);
	hr->wake_fd = wake[1];
	hr->ev_wake = event_new(d->base, wake[1], EV_READ | EV_PERSIST, on_wake, hr);
	if (r < 0 || !hr->ev_wake || event_add(hr->ev_wake, NULL) < 0) {
		ring_free(prod);
		close(wake[0]);
		reply_error(d, hr->req, 500, NULL, NULL, "cannot map the request's ring");
		return 500;
	}
	worker_attach(d->worker, c->id, prod, wake[0]); /* the worker owns both now */
	return 0;
}

/* Who is asking on the Unix socket: the peer's credentials. */
static void peer_of(struct evhttp_request *req, struct http_who *w)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
	int fd = bev ? bufferevent_getfd(bev) : -1;
	char comm[20] = "?", path[64];
	FILE *f;

	w->uid = (uid_t)-1;
	w->gid = (gid_t)-1;
	w->pid = 0;
	w->admin_ok = 0;
	if (fd >= 0 && usock_peercred(fd, &w->pid, &w->uid, &w->gid) == 0) {
		w->admin_ok = 1;
		snprintf(path, sizeof path, "/proc/%d/comm", (int)w->pid);
		if ((f = fopen(path, "r"))) {
			if (fgets(comm, sizeof comm, f))
				comm[strcspn(comm, "\n")] = 0;
			fclose(f);
		}
	}
	snprintf(w->name, sizeof w->name, "http:%s", comm);
}

/* Over TCP, the request's key ("Authorization: Bearer KEY"): 0 with W,
 * or -1 after a 401.  Every key is compared in full, so that the time
 * taken says nothing of how much of one matched. */
static int key_of(struct llmd *d, struct evhttp_request *req, struct http_who *w)
{
	struct http_front *h = d->http;
	const char *a = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	int found = -1;

	if (a && !strncasecmp(a, "Bearer ", 7)) {
		const char *k = a + 7;
		size_t kl = strlen(k);
		for (int i = 0; i < h->n_keys; i++) {
			const char *key = h->keys[i].key;
			size_t n = strlen(key);
			unsigned diff = (unsigned)(n ^ kl);
			for (size_t j = 0; j < n; j++)
				diff |= (unsigned char)key[j] ^ (unsigned char)(j < kl ? k[j] : 0);
			if (!diff && found < 0)
				found = i;
		}
	}
	if (found < 0) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
		reply_error(d, req, 401, NULL, "invalid_api_key", "%s",
			    a ? "the API key is not one of http.keys_file's"
			      : "requests over TCP need an API key (Authorization: Bearer KEY)");
		return -1;
	}
	w->uid = (uid_t)(HTTP_KEY_UID_BASE + (unsigned)found);
	w->gid = (gid_t)-1;
	w->pid = 0;
	w->admin_ok = 0;
	snprintf(w->name, sizeof w->name, "key:%s", h->keys[found].name);
	return 0;
}

static void handle_generate(struct llmd *d, struct evhttp_request *req, int chat,
			    const struct http_who *who)
{
	struct http_front *h = d->http;
	struct proto_message msgs[PROTO_MAX_MESSAGES];
	struct proto_str stops[PROTO_MAX_STOPS];
	struct proto_submit s = { 0 };
	struct params_err pe = { 0 };
	struct worker_req *wr = NULL;
	char msg[PROTO_MAX_ERRMSG + 1];
	uint32_t code;
	json_object *body, *keep, *v;
	struct http_req *hr;
	char *tool_prompt = NULL, *tool_gbnf = NULL;
	int rt = 0;

	if (!(body = read_body(d, req)))
		return;
	v = field(body, "model");
	if (!model_named(d, v)) {
		reply_no_model(d, req, v);
		json_object_put(body);
		return;
	}
	hr = calloc(1, sizeof *hr);
	keep = json_object_new_array();
	if (!hr || !keep) {
		free(hr);
		json_object_put(keep);
		json_object_put(body);
		reply_error(d, req, 500, NULL, NULL, "out of memory");
		return;
	}
	hr->d = d;
	hr->req = req;
	hr->lm = model_named(d, v);
	if ((v = field(body, "keep_alive"))) {
		int32_t ka;
		if (parse_keep_alive(v, &ka) < 0) {
			reply_error(d, req, 400, "keep_alive", NULL, "keep_alive must be seconds (a number, "
				    "or \"30s\", \"5m\", \"1h\"), -1 to keep the model loaded, 0 to unload it "
				    "when idle");
			goto out;
		}
		if (!hr->lm->pinned && hr->lm->index != 0)
			hr->lm->keep_alive_s = ka; /* Ollama's: the last request's counts */
	}
	hr->chat = chat;
	hr->wake_fd = -1;
	hr->created = (int64_t)time(NULL);
	if (parse_common(d, hr, body, &s, stops, &pe) < 0 || parse_format(body, &s, &pe) < 0 ||
	    (chat && (rt = parse_tools(d, hr, body, &s, &tool_prompt, &tool_gbnf, &pe)) < 0) ||
	    (rt == 0 && (chat ? parse_messages(body, keep, &s, msgs, &pe) : parse_prompt(body, &s, &pe)) < 0)) {
		reply_error(d, req, 400, pe.param[0] ? pe.param : NULL, NULL, "%s", pe.msg);
		goto out;
	}
	s.id = ++h->next_id;
	s.flags |= PROTO_SUBMIT_MODEL;
	s.model = (struct proto_str){ hr->lm->name, (uint32_t)strlen(hr->lm->name) };
	snprintf(hr->id, sizeof hr->id, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
		 (unsigned long long)clock_us(), (unsigned long long)s.id & 0xffffff);
	if ((!hr->stream && !(hr->text = evbuffer_new())) || (hr->stream && hr->tools && !(hr->all = evbuffer_new()))) {
		reply_error(d, req, 500, NULL, NULL, "out of memory");
		goto out;
	}
	/* the list first, so that req_end can unlink it */
	hr->next = h->reqs;
	if (h->reqs)
		h->reqs->prev = hr;
	h->reqs = hr;
	if (req_open(d, hr, who)) {
		hr->req = NULL;
		req_end(hr);
		hr = NULL;
		goto out;
	}
	code = server_make_request(d, hr->c, &s, &wr, msg, sizeof msg);
	if (!code)
		code = server_post_request(d, hr->c, wr, msg, sizeof msg);
	if (code) {
		if (code < PROTO_E__MAX)
			d->refused[code]++;
		reply_error(d, req, status_of(code), NULL, status_of(code) == 429 ? "rate_limit_exceeded" : NULL,
			    "%s", msg);
		hr->req = NULL;
		req_end(hr);
		hr = NULL;
		goto out;
	}
	hr->evcon = evhttp_request_get_connection(req);
	evhttp_connection_set_closecb(hr->evcon, on_client_gone, hr);
	struct bufferevent *bev = evhttp_connection_get_bufferevent(hr->evcon);
	if (bev && bufferevent_getfd(bev) >= 0 &&
	    (hr->ev_closed = event_new(d->base, bufferevent_getfd(bev), EV_CLOSED, on_client_closed, hr)))
		event_add(hr->ev_closed, NULL);
	hr = NULL; /* it lives on: the ring's records answer it */
out:
	if (hr) {
		json_object_put(hr->lp);
		json_object_put(hr->tool_defs);
		if (hr->text)
			evbuffer_free(hr->text);
		if (hr->all)
			evbuffer_free(hr->all);
		free(hr);
	}
	free(tool_prompt);
	free(tool_gbnf);
	json_object_put(keep);
	json_object_put(body);
}

/* The client closed its connection: its request is cancelled (at the
 * engine's next step) and forgotten. */
static void on_client_gone(struct evhttp_connection *evcon, void *arg)
{
	struct http_req *hr = arg;
	(void)evcon;

	hr->req = NULL;
	hr->evcon = NULL;
	req_end(hr);
}

/* The client's socket closed while its request waited for the engine:
 * freeing the connection ends its HTTP request, and on_client_gone ours. */
static void on_client_closed(evutil_socket_t fd, short what, void *arg)
{
	struct http_req *hr = arg;
	struct evhttp_connection *evcon = hr->evcon;
	(void)fd;
	(void)what;

	if (evcon)
		evhttp_connection_free(evcon);
	else
		on_client_gone(NULL, hr);
}

static const char *finish_reason(uint32_t finish)
{
	return finish == PROTO_FIN_LENGTH ? "length" : "stop";
}

static json_object *usage_obj(const struct proto_final *f)
{
	json_object *u = json_object_new_object(), *det = json_object_new_object();

	json_object_object_add(u, "prompt_tokens", json_object_new_int64(f->prompt_tokens));
	json_object_object_add(u, "completion_tokens", json_object_new_int64(f->generated_tokens));
	json_object_object_add(u, "total_tokens",
			       json_object_new_int64((int64_t)f->prompt_tokens + f->generated_tokens));
	json_object_object_add(det, "cached_tokens", json_object_new_int64(f->cached_tokens));
	json_object_object_add(u, "prompt_tokens_details", det);
	return u;
}

/* The envelope both kinds of answer share. */
static json_object *answer_obj(struct http_req *hr, const char *object)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "id", json_object_new_string(hr->id));
	json_object_object_add(o, "object", json_object_new_string(object));
	json_object_object_add(o, "created", json_object_new_int64(hr->created));
	json_object_object_add(o, "model", json_object_new_string(hr->lm->name));
	json_object_object_add(o, "system_fingerprint", NULL);
	return o;
}

/* TEXT as a JSON string, and its bytes as OpenAI's "bytes" list: a
 * token's piece may be part of a character, and then the string has
 * U+FFFD where the bytes do not make one. */
static json_object *piece_str(const char *text, size_t len, json_object **bytes)
{
	char buf[3 * 256];
	size_t o = 0;

	if (bytes) {
		*bytes = json_object_new_array();
		for (size_t i = 0; i < len; i++)
			json_object_array_add(*bytes, json_object_new_int((unsigned char)text[i]));
	}
	if (utf8_valid(text, len))
		return jstr_n(text, len);
	for (size_t i = 0; i < len && o + 3 <= sizeof buf;) {
		size_t k = utf8_char_len((const uint8_t *)text + i, len - i);
		if (k) {
			memcpy(buf + o, text + i, k);
			o += k;
			i += k;
		} else {
			memcpy(buf + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	return jstr_n(buf, o);
}

/* Token ID's piece, as piece_str gives it. */
static json_object *token_str(struct http_req *hr, int32_t id, json_object **bytes)
{
	char piece[256];
	int n = tokenizer_piece(hr->lm->model->tok, id, 1, piece, sizeof piece);

	return piece_str(piece, n > 0 ? (size_t)(n < (int)sizeof piece ? n : (int)sizeof piece) : 0, bytes);
}

/* Adds a token to the logprobs being collected: chat's content entry
 * {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}, or the
 * completions' parallel lists (top_logprobs a {text: logprob} a token). */
static void add_logprob(struct http_req *hr, const struct proto_token *t)
{
	if (!hr->logprobs || t->token < 0)
		return;
	if (hr->chat) {
		json_object *e = json_object_new_object(), *bytes, *tops = json_object_new_array();
		if (!hr->lp)
			hr->lp = json_object_new_array();
		json_object_object_add(e, "token", piece_str(t->text.p, t->text.len, &bytes));
		json_object_object_add(e, "logprob", json_object_new_double(t->logprob));
		json_object_object_add(e, "bytes", bytes);
		for (uint32_t i = 0; i < t->n_top; i++) {
			json_object *a = json_object_new_object(), *ab;
			json_object_object_add(a, "token", token_str(hr, t->top_ids[i], &ab));
			json_object_object_add(a, "logprob", json_object_new_double(t->top_logprobs[i]));
			json_object_object_add(a, "bytes", ab);
			json_object_array_add(tops, a);
		}
		json_object_object_add(e, "top_logprobs", tops);
		json_object_array_add(hr->lp, e);
	} else {
		json_object *toks, *lps, *offs, *tops;
		if (!hr->lp) {
			hr->lp = json_object_new_object();
			json_object_object_add(hr->lp, "tokens", json_object_new_array());
			json_object_object_add(hr->lp, "token_logprobs", json_object_new_array());
			json_object_object_add(hr->lp, "top_logprobs",
					       hr->n_top ? json_object_new_array() : NULL);
			json_object_object_add(hr->lp, "text_offset", json_object_new_array());
		}
		json_object_object_get_ex(hr->lp, "tokens", &toks);
		json_object_object_get_ex(hr->lp, "token_logprobs", &lps);
		json_object_object_get_ex(hr->lp, "text_offset", &offs);
		json_object_array_add(toks, piece_str(t->text.p, t->text.len, NULL));
		json_object_array_add(lps, json_object_new_double(t->logprob));
		json_object_array_add(offs, json_object_new_int64((int64_t)hr->text_off));
		if (hr->n_top && json_object_object_get_ex(hr->lp, "top_logprobs", &tops) && tops) {
			json_object *m = json_object_new_object();
			for (uint32_t i = 0; i < t->n_top; i++) {
				json_object *k = token_str(hr, t->top_ids[i], NULL);
				json_object_object_add(m, json_object_get_string(k),
						       json_object_new_double(t->top_logprobs[i]));
				json_object_put(k);
			}
			json_object_array_add(tops, m);
		}
	}
	hr->text_off += t->text.len;
}

/* The logprobs collected since the last call, for a choice (and reset). */
static json_object *take_logprobs(struct http_req *hr)
{
	json_object *lp = hr->lp;

	if (!hr->logprobs)
		return NULL;
	hr->lp = NULL;
	if (hr->chat) {
		json_object *o = json_object_new_object();
		json_object_object_add(o, "content", lp ? lp : json_object_new_array());
		return o;
	}
	if (!lp) {
		lp = json_object_new_object();
		json_object_object_add(lp, "tokens", json_object_new_array());
		json_object_object_add(lp, "token_logprobs", json_object_new_array());
		json_object_object_add(lp, "top_logprobs", hr->n_top ? json_object_new_array() : NULL);
		json_object_object_add(lp, "text_offset", json_object_new_array());
	}
	return lp;
}

/* A choice: chat's message or delta, or the completion's text. */
static json_object *choice_obj(struct http_req *hr, const char *text, size_t len, int delta,
			       const char *finish)
{
	json_object *ch = json_object_new_object();

	json_object_object_add(ch, "index", json_object_new_int(0));
	if (hr->chat) {
		json_object *m = json_object_new_object();
		if (!delta || !hr->started)
			json_object_object_add(m, "role", json_object_new_string("assistant"));
		if (!delta || len || !finish)
			json_object_object_add(m, "content", jstr_n(text, len));
		json_object_object_add(ch, delta ? "delta" : "message", m);
	} else {
		json_object_object_add(ch, "text", jstr_n(text, len));
	}
	json_object_object_add(ch, "logprobs", take_logprobs(hr));
	if (hr->want_ids) {
		json_object_object_add(ch, "token_ids", hr->ids ? hr->ids : json_object_new_array());
		hr->ids = NULL;
	}
	json_object_object_add(ch, "finish_reason", finish ? json_object_new_string(finish) : NULL);
	return ch;
}

/* ---- tool calls in the output ---- */

/* A call's id: "call_" and 24 letters and digits, or 9 of them alone for
 * Mistral's templates, which refuse any other. */
static void call_id(const struct http_req *hr, char *out, size_t cap)
{
	static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	unsigned char r[24];
	int n = hr->tool_style == TOOLCALL_MISTRAL ? 9 : 24;
	size_t o = 0;

	if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
		uint64_t x = clock_us() ^ (uint64_t)(uintptr_t)hr;
		for (size_t i = 0; i < sizeof r; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
			r[i] = (unsigned char)(x >> 56);
	}
	if (n == 24)
		o = (size_t)snprintf(out, cap, "call_");
	for (int i = 0; i < n && o + 1 < cap; i++)
		out[o++] = an[r[i] % (sizeof an - 1)];
	out[o] = 0;
}

/* RES's calls as OpenAI's tool_calls list (a stream's deltas carry an
 * index each). */
static json_object *tool_calls_obj(const struct http_req *hr, const struct toolcall_result *res, int delta)
{
	json_object *a = json_object_new_array();

	for (int i = 0; i < res->n_calls; i++) {
		json_object *c = json_object_new_object(), *f = json_object_new_object();
		char id[40];
		call_id(hr, id, sizeof id);
		if (delta)
			json_object_object_add(c, "index", json_object_new_int(i));
		json_object_object_add(c, "id", json_object_new_string(id));
		json_object_object_add(c, "type", json_object_new_string("function"));
		json_object_object_add(f, "name", json_object_new_string(res->calls[i].name));
		json_object_object_add(f, "arguments", json_object_new_string(res->calls[i].arguments));
		json_object_object_add(c, "function", f);
		json_object_array_add(a, c);
	}
	return a;
}

/* The whole output TEXT parsed for calls into *RES (the text as content
 * when it cannot be parsed). */
static void tool_parse(const struct http_req *hr, const char *text, size_t len, struct toolcall_result *res)
{
	char err[200];

	memset(res, 0, sizeof *res);
	if (toolcall_parse(hr->tool_style, text, len, hr->tool_defs, res, err, sizeof err) < 0) {
		memset(res, 0, sizeof *res);
		log_msg(LOG_WARNING, "http: request %s: tool calls not parsed: %s", hr->id, err);
	}
}

/* Sends one server-sent event with OBJ (consumed), the 200 first. */
static void send_event(struct http_req *hr, json_object *obj)
{
	struct evbuffer *b = evbuffer_new();

	if (!hr->started) {
		struct evkeyvalq *hd = evhttp_request_get_output_headers(hr->req);
		evhttp_add_header(hd, "Content-Type", "text/event-stream");
		evhttp_add_header(hd, "Cache-Control", "no-cache");
		evhttp_send_reply_start(hr->req, 200, "OK");
		count_status(hr->d, 200);
	}
	if (b) {
		add_json(b, "data: ", obj, "\n\n");
		evhttp_send_reply_chunk(hr->req, b);
		evbuffer_free(b);
	}
	hr->started = 1;
	json_object_put(obj);
}

static void send_stream_text(struct http_req *hr, const char *text, size_t len);

/* Streams what the tool syntax lets out of the output so far: nothing
 * from where a call may begin (held back until the FINAL). */
static void send_stream_tools(struct http_req *hr, const char *text, size_t len)
{
	size_t total, safe;
	const char *all;

	evbuffer_add(hr->all, text, len);
	total = evbuffer_get_length(hr->all);
	all = total ? (const char *)evbuffer_pullup(hr->all, -1) : "";
	safe = toolcall_stream_safe(hr->tool_style, all, total);
	if (safe > hr->sent) {
		send_stream_text(hr, all + hr->sent, safe - hr->sent);
		hr->sent = safe;
	} else if ((hr->logprobs && hr->lp) || hr->ids) {
		send_stream_text(hr, "", 0);
	}
}

static void send_stream_text(struct http_req *hr, const char *text, size_t len)
{
	const char *object = hr->chat ? "chat.completion.chunk" : "text_completion";
	json_object *o = answer_obj(hr, object), *choices = json_object_new_array();

	json_object_array_add(choices, choice_obj(hr, text, len, 1, NULL));
	json_object_object_add(o, "choices", choices);
	send_event(hr, o);
}

/* The request's FINAL record: the answer's end, or its error.  HR's HTTP
 * request is answered and forgotten. */
static void finish_req(struct http_req *hr, const struct proto_final *f)
{
	struct evhttp_request *req = hr->req;
	const char *object = hr->chat ? (hr->stream ? "chat.completion.chunk" : "chat.completion")
				      : "text_completion";
	char msg[PROTO_MAX_ERRMSG + 1];

	/* answered below: the client going away no longer concerns us */
	unwatch_client(hr);
	snprintf(msg, sizeof msg, "%.*s", (int)f->message.len, f->message.p);
	if (f->finish == PROTO_FIN_ERROR || f->finish == PROTO_FIN_CANCELLED) {
		int status = f->finish == PROTO_FIN_CANCELLED ? 503 : status_of(f->code);
		if (f->finish == PROTO_FIN_CANCELLED && !msg[0])
			snprintf(msg, sizeof msg, "the request was cancelled (llmctl cancel, or llmd stopping)");
		if (!hr->started) {
			reply_error(hr->d, req, status, NULL, status == 429 ? "rate_limit_exceeded" : NULL,
				    "%s", msg);
		} else {
			struct evbuffer *b = evbuffer_new();
			json_object *e = error_obj(status, NULL, NULL, msg);
			if (b) {
				add_json(b, "data: ", e, "\n\ndata: [DONE]\n\n");
				evhttp_send_reply_chunk(req, b);
				evbuffer_free(b);
			}
			json_object_put(e);
			evhttp_send_reply_end(req);
		}
		return;
	}
	if (hr->stream) {
		json_object *o, *choices;
		struct evbuffer *b;
		const char *why = finish_reason(f->finish);
		if (hr->tools) {
			/* the held-back text: calls, or content after all */
			size_t total = evbuffer_get_length(hr->all);
			const char *all = total ? (const char *)evbuffer_pullup(hr->all, -1) : "";
			struct toolcall_result res;
			tool_parse(hr, all, total, &res);
			if (res.n_calls) {
				/* content the calls were written among, past what went out */
				if (res.content_len > hr->sent && !memcmp(res.content, all, hr->sent))
					send_stream_text(hr, res.content + hr->sent, res.content_len - hr->sent);
				o = answer_obj(hr, object);
				choices = json_object_new_array();
				json_object *ch = json_object_new_object(), *m = json_object_new_object();
				json_object_object_add(ch, "index", json_object_new_int(0));
				if (!hr->started)
					json_object_object_add(m, "role", json_object_new_string("assistant"));
				json_object_object_add(m, "tool_calls", tool_calls_obj(hr, &res, 1));
				json_object_object_add(ch, "delta", m);
				json_object_object_add(ch, "logprobs", NULL);
				json_object_object_add(ch, "finish_reason", NULL);
				json_object_array_add(choices, ch);
				json_object_object_add(o, "choices", choices);
				send_event(hr, o);
				if (f->finish == PROTO_FIN_STOP)
					why = "tool_calls";
			} else if (total > hr->sent) {
				send_stream_text(hr, all + hr->sent, total - hr->sent);
			}
			toolcall_result_clear(&res);
		}
		o = answer_obj(hr, object);
		choices = json_object_new_array();
		json_object_array_add(choices, choice_obj(hr, "", 0, 1, why));
		json_object_object_add(o, "choices", choices);
		send_event(hr, o);
		if (hr->include_usage) {
			o = answer_obj(hr, object);
			json_object_object_add(o, "choices", json_object_new_array());
			json_object_object_add(o, "usage", usage_obj(f));
			send_event(hr, o);
		}
		if ((b = evbuffer_new())) {
			evbuffer_add_printf(b, "data: [DONE]\n\n");
			evhttp_send_reply_chunk(req, b);
			evbuffer_free(b);
		}
		evhttp_send_reply_end(req);
		return;
	}
	json_object *o = answer_obj(hr, object), *choices = json_object_new_array();
	size_t len = evbuffer_get_length(hr->text);
	const char *text = len ? (const char *)evbuffer_pullup(hr->text, -1) : "";
	if (hr->tools) {
		struct toolcall_result res;
		tool_parse(hr, text, len, &res);
		if (res.n_calls) {
			json_object *ch = choice_obj(hr, res.content, res.content_len, 0,
						     f->finish == PROTO_FIN_STOP ? "tool_calls" : finish_reason(f->finish));
			json_object *m;
			json_object_object_get_ex(ch, "message", &m);
			if (!res.content_len)
				json_object_object_add(m, "content", NULL);
			json_object_object_add(m, "tool_calls", tool_calls_obj(hr, &res, 0));
			json_object_array_add(choices, ch);
			toolcall_result_clear(&res);
			json_object_object_add(o, "choices", choices);
			json_object_object_add(o, "usage", usage_obj(f));
			reply_json(hr->d, req, 200, o);
			return;
		}
		toolcall_result_clear(&res);
	}
	json_object_array_add(choices, choice_obj(hr, text, len, 0, finish_reason(f->finish)));
	json_object_object_add(o, "choices", choices);
	json_object_object_add(o, "usage", usage_obj(f));
	reply_json(hr->d, req, 200, o);
}

static void finish(struct http_req *hr, const struct proto_final *f)
{
	finish_req(hr, f);
	hr->req = NULL;
}

/* The engine wrote records: text goes out (a stream's as one event for
 * all the tokens since the last wake-up), the FINAL ends the request. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct http_req *hr = arg;
	struct ring_rec rec;
	struct evbuffer *chunk = NULL;
	int r, wake_producer = 0;
	(void)what;

	usock_wake_drain(fd);
	while ((r = ring_peek(hr->ring, &rec)) == 1) {
		if (rec.type == PROTO_REC_TOKEN) {
			struct proto_token t;
			if (proto_token_decode(rec.payload, rec.len, &t) == 0 && hr->req) {
				add_logprob(hr, &t);
				if (hr->want_ids && t.token >= 0) {
					if (!hr->ids)
						hr->ids = json_object_new_array();
					json_object_array_add(hr->ids, json_object_new_int(t.token));
				}
				if (hr->stream) {
					if (!chunk)
						chunk = evbuffer_new();
					if (chunk)
						evbuffer_add(chunk, t.text.p, t.text.len);
				} else {
					evbuffer_add(hr->text, t.text.p, t.text.len);
				}
			}
		} else if (rec.type == PROTO_REC_FINAL) {
			struct proto_final f;
			if (proto_final_decode(rec.payload, rec.len, &f) == 0 && hr->req) {
				if (chunk && evbuffer_get_length(chunk) && hr->tools)
					send_stream_tools(hr, (const char *)evbuffer_pullup(chunk, -1),
							  evbuffer_get_length(chunk));
				else if (chunk && evbuffer_get_length(chunk))
					send_stream_text(hr, (const char *)evbuffer_pullup(chunk, -1),
							 evbuffer_get_length(chunk));
				if (chunk)
					evbuffer_free(chunk);
				chunk = NULL;
				finish(hr, &f);
			}
			ring_consume(hr->ring);
			req_end(hr);
			return;
		}
		wake_producer |= ring_consume(hr->ring);
	}
	if (chunk) {
		if (evbuffer_get_length(chunk) && hr->req && hr->tools)
			send_stream_tools(hr, (const char *)evbuffer_pullup(chunk, -1), evbuffer_get_length(chunk));
		else if (evbuffer_get_length(chunk) && hr->req)
			send_stream_text(hr, (const char *)evbuffer_pullup(chunk, -1), evbuffer_get_length(chunk));
		else if (((hr->logprobs && hr->lp) || hr->ids) && hr->req)
			send_stream_text(hr, "", 0);
		evbuffer_free(chunk);
	}
	if (wake_producer)
		worker_ring_wake(hr->d->worker);
	if (r < 0) {
		log_msg(LOG_ERR, "http: request %s: the engine wrote a malformed record", hr->id);
		if (hr->req) {
			struct evhttp_request *req = hr->req;
			hr->req = NULL;
			if (hr->started)
				evhttp_send_reply_end(req);
			else
				reply_error(hr->d, req, 500, NULL, NULL, "internal error: a malformed record");
		}
		req_end(hr);
	}
}

static void handle_chat(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	handle_generate(d, req, 1, who);
}

static void handle_completions(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	handle_generate(d, req, 0, who);
}

/* ---- the other endpoints ---- */

static void handle_models(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	(void)who;
	json_object *o = json_object_new_object(), *list = json_object_new_array();

	for (int i = 0; i < d->n_models; i++) {
		const struct llmd_model *lm = &d->models[i];
		json_object *m = json_object_new_object();
		json_object_object_add(m, "id", json_object_new_string(lm->name));
		json_object_object_add(m, "object", json_object_new_string("model"));
		json_object_object_add(m, "created", json_object_new_int64(d->http->created));
		json_object_object_add(m, "owned_by", json_object_new_string("llmd"));
		json_object_object_add(m, "name", json_object_new_string(lm->model->name));
		json_object_object_add(m, "n_ctx",
				       json_object_new_int(lm->n_ctx));
		json_object_object_add(m, "default", json_object_new_boolean(i == 0));
		json_object_array_add(list, m);
	}
	json_object_object_add(o, "object", json_object_new_string("list"));
	json_object_object_add(o, "data", list);
	reply_json(d, req, 200, o);
}

static void handle_health(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	(void)who;
	json_object *o = json_object_new_object();
	const char *state = d->fatal ? "failed" : d->stopping ? "stopping" : d->draining ? "draining" : "ok";

	json_object_object_add(o, "status", json_object_new_string(state));
	if (!strcmp(state, "ok"))
		reply_json(d, req, 200, o);
	else {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "5");
		reply_json(d, req, 503, o);
	}
}

/* Prometheus text: llmctl stats --prometheus's (admin.c renders it), with
 * the HTTP front's own counters. */
static void handle_metrics(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	(void)who;
	struct conn me = { .uid = (uid_t)-1, .gid = (gid_t)-1 };
	struct proto_admin a = { { "stats", 5 }, { "prometheus", 10 } };
	char *body = NULL;
	uint32_t code = admin_run(d, &me, &a, &body);
	json_object *j = code == 0 && body ? json_tokener_parse(body) : NULL, *text = NULL;
	struct evbuffer *b = evbuffer_new();
	struct http_front *h = d->http;
	int live = 0;

	free(body);
	if (!j || !b || !json_object_object_get_ex(j, "prometheus", &text)) {
		json_object_put(j);
		if (b)
			evbuffer_free(b);
		reply_error(d, req, 500, NULL, NULL, "cannot collect the counters");
		return;
	}
	evbuffer_add(b, json_object_get_string(text), (size_t)json_object_get_string_len(text));
	json_object_put(j);
	count_status(d, 200);
	evbuffer_add_printf(b, "# TYPE llmd_http_requests_total counter\nllmd_http_requests_total %llu\n",
			    (unsigned long long)h->requests_total);
	evbuffer_add_printf(b, "# TYPE llmd_http_responses_total counter\n");
	for (int i = 1; i < 6; i++)
		evbuffer_add_printf(b, "llmd_http_responses_total{class=\"%dxx\"} %llu\n", i,
				    (unsigned long long)h->by_status[i]);
	for (struct http_req *r = h->reqs; r; r = r->next)
		live++;
	evbuffer_add_printf(b, "# TYPE llmd_http_requests_live gauge\nllmd_http_requests_live %d\n", live);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4");
	evhttp_send_reply(req, 200, "OK", b);
	evbuffer_free(b);
}

/* llama-server's shapes: {"content", "add_special"} -> {"tokens"}. */
static void handle_tokenize(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	(void)who;
	json_object *body = read_body(d, req), *c, *o, *list;
	struct params_err pe = { 0 };
	int add_special = 0, n;
	int32_t *ids;

	if (!body)
		return;
	if (!(c = field(body, "content")) || !json_object_is_type(c, json_type_string)) {
		reply_error(d, req, 400, "content", NULL, "content must be a string");
		json_object_put(body);
		return;
	}
	if (get_bool(body, "add_special", &add_special, &pe) < 0) {
		reply_error(d, req, 400, pe.param[0] ? pe.param : NULL, NULL, "%s", pe.msg);
		json_object_put(body);
		return;
	}
	if (json_object_get_string_len(c) > d->cfg.prompt_bytes) {
		reply_error(d, req, 413, "content", NULL, "content is %d bytes, over the limit of %d "
			    "(limits.prompt_bytes)", json_object_get_string_len(c), d->cfg.prompt_bytes);
		json_object_put(body);
		return;
	}
	struct llmd_model *lm = model_named(d, field(body, "model"));
	if (!lm) {
		reply_no_model(d, req, field(body, "model"));
		json_object_put(body);
		return;
	}
	const struct tokenizer *tok = lm->model->tok;
	const char *text = json_object_get_string(c);
	size_t len = (size_t)json_object_get_string_len(c);
	int add_bos = add_special && tokenizer_add_bos(tok);
	n = tokenizer_encode(tok, text, len, add_bos, add_special, NULL, 0);
	ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
	if (n < 0 || (n > 0 && !ids)) {
		free(ids);
		reply_error(d, req, 500, NULL, NULL, "cannot tokenize");
		json_object_put(body);
		return;
	}
	if (n > 0)
		n = tokenizer_encode(tok, text, len, add_bos, add_special, ids, n);
	o = json_object_new_object();
	list = json_object_new_array_ext(n > 0 ? n : 1);
	for (int i = 0; i < n; i++)
		json_object_array_add(list, json_object_new_int(ids[i]));
	json_object_object_add(o, "tokens", list);
	free(ids);
	json_object_put(body);
	reply_json(d, req, 200, o);
}

/* {"tokens": [ids]} -> {"content"}. */
static void handle_detokenize(struct llmd *d, struct evhttp_request *req, const struct http_who *who)
{
	(void)who;
	json_object *body = read_body(d, req), *t;
	const struct tokenizer *tok;
	int32_t n_vocab;
	struct llmd_model *lm;
	struct detok dt = { 0 };
	struct evbuffer *out;
	char piece[512];
	size_t n;

	if (!body)
		return;
	if (!(lm = model_named(d, field(body, "model")))) {
		reply_no_model(d, req, field(body, "model"));
		json_object_put(body);
		return;
	}
	tok = lm->model->tok;
	n_vocab = lm->n_vocab;
	if (!(t = field(body, "tokens")) || !json_object_is_type(t, json_type_array)) {
		reply_error(d, req, 400, "tokens", NULL, "tokens must be a list of token ids");
		json_object_put(body);
		return;
	}
	n = json_object_array_length(t);
	if (n > HTTP_MAX_TOKENIZE) {
		reply_error(d, req, 413, "tokens", NULL, "at most %d tokens", HTTP_MAX_TOKENIZE);
		json_object_put(body);
		return;
	}
	out = evbuffer_new();
	for (size_t i = 0; out && i < n; i++) {
		json_object *e = json_object_array_get_idx(t, i);
		int64_t id = json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
		int k;
		if (id < 0 || id >= n_vocab) {
			reply_error(d, req, 400, "tokens", NULL, "tokens[%zu] is not a token id in 0..%d", i,
				    n_vocab - 1);
			evbuffer_free(out);
			json_object_put(body);
			return;
		}
		k = detok_push(tok, &dt, (int32_t)id, 1, piece, sizeof piece);
		if (k > 0)
			evbuffer_add(out, piece, (size_t)k);
	}
	if (!out) {
		reply_error(d, req, 500, NULL, NULL, "out of memory");
		json_object_put(body);
		return;
	}
	int k = detok_flush(&dt, piece, sizeof piece);
	if (k > 0)
		evbuffer_add(out, piece, (size_t)k);
	json_object *o = json_object_new_object();
	json_object_object_add(o, "content", jstr_n((const char *)evbuffer_pullup(out, -1),
						    evbuffer_get_length(out)));
	evbuffer_free(out);
	json_object_put(body);
	reply_json(d, req, 200, o);
}

/* ---- routing ---- */

static void on_request(struct evhttp_request *req, void *arg)
{
	struct http_listener *l = arg;
	struct llmd *d = l->d;
	struct http_who who;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	static const struct {
		const char *path;
		enum evhttp_cmd_type cmd;
		int draining_ok;          /* answered while draining */
		void (*fn)(struct llmd *d, struct evhttp_request *req, const struct http_who *who);
	} routes[] = {
		{ "/v1/chat/completions", EVHTTP_REQ_POST, 0, handle_chat },
		{ "/v1/completions", EVHTTP_REQ_POST, 0, handle_completions },
		{ "/v1/models", EVHTTP_REQ_GET, 1, handle_models },
		{ "/health", EVHTTP_REQ_GET, 1, handle_health },
		{ "/metrics", EVHTTP_REQ_GET, 1, handle_metrics },
		{ "/tokenize", EVHTTP_REQ_POST, 1, handle_tokenize },
		{ "/detokenize", EVHTTP_REQ_POST, 1, handle_detokenize },
	};
	size_t i;

	if (!path)
		path = "";
	for (i = 0; i < sizeof routes / sizeof routes[0]; i++)
		if (!strcmp(path, routes[i].path) ||
		    (!strncmp(routes[i].path, "/v1/", 4) && !strcmp(path, routes[i].path + 3)))
			break;
	if (i == sizeof routes / sizeof routes[0]) {
		reply_error(d, req, 404, NULL, "unknown_url", "no such endpoint: %s %s",
			    cmd == EVHTTP_REQ_GET ? "GET" : cmd == EVHTTP_REQ_POST ? "POST" : "?", path);
		return;
	}
	if (cmd != routes[i].cmd) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
				  routes[i].cmd == EVHTTP_REQ_GET ? "GET" : "POST");
		reply_error(d, req, 405, NULL, "method_not_allowed", "%s takes %s", routes[i].path,
			    routes[i].cmd == EVHTTP_REQ_GET ? "GET" : "POST");
		return;
	}
	if (l->tcp ? key_of(d, req, &who) < 0 : (peer_of(req, &who), 0))
		return;
	if (d->draining && !routes[i].draining_ok) {
		reply_error(d, req, 503, NULL, "draining", "%s",
			    d->stopping ? "llmd is shutting down" : "llmd is draining: not taking new requests");
		return;
	}
	routes[i].fn(d, req, &who);
}

/* ---- lifecycle ---- */

void http_socket_path(const struct llmd_conf *cfg, char *out, size_t len)
{
	size_t n = strlen(cfg->socket_path);

	if (!strcmp(cfg->http_socket, "off") || !cfg->http_socket[0])
		snprintf(out, len, "%s", "");
	else if (strcmp(cfg->http_socket, "auto"))
		snprintf(out, len, "%s", cfg->http_socket);
	else if (n > 5 && !strcmp(cfg->socket_path + n - 5, ".sock"))
		snprintf(out, len, "%.*s-http.sock", (int)(n - 5), cfg->socket_path);
	else
		snprintf(out, len, "%s-http", cfg->socket_path);
}

/* Reads [http] keys_file: "NAME KEY" a line ('#' comments), a file only
 * its owner (root or llmd's user) may read. */
static int read_keys(struct http_front *h, const char *path, char *err, size_t errlen)
{
	struct stat st;
	char line[512];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), lineno = 0;
	FILE *f;

	if (fd < 0 || fstat(fd, &st) < 0) {
		snprintf(err, errlen, "http.keys_file %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || (st.st_uid != 0 && st.st_uid != geteuid())) {
		snprintf(err, errlen, "http.keys_file %s must be a file only its owner (root or llmd's "
			 "user) can read or write: chmod 600 it (mode now %04o)", path,
			 (unsigned)(st.st_mode & 07777));
		close(fd);
		return -EPERM;
	}
	if (!(f = fdopen(fd, "r"))) {
		close(fd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	while (fgets(line, sizeof line, f)) {
		char *name, *key, *extra, *save = NULL;
		lineno++;
		line[strcspn(line, "#\r\n")] = 0;
		if (!(name = strtok_r(line, " \t", &save)))
			continue;
		key = strtok_r(NULL, " \t", &save);
		extra = key ? strtok_r(NULL, " \t", &save) : NULL;
		if (!key || extra || strlen(name) >= sizeof h->keys[0].name ||
		    strlen(key) >= sizeof h->keys[0].key || strlen(key) < 16) {
			snprintf(err, errlen, "%s:%d: expected NAME KEY (a name of at most 27 bytes, a key "
				 "of 16 to 255 bytes)", path, lineno);
			fclose(f);
			return -EINVAL;
		}
		if (h->n_keys == HTTP_MAX_KEYS) {
			snprintf(err, errlen, "%s: more than %d keys", path, HTTP_MAX_KEYS);
			fclose(f);
			return -EINVAL;
		}
		struct http_key *k = realloc(h->keys, (size_t)(h->n_keys + 1) * sizeof *k);
		if (!k) {
			fclose(f);
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		h->keys = k;
		snprintf(k[h->n_keys].name, sizeof k->name, "%s", name);
		snprintf(k[h->n_keys].key, sizeof k->key, "%s", key);
		h->n_keys++;
	}
	fclose(f);
	if (!h->n_keys) {
		snprintf(err, errlen, "http.keys_file %s has no keys", path);
		return -EINVAL;
	}
	return 0;
}

static int listener_init(struct llmd *d, struct http_listener *l, int tcp)
{
	l->d = d;
	l->tcp = tcp;
	if (!(l->eh = evhttp_new(d->base)))
		return -ENOMEM;
	evhttp_set_max_body_size(l->eh, (ev_ssize_t)d->cfg.http_max_body_kib * 1024);
	evhttp_set_max_headers_size(l->eh, HTTP_MAX_HEADERS);
	evhttp_set_timeout(l->eh, d->cfg.http_timeout_s);
	evhttp_set_allowed_methods(l->eh, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
					  EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
	evhttp_set_default_content_type(l->eh, "application/json");
	evhttp_set_gencb(l->eh, on_request, l);
	return 0;
}

/* HOST:PORT, [V6]:PORT or PORT (loopback). */
static int parse_listen(const char *s, char *host, size_t hlen, uint16_t *port)
{
	const char *colon = strrchr(s, ':');
	const char *p = colon ? colon + 1 : s;
	char *end;
	long v;

	errno = 0;
	v = strtol(p, &end, 10);
	if (errno || end == p || *end || v < 1 || v > 65535)
		return -EINVAL;
	*port = (uint16_t)v;
	if (!colon) {
		snprintf(host, hlen, "127.0.0.1");
		return 0;
	}
	if (s[0] == '[' && colon > s + 1 && colon[-1] == ']')
		snprintf(host, hlen, "%.*s", (int)(colon - s - 2), s + 1);
	else
		snprintf(host, hlen, "%.*s", (int)(colon - s), s);
	return host[0] ? 0 : -EINVAL;
}

int http_start(struct llmd *d, int fd, char *err, size_t errlen)
{
	struct http_front *h = calloc(1, sizeof *h);
	const char *base;
	size_t n;

	if (!h) {
		if (fd >= 0)
			close(fd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	d->http = h;
	h->created = (int64_t)time(NULL);
	base = strrchr(d->model->path, '/');
	base = base ? base + 1 : d->model->path;
	snprintf(h->model_id, sizeof h->model_id, "%s", base);
	n = strlen(h->model_id);
	if (n > 5 && !strcmp(h->model_id + n - 5, ".gguf"))
		h->model_id[n - 5] = 0;
	if (fd >= 0) {
		if (listener_init(d, &h->unix_l, 0) < 0 ||
		    !(h->unix_l.bound = evhttp_accept_socket_with_handle(h->unix_l.eh, fd))) {
			close(fd);
			snprintf(err, errlen, "evhttp cannot accept on the socket");
			return -ENOMEM;
		}
	}
	if (d->cfg.http_listen[0]) {
		char host[256];
		uint16_t port;
		int r;
		if (parse_listen(d->cfg.http_listen, host, sizeof host, &port) < 0) {
			snprintf(err, errlen, "http.listen: '%s' is not PORT, HOST:PORT or [IPV6]:PORT",
				 d->cfg.http_listen);
			return -EINVAL;
		}
		if (!d->cfg.http_keys_file[0]) {
			snprintf(err, errlen, "http.listen needs http.keys_file: every request over TCP "
				 "must carry a key");
			return -EINVAL;
		}
		if ((r = read_keys(h, d->cfg.http_keys_file, err, errlen)) < 0)
			return r;
		if (listener_init(d, &h->tcp_l, 1) < 0) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		if (!(h->tcp_l.bound = evhttp_bind_socket_with_handle(h->tcp_l.eh, host, port))) {
			snprintf(err, errlen, "http.listen: cannot listen on %s port %u: %s", host,
				 (unsigned)port, strerror(errno));
			return -EADDRINUSE;
		}
	}
	return 0;
}

void http_stop_listening(struct llmd *d)
{
	struct http_front *h = d->http;

	if (!h)
		return;
	for (int i = 0; i < 2; i++) {
		struct http_listener *l = i ? &h->tcp_l : &h->unix_l;
		if (l->bound)
			evhttp_del_accept_socket(l->eh, l->bound); /* closes the fd */
		l->bound = NULL;
	}
	if (d->http_socket_path[0]) {
		unlink(d->http_socket_path);
		d->http_socket_path[0] = 0;
	}
}

void http_stop(struct llmd *d)
{
	struct http_front *h = d->http;

	if (!h)
		return;
	http_stop_listening(d);
	while (h->reqs) {
		struct http_req *hr = h->reqs;
		if (hr->req) {
			struct evhttp_request *req = hr->req;
			hr->req = NULL;
			if (hr->started)
				evhttp_send_reply_end(req);
			else
				reply_error(d, req, 503, NULL, "shutting_down", "llmd is shutting down");
		}
		req_end(hr);
	}
	if (h->unix_l.eh)
		evhttp_free(h->unix_l.eh);
	if (h->tcp_l.eh)
		evhttp_free(h->tcp_l.eh);
	explicit_bzero(h->keys, (size_t)h->n_keys * sizeof *h->keys);
	free(h->keys);
	free(h);
	d->http = NULL;
}
