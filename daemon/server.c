/* server.c - connections on the event-loop thread: accept, HELLO/WELCOME
 * with the ring, SUBMIT validation and limits, tokenizing, CANCEL, and the
 * engine thread's notes.  A malformed frame closes only its connection; a
 * refused request gets an ERROR frame with a code.  It never computes and
 * never touches the scheduler: that is the worker's.
 */
#include "server.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <syslog.h>
#include <unistd.h>

#include "admin.h"
#include "chat.h"
#include "clock.h"
#include "constrain.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "models.h"
#include "ring.h"
#include "sampler.h"
#include "stopstr.h"
#include "tokenizer.h"
#include "usock.h"
#include "utf8.h"
#include "worker.h"

/* a SUBMIT's max_draft is the scheduler's per-request bound as is */
_Static_assert(PROTO_MAX_DRAFT == SCHED_SPEC_MAX_DRAFT, "PROTO_MAX_DRAFT");

/* Every stop string a SUBMIT can carry, the engine takes. */
_Static_assert(STOPSTR_MAX == PROTO_MAX_STOPS && STOPSTR_MAX_LEN == PROTO_MAX_STOP_LEN,
	       "stopstr.h and proto.h must agree on stop strings");
_Static_assert(SAMPLER_MAX_TOP == PROTO_MAX_TOP_LOGPROBS,
	       "sampler.h and proto.h must agree on the alternatives a token carries");

#define FRAMES_PER_EVENT 64          /* work cap per read event */
#define READ_AHEAD (64u << 10)       /* input buffered beyond the frame being read */
#define CLOSE_LINGER_S 5.0           /* a closing connection that will not take its ERROR */
#define TRIM_BYTES (4u << 20)        /* freed buffers worth giving back to the system */

static void conn_close(struct llmd *d, struct conn *c);

/* ---- per-uid accounting ---- */

static struct uid_use *uid_use(struct llmd *d, uid_t uid, int create)
{
	for (int32_t i = 0; i < d->n_uids; i++)
		if (d->uids[i].uid == uid)
			return &d->uids[i];
	if (!create)
		return NULL;
	if (d->n_uids == d->cap_uids) {
		int32_t cap = d->cap_uids ? d->cap_uids * 2 : 16;
		struct uid_use *p = realloc(d->uids, (size_t)cap * sizeof *p);
		if (!p)
			return NULL;
		d->uids = p;
		d->cap_uids = cap;
	}
	d->uids[d->n_uids] = (struct uid_use){ .uid = uid };
	return &d->uids[d->n_uids++];
}

static void uid_release(struct llmd *d, uid_t uid, int32_t conns, int32_t live)
{
	struct uid_use *u = uid_use(d, uid, 0);
	if (!u)
		return;
	u->conns -= conns;
	u->live -= live;
	if (u->conns <= 0 && u->live <= 0)
		*u = d->uids[--d->n_uids];
}

/* ---- sending ---- */

void server_send(struct conn *c, const void *frame, size_t len)
{
	if (c->bev && c->state != CONN_CLOSING)
		bufferevent_write(c->bev, frame, len);
}

static void on_write_done(struct bufferevent *bev, void *arg);
static void on_conn_event(struct bufferevent *bev, short what, void *arg);

void server_send_error(struct llmd *d, struct conn *c, uint64_t id, uint32_t code, int close,
		       const char *fmt, ...)
{
	char msg[PROTO_MAX_ERRMSG + 1];
	uint8_t buf[PROTO_HDR_SIZE + 16 + PROTO_MAX_ERRMSG];
	va_list ap;
	ssize_t n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	struct proto_error e = { .id = id, .code = code, .message = { msg, (uint32_t)strlen(msg) } };
	if (code < PROTO_E__MAX)
		d->refused[code]++;
	n = proto_encode_error(buf, sizeof buf, &e);
	if (n > 0)
		server_send(c, buf, (size_t)n);
	if (close && c->state != CONN_CLOSING) {
		c->state = CONN_CLOSING;
		c->t_closing = clock_s();
		/* Stop reading; close once the error is written (or at once if it was). */
		bufferevent_disable(c->bev, EV_READ);
		bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
		bufferevent_setcb(c->bev, NULL, on_write_done, on_conn_event, c);
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
			conn_close(d, c);
	}
}

/* ---- connections ---- */

static struct llmd *g_d; /* the one daemon; libevent callbacks get the conn */

void server_conn_remove(struct llmd *d, struct conn *c)
{
	uint32_t slot = c->id & 0xffff;

	if (c->state == CONN_READY || c->state == CONN_CLOSING)
		worker_detach(d->worker, c->id); /* harmless if never attached */
	uid_release(d, c->uid, 1, c->n_live);
	d->conns[slot] = NULL;
	d->n_conns--;
	free(c->live);
	free(c);
}

static void conn_close(struct llmd *d, struct conn *c)
{
	if (c->bev) {
		d->freed_bytes += evbuffer_get_length(bufferevent_get_output(c->bev)) +
				  evbuffer_get_length(bufferevent_get_input(c->bev));
		bufferevent_free(c->bev); /* closes the fd */
	}
	server_conn_remove(d, c);
}

static void on_write_done(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_close(g_d, c);
}

static void read_comm(pid_t pid, char *out, size_t len)
{
	char path[64];
	int fd;
	ssize_t n;

	snprintf(out, len, "?");
	snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, out, len - 1);
	close(fd);
	if (n <= 0) {
		snprintf(out, len, "?");
		return;
	}
	out[n] = 0;
	out[strcspn(out, "\n")] = 0;
}

/* ---- HELLO ---- */

static uint32_t ring_size_for(const struct llmd *d, uint32_t want)
{
	uint32_t max = (uint32_t)d->cfg.ring_max_kib * 1024u, size = RING_MIN_CAPACITY;
	if (want == 0)
		return (uint32_t)d->cfg.ring_kib * 1024u;
	if (want > max)
		return max;
	while (size < want)
		size <<= 1;
	return size;
}

static void handle_hello(struct llmd *d, struct conn *c, const struct proto_frame *f)
{
	struct proto_hello h;
	struct ring *ring = NULL;
	char err[256];
	int r, wake[2], fds[2];
	uint8_t buf[PROTO_HDR_SIZE + 64 + 3 * (4 + PROTO_MAX_NAME)];
	ssize_t n, sent;
	const struct model *m = d->model;
	const struct engine *e = worker_engine(d->worker);

	if (proto_decode_hello(f, &h) < 0) {
		d->bad_frames++;
		server_send_error(d, c, 0, PROTO_E_BADFRAME, 1, "malformed HELLO");
		return;
	}
	if (h.version != PROTO_VERSION) {
		server_send_error(d, c, 0, PROTO_E_VERSION, 1,
				  "protocol version %u is not supported (this llmd speaks %d)", h.version,
				  PROTO_VERSION);
		return;
	}
	if (ring_create(ring_size_for(d, h.ring_bytes), &ring, err, sizeof err) < 0) {
		server_send_error(d, c, 0, PROTO_E_INTERNAL, 1, "cannot create the ring: %s", err);
		return;
	}
	/* The client waits on its end of a wake channel; ours is a separate
	 * open file description it cannot make blocking or write to. */
	if ((r = usock_wake_pair(wake)) < 0) {
		ring_free(ring);
		server_send_error(d, c, 0, PROTO_E_INTERNAL, 1, "cannot create a wake channel: %s",
				  strerror(-r));
		return;
	}
	const char *tmpl = m->chat.kind ? chat_template_name(m->chat.kind) : "";
	struct proto_welcome w = {
		.version = PROTO_VERSION, .ring_bytes = ring_capacity(ring),
		.daemon_pid = (uint32_t)getpid(),
		.max_inflight = (uint32_t)d->cfg.requests_per_connection,
		.max_prompt_bytes = (uint32_t)d->cfg.prompt_bytes,
		.max_prompt_tokens = (uint32_t)(d->cfg.prompt_tokens && d->cfg.prompt_tokens < engine_n_ctx(e)
							? d->cfg.prompt_tokens : engine_n_ctx(e) - 1),
		.max_tokens = (uint32_t)d->cfg.max_tokens, .n_ctx = (uint32_t)engine_n_ctx(e),
		.n_vocab = (uint32_t)engine_n_vocab(e), .client_id = c->id,
		.model = { m->name, (uint32_t)strnlen(m->name, sizeof m->name) },
		.backend = { d->backend, (uint32_t)strlen(d->backend) },
		.chat_template = { tmpl, (uint32_t)strlen(tmpl) },
	};
	n = proto_encode_welcome(buf, sizeof buf, &w);
	fds[0] = ring_fd(ring);
	fds[1] = wake[1];
	/* WELCOME is the first thing we send, so the output buffer is empty and
	 * the fds can go straight out with its first byte. */
	sent = n > 0 ? usock_send(c->fd, buf, (size_t)n, fds, 2) : -EINVAL;
	close(wake[1]); /* the client's now (or nobody's) */
	if (sent <= 0) {
		ring_free(ring);
		close(wake[0]);
		if (sent == -EAGAIN || sent == -EINVAL)
			server_send_error(d, c, 0, PROTO_E_INTERNAL, 1, "cannot send WELCOME");
		else
			conn_close(d, c);
		return;
	}
	if (sent < n)
		bufferevent_write(c->bev, buf + sent, (size_t)(n - sent));
	c->state = CONN_READY;
	worker_attach(d->worker, c->id, ring, wake[0]); /* the worker owns both now */
}

/* ---- ADMIN ---- */

/* Runs an admin command (admin.c builds the answer) and sends its reply. */
static void send_admin_reply(struct llmd *d, struct conn *c, const struct proto_admin *a)
{
	char *body = NULL;
	uint32_t code = admin_run(d, c, a, &body);
	const char *text = body ? body : "out of memory";
	size_t len = strlen(text), cap = PROTO_HDR_SIZE + 12 + len;
	uint8_t *buf = malloc(cap);
	struct proto_admin_reply r = { .code = body ? code : PROTO_E_INTERNAL,
				       .body = { text, (uint32_t)len } };
	ssize_t n;

	if (buf && (n = proto_encode_admin_reply(buf, cap, &r)) > 0)
		server_send(c, buf, (size_t)n);
	free(buf);
	free(body);
}

/* ---- SUBMIT ---- */

/* Whether T (WHAT, number I when I >= 0) is valid UTF-8; else MSG names
 * the first bad byte's offset. */
static int text_utf8_ok(const char *what, int i, const struct proto_str *t, char *msg, size_t msglen)
{
	size_t bad = utf8_check(t->p, t->len);
	char num[16] = "";

	if (bad == t->len)
		return 1;
	if (i >= 0)
		snprintf(num, sizeof num, " %d", i);
	snprintf(msg, msglen, "%s%s is not valid UTF-8 at byte %zu (0x%02x)", what, num, bad,
		 (unsigned char)t->p[bad]);
	return 0;
}

/* The prompt text of S: the raw prompt, or the chat rendered with the
 * model's template.  Returns its length and a malloc'd string in *RET, or
 * -1 with an error code in *CODE and MSG. */
static ssize_t prompt_text(const struct model *m, const struct proto_submit *s, char **ret,
			   uint32_t *code, char *msg, size_t msglen)
{
	static const char *const roles[] = { NULL, "system", "user", "assistant" };
	struct chat_msg *msgs;
	size_t total = 0;
	int r;

	*code = PROTO_E_INTERNAL;
	snprintf(msg, msglen, "out of memory");
	if (!(s->flags & PROTO_SUBMIT_CHAT)) {
		/* Empty is fine where the model adds BOS: a story from nothing. */
		*ret = s->prompt.len ? strndup(s->prompt.p, s->prompt.len) : strdup("");
		return *ret ? (ssize_t)s->prompt.len : -1;
	}
	if (!m->chat.kind) {
		*code = PROTO_E_NOTEMPLATE;
		snprintf(msg, msglen, "model %s has no chat template llmd knows; send a plain prompt",
			 m->name);
		return -1;
	}
	for (uint32_t i = 0; i < s->n_messages; i++)
		total += s->messages[i].content.len;
	msgs = calloc(s->n_messages, sizeof *msgs);
	if (!msgs)
		return -1;
	for (uint32_t i = 0; i < s->n_messages; i++) {
		msgs[i].role = roles[s->messages[i].role];
		msgs[i].content = strndup(s->messages[i].content.p, s->messages[i].content.len);
		if (!msgs[i].content)
			total = SIZE_MAX;
	}
	char why[256] = "";
	r = total == SIZE_MAX ? -ENOMEM : chat_render_err(&m->chat, msgs, (int)s->n_messages, 1, ret, why, sizeof why);
	for (uint32_t i = 0; i < s->n_messages; i++)
		free((char *)msgs[i].content);
	free(msgs);
	if (r == -ENOMEM)
		return -1;
	if (r < 0) {
		*code = PROTO_E_INVAL;
		snprintf(msg, msglen, "the %s template cannot render this conversation%s%s",
			 chat_template_name(m->chat.kind), why[0] ? ": " : "", why);
		return -1;
	}
	return r;
}

uint32_t server_make_request(struct llmd *d, struct conn *c, const struct proto_submit *s,
			     struct worker_req **ret, char *msg, size_t msglen)
{
	struct uid_use *u = uid_use(d, c->uid, 0);
	struct worker_req *r = NULL;
	size_t bytes = 0;
	int32_t limit_tok, n;
	char *text = NULL;
	ssize_t len;
	uint32_t code = PROTO_E_INTERNAL;
	int named = !!(s->flags & PROTO_SUBMIT_MODEL);
	struct llmd_model *lm = llmd_model_find(d, named ? s->model.p : NULL, named ? s->model.len : 0);
	const struct model *m;
	int32_t n_ctx;

	*ret = NULL;
	if (!lm) {
		snprintf(msg, msglen, "no model named '%.*s' is served here (llmctl models lists them)",
			 (int)(s->model.len > 64 ? 64 : s->model.len), s->model.p);
		return PROTO_E_NOMODEL;
	}
	m = lm->model;
	n_ctx = lm->n_ctx;
	if (d->draining) {
		snprintf(msg, msglen, "%s",
			 d->stopping ? "llmd is shutting down" : "llmd is draining: not taking new requests");
		return PROTO_E_DRAINING;
	}
	if (conn_find_live(c, s->id) >= 0) {
		snprintf(msg, msglen, "request id %llu is already live", (unsigned long long)s->id);
		return PROTO_E_DUPLICATE;
	}
	if (c->n_live >= d->cfg.requests_per_connection || (u && u->live >= d->cfg.requests_per_uid)) {
		/* A client may have read a FINAL whose DONE note is still queued:
		 * take the notes before refusing. */
		server_take_notes(d);
		if (c->state == CONN_CLOSING) {
			snprintf(msg, msglen, "the connection is closing");
			return PROTO_E_STATE;
		}
		u = uid_use(d, c->uid, 0);
	}
	if (c->n_live >= d->cfg.requests_per_connection) {
		snprintf(msg, msglen, "%d requests in flight on this connection (limits.requests_per_connection)",
			 c->n_live);
		return PROTO_E_LIMIT;
	}
	if (u && u->live >= d->cfg.requests_per_uid) {
		snprintf(msg, msglen, "%d requests in flight for uid %u (limits.requests_per_uid)", u->live,
			 (unsigned)c->uid);
		return PROTO_E_LIMIT;
	}
	/* What the engine would refuse, refused here with the parameter's name. */
	struct sampler_params sp = {
		.temperature = s->temperature, .top_k = s->top_k, .top_p = s->top_p, .min_p = s->min_p,
		.repeat_penalty = s->repeat_penalty, .presence_penalty = s->presence_penalty,
		.frequency_penalty = s->frequency_penalty, .penalty_last_n = s->repeat_last_n,
		.seed = s->seed,
	};
	/* A history longer than the context holds every token anyway. */
	if (sp.penalty_last_n > n_ctx)
		sp.penalty_last_n = n_ctx;
	if (sampler_params_check(&sp, msg, msglen) < 0)
		return PROTO_E_INVAL;
	if (s->max_tokens > d->cfg.max_tokens) {
		snprintf(msg, msglen, "max_tokens %d is over the limit of %d (limits.max_tokens)",
			 s->max_tokens, d->cfg.max_tokens);
		return PROTO_E_LIMIT;
	}
	bytes = s->prompt.len;
	for (uint32_t i = 0; i < s->n_messages; i++)
		bytes += s->messages[i].content.len;
	if (bytes > (size_t)d->cfg.prompt_bytes) {
		snprintf(msg, msglen, "the prompt is %zu bytes, over the limit of %d (limits.prompt_bytes)",
			 bytes, d->cfg.prompt_bytes);
		return PROTO_E_TOOBIG;
	}
	if (!text_utf8_ok("the prompt", -1, &s->prompt, msg, msglen))
		return PROTO_E_INVAL;
	for (uint32_t i = 0; i < s->n_messages; i++)
		if (!text_utf8_ok("message", (int)i, &s->messages[i].content, msg, msglen))
			return PROTO_E_INVAL;
	for (uint32_t i = 0; i < s->n_stops; i++)
		if (!text_utf8_ok("stop string", (int)i, &s->stops[i], msg, msglen))
			return PROTO_E_INVAL;
	if ((len = prompt_text(m, s, &text, &code, msg, msglen)) < 0)
		return code;
	if ((s->flags & PROTO_SUBMIT_SPEC_DRAFT) && !lm->draft) {
		code = PROTO_E_INVAL;
		if (lm->index == 0)
			snprintf(msg, msglen, "speculative decoding with a draft model: this daemon has "
				 "none (spec.draft_model)");
		else
			snprintf(msg, msglen, "speculative decoding with a draft model: model %s has none "
				 "(models.%s.draft_model)", lm->name, lm->name);
		goto fail;
	}
	if (s->flags & PROTO_SUBMIT_GRAMMAR) {
		r = calloc(1, sizeof *r);
		if (!r) {
			snprintf(msg, msglen, "out of memory");
			goto fail;
		}
		int rc = constrain_start(lm->constrain, (enum constrain_kind)s->grammar_kind,
					 s->grammar_flags & PROTO_GRAMMAR_STRICT ? CONSTRAIN_STRICT : 0,
					 s->grammar.p, s->grammar.len, &r->grammar, msg, msglen);
		if (rc < 0) {
			code = rc == -ENOMEM ? PROTO_E_INTERNAL : rc == -E2BIG ? PROTO_E_TOOBIG : PROTO_E_INVAL;
			goto fail;
		}
	}

	code = PROTO_E_INTERNAL;
	snprintf(msg, msglen, "out of memory");
	limit_tok = d->cfg.prompt_tokens ? d->cfg.prompt_tokens : n_ctx - 1;
	if (limit_tok > n_ctx - 1)
		limit_tok = n_ctx - 1;
	if (!r && !(r = calloc(1, sizeof *r)))
		goto fail;
	if (!(r->prompt = malloc((size_t)(limit_tok + 1) * sizeof *r->prompt)))
		goto fail;
	n = tokenizer_encode(m->tok, text, (size_t)len, tokenizer_add_bos(m->tok), 1, r->prompt,
			     limit_tok + 1);
	code = n < 0 || n == 0 ? PROTO_E_INVAL : PROTO_E_TOOBIG;
	if (n < 0) {
		snprintf(msg, msglen, "cannot tokenize the prompt");
		goto fail;
	}
	if (n > limit_tok) {
		snprintf(msg, msglen, "the prompt is %d tokens, over the limit of %d", n, limit_tok);
		goto fail;
	}
	if (n == 0) {
		snprintf(msg, msglen, "the prompt is empty");
		goto fail;
	}
	code = PROTO_E_INTERNAL;
	snprintf(msg, msglen, "out of memory");
	r->n_prompt = n;
	r->model = lm->index;
	/* Ollama's keep_alive: the last request's counts (never for the
	 * default model or a pinned one, which stay) */
	if ((s->flags & PROTO_SUBMIT_KEEP_ALIVE) && !lm->pinned && lm->index != 0)
		lm->keep_alive_s = s->keep_alive_s;
	r->conn_id = c->id;
	r->client_id = s->id;
	r->uid = (uint32_t)c->uid;
	r->priority = s->priority;
	if (!c->is_admin) {
		int32_t mp = d->cfg.max_priority;
		r->priority = r->priority > mp ? mp : r->priority < -mp ? -mp : r->priority;
		if (r->priority != s->priority)
			snprintf(r->notice, sizeof r->notice,
				 "priority %d was clamped to %d (limits.max_priority; admins are not "
				 "clamped)", s->priority, r->priority);
	}
	r->max_tokens = s->max_tokens;
	r->ignore_eos = !!(s->flags & PROTO_SUBMIT_IGNORE_EOS);
	r->logprobs = !!(s->flags & PROTO_SUBMIT_LOGPROBS);
	r->spec = s->flags & PROTO_SUBMIT_SPEC_DRAFT ? SCHED_SPEC_DRAFT :
		  s->flags & PROTO_SUBMIT_SPEC_NGRAM ? SCHED_SPEC_NGRAM :
		  s->flags & PROTO_SUBMIT_SPEC_OFF ? SCHED_SPEC_OFF : SCHED_SPEC_DEFAULT;
	r->spec_max_draft = (int32_t)s->max_draft; /* 1..PROTO_MAX_DRAFT, or 0: spec.max_draft */
	r->top_logprobs = (int32_t)s->top_logprobs;
	r->sampling = sp;
	if (!(s->flags & PROTO_SUBMIT_SEED) &&
	    getrandom(&r->sampling.seed, sizeof r->sampling.seed, GRND_NONBLOCK) != sizeof r->sampling.seed)
		r->sampling.seed = (uint64_t)clock_s() * 1000003u ^ (uint64_t)d->next_gid;
	if (s->n_stops) {
		if (!(r->stops = calloc(s->n_stops, sizeof *r->stops)))
			goto fail;
		for (uint32_t i = 0; i < s->n_stops; i++) {
			if (!(r->stops[i] = strndup(s->stops[i].p, s->stops[i].len)))
				goto fail;
			r->n_stops++;
		}
	}
	free(text);
	*ret = r;
	return 0;
fail:
	worker_req_free(r);
	free(text);
	return code;
}

uint32_t server_post_request(struct llmd *d, struct conn *c, struct worker_req *r, char *msg,
			     size_t msglen)
{
	struct uid_use *u;

	struct llmd_model *lm = r->model >= 0 && r->model < d->n_models ? &d->models[r->model] : NULL;
	uint32_t code;

	/* a model not loaded is loaded now (or refused, over the budget) */
	if (lm && (code = models_want(d, lm, msg, msglen))) {
		worker_req_free(r);
		return code;
	}
	if (c->n_live == c->cap_live) {
		int32_t cap = c->cap_live ? c->cap_live * 2 : 8;
		struct conn_req *p = realloc(c->live, (size_t)cap * sizeof *p);
		if (!p) {
			worker_req_free(r);
			snprintf(msg, msglen, "out of memory");
			return PROTO_E_INTERNAL;
		}
		c->live = p;
		c->cap_live = cap;
	}
	r->gid = ++d->next_gid;
	c->live[c->n_live++] = (struct conn_req){ .client_id = r->client_id, .gid = r->gid };
	if ((u = uid_use(d, c->uid, 1)))
		u->live++;
	c->requests++;
	d->requests_total++;
	if (r->model >= 0 && r->model < d->n_models)
		d->models[r->model].requests_total++;
	worker_submit(d->worker, r); /* the worker owns R now */
	return 0;
}

static void handle_submit(struct llmd *d, struct conn *c, const struct proto_frame *f)
{
	static struct proto_submit_buf sb; /* event-loop thread only */
	struct proto_submit s;
	struct worker_req *r;
	char msg[PROTO_MAX_ERRMSG + 1];
	uint32_t code;

	if (proto_decode_submit(f, &sb, &s) < 0) {
		d->bad_frames++;
		server_send_error(d, c, 0, PROTO_E_BADFRAME, 1, "malformed SUBMIT");
		return;
	}
	code = server_make_request(d, c, &s, &r, msg, sizeof msg);
	if (!code)
		code = server_post_request(d, c, r, msg, sizeof msg);
	if (code && c->state != CONN_CLOSING)
		server_send_error(d, c, s.id, code, 0, "%s", msg);
}

/* ---- frames ---- */

static void handle_frame(struct llmd *d, struct conn *c, const struct proto_frame *f)
{
	uint64_t id;
	struct proto_admin a;
	int i;

	if (c->state == CONN_HELLO && f->type != PROTO_HELLO) {
		server_send_error(d, c, 0, PROTO_E_STATE, 1, "%s before HELLO", proto_type_name(f->type));
		return;
	}
	switch (f->type) {
	case PROTO_HELLO:
		if (c->state != CONN_HELLO) {
			server_send_error(d, c, 0, PROTO_E_STATE, 1, "second HELLO");
			return;
		}
		handle_hello(d, c, f);
		return;
	case PROTO_SUBMIT:
		handle_submit(d, c, f);
		return;
	case PROTO_CANCEL:
		if (proto_decode_cancel(f, &id) < 0)
			break;
		/* An id no longer live finished meanwhile: its FINAL is on the way. */
		if ((i = conn_find_live(c, id)) >= 0)
			conn_cancel(d, c, i);
		return;
	case PROTO_RING_WAKE:
		if (proto_decode_ring_wake(f) < 0)
			break;
		worker_ring_wake(d->worker);
		return;
	case PROTO_ADMIN:
		if (proto_decode_admin(f, &a) < 0)
			break;
		send_admin_reply(d, c, &a);
		return;
	default:
		server_send_error(d, c, 0, PROTO_E_BADFRAME, 1, "unexpected %s frame",
				  proto_type_name(f->type));
		return;
	}
	d->bad_frames++;
	server_send_error(d, c, 0, PROTO_E_BADFRAME, 1, "malformed %s frame", proto_type_name(f->type));
}

/* ---- reading, with the limits on what a client may leave unread ---- */

static size_t output_limit(const struct llmd *d)
{
	return (size_t)d->cfg.output_kib * 1024u;
}

/* C left more replies unread than limits.output_kib: read none of its
 * frames (they wait in its socket, in the kernel) until it reads; on_write
 * resumes at half the limit. */
static void pause_reading(struct llmd *d, struct conn *c)
{
	c->read_paused = 1;
	c->t_partial = 0; /* what waits is whole frames, held back by us */
	bufferevent_disable(c->bev, EV_READ);
	bufferevent_setwatermark(c->bev, EV_WRITE, output_limit(d) / 2, 0);
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct llmd *d = g_d;
	struct evbuffer *in = bufferevent_get_input(bev);
	uint32_t id = c->id;
	int k;

	for (k = 0; c->state != CONN_CLOSING; k++) {
		size_t avail = evbuffer_get_length(in);
		struct proto_frame f;
		uint8_t *p;
		ssize_t r;
		uint32_t len;

		if (evbuffer_get_length(bufferevent_get_output(bev)) > output_limit(d)) {
			pause_reading(d, c);
			return;
		}
		if (avail < PROTO_HDR_SIZE)
			break;
		if (k == FRAMES_PER_EVENT) {
			/* Work cap reached: come back after other connections had their turn. */
			bufferevent_trigger(bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
			c->t_partial = 0;
			return;
		}
		p = evbuffer_pullup(in, PROTO_HDR_SIZE);
		len = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		r = proto_frame_parse(p, PROTO_HDR_SIZE, &f);
		if (r < 0) {
			d->bad_frames++;
			server_send_error(d, c, 0, PROTO_E_BADFRAME, 1,
					  r == -EMSGSIZE ? "frame of %u bytes is over the %u-byte maximum"
							 : "malformed frame header (length %u, maximum %u)",
					  len, PROTO_MAX_PAYLOAD);
			return;
		}
		if (avail < PROTO_HDR_SIZE + (size_t)len) {
			/* Buffer the whole frame, and not much more. */
			bufferevent_setwatermark(bev, EV_READ, 0, PROTO_HDR_SIZE + (size_t)len + READ_AHEAD);
			break;
		}
		p = evbuffer_pullup(in, PROTO_HDR_SIZE + (ssize_t)len);
		r = proto_frame_parse(p, PROTO_HDR_SIZE + (size_t)len, &f);
		if (r <= 0) {
			server_send_error(d, c, 0, PROTO_E_BADFRAME, 1, "malformed frame");
			return;
		}
		handle_frame(d, c, &f);
		if (conn_lookup(d, id) != c || c->state == CONN_CLOSING)
			return; /* closed (C is freed) or closing */
		evbuffer_drain(in, (size_t)r);
		c->t_frame = clock_s();
		if (len > READ_AHEAD)
			bufferevent_setwatermark(bev, EV_READ, 0, READ_AHEAD);
	}
	if (c->state == CONN_CLOSING)
		return;
	/* Part of a frame waits for the rest: limits.frame_timeout_s runs from
	 * the end of the last whole frame, or from its first byte. */
	if (evbuffer_get_length(in) == 0)
		c->t_partial = 0;
	else if (k > 0 || !c->t_partial)
		c->t_partial = clock_s();
}

/* The output drained to the low watermark: a connection whose reading was
 * paused reads again. */
static void on_write(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (!c->read_paused)
		return;
	c->read_paused = 0;
	g_d->freed_bytes += output_limit(g_d) / 2;
	bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
	bufferevent_enable(bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_input(bev)) >= PROTO_HDR_SIZE)
		bufferevent_trigger(bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
}

static void on_conn_event(struct bufferevent *bev, short what, void *arg)
{
	struct conn *c = arg;
	(void)bev;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		conn_close(g_d, c); /* its requests are cancelled, its blocks freed */
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct llmd *d = arg;
	(void)what;

	for (int k = 0; k < FRAMES_PER_EVENT; k++) {
		struct conn *c;
		char msg[160];
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				log_msg(LOG_WARNING, "accept: %s (raise LimitNOFILE?)", strerror(errno));
			return;
		}
		c = calloc(1, sizeof *c);
		if (!c) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->state = CONN_HELLO;
		c->t_connect = c->t_frame = clock_s();
		if (usock_peercred(fd, &c->pid, &c->uid, &c->gid) < 0) {
			close(fd);
			free(c);
			continue;
		}
		read_comm(c->pid, c->comm, sizeof c->comm);
		c->is_admin = admin_allowed(d, c->uid, c->gid);
		c->bev = bufferevent_socket_new(d->base, fd, BEV_OPT_CLOSE_ON_FREE);
		if (!c->bev) {
			close(fd);
			free(c);
			continue;
		}
		if (server_conn_add(d, c, msg, sizeof msg)) {
			/* Say why, then go; nothing of this connection is kept. */
			uint8_t buf[PROTO_HDR_SIZE + 16 + sizeof msg];
			struct proto_error e = { 0, PROTO_E_LIMIT, { msg, (uint32_t)strlen(msg) } };
			ssize_t n = proto_encode_error(buf, sizeof buf, &e);
			if (n > 0)
				(void)!send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
			d->refused[PROTO_E_LIMIT]++;
			bufferevent_free(c->bev);
			free(c);
			continue;
		}
		bufferevent_setcb(c->bev, on_read, on_write, on_conn_event, c);
		bufferevent_setwatermark(c->bev, EV_READ, 0, READ_AHEAD);
		bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	}
}

uint32_t server_conn_add(struct llmd *d, struct conn *c, char *msg, size_t msglen)
{
	struct uid_use *u;
	uint32_t slot;

	for (slot = 0; slot < d->max_conn_slots && d->conns[slot]; slot++)
		;
	/* Admins have limits.admin_connections more, so that other users'
	 * connections can never lock them out. */
	if (slot >= d->max_conn_slots ||
	    d->n_conns >= d->cfg.max_connections + (c->is_admin ? d->cfg.admin_connections : 0)) {
		snprintf(msg, msglen, "%s", c->is_admin
			 ? "too many connections (limits.max_connections and limits.admin_connections)"
			 : "too many connections (limits.max_connections)");
		return PROTO_E_LIMIT;
	}
	u = uid_use(d, c->uid, 1);
	if (!u || u->conns >= d->cfg.connections_per_uid) {
		snprintf(msg, msglen, "uid %u has %d connections open (limits.connections_per_uid)",
			 (unsigned)c->uid, u ? u->conns : 0);
		if (u)
			uid_release(d, c->uid, 0, 0);
		return PROTO_E_LIMIT;
	}
	u->conns++;
	c->id = slot | (uint32_t)++d->conn_gen[slot] << 16;
	d->conns[slot] = c;
	d->n_conns++;
	d->conns_total++;
	return 0;
}

/* ---- notes from the engine thread ---- */

static void on_notes(evutil_socket_t fd, short what, void *arg)
{
	struct llmd *d = arg;
	uint64_t v;
	(void)what;

	if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
		log_msg(LOG_ERR, "reading the worker's eventfd: %s", strerror(errno));
	server_take_notes(d);
}

void server_take_notes(struct llmd *d)
{
	struct worker_note notes[64];
	int n;

	while ((n = worker_take_notes(d->worker, notes, 64)) > 0) {
		for (int i = 0; i < n; i++) {
			struct worker_note *nt = &notes[i];
			struct conn *c = conn_lookup(d, nt->conn_id);
			switch (nt->kind) {
			case WORKER_NOTE_DONE:
				if (!c)
					break;
				for (int32_t k = 0; k < c->n_live; k++)
					if (c->live[k].gid == nt->gid) {
						c->live[k] = c->live[--c->n_live];
						uid_release(d, c->uid, 0, 1);
						break;
					}
				break;
			case WORKER_NOTE_RING_BAD:
				if (c && c->http) {
					log_msg(LOG_ERR, "an HTTP request's ring broke; its request ends");
				} else if (c) {
					log_msg(LOG_WARNING, "client pid %d uid %u (%s): corrupt ring, closing",
						 (int)c->pid, (unsigned)c->uid, c->comm);
					server_send_error(d, c, 0, PROTO_E_RING, 1,
							  "your ring broke (an impossible consumer index, or a record it cannot hold); closing");
				}
				break;
			case WORKER_NOTE_FAILED:
				log_msg(LOG_ERR, "a forward step on the %s backend failed: %s%s%s; its requests "
					 "ended with an error%s", d->backend, strerror(-nt->error),
					 nt->message[0] ? ": " : "", nt->message,
					 nt->sticky ? "; the device is unusable, exiting so that llmd is restarted" : "");
				if (nt->sticky)
					d->fatal = 1;
				break;
			case WORKER_NOTE_UNLOADED:
				models_unloaded(d, nt->model, nt->error);
				break;
			}
		}
	}
}

/* ---- lifecycle ---- */

int server_start(struct llmd *d, int fd)
{
	g_d = d;
	d->max_conn_slots = (uint32_t)d->cfg.max_connections + (uint32_t)d->cfg.admin_connections + 64;
	if (d->max_conn_slots > 65536)
		d->max_conn_slots = 65536;
	d->conns = calloc(d->max_conn_slots, sizeof *d->conns);
	d->conn_gen = calloc(d->max_conn_slots, sizeof *d->conn_gen);
	if (!d->conns || !d->conn_gen)
		return -ENOMEM;
	d->listen_fd = fd;
	d->ev_listen = event_new(d->base, fd, EV_READ | EV_PERSIST, on_accept, d);
	d->ev_notes = event_new(d->base, worker_note_fd(d->worker), EV_READ | EV_PERSIST, on_notes, d);
	if (!d->ev_listen || !d->ev_notes || event_add(d->ev_listen, NULL) < 0 ||
	    event_add(d->ev_notes, NULL) < 0)
		return -ENOMEM;
	return 0;
}

void server_stop_listening(struct llmd *d)
{
	if (d->ev_listen) {
		event_free(d->ev_listen);
		d->ev_listen = NULL;
	}
	if (d->listen_fd >= 0) {
		close(d->listen_fd);
		d->listen_fd = -1;
	}
	if (d->socket_path[0]) {
		unlink(d->socket_path);
		d->socket_path[0] = 0;
	}
}

void server_close_all(struct llmd *d)
{
	for (uint32_t i = 0; d->conns && i < d->max_conn_slots; i++)
		if (d->conns[i])
			conn_close(d, d->conns[i]);
	if (d->ev_notes) {
		event_free(d->ev_notes);
		d->ev_notes = NULL;
	}
	free(d->conns);
	free(d->conn_gen);
	free(d->uids);
	d->conns = NULL;
	d->conn_gen = NULL;
	d->uids = NULL;
	d->n_uids = d->cap_uids = 0;
}

/* ---- timeouts ---- */

static void time_out(struct llmd *d, struct conn *c, const char *why)
{
	log_msg(LOG_INFO, "client pid %d uid %u (%s): closing: %s", (int)c->pid, (unsigned)c->uid,
		 c->comm, why);
	server_send_error(d, c, 0, PROTO_E_LIMIT, 1, "%s", why);
}

void server_tick(struct llmd *d, double now)
{
	const struct llmd_conf *f = &d->cfg;
	char why[128];

	for (uint32_t i = 0; d->conns && i < d->max_conn_slots; i++) {
		struct conn *c = d->conns[i];
		if (!c || c->http) /* http.c's, under evhttp's timeouts */
			continue;
		if (c->state == CONN_CLOSING) {
			/* Its ERROR is not being read: go without it. */
			if (now - c->t_closing >= CLOSE_LINGER_S)
				conn_close(d, c);
		} else if (c->state == CONN_HELLO && f->hello_timeout_s &&
			   now - c->t_connect >= f->hello_timeout_s) {
			snprintf(why, sizeof why, "no HELLO within %d s (limits.hello_timeout_s)",
				 f->hello_timeout_s);
			time_out(d, c, why);
		} else if (c->t_partial && f->frame_timeout_s && now - c->t_partial >= f->frame_timeout_s) {
			snprintf(why, sizeof why, "a frame was not finished within %d s (limits.frame_timeout_s)",
				 f->frame_timeout_s);
			time_out(d, c, why);
		} else if (c->state == CONN_READY && f->idle_timeout_s && c->n_live == 0 &&
			   now - c->t_frame >= f->idle_timeout_s) {
			snprintf(why, sizeof why, "idle for %d s (limits.idle_timeout_s)", f->idle_timeout_s);
			time_out(d, c, why);
		}
	}
	/* Buffers of clients that flooded us went back to malloc; give them
	 * back to the system too, at most once a second. */
	if (d->freed_bytes >= TRIM_BYTES && now - d->t_trim >= 1.0) {
		malloc_trim(0);
		d->freed_bytes = 0;
		d->t_trim = now;
	}
}
