/* fuzz_frame.c - libFuzzer target for the wire protocol (libipc/proto.c):
 * splits the input into frames with proto_frame_parse, decodes each with the
 * decoder of its type, and also decodes the raw input as a payload of every
 * frame type and as TOKEN and FINAL records.  Whatever decodes must encode
 * again to the very same bytes and decode to the same fields.  Not a test by
 * itself: fuzz_replay_main.c runs it over tests/corpus/frame in `make check`,
 * tests/fuzz/run-fuzz.sh frame runs it under libFuzzer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks an invariant the protocol promises; a failure is a finding. */
#define ASSERT(c) do { if (!(c)) abort(); } while (0)

static uint8_t out[PROTO_MAX_FRAME];            /* re-encoded frames and records */
static struct proto_submit_buf sbuf1, sbuf2;    /* the first and second SUBMIT decodes */

/* S lies within the N bytes at BASE (an empty one anywhere or nowhere). */
static void check_str_inside(struct proto_str s, const uint8_t *base, size_t n)
{
	const uint8_t *p = (const uint8_t *)s.p;

	if (s.len == 0)
		return;
	ASSERT(p >= base && p <= base + n && s.len <= (size_t)(base + n - p));
}

static int str_same(struct proto_str a, struct proto_str b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static int f32_same(float a, float b)
{
	return memcmp(&a, &b, sizeof a) == 0;
}

/* ENCODED (from an encoder) must be a frame of F's type whose payload is
 * byte for byte F's; returns the re-parsed frame. */
static struct proto_frame reparse(ssize_t encoded, const struct proto_frame *f)
{
	struct proto_frame g;

	ASSERT(encoded == (ssize_t)(PROTO_HDR_SIZE + f->len));
	ASSERT(proto_frame_parse(out, (size_t)encoded, &g) == encoded);
	ASSERT(g.type == f->type && g.len == f->len);
	ASSERT(f->len == 0 || memcmp(g.payload, f->payload, f->len) == 0);
	return g;
}

/* ---- one decoder per frame type, each with its round trip ---- */

static void fuzz_hello(const struct proto_frame *f)
{
	struct proto_hello a, b;
	struct proto_frame g;

	if (proto_decode_hello(f, &a) != 0)
		return;
	g = reparse(proto_encode_hello(out, sizeof out, &a), f);
	ASSERT(proto_decode_hello(&g, &b) == 0);
	ASSERT(a.version == b.version && a.flags == b.flags && a.ring_bytes == b.ring_bytes &&
	       a.reserved == b.reserved);
}

static void fuzz_welcome(const struct proto_frame *f)
{
	struct proto_welcome a, b;
	struct proto_frame g;

	if (proto_decode_welcome(f, &a) != 0)
		return;
	check_str_inside(a.model, f->payload, f->len);
	check_str_inside(a.backend, f->payload, f->len);
	check_str_inside(a.chat_template, f->payload, f->len);
	g = reparse(proto_encode_welcome(out, sizeof out, &a), f);
	ASSERT(proto_decode_welcome(&g, &b) == 0);
	ASSERT(a.version == b.version && a.flags == b.flags && a.ring_bytes == b.ring_bytes &&
	       a.daemon_pid == b.daemon_pid && a.max_inflight == b.max_inflight &&
	       a.max_prompt_bytes == b.max_prompt_bytes &&
	       a.max_prompt_tokens == b.max_prompt_tokens && a.max_tokens == b.max_tokens &&
	       a.n_ctx == b.n_ctx && a.n_vocab == b.n_vocab && a.client_id == b.client_id &&
	       a.reserved == b.reserved);
	ASSERT(str_same(a.model, b.model) && str_same(a.backend, b.backend) &&
	       str_same(a.chat_template, b.chat_template));
}

static void fuzz_submit(const struct proto_frame *f)
{
	struct proto_submit a, b;
	struct proto_frame g;

	if (proto_decode_submit(f, &sbuf1, &a) != 0)
		return;
	ASSERT(a.n_stops <= PROTO_MAX_STOPS && a.n_messages <= PROTO_MAX_MESSAGES);
	check_str_inside(a.prompt, f->payload, f->len);
	for (uint32_t i = 0; i < a.n_messages; i++)
		check_str_inside(a.messages[i].content, f->payload, f->len);
	for (uint32_t i = 0; i < a.n_stops; i++)
		check_str_inside(a.stops[i], f->payload, f->len);
	check_str_inside(a.grammar, f->payload, f->len);
	check_str_inside(a.model, f->payload, f->len);
	/* A name is there exactly when the flag says so, and holds no NUL. */
	ASSERT(!!(a.flags & PROTO_SUBMIT_MODEL) == (a.model.len != 0));
	ASSERT(a.model.len <= PROTO_MAX_NAME && (a.model.len == 0 || !memchr(a.model.p, 0, a.model.len)));
	g = reparse(proto_encode_submit(out, sizeof out, &a), f);
	ASSERT(proto_decode_submit(&g, &sbuf2, &b) == 0);
	ASSERT(a.id == b.id && a.flags == b.flags && a.priority == b.priority &&
	       a.max_tokens == b.max_tokens && a.top_k == b.top_k &&
	       f32_same(a.temperature, b.temperature) && f32_same(a.top_p, b.top_p) &&
	       f32_same(a.min_p, b.min_p) && f32_same(a.repeat_penalty, b.repeat_penalty) &&
	       a.repeat_last_n == b.repeat_last_n &&
	       f32_same(a.presence_penalty, b.presence_penalty) &&
	       f32_same(a.frequency_penalty, b.frequency_penalty) && a.seed == b.seed);
	ASSERT(str_same(a.prompt, b.prompt));
	ASSERT(a.n_messages == b.n_messages && a.n_stops == b.n_stops);
	for (uint32_t i = 0; i < a.n_messages; i++)
		ASSERT(a.messages[i].role == b.messages[i].role &&
		       str_same(a.messages[i].content, b.messages[i].content));
	for (uint32_t i = 0; i < a.n_stops; i++)
		ASSERT(str_same(a.stops[i], b.stops[i]));
	ASSERT(a.grammar_kind == b.grammar_kind && a.grammar_flags == b.grammar_flags &&
	       str_same(a.grammar, b.grammar));
	ASSERT(str_same(a.model, b.model));
}

static void fuzz_cancel(const struct proto_frame *f)
{
	uint64_t a, b;
	struct proto_frame g;

	if (proto_decode_cancel(f, &a) != 0)
		return;
	g = reparse(proto_encode_cancel(out, sizeof out, a), f);
	ASSERT(proto_decode_cancel(&g, &b) == 0 && a == b);
}

static void fuzz_ring_wake(const struct proto_frame *f)
{
	struct proto_frame g;

	if (proto_decode_ring_wake(f) != 0)
		return;
	g = reparse(proto_encode_ring_wake(out, sizeof out), f);
	ASSERT(proto_decode_ring_wake(&g) == 0);
}

static void fuzz_error(const struct proto_frame *f)
{
	struct proto_error a, b;
	struct proto_frame g;

	if (proto_decode_error(f, &a) != 0)
		return;
	check_str_inside(a.message, f->payload, f->len);
	g = reparse(proto_encode_error(out, sizeof out, &a), f);
	ASSERT(proto_decode_error(&g, &b) == 0);
	ASSERT(a.id == b.id && a.code == b.code && str_same(a.message, b.message));
}

static void fuzz_admin(const struct proto_frame *f)
{
	struct proto_admin a, b;
	struct proto_frame g;

	if (proto_decode_admin(f, &a) != 0)
		return;
	check_str_inside(a.command, f->payload, f->len);
	check_str_inside(a.arg, f->payload, f->len);
	g = reparse(proto_encode_admin(out, sizeof out, &a), f);
	ASSERT(proto_decode_admin(&g, &b) == 0);
	ASSERT(str_same(a.command, b.command) && str_same(a.arg, b.arg));
}

static void fuzz_admin_reply(const struct proto_frame *f)
{
	struct proto_admin_reply a, b;
	struct proto_frame g;

	if (proto_decode_admin_reply(f, &a) != 0)
		return;
	check_str_inside(a.body, f->payload, f->len);
	g = reparse(proto_encode_admin_reply(out, sizeof out, &a), f);
	ASSERT(proto_decode_admin_reply(&g, &b) == 0);
	ASSERT(a.code == b.code && str_same(a.body, b.body));
}

static const uint16_t frame_types[] = {
	PROTO_HELLO, PROTO_SUBMIT, PROTO_CANCEL, PROTO_RING_WAKE, PROTO_ADMIN,
	PROTO_WELCOME, PROTO_ERROR, PROTO_ADMIN_REPLY,
};

/* The decoder for type T applied to F, whatever F's type. */
static int decode_as(uint16_t t, const struct proto_frame *f)
{
	struct proto_hello hello;
	struct proto_welcome welcome;
	struct proto_submit submit;
	struct proto_error error;
	struct proto_admin admin;
	struct proto_admin_reply reply;
	uint64_t id;

	switch (t) {
	case PROTO_HELLO: return proto_decode_hello(f, &hello);
	case PROTO_WELCOME: return proto_decode_welcome(f, &welcome);
	case PROTO_SUBMIT: return proto_decode_submit(f, &sbuf2, &submit);
	case PROTO_CANCEL: return proto_decode_cancel(f, &id);
	case PROTO_RING_WAKE: return proto_decode_ring_wake(f);
	case PROTO_ERROR: return proto_decode_error(f, &error);
	case PROTO_ADMIN: return proto_decode_admin(f, &admin);
	case PROTO_ADMIN_REPLY: return proto_decode_admin_reply(f, &reply);
	}
	abort();
}

/* Runs F through the decoder of its type; the decoders of the other types
 * must refuse it. */
static void fuzz_frame(const struct proto_frame *f)
{
	switch (f->type) {
	case PROTO_HELLO: fuzz_hello(f); break;
	case PROTO_WELCOME: fuzz_welcome(f); break;
	case PROTO_SUBMIT: fuzz_submit(f); break;
	case PROTO_CANCEL: fuzz_cancel(f); break;
	case PROTO_RING_WAKE: fuzz_ring_wake(f); break;
	case PROTO_ERROR: fuzz_error(f); break;
	case PROTO_ADMIN: fuzz_admin(f); break;
	case PROTO_ADMIN_REPLY: fuzz_admin_reply(f); break;
	default: abort();       /* proto_frame_parse let an unknown type through */
	}
	for (size_t i = 0; i < sizeof frame_types / sizeof frame_types[0]; i++)
		if (frame_types[i] != f->type)
			ASSERT(decode_as(frame_types[i], f) == -EBADMSG);
}

/* ---- ring records ---- */

static void fuzz_token(const uint8_t *p, size_t n)
{
	struct proto_token a, b;
	ssize_t m;

	if (proto_token_decode(p, n, &a) != 0)
		return;
	ASSERT(n == PROTO_TOKEN_FIXED + (size_t)a.text.len && a.text.len <= PROTO_MAX_TOKEN_TEXT);
	check_str_inside(a.text, p, n);
	m = proto_token_encode(out, sizeof out, &a);
	ASSERT(m == (ssize_t)n && memcmp(out, p, n) == 0);
	ASSERT(proto_token_decode(out, n, &b) == 0);
	ASSERT(a.id == b.id && a.token == b.token && f32_same(a.logprob, b.logprob) &&
	       str_same(a.text, b.text));
}

static void fuzz_final(const uint8_t *p, size_t n)
{
	struct proto_final a, b;
	ssize_t m;

	if (proto_final_decode(p, n, &a) != 0)
		return;
	ASSERT(n == PROTO_FINAL_FIXED + (size_t)a.message.len);
	check_str_inside(a.message, p, n);
	m = proto_final_encode(out, sizeof out, &a);
	ASSERT(m == (ssize_t)n && memcmp(out, p, n) == 0);
	ASSERT(proto_final_decode(out, n, &b) == 0);
	ASSERT(a.id == b.id && a.finish == b.finish && a.code == b.code &&
	       a.prompt_tokens == b.prompt_tokens && a.cached_tokens == b.cached_tokens &&
	       a.generated_tokens == b.generated_tokens && a.preemptions == b.preemptions &&
	       a.queue_us == b.queue_us && a.prefill_us == b.prefill_us &&
	       a.decode_us == b.decode_us && str_same(a.message, b.message));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_frame f;
	size_t off = 0;
	ssize_t n;

	/* The input as a byte stream on the socket. */
	while (off < size) {
		n = proto_frame_parse(data + off, size - off, &f);
		ASSERT(n == 0 || n == -EBADMSG || n == -EMSGSIZE || n >= PROTO_HDR_SIZE);
		if (n <= 0)
			break;
		ASSERT((size_t)n <= size - off && f.len == (size_t)n - PROTO_HDR_SIZE &&
		       f.payload == data + off + PROTO_HDR_SIZE && f.len <= PROTO_MAX_PAYLOAD);
		fuzz_frame(&f);
		off += (size_t)n;
	}

	/* The input as one payload of every type, and as a ring record. */
	if (size <= PROTO_MAX_PAYLOAD) {
		f.len = (uint32_t)size;
		f.payload = data;
		for (size_t i = 0; i < sizeof frame_types / sizeof frame_types[0]; i++) {
			f.type = frame_types[i];
			fuzz_frame(&f);
		}
	}
	fuzz_token(data, size);
	fuzz_final(data, size);
	return 0;
}
