/* proto.c - encoders, decoders and validators for the frames and ring records
 * declared in proto.h.  Pure functions over caller buffers: no I/O, no
 * allocation, no logging.  The socket and the ring live in usock.c and ring.c.
 *
 * Every message type has one validator used by both directions, so a payload
 * decodes if and only if the decoded message would encode again.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "proto.h"

/* ---- names ---- */

static const char *const err_names[PROTO_E__MAX] = {
	[PROTO_E_OK] = "ok",
	[PROTO_E_BADFRAME] = "badframe",
	[PROTO_E_VERSION] = "version",
	[PROTO_E_STATE] = "state",
	[PROTO_E_INVAL] = "inval",
	[PROTO_E_LIMIT] = "limit",
	[PROTO_E_TOOBIG] = "toobig",
	[PROTO_E_BUSY] = "busy",
	[PROTO_E_DRAINING] = "draining",
	[PROTO_E_DUPLICATE] = "duplicate",
	[PROTO_E_NOTFOUND] = "notfound",
	[PROTO_E_PERM] = "perm",
	[PROTO_E_NOTEMPLATE] = "notemplate",
	[PROTO_E_INTERNAL] = "internal",
	[PROTO_E_RING] = "ring",
	[PROTO_E_NOMODEL] = "nomodel",
};

const char *proto_err_name(uint32_t code)
{
	return code < PROTO_E__MAX ? err_names[code] : "unknown";
}

const char *proto_type_name(uint32_t type)
{
	switch (type) {
	case PROTO_HELLO: return "HELLO";
	case PROTO_SUBMIT: return "SUBMIT";
	case PROTO_CANCEL: return "CANCEL";
	case PROTO_RING_WAKE: return "RING_WAKE";
	case PROTO_ADMIN: return "ADMIN";
	case PROTO_WELCOME: return "WELCOME";
	case PROTO_ERROR: return "ERROR";
	case PROTO_ADMIN_REPLY: return "ADMIN_REPLY";
	}
	return "?";
}

static int type_known(uint32_t type)
{
	return proto_type_name(type)[0] != '?';
}

/* ---- little-endian reader ---- */

/* A cursor over a payload; BAD sticks once a read runs past the end, and
 * every later read then returns zeros. */
struct rd {
	const uint8_t *p;       /* (n) the payload */
	size_t n;               /* bytes */
	size_t off;             /* bytes consumed, <= n */
	int bad;                /* 1: a read ran past the end */
};

static const uint8_t *rd_take(struct rd *r, size_t len)
{
	const uint8_t *q;

	if (r->bad || len > r->n - r->off) {
		r->bad = 1;
		return NULL;
	}
	q = r->p + r->off;
	r->off += len;
	return q;
}

static uint32_t get_le32(const uint8_t *q)
{
	return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static uint32_t rd_u32(struct rd *r)
{
	const uint8_t *q = rd_take(r, 4);

	return q ? get_le32(q) : 0;
}

static uint64_t rd_u64(struct rd *r)
{
	const uint8_t *q = rd_take(r, 8);

	return q ? (uint64_t)get_le32(q) | (uint64_t)get_le32(q + 4) << 32 : 0;
}

static int32_t rd_i32(struct rd *r)
{
	return (int32_t)rd_u32(r);
}

static float rd_f32(struct rd *r)
{
	uint32_t u = rd_u32(r);
	float x;

	memcpy(&x, &u, sizeof x);
	return x;
}

/* A u32 length then that many bytes; an empty string points at its place in
 * the payload too, so P is never NULL after a good read. */
static struct proto_str rd_str(struct rd *r)
{
	struct proto_str s = { NULL, 0 };
	uint32_t len = rd_u32(r);
	const uint8_t *q = rd_take(r, len);

	if (q) {
		s.p = (const char *)q;
		s.len = len;
	}
	return s;
}

/* 0 when every byte was read and nothing ran short. */
static int rd_end(const struct rd *r)
{
	return !r->bad && r->off == r->n ? 0 : -EBADMSG;
}

/* ---- little-endian writer ---- */

/* The writers never check room: every encoder sizes its output first. */
struct wr {
	uint8_t *p;             /* the caller's buffer */
	size_t off;             /* bytes written */
};

static void wr_u16(struct wr *w, uint16_t v)
{
	w->p[w->off++] = (uint8_t)v;
	w->p[w->off++] = (uint8_t)(v >> 8);
}

static void wr_u32(struct wr *w, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		w->p[w->off++] = (uint8_t)(v >> (8 * i));
}

static void wr_u64(struct wr *w, uint64_t v)
{
	wr_u32(w, (uint32_t)v);
	wr_u32(w, (uint32_t)(v >> 32));
}

static void wr_i32(struct wr *w, int32_t v)
{
	wr_u32(w, (uint32_t)v);
}

static void wr_f32(struct wr *w, float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof u);
	wr_u32(w, u);
}

static void wr_str(struct wr *w, struct proto_str s)
{
	wr_u32(w, s.len);
	if (s.len)
		memcpy(w->p + w->off, s.p, s.len);
	w->off += s.len;
}

/* Bytes a string takes on the wire. */
static uint64_t str_size(struct proto_str s)
{
	return 4 + (uint64_t)s.len;
}

/* Checks that a frame of LEN payload bytes fits CAP and the protocol, and
 * writes its header. */
static int frame_begin(struct wr *w, uint8_t *buf, size_t cap, uint16_t type, uint64_t len)
{
	if (len > PROTO_MAX_PAYLOAD || len + PROTO_HDR_SIZE > cap)
		return -EMSGSIZE;
	w->p = buf;
	w->off = 0;
	wr_u32(w, (uint32_t)len);
	wr_u16(w, type);
	wr_u16(w, 0);
	return 0;
}

/* Same for a ring record's payload, which has no header here. */
static int rec_begin(struct wr *w, uint8_t *buf, size_t cap, uint64_t len)
{
	if (len > PROTO_MAX_PAYLOAD || len > cap)
		return -EMSGSIZE;
	w->p = buf;
	w->off = 0;
	return 0;
}

/* ---- frames ---- */

ssize_t proto_frame_parse(const uint8_t *buf, size_t avail, struct proto_frame *ret)
{
	uint32_t len, type, reserved;

	if (avail < PROTO_HDR_SIZE)
		return 0;
	len = get_le32(buf);
	type = (uint32_t)buf[4] | (uint32_t)buf[5] << 8;
	reserved = (uint32_t)buf[6] | (uint32_t)buf[7] << 8;
	if (reserved != 0 || !type_known(type))
		return -EBADMSG;
	if (len > PROTO_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (avail - PROTO_HDR_SIZE < len)
		return 0;
	ret->type = (uint16_t)type;
	ret->len = len;
	ret->payload = buf + PROTO_HDR_SIZE;
	return (ssize_t)(PROTO_HDR_SIZE + len);
}

/* A reader over F's payload, or -EBADMSG when F is not of TYPE. */
static int frame_reader(const struct proto_frame *f, uint16_t type, struct rd *r)
{
	if (f->type != type || f->len > PROTO_MAX_PAYLOAD)
		return -EBADMSG;
	r->p = f->payload;
	r->n = f->len;
	r->off = 0;
	r->bad = 0;
	return 0;
}

/* LEN within MIN..MAX, and bytes behind it when it is not empty. */
static int str_ok(struct proto_str s, uint32_t min, uint32_t max)
{
	return s.len >= min && s.len <= max && (s.len == 0 || s.p != NULL);
}

static int code_ok(uint32_t code)
{
	return code < PROTO_E__MAX;
}

/* ---- HELLO ---- */

static int hello_ok(const struct proto_hello *m)
{
	return m->flags == 0 && m->reserved == 0;
}

ssize_t proto_encode_hello(uint8_t *buf, size_t cap, const struct proto_hello *m)
{
	struct wr w;
	int r;

	if (!hello_ok(m))
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_HELLO, 16);
	if (r < 0)
		return r;
	wr_u32(&w, m->version);
	wr_u32(&w, m->flags);
	wr_u32(&w, m->ring_bytes);
	wr_u32(&w, m->reserved);
	return (ssize_t)w.off;
}

int proto_decode_hello(const struct proto_frame *f, struct proto_hello *ret)
{
	struct proto_hello m;
	struct rd r;

	if (frame_reader(f, PROTO_HELLO, &r) < 0)
		return -EBADMSG;
	m.version = rd_u32(&r);
	m.flags = rd_u32(&r);
	m.ring_bytes = rd_u32(&r);
	m.reserved = rd_u32(&r);
	if (rd_end(&r) < 0 || !hello_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

/* ---- WELCOME ---- */

static int welcome_ok(const struct proto_welcome *m)
{
	return m->flags == 0 && m->reserved == 0 &&
	       str_ok(m->model, 0, PROTO_MAX_NAME) &&
	       str_ok(m->backend, 0, PROTO_MAX_NAME) &&
	       str_ok(m->chat_template, 0, PROTO_MAX_NAME);
}

ssize_t proto_encode_welcome(uint8_t *buf, size_t cap, const struct proto_welcome *m)
{
	struct wr w;
	int r;

	if (!welcome_ok(m))
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_WELCOME, 48 + str_size(m->model) +
			str_size(m->backend) + str_size(m->chat_template));
	if (r < 0)
		return r;
	wr_u32(&w, m->version);
	wr_u32(&w, m->flags);
	wr_u32(&w, m->ring_bytes);
	wr_u32(&w, m->daemon_pid);
	wr_u32(&w, m->max_inflight);
	wr_u32(&w, m->max_prompt_bytes);
	wr_u32(&w, m->max_prompt_tokens);
	wr_u32(&w, m->max_tokens);
	wr_u32(&w, m->n_ctx);
	wr_u32(&w, m->n_vocab);
	wr_u32(&w, m->client_id);
	wr_u32(&w, m->reserved);
	wr_str(&w, m->model);
	wr_str(&w, m->backend);
	wr_str(&w, m->chat_template);
	return (ssize_t)w.off;
}

int proto_decode_welcome(const struct proto_frame *f, struct proto_welcome *ret)
{
	struct proto_welcome m;
	struct rd r;

	if (frame_reader(f, PROTO_WELCOME, &r) < 0)
		return -EBADMSG;
	m.version = rd_u32(&r);
	m.flags = rd_u32(&r);
	m.ring_bytes = rd_u32(&r);
	m.daemon_pid = rd_u32(&r);
	m.max_inflight = rd_u32(&r);
	m.max_prompt_bytes = rd_u32(&r);
	m.max_prompt_tokens = rd_u32(&r);
	m.max_tokens = rd_u32(&r);
	m.n_ctx = rd_u32(&r);
	m.n_vocab = rd_u32(&r);
	m.client_id = rd_u32(&r);
	m.reserved = rd_u32(&r);
	m.model = rd_str(&r);
	m.backend = rd_str(&r);
	m.chat_template = rd_str(&r);
	if (rd_end(&r) < 0 || !welcome_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

/* ---- SUBMIT ---- */

/* The sampling fields; comparisons are written so that NaN fails them. */
static int sampling_ok(const struct proto_submit *m)
{
	return m->temperature >= 0 && isfinite(m->temperature) &&
	       m->top_p > 0 && m->top_p <= 1 &&
	       m->min_p >= 0 && m->min_p <= 1 &&
	       m->repeat_penalty > 0 && isfinite(m->repeat_penalty) &&
	       m->repeat_last_n >= 0 &&
	       isfinite(m->presence_penalty) && isfinite(m->frequency_penalty);
}

static int submit_ok(const struct proto_submit *m)
{
	if (m->id == 0 || (m->flags & ~(uint32_t)PROTO_SUBMIT__ALL) || m->max_tokens < 1 ||
	    __builtin_popcount(m->flags & (PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_OFF |
					   PROTO_SUBMIT_SPEC_DRAFT)) > 1 ||
	    !sampling_ok(m) || m->top_logprobs > PROTO_MAX_TOP_LOGPROBS ||
	    (m->top_logprobs && !(m->flags & PROTO_SUBMIT_LOGPROBS)))
		return 0;
	if (m->n_stops > PROTO_MAX_STOPS || (m->n_stops && !m->stops))
		return 0;
	for (uint32_t i = 0; i < m->n_stops; i++)
		if (!str_ok(m->stops[i], 1, PROTO_MAX_STOP_LEN))
			return 0;
	if (m->flags & PROTO_SUBMIT_GRAMMAR) {
		if (m->grammar_kind < PROTO_GRAMMAR_GBNF || m->grammar_kind > PROTO_GRAMMAR_JSON_OBJECT ||
		    (m->grammar_flags & ~PROTO_GRAMMAR_STRICT) ||
		    !str_ok(m->grammar, m->grammar_kind != PROTO_GRAMMAR_JSON_OBJECT,
			    m->grammar_kind == PROTO_GRAMMAR_JSON_OBJECT ? 0 : PROTO_MAX_GRAMMAR))
			return 0;
	} else if (m->grammar_kind || m->grammar_flags || m->grammar.len) {
		return 0;
	}
	/* A model's name is a C string at both ends: no NUL inside. */
	if (m->flags & PROTO_SUBMIT_MODEL) {
		if (!str_ok(m->model, 1, PROTO_MAX_NAME) || memchr(m->model.p, 0, m->model.len))
			return 0;
	} else if (m->model.len) {
		return 0;
	}
	if ((m->flags & PROTO_SUBMIT_KEEP_ALIVE) ? m->keep_alive_s < -1 : m->keep_alive_s != 0)
		return 0;
	if ((m->flags & PROTO_SUBMIT_MAX_DRAFT) ? m->max_draft < 1 || m->max_draft > PROTO_MAX_DRAFT :
	    m->max_draft != 0)
		return 0;
	if (!(m->flags & PROTO_SUBMIT_CHAT))
		return m->n_messages == 0 && str_ok(m->prompt, 0, UINT32_MAX);
	/* A chat request carries no prompt: one given would be lost. */
	if (m->prompt.len != 0 || m->n_messages < 1 || m->n_messages > PROTO_MAX_MESSAGES ||
	    !m->messages)
		return 0;
	for (uint32_t i = 0; i < m->n_messages; i++)
		if (m->messages[i].role < PROTO_ROLE_SYSTEM ||
		    m->messages[i].role > PROTO_ROLE_ASSISTANT ||
		    !str_ok(m->messages[i].content, 0, UINT32_MAX))
			return 0;
	return 1;
}

ssize_t proto_encode_submit(uint8_t *buf, size_t cap, const struct proto_submit *m)
{
	uint64_t len = 72;
	struct wr w;
	int r;

	if (!submit_ok(m))
		return -EINVAL;
	if (m->flags & PROTO_SUBMIT_CHAT)
		for (uint32_t i = 0; i < m->n_messages; i++)
			len += 4 + str_size(m->messages[i].content);
	else
		len += str_size(m->prompt);
	for (uint32_t i = 0; i < m->n_stops; i++)
		len += str_size(m->stops[i]);
	if (m->flags & PROTO_SUBMIT_GRAMMAR)
		len += 8 + str_size(m->grammar);
	if (m->flags & PROTO_SUBMIT_MODEL)
		len += str_size(m->model);
	if (m->flags & PROTO_SUBMIT_KEEP_ALIVE)
		len += 4;
	if (m->flags & PROTO_SUBMIT_MAX_DRAFT)
		len += 4;
	r = frame_begin(&w, buf, cap, PROTO_SUBMIT, len);
	if (r < 0)
		return r;
	wr_u64(&w, m->id);
	wr_u32(&w, m->flags);
	wr_i32(&w, m->priority);
	wr_i32(&w, m->max_tokens);
	wr_i32(&w, m->top_k);
	wr_f32(&w, m->temperature);
	wr_f32(&w, m->top_p);
	wr_f32(&w, m->min_p);
	wr_f32(&w, m->repeat_penalty);
	wr_i32(&w, m->repeat_last_n);
	wr_f32(&w, m->presence_penalty);
	wr_f32(&w, m->frequency_penalty);
	wr_u32(&w, m->n_stops);
	wr_u64(&w, m->seed);
	wr_u32(&w, m->n_messages);
	wr_u32(&w, m->top_logprobs);
	if (m->flags & PROTO_SUBMIT_CHAT) {
		for (uint32_t i = 0; i < m->n_messages; i++) {
			wr_u32(&w, m->messages[i].role);
			wr_str(&w, m->messages[i].content);
		}
	} else {
		wr_str(&w, m->prompt);
	}
	for (uint32_t i = 0; i < m->n_stops; i++)
		wr_str(&w, m->stops[i]);
	if (m->flags & PROTO_SUBMIT_GRAMMAR) {
		wr_u32(&w, m->grammar_kind);
		wr_u32(&w, m->grammar_flags);
		wr_str(&w, m->grammar);
	}
	if (m->flags & PROTO_SUBMIT_MODEL)
		wr_str(&w, m->model);
	if (m->flags & PROTO_SUBMIT_KEEP_ALIVE)
		wr_i32(&w, m->keep_alive_s);
	if (m->flags & PROTO_SUBMIT_MAX_DRAFT)
		wr_u32(&w, m->max_draft);
	return (ssize_t)w.off;
}

int proto_decode_submit(const struct proto_frame *f, struct proto_submit_buf *buf,
			struct proto_submit *ret)
{
	struct proto_submit m;
	struct rd r;

	if (frame_reader(f, PROTO_SUBMIT, &r) < 0)
		return -EBADMSG;
	m.id = rd_u64(&r);
	m.flags = rd_u32(&r);
	m.priority = rd_i32(&r);
	m.max_tokens = rd_i32(&r);
	m.top_k = rd_i32(&r);
	m.temperature = rd_f32(&r);
	m.top_p = rd_f32(&r);
	m.min_p = rd_f32(&r);
	m.repeat_penalty = rd_f32(&r);
	m.repeat_last_n = rd_i32(&r);
	m.presence_penalty = rd_f32(&r);
	m.frequency_penalty = rd_f32(&r);
	m.n_stops = rd_u32(&r);
	m.seed = rd_u64(&r);
	m.n_messages = rd_u32(&r);
	m.top_logprobs = rd_u32(&r);
	/* Counts bound the loops below and the arrays in BUF: check them first. */
	if (r.bad || m.n_stops > PROTO_MAX_STOPS ||
	    m.n_messages > PROTO_MAX_MESSAGES)
		return -EBADMSG;
	m.prompt = (struct proto_str){ NULL, 0 };
	m.messages = buf->messages;
	m.stops = buf->stops;
	if (m.flags & PROTO_SUBMIT_CHAT) {
		for (uint32_t i = 0; i < m.n_messages && !r.bad; i++) {
			buf->messages[i].role = rd_u32(&r);
			buf->messages[i].content = rd_str(&r);
		}
	} else {
		m.prompt = rd_str(&r);
	}
	for (uint32_t i = 0; i < m.n_stops && !r.bad; i++)
		buf->stops[i] = rd_str(&r);
	m.grammar_kind = m.grammar_flags = 0;
	m.grammar = (struct proto_str){ NULL, 0 };
	if (m.flags & PROTO_SUBMIT_GRAMMAR) {
		m.grammar_kind = rd_u32(&r);
		m.grammar_flags = rd_u32(&r);
		m.grammar = rd_str(&r);
	}
	m.model = (struct proto_str){ NULL, 0 };
	if (m.flags & PROTO_SUBMIT_MODEL)
		m.model = rd_str(&r);
	m.keep_alive_s = m.flags & PROTO_SUBMIT_KEEP_ALIVE ? rd_i32(&r) : 0;
	m.max_draft = m.flags & PROTO_SUBMIT_MAX_DRAFT ? rd_u32(&r) : 0;
	if (rd_end(&r) < 0 || !submit_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

/* ---- CANCEL and RING_WAKE ---- */

ssize_t proto_encode_cancel(uint8_t *buf, size_t cap, uint64_t id)
{
	struct wr w;
	int r;

	if (id == 0)
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_CANCEL, 8);
	if (r < 0)
		return r;
	wr_u64(&w, id);
	return (ssize_t)w.off;
}

int proto_decode_cancel(const struct proto_frame *f, uint64_t *ret_id)
{
	struct rd r;
	uint64_t id;

	if (frame_reader(f, PROTO_CANCEL, &r) < 0)
		return -EBADMSG;
	id = rd_u64(&r);
	if (rd_end(&r) < 0 || id == 0)
		return -EBADMSG;
	*ret_id = id;
	return 0;
}

ssize_t proto_encode_ring_wake(uint8_t *buf, size_t cap)
{
	struct wr w;
	int r;

	r = frame_begin(&w, buf, cap, PROTO_RING_WAKE, 0);
	if (r < 0)
		return r;
	return (ssize_t)w.off;
}

int proto_decode_ring_wake(const struct proto_frame *f)
{
	return f->type == PROTO_RING_WAKE && f->len == 0 ? 0 : -EBADMSG;
}

/* ---- ERROR ---- */

static int error_ok(const struct proto_error *m)
{
	return m->code != PROTO_E_OK && code_ok(m->code) &&
	       str_ok(m->message, 0, PROTO_MAX_ERRMSG);
}

ssize_t proto_encode_error(uint8_t *buf, size_t cap, const struct proto_error *m)
{
	struct wr w;
	int r;

	if (!error_ok(m))
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_ERROR, 16 + str_size(m->message));
	if (r < 0)
		return r;
	wr_u64(&w, m->id);
	wr_u32(&w, m->code);
	wr_u32(&w, 0);
	wr_str(&w, m->message);
	return (ssize_t)w.off;
}

int proto_decode_error(const struct proto_frame *f, struct proto_error *ret)
{
	struct proto_error m;
	struct rd r;

	if (frame_reader(f, PROTO_ERROR, &r) < 0)
		return -EBADMSG;
	m.id = rd_u64(&r);
	m.code = rd_u32(&r);
	if (rd_u32(&r) != 0)
		return -EBADMSG;
	m.message = rd_str(&r);
	if (rd_end(&r) < 0 || !error_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

/* ---- ADMIN and ADMIN_REPLY ---- */

static int admin_ok(const struct proto_admin *m)
{
	return str_ok(m->command, 1, PROTO_MAX_ADMIN_CMD) &&
	       str_ok(m->arg, 0, PROTO_MAX_ADMIN_ARG);
}

ssize_t proto_encode_admin(uint8_t *buf, size_t cap, const struct proto_admin *m)
{
	struct wr w;
	int r;

	if (!admin_ok(m))
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_ADMIN, 4 + str_size(m->command) + str_size(m->arg));
	if (r < 0)
		return r;
	wr_u32(&w, 0);
	wr_str(&w, m->command);
	wr_str(&w, m->arg);
	return (ssize_t)w.off;
}

int proto_decode_admin(const struct proto_frame *f, struct proto_admin *ret)
{
	struct proto_admin m;
	struct rd r;

	if (frame_reader(f, PROTO_ADMIN, &r) < 0 || rd_u32(&r) != 0)
		return -EBADMSG;
	m.command = rd_str(&r);
	m.arg = rd_str(&r);
	if (rd_end(&r) < 0 || !admin_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

static int admin_reply_ok(const struct proto_admin_reply *m)
{
	return code_ok(m->code) && str_ok(m->body, 0, UINT32_MAX);
}

ssize_t proto_encode_admin_reply(uint8_t *buf, size_t cap, const struct proto_admin_reply *m)
{
	struct wr w;
	int r;

	if (!admin_reply_ok(m))
		return -EINVAL;
	r = frame_begin(&w, buf, cap, PROTO_ADMIN_REPLY, 8 + str_size(m->body));
	if (r < 0)
		return r;
	wr_u32(&w, m->code);
	wr_u32(&w, 0);
	wr_str(&w, m->body);
	return (ssize_t)w.off;
}

int proto_decode_admin_reply(const struct proto_frame *f, struct proto_admin_reply *ret)
{
	struct proto_admin_reply m;
	struct rd r;

	if (frame_reader(f, PROTO_ADMIN_REPLY, &r) < 0)
		return -EBADMSG;
	m.code = rd_u32(&r);
	if (rd_u32(&r) != 0)
		return -EBADMSG;
	m.body = rd_str(&r);
	if (rd_end(&r) < 0 || !admin_reply_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

/* ---- ring records ---- */

static int token_ok(const struct proto_token *m)
{
	if (m->n_top > PROTO_MAX_TOP_LOGPROBS)
		return 0;
	for (uint32_t i = 0; i < m->n_top; i++)
		if (m->top_ids[i] < 0 || !(m->top_logprobs[i] <= 0))
			return 0;
	return m->id != 0 && m->token >= -1 && isfinite(m->logprob) &&
	       str_ok(m->text, 0, PROTO_MAX_TOKEN_TEXT);
}

ssize_t proto_token_encode(uint8_t *buf, size_t cap, const struct proto_token *m)
{
	struct wr w;
	int r;

	if (!token_ok(m))
		return -EINVAL;
	r = rec_begin(&w, buf, cap, PROTO_TOKEN_FIXED + (uint64_t)m->text.len + 8 * (uint64_t)m->n_top);
	if (r < 0)
		return r;
	wr_u64(&w, m->id);
	wr_i32(&w, m->token);
	wr_f32(&w, m->logprob);
	wr_u32(&w, m->text.len);
	wr_u32(&w, m->n_top);
	if (m->text.len)
		memcpy(w.p + w.off, m->text.p, m->text.len);
	w.off += m->text.len;
	for (uint32_t i = 0; i < m->n_top; i++) {
		wr_i32(&w, m->top_ids[i]);
		wr_f32(&w, m->top_logprobs[i]);
	}
	return (ssize_t)w.off;
}

int proto_token_decode(const uint8_t *p, size_t n, struct proto_token *ret)
{
	struct rd r = { p, n, 0, 0 };
	struct proto_token m;
	const uint8_t *text;

	m.id = rd_u64(&r);
	m.token = rd_i32(&r);
	m.logprob = rd_f32(&r);
	m.text.len = rd_u32(&r);
	m.n_top = rd_u32(&r);
	if (r.bad || m.n_top > PROTO_MAX_TOP_LOGPROBS)
		return -EBADMSG;
	text = rd_take(&r, m.text.len);
	m.text.p = (const char *)text;
	for (uint32_t i = 0; i < m.n_top; i++) {
		m.top_ids[i] = rd_i32(&r);
		m.top_logprobs[i] = rd_f32(&r);
	}
	if (rd_end(&r) < 0 || !token_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}

static int final_ok(const struct proto_final *m)
{
	if (m->id == 0 || m->finish < PROTO_FIN_STOP || m->finish > PROTO_FIN_ERROR)
		return 0;
	/* A code says why a request failed, and only a failed one has it. */
	if (m->finish == PROTO_FIN_ERROR ? m->code == PROTO_E_OK || !code_ok(m->code)
					 : m->code != PROTO_E_OK)
		return 0;
	return str_ok(m->message, 0, PROTO_MAX_ERRMSG);
}

ssize_t proto_final_encode(uint8_t *buf, size_t cap, const struct proto_final *m)
{
	struct wr w;
	int r;

	if (!final_ok(m))
		return -EINVAL;
	r = rec_begin(&w, buf, cap, PROTO_FINAL_FIXED + (uint64_t)m->message.len);
	if (r < 0)
		return r;
	wr_u64(&w, m->id);
	wr_u32(&w, m->finish);
	wr_u32(&w, m->code);
	wr_u32(&w, m->prompt_tokens);
	wr_u32(&w, m->cached_tokens);
	wr_u32(&w, m->generated_tokens);
	wr_u32(&w, m->preemptions);
	wr_u64(&w, m->queue_us);
	wr_u64(&w, m->prefill_us);
	wr_u64(&w, m->decode_us);
	wr_u32(&w, m->message.len);
	wr_u32(&w, 0);
	if (m->message.len)
		memcpy(w.p + w.off, m->message.p, m->message.len);
	w.off += m->message.len;
	return (ssize_t)w.off;
}

int proto_final_decode(const uint8_t *p, size_t n, struct proto_final *ret)
{
	struct rd r = { p, n, 0, 0 };
	struct proto_final m;
	const uint8_t *msg;

	m.id = rd_u64(&r);
	m.finish = rd_u32(&r);
	m.code = rd_u32(&r);
	m.prompt_tokens = rd_u32(&r);
	m.cached_tokens = rd_u32(&r);
	m.generated_tokens = rd_u32(&r);
	m.preemptions = rd_u32(&r);
	m.queue_us = rd_u64(&r);
	m.prefill_us = rd_u64(&r);
	m.decode_us = rd_u64(&r);
	m.message.len = rd_u32(&r);
	if (rd_u32(&r) != 0)
		return -EBADMSG;
	msg = rd_take(&r, m.message.len);
	m.message.p = (const char *)msg;
	if (rd_end(&r) < 0 || !final_ok(&m))
		return -EBADMSG;
	*ret = m;
	return 0;
}
