/* test_proto.c - pins the wire protocol of libipc/proto.c: the exact byte
 * layout of a few frames, a round trip of every frame and record type, and
 * each rule the decoders and encoders enforce (lengths, reserved fields,
 * counts, string maxima, float ranges).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "testutil.h"

/* ---- helpers ---- */

static uint8_t buf[PROTO_MAX_FRAME + 64];   /* encoder output */
static struct proto_submit_buf sbuf;          /* decoded SUBMIT arrays */

#define S(lit) ((struct proto_str){ (lit), sizeof(lit) - 1 })

static int str_eq(struct proto_str a, struct proto_str b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static uint32_t f2u(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof u);
	return u;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A payload built by hand, for shapes no encoder will write. */
struct bld {
	uint8_t b[8192];        /* the payload */
	size_t n;               /* bytes used */
};

static void b_u32(struct bld *b, uint32_t v)
{
	put_le32(b->b + b->n, v);
	b->n += 4;
}

static void b_u64(struct bld *b, uint64_t v)
{
	put_le64(b->b + b->n, v);
	b->n += 8;
}

static void b_f32(struct bld *b, float x)
{
	b_u32(b, f2u(x));
}

/* A string of LEN copies of C. */
static void b_str(struct bld *b, uint32_t len, char c)
{
	b_u32(b, len);
	memset(b->b + b->n, c, len);
	b->n += len;
}

/* Decodes one payload of a frame type into a throwaway message. */
typedef int (*decode_fn)(const struct proto_frame *f);

static int dec_hello(const struct proto_frame *f)
{
	struct proto_hello m;

	return proto_decode_hello(f, &m);
}

static int dec_welcome(const struct proto_frame *f)
{
	struct proto_welcome m;

	return proto_decode_welcome(f, &m);
}

static int dec_submit(const struct proto_frame *f)
{
	struct proto_submit m;

	return proto_decode_submit(f, &sbuf, &m);
}

static int dec_cancel(const struct proto_frame *f)
{
	uint64_t id;

	return proto_decode_cancel(f, &id);
}

static int dec_ring_wake(const struct proto_frame *f)
{
	return proto_decode_ring_wake(f);
}

static int dec_error(const struct proto_frame *f)
{
	struct proto_error m;

	return proto_decode_error(f, &m);
}

static int dec_admin(const struct proto_frame *f)
{
	struct proto_admin m;

	return proto_decode_admin(f, &m);
}

static int dec_admin_reply(const struct proto_frame *f)
{
	struct proto_admin_reply m;

	return proto_decode_admin_reply(f, &m);
}

/* Records have no frame; these read F's payload and ignore its type. */
static int dec_token(const struct proto_frame *f)
{
	struct proto_token m;

	return proto_token_decode(f->payload, f->len, &m);
}

static int dec_final(const struct proto_frame *f)
{
	struct proto_final m;

	return proto_final_decode(f->payload, f->len, &m);
}

/* Decodes N bytes of P as a payload of TYPE from an exact-size heap copy, so
 * that valgrind or ASan see any read past the end. */
static int decode_copy(uint16_t type, const uint8_t *p, size_t n, decode_fn fn)
{
	uint8_t *copy = malloc(n ? n : 1);
	struct proto_frame f;
	int rc;

	if (!copy)
		abort();
	if (n)
		memcpy(copy, p, n);
	f.type = type;
	f.len = (uint32_t)n;
	f.payload = copy;
	rc = fn(&f);
	free(copy);
	return rc;
}

static int decode_bld(uint16_t type, const struct bld *b, decode_fn fn)
{
	return decode_copy(type, b->b, b->n, fn);
}

/* The payload P (N bytes, valid) with the u32 at OFF replaced by V. */
static int decode_with_u32(uint16_t type, const uint8_t *p, size_t n, size_t off,
			   uint32_t v, decode_fn fn)
{
	uint8_t tmp[8192];

	if (n > sizeof tmp || off + 4 > n)
		abort();
	memcpy(tmp, p, n);
	put_le32(tmp + off, v);
	return decode_copy(type, tmp, n, fn);
}

static int decode_with_u64(uint16_t type, const uint8_t *p, size_t n, size_t off,
			   uint64_t v, decode_fn fn)
{
	uint8_t tmp[8192];

	if (n > sizeof tmp || off + 8 > n)
		abort();
	memcpy(tmp, p, n);
	put_le64(tmp + off, v);
	return decode_copy(type, tmp, n, fn);
}

/* The valid payload P decodes; every shorter prefix and every longer
 * version (one trailing byte, zero or not) does not. */
static void check_exact_length(uint16_t type, const uint8_t *p, size_t n, decode_fn fn)
{
	uint8_t tmp[8192];
	size_t bad = 0;

	if (n + 1 > sizeof tmp)
		abort();
	CHECK_INT_EQ(decode_copy(type, p, n, fn), 0);
	for (size_t len = 0; len < n; len++)
		if (decode_copy(type, p, len, fn) != -EBADMSG)
			bad++;
	CHECK_INT_EQ(bad, 0);
	memcpy(tmp, p, n);
	tmp[n] = 0;
	CHECK_INT_EQ(decode_copy(type, tmp, n + 1, fn), -EBADMSG);
	tmp[n] = 'x';
	CHECK_INT_EQ(decode_copy(type, tmp, n + 1, fn), -EBADMSG);
}

/* Encoded frames: parses the whole of BUF (N bytes) and checks the header. */
static struct proto_frame parse_whole(ssize_t n, uint16_t type)
{
	struct proto_frame f = { 0, 0, NULL };

	CHECK(n >= PROTO_HDR_SIZE);
	if (n < PROTO_HDR_SIZE)
		return f;
	CHECK_INT_EQ(proto_frame_parse(buf, (size_t)n, &f), n);
	CHECK_INT_EQ(f.type, type);
	CHECK_INT_EQ(f.len, n - PROTO_HDR_SIZE);
	CHECK(f.payload == buf + PROTO_HDR_SIZE);
	return f;
}

/* An encoder given any CAP below the frame's size fails with -EMSGSIZE and
 * writes nothing; given exactly the size it writes exactly that. */
#define CHECK_CAPS(call_with_cap, size) do { \
	size_t _bad = 0; \
	for (size_t cap = 0; cap < (size_t)(size); cap++) { \
		buf[0] = 0xa5; \
		if ((call_with_cap) != -EMSGSIZE || buf[0] != 0xa5) \
			_bad++; \
	} \
	CHECK_INT_EQ(_bad, 0); \
	{ \
		size_t cap = (size_t)(size); \
		memset(buf, 0xa5, cap + 1); \
		CHECK_INT_EQ((call_with_cap), (size)); \
		CHECK_INT_EQ(buf[cap], 0xa5); \
	} \
} while (0)

/* ---- names ---- */

static void test_names(void)
{
	CHECK_STR_EQ(proto_err_name(PROTO_E_OK), "ok");
	CHECK_STR_EQ(proto_err_name(PROTO_E_LIMIT), "limit");
	CHECK_STR_EQ(proto_err_name(PROTO_E_RING), "ring");
	CHECK_STR_EQ(proto_err_name(PROTO_E_NOMODEL), "nomodel");
	CHECK_STR_EQ(proto_err_name(PROTO_E__MAX), "unknown");
	CHECK_STR_EQ(proto_err_name(UINT32_MAX), "unknown");
	for (uint32_t i = 0; i < PROTO_E__MAX; i++) {
		CHECK(proto_err_name(i) != NULL);
		CHECK(strcmp(proto_err_name(i), "unknown") != 0);
		for (uint32_t j = 0; j < i; j++)
			CHECK(strcmp(proto_err_name(i), proto_err_name(j)) != 0);
	}
	CHECK_STR_EQ(proto_type_name(PROTO_HELLO), "HELLO");
	CHECK_STR_EQ(proto_type_name(PROTO_SUBMIT), "SUBMIT");
	CHECK_STR_EQ(proto_type_name(PROTO_CANCEL), "CANCEL");
	CHECK_STR_EQ(proto_type_name(PROTO_RING_WAKE), "RING_WAKE");
	CHECK_STR_EQ(proto_type_name(PROTO_ADMIN), "ADMIN");
	CHECK_STR_EQ(proto_type_name(PROTO_WELCOME), "WELCOME");
	CHECK_STR_EQ(proto_type_name(PROTO_ERROR), "ERROR");
	CHECK_STR_EQ(proto_type_name(PROTO_ADMIN_REPLY), "ADMIN_REPLY");
	CHECK_STR_EQ(proto_type_name(0), "?");
	CHECK_STR_EQ(proto_type_name(6), "?");
	CHECK_STR_EQ(proto_type_name(0x80), "?");
	CHECK_STR_EQ(proto_type_name(0x84), "?");
	CHECK_STR_EQ(proto_type_name(0x10001), "?");
}

/* ---- byte layout ---- */

static void test_layout_cancel(void)
{
	static const uint8_t want[] = {
		0x08, 0x00, 0x00, 0x00,  0x03, 0x00,  0x00, 0x00,  /* len 8, CANCEL, reserved */
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,    /* id */
	};
	uint64_t id = 0;
	struct proto_frame f;

	CHECK_INT_EQ(proto_encode_cancel(buf, sizeof buf, 0x0102030405060708ull), sizeof want);
	CHECK(memcmp(buf, want, sizeof want) == 0);
	CHECK_INT_EQ(proto_frame_parse(want, sizeof want, &f), sizeof want);
	CHECK_INT_EQ(proto_decode_cancel(&f, &id), 0);
	CHECK(id == 0x0102030405060708ull);
}

static void test_layout_hello(void)
{
	static const uint8_t want[] = {
		0x10, 0x00, 0x00, 0x00,  0x01, 0x00,  0x00, 0x00,  /* len 16, HELLO, reserved */
		0x01, 0x00, 0x00, 0x00,                            /* version 1 */
		0x00, 0x00, 0x00, 0x00,                            /* flags */
		0x00, 0x00, 0x01, 0x00,                            /* ring_bytes 65536 */
		0x00, 0x00, 0x00, 0x00,                            /* reserved */
	};
	struct proto_hello m = { .version = PROTO_VERSION, .ring_bytes = 1u << 16 };

	CHECK_INT_EQ(proto_encode_hello(buf, sizeof buf, &m), sizeof want);
	CHECK(memcmp(buf, want, sizeof want) == 0);
}

static void test_layout_ring_wake(void)
{
	static const uint8_t want[] = { 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00 };
	struct proto_frame f;

	CHECK_INT_EQ(proto_encode_ring_wake(buf, sizeof buf), sizeof want);
	CHECK(memcmp(buf, want, sizeof want) == 0);
	CHECK_INT_EQ(proto_frame_parse(want, sizeof want, &f), 8);
	CHECK_INT_EQ(proto_decode_ring_wake(&f), 0);
	CHECK_INT_EQ(proto_encode_ring_wake(buf, 7), -EMSGSIZE);
}

/* SUBMIT's fixed part: every field at the offset proto.h gives. */
static void test_layout_submit(void)
{
	struct proto_submit m = {
		.id = 0x1122334455667788ull, .flags = PROTO_SUBMIT_SEED, .priority = -2,
		.max_tokens = 100, .top_k = 40, .temperature = 1.0f, .top_p = 0.5f,
		.min_p = 0.25f, .repeat_penalty = 2.0f, .repeat_last_n = 64,
		.presence_penalty = -1.0f, .frequency_penalty = 0.125f,
		.seed = 0xa1a2a3a4a5a6a7a8ull, .prompt = S("hi"),
	};
	const uint8_t *p = buf + PROTO_HDR_SIZE;

	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), 8 + 72 + 4 + 2);
	CHECK_INT_EQ(get_le32(buf), 72 + 4 + 2);
	CHECK_INT_EQ(get_le32(p + 0), 0x55667788u);
	CHECK_INT_EQ(get_le32(p + 4), 0x11223344u);
	CHECK_INT_EQ(get_le32(p + 8), PROTO_SUBMIT_SEED);
	CHECK_INT_EQ(get_le32(p + 12), 0xfffffffeu);
	CHECK_INT_EQ(get_le32(p + 16), 100);
	CHECK_INT_EQ(get_le32(p + 20), 40);
	CHECK_INT_EQ(get_le32(p + 24), 0x3f800000u);
	CHECK_INT_EQ(get_le32(p + 28), 0x3f000000u);
	CHECK_INT_EQ(get_le32(p + 32), 0x3e800000u);
	CHECK_INT_EQ(get_le32(p + 36), 0x40000000u);
	CHECK_INT_EQ(get_le32(p + 40), 64);
	CHECK_INT_EQ(get_le32(p + 44), 0xbf800000u);
	CHECK_INT_EQ(get_le32(p + 48), 0x3e000000u);
	CHECK_INT_EQ(get_le32(p + 52), 0);          /* n_stops */
	CHECK_INT_EQ(get_le32(p + 56), 0xa5a6a7a8u);
	CHECK_INT_EQ(get_le32(p + 60), 0xa1a2a3a4u);
	CHECK_INT_EQ(get_le32(p + 64), 0);          /* n_messages */
	CHECK_INT_EQ(get_le32(p + 68), 0);          /* top_logprobs */
	CHECK_INT_EQ(get_le32(p + 72), 2);
	CHECK(memcmp(p + 76, "hi", 2) == 0);
}

/* TOKEN and FINAL records: fixed sizes and field offsets. */
static void test_layout_records(void)
{
	static const uint8_t want_token[] = {
		0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,    /* id 2 */
		0xff, 0xff, 0xff, 0xff,                            /* token -1 */
		0x00, 0x00, 0x00, 0xbf,                            /* logprob -0.5 */
		0x03, 0x00, 0x00, 0x00,                            /* text_len 3 */
		0x00, 0x00, 0x00, 0x00,                            /* n_top */
		'a', 'b', 'c',
	};
	struct proto_token t = { .id = 2, .token = -1, .logprob = -0.5f, .text = S("abc") };
	struct proto_final fin = {
		.id = 7, .finish = PROTO_FIN_ERROR, .code = PROTO_E_INTERNAL,
		.prompt_tokens = 1, .cached_tokens = 2, .generated_tokens = 3, .preemptions = 4,
		.queue_us = 5, .prefill_us = 6, .decode_us = 0x100000007ull, .message = S("oops"),
	};

	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &t), sizeof want_token);
	CHECK(memcmp(buf, want_token, sizeof want_token) == 0);
	CHECK_INT_EQ(proto_final_encode(buf, sizeof buf, &fin), PROTO_FINAL_FIXED + 4);
	CHECK_INT_EQ(get_le32(buf + 0), 7);
	CHECK_INT_EQ(get_le32(buf + 8), PROTO_FIN_ERROR);
	CHECK_INT_EQ(get_le32(buf + 12), PROTO_E_INTERNAL);
	CHECK_INT_EQ(get_le32(buf + 16), 1);
	CHECK_INT_EQ(get_le32(buf + 28), 4);
	CHECK_INT_EQ(get_le32(buf + 32), 5);
	CHECK_INT_EQ(get_le32(buf + 40), 6);
	CHECK_INT_EQ(get_le32(buf + 48), 7);
	CHECK_INT_EQ(get_le32(buf + 52), 1);
	CHECK_INT_EQ(get_le32(buf + 56), 4);        /* msg_len */
	CHECK_INT_EQ(get_le32(buf + 60), 0);        /* reserved */
	CHECK(memcmp(buf + 64, "oops", 4) == 0);
}

/* ---- proto_frame_parse ---- */

static void test_frame_parse(void)
{
	uint8_t hdr[PROTO_HDR_SIZE + 4];
	struct proto_frame f;
	ssize_t n1, n2;

	/* A header alone is not enough, nor part of one. */
	CHECK_INT_EQ(proto_encode_cancel(buf, sizeof buf, 9), 16);
	for (size_t avail = 0; avail < 16; avail++)
		CHECK_INT_EQ(proto_frame_parse(buf, avail, &f), 0);
	CHECK_INT_EQ(proto_frame_parse(buf, 16, &f), 16);
	CHECK_INT_EQ(proto_frame_parse(buf, 100, &f), 16);

	/* Lengths: the maximum waits for its payload, one more is refused. */
	memset(hdr, 0, sizeof hdr);
	put_le32(hdr, PROTO_MAX_PAYLOAD);
	hdr[4] = PROTO_ADMIN_REPLY;
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), 0);
	put_le32(hdr, PROTO_MAX_PAYLOAD + 1);
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), -EMSGSIZE);
	put_le32(hdr, UINT32_MAX);
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), -EMSGSIZE);
	put_le32(hdr, UINT32_MAX);
	CHECK_INT_EQ(proto_frame_parse(hdr, PROTO_HDR_SIZE, &f), -EMSGSIZE);

	/* Types and the reserved half-word. */
	static const uint16_t bad_types[] = { 0, 6, 0x7f, 0x80, 0x84, 0x101, 0x8101, 0xffff };
	for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
		memset(hdr, 0, sizeof hdr);
		hdr[4] = (uint8_t)bad_types[i];
		hdr[5] = (uint8_t)(bad_types[i] >> 8);
		CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), -EBADMSG);
	}
	memset(hdr, 0, sizeof hdr);
	hdr[4] = PROTO_RING_WAKE;
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), 8);
	hdr[6] = 1;
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), -EBADMSG);
	hdr[6] = 0;
	hdr[7] = 0x80;
	CHECK_INT_EQ(proto_frame_parse(hdr, sizeof hdr, &f), -EBADMSG);

	/* Two frames back to back come out one at a time. */
	n1 = proto_encode_cancel(buf, sizeof buf, 5);
	n2 = proto_encode_ring_wake(buf + n1, sizeof buf - (size_t)n1);
	CHECK_INT_EQ(n1, 16);
	CHECK_INT_EQ(n2, 8);
	CHECK_INT_EQ(proto_frame_parse(buf, (size_t)(n1 + n2), &f), n1);
	CHECK_INT_EQ(f.type, PROTO_CANCEL);
	CHECK_INT_EQ(f.len, 8);
	CHECK(f.payload == buf + 8);
	CHECK_INT_EQ(proto_frame_parse(buf + n1, (size_t)n2, &f), n2);
	CHECK_INT_EQ(f.type, PROTO_RING_WAKE);
	CHECK_INT_EQ(f.len, 0);
}

/* ---- HELLO ---- */

static void test_hello(void)
{
	struct proto_hello m = { .version = 7, .ring_bytes = 0xdeadbeef }, d;
	struct proto_frame f;
	ssize_t n;

	n = proto_encode_hello(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 24);
	f = parse_whole(n, PROTO_HELLO);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_hello(&f, &d), 0);
	CHECK_INT_EQ(d.version, 7);
	CHECK_INT_EQ(d.flags, 0);
	CHECK_INT_EQ(d.ring_bytes, 0xdeadbeef);
	CHECK_INT_EQ(d.reserved, 0);

	check_exact_length(PROTO_HELLO, f.payload, f.len, dec_hello);
	CHECK_INT_EQ(decode_with_u32(PROTO_HELLO, f.payload, f.len, 4, 1, dec_hello), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_HELLO, f.payload, f.len, 12, 1, dec_hello), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_HELLO, f.payload, f.len, 0, 0, dec_hello), 0);
	/* Another type's frame is not a HELLO. */
	CHECK_INT_EQ(decode_copy(PROTO_SUBMIT, f.payload, f.len, dec_hello), -EBADMSG);

	m.flags = 1;
	CHECK_INT_EQ(proto_encode_hello(buf, sizeof buf, &m), -EINVAL);
	m.flags = 0;
	m.reserved = 1;
	CHECK_INT_EQ(proto_encode_hello(buf, sizeof buf, &m), -EINVAL);
	m.reserved = 0;
	CHECK_CAPS(proto_encode_hello(buf, cap, &m), 24);
}

/* ---- WELCOME ---- */

static struct proto_welcome welcome_example(void)
{
	return (struct proto_welcome){
		.version = PROTO_VERSION, .ring_bytes = 1u << 20, .daemon_pid = 4242,
		.max_inflight = 8, .max_prompt_bytes = 65536, .max_prompt_tokens = 4096,
		.max_tokens = 2048, .n_ctx = 8192, .n_vocab = 49152, .client_id = 17,
		.model = S("SmolLM2-135M-Instruct"), .backend = S("cpu"), .chat_template = S("chatml"),
	};
}

static void test_welcome(void)
{
	struct proto_welcome m = welcome_example(), d;
	char name[PROTO_MAX_NAME + 1];
	struct proto_frame f;
	struct bld b;
	ssize_t n;

	n = proto_encode_welcome(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 48 + 4 + 21 + 4 + 3 + 4 + 6);
	f = parse_whole(n, PROTO_WELCOME);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_welcome(&f, &d), 0);
	CHECK_INT_EQ(d.version, m.version);
	CHECK_INT_EQ(d.flags, 0);
	CHECK_INT_EQ(d.ring_bytes, m.ring_bytes);
	CHECK_INT_EQ(d.daemon_pid, m.daemon_pid);
	CHECK_INT_EQ(d.max_inflight, m.max_inflight);
	CHECK_INT_EQ(d.max_prompt_bytes, m.max_prompt_bytes);
	CHECK_INT_EQ(d.max_prompt_tokens, m.max_prompt_tokens);
	CHECK_INT_EQ(d.max_tokens, m.max_tokens);
	CHECK_INT_EQ(d.n_ctx, m.n_ctx);
	CHECK_INT_EQ(d.n_vocab, m.n_vocab);
	CHECK_INT_EQ(d.client_id, m.client_id);
	CHECK_INT_EQ(d.reserved, 0);
	CHECK(str_eq(d.model, m.model));
	CHECK(str_eq(d.backend, m.backend));
	CHECK(str_eq(d.chat_template, m.chat_template));
	CHECK((const uint8_t *)d.model.p == f.payload + 52);

	check_exact_length(PROTO_WELCOME, f.payload, f.len, dec_welcome);
	CHECK_INT_EQ(decode_with_u32(PROTO_WELCOME, f.payload, f.len, 4, 2, dec_welcome), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_WELCOME, f.payload, f.len, 44, 1, dec_welcome), -EBADMSG);
	/* The model name's length running past the end, by a little and a lot. */
	CHECK_INT_EQ(decode_with_u32(PROTO_WELCOME, f.payload, f.len, 48, 22, dec_welcome), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_WELCOME, f.payload, f.len, 48, UINT32_MAX, dec_welcome),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_WELCOME, f.payload, f.len, 48, UINT32_MAX - 3,
				     dec_welcome), -EBADMSG);

	/* Empty strings are fine (no chat template); a name over the maximum is not. */
	m.chat_template = (struct proto_str){ NULL, 0 };
	m.backend = (struct proto_str){ "", 0 };
	n = proto_encode_welcome(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 48 + 4 + 21 + 4 + 4);
	f = parse_whole(n, PROTO_WELCOME);
	CHECK_INT_EQ(proto_decode_welcome(&f, &d), 0);
	CHECK_INT_EQ(d.backend.len, 0);
	CHECK_INT_EQ(d.chat_template.len, 0);

	memset(name, 'm', sizeof name);
	m.model = (struct proto_str){ name, PROTO_MAX_NAME };
	CHECK(proto_encode_welcome(buf, sizeof buf, &m) > 0);
	m.model.len = PROTO_MAX_NAME + 1;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);
	m = welcome_example();
	m.backend.len = PROTO_MAX_NAME + 1;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);
	m = welcome_example();
	m.chat_template.len = PROTO_MAX_NAME + 1;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);
	m = welcome_example();
	m.model.p = NULL;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);
	m = welcome_example();
	m.flags = 1;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);
	m = welcome_example();
	m.reserved = 1;
	CHECK_INT_EQ(proto_encode_welcome(buf, sizeof buf, &m), -EINVAL);

	/* The same limits on receipt. */
	for (int which = 0; which < 3; which++) {
		b.n = 0;
		for (int i = 0; i < 12; i++)
			b_u32(&b, 0);
		for (int i = 0; i < 3; i++)
			b_str(&b, i == which ? PROTO_MAX_NAME + 1 : PROTO_MAX_NAME, 'n');
		CHECK_INT_EQ(decode_bld(PROTO_WELCOME, &b, dec_welcome), -EBADMSG);
	}
	b.n = 0;
	for (int i = 0; i < 12; i++)
		b_u32(&b, 0);
	for (int i = 0; i < 3; i++)
		b_str(&b, PROTO_MAX_NAME, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_WELCOME, &b, dec_welcome), 0);

	m = welcome_example();
	n = proto_encode_welcome(buf, sizeof buf, &m);
	CHECK_CAPS(proto_encode_welcome(buf, cap, &m), n);
}

/* ---- SUBMIT ---- */

static const struct proto_str example_stops[] = { { "\n\n", 2 }, { "User:", 5 } };
static const struct proto_message example_msgs[] = {
	{ PROTO_ROLE_SYSTEM, { "Be brief.", 9 } },
	{ PROTO_ROLE_USER, { "Hello?", 6 } },
	{ PROTO_ROLE_ASSISTANT, { "", 0 } },
};

static struct proto_submit submit_example(int chat)
{
	struct proto_submit m = {
		.id = 0x8000000000000001ull,
		.flags = PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_IGNORE_EOS | PROTO_SUBMIT_SEED,
		.priority = -3, .max_tokens = 128, .top_k = 40, .temperature = 0.7f,
		.top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.1f, .repeat_last_n = 64,
		.presence_penalty = 0.5f, .frequency_penalty = -0.25f, .seed = 0xfedcba9876543210ull,
		.n_stops = 2, .stops = example_stops,
	};

	if (chat) {
		m.flags |= PROTO_SUBMIT_CHAT;
		m.n_messages = 3;
		m.messages = example_msgs;
	} else {
		m.prompt = S("Once upon a time");
	}
	return m;
}

static void check_submit_equal(const struct proto_submit *d, const struct proto_submit *m)
{
	CHECK(d->id == m->id);
	CHECK_INT_EQ(d->flags, m->flags);
	CHECK_INT_EQ(d->priority, m->priority);
	CHECK_INT_EQ(d->max_tokens, m->max_tokens);
	CHECK_INT_EQ(d->top_k, m->top_k);
	CHECK_INT_EQ(f2u(d->temperature), f2u(m->temperature));
	CHECK_INT_EQ(f2u(d->top_p), f2u(m->top_p));
	CHECK_INT_EQ(f2u(d->min_p), f2u(m->min_p));
	CHECK_INT_EQ(f2u(d->repeat_penalty), f2u(m->repeat_penalty));
	CHECK_INT_EQ(d->repeat_last_n, m->repeat_last_n);
	CHECK_INT_EQ(f2u(d->presence_penalty), f2u(m->presence_penalty));
	CHECK_INT_EQ(f2u(d->frequency_penalty), f2u(m->frequency_penalty));
	CHECK(d->seed == m->seed);
	CHECK(str_eq(d->prompt, m->prompt));
	CHECK_INT_EQ(d->n_messages, m->n_messages);
	for (uint32_t i = 0; i < d->n_messages && i < m->n_messages; i++) {
		CHECK_INT_EQ(d->messages[i].role, m->messages[i].role);
		CHECK(str_eq(d->messages[i].content, m->messages[i].content));
	}
	CHECK_INT_EQ(d->n_stops, m->n_stops);
	for (uint32_t i = 0; i < d->n_stops && i < m->n_stops; i++)
		CHECK(str_eq(d->stops[i], m->stops[i]));
	CHECK_INT_EQ(d->grammar_kind, m->grammar_kind);
	CHECK_INT_EQ(d->grammar_flags, m->grammar_flags);
	CHECK(str_eq(d->grammar, m->grammar));
	CHECK(str_eq(d->model, m->model));
	CHECK_INT_EQ(d->keep_alive_s, m->keep_alive_s);
	CHECK_INT_EQ(d->max_draft, m->max_draft);
}

/* Encodes M, parses and decodes it, and compares every field. */
static void roundtrip_submit(const struct proto_submit *m, ssize_t want_size)
{
	struct proto_submit d;
	struct proto_frame f;
	ssize_t n;

	n = proto_encode_submit(buf, sizeof buf, m);
	CHECK_INT_EQ(n, want_size);
	f = parse_whole(n, PROTO_SUBMIT);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_submit(&f, &sbuf, &d), 0);
	check_submit_equal(&d, m);
}

static void test_submit_roundtrip(void)
{
	static char big_stops[PROTO_MAX_STOPS][PROTO_MAX_STOP_LEN];
	static struct proto_message msgs[PROTO_MAX_MESSAGES];
	static struct proto_str stops[PROTO_MAX_STOPS];
	struct proto_submit m;
	ssize_t n;

	m = submit_example(0);
	roundtrip_submit(&m, 8 + 72 + 4 + 16 + (4 + 2) + (4 + 5));
	m = submit_example(1);
	roundtrip_submit(&m, 8 + 72 + (8 + 9) + (8 + 6) + 8 + (4 + 2) + (4 + 5));

	/* Boundary values that are allowed: greedy, top_p 1, min_p 0 and 1, the
	 * smallest positive floats, an empty prompt, no stops, a one-byte model
	 * name, every flag. */
	m = submit_example(0);
	m.flags = PROTO_SUBMIT__ALL & ~(PROTO_SUBMIT_CHAT | PROTO_SUBMIT_SPEC_OFF | PROTO_SUBMIT_SPEC_DRAFT);
	m.grammar_kind = PROTO_GRAMMAR_JSON_OBJECT;
	m.model = S("m");
	m.temperature = 0.0f;
	m.top_p = 1.0f;
	m.min_p = 1.0f;
	m.repeat_penalty = 1e-38f;
	m.max_tokens = 1;
	m.top_k = INT32_MIN;
	m.priority = INT32_MAX;
	m.repeat_last_n = 0;
	m.presence_penalty = -3.4e38f;
	m.frequency_penalty = 3.4e38f;
	m.prompt = (struct proto_str){ NULL, 0 };
	m.n_stops = 0;
	m.stops = NULL;
	m.keep_alive_s = -1;
	m.max_draft = 1;
	roundtrip_submit(&m, 8 + 72 + 4 + 12 + 5 + 4 + 4);
	m.top_p = 1e-45f;       /* the smallest denormal */
	m.min_p = 0.0f;
	m.temperature = 1e30f;
	roundtrip_submit(&m, 8 + 72 + 4 + 12 + 5 + 4 + 4);

	/* Every count and the model's name at their maximum. */
	static char big_name[PROTO_MAX_NAME];
	memset(big_name, 'n', sizeof big_name);
	for (int i = 0; i < PROTO_MAX_STOPS; i++) {
		memset(big_stops[i], 'a' + i, PROTO_MAX_STOP_LEN);
		stops[i] = (struct proto_str){ big_stops[i], PROTO_MAX_STOP_LEN };
	}
	for (int i = 0; i < PROTO_MAX_MESSAGES; i++)
		msgs[i] = (struct proto_message){ 1 + i % 3, { big_stops[i % 16], (uint32_t)i } };
	m = submit_example(1);
	m.flags = PROTO_SUBMIT__ALL & ~(PROTO_SUBMIT_GRAMMAR | PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_OFF);
	m.n_messages = PROTO_MAX_MESSAGES;
	m.messages = msgs;
	m.n_stops = PROTO_MAX_STOPS;
	m.stops = stops;
	m.model = (struct proto_str){ big_name, PROTO_MAX_NAME };
	m.keep_alive_s = INT32_MAX;
	m.max_draft = PROTO_MAX_DRAFT;
	n = 8 + 72 + PROTO_MAX_STOPS * (4 + PROTO_MAX_STOP_LEN) + 4 + PROTO_MAX_NAME + 4 + 4;
	for (int i = 0; i < PROTO_MAX_MESSAGES; i++)
		n += 8 + i;
	roundtrip_submit(&m, n);
	CHECK_CAPS(proto_encode_submit(buf, cap, &m), n);

	m = submit_example(0);
	n = proto_encode_submit(buf, sizeof buf, &m);
	CHECK_CAPS(proto_encode_submit(buf, cap, &m), n);

	/* Grammars: GBNF, a strict schema, the longest text; JSON_OBJECT has
	 * none. */
	static char big_grammar[PROTO_MAX_GRAMMAR];
	m = submit_example(1);
	m.flags |= PROTO_SUBMIT_GRAMMAR;
	m.grammar_kind = PROTO_GRAMMAR_GBNF;
	m.grammar = S("root ::= \"yes\" | \"no\"");
	roundtrip_submit(&m, 8 + 72 + (8 + 9) + (8 + 6) + 8 + (4 + 2) + (4 + 5) + 12 + 21);
	m.grammar_kind = PROTO_GRAMMAR_JSON_SCHEMA;
	m.grammar_flags = PROTO_GRAMMAR_STRICT;
	m.grammar = S("{\"type\":\"object\"}");
	roundtrip_submit(&m, 8 + 72 + (8 + 9) + (8 + 6) + 8 + (4 + 2) + (4 + 5) + 12 + 17);
	memset(big_grammar, ' ', sizeof big_grammar);
	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_GRAMMAR;
	m.grammar_kind = PROTO_GRAMMAR_GBNF;
	m.grammar = (struct proto_str){ big_grammar, PROTO_MAX_GRAMMAR };
	roundtrip_submit(&m, 8 + 72 + 4 + 16 + (4 + 2) + (4 + 5) + 12 + PROTO_MAX_GRAMMAR);
}

/* Each rule of SUBMIT, broken one at a time, on the way out. */
static void test_submit_encode_rejects(void)
{
	static char long_stop[PROTO_MAX_STOP_LEN + 1];
	struct proto_message msgs[PROTO_MAX_MESSAGES + 1];
	struct proto_str stops[PROTO_MAX_STOPS + 1];
	struct proto_submit m;

#define REJECT(chat, change) do { \
	m = submit_example(chat); \
	change; \
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EINVAL); \
} while (0)
	REJECT(0, m.id = 0);
	REJECT(0, m.flags |= 1u << 11);
	/* a keep-alive without its flag, or under -1 */
	REJECT(0, m.keep_alive_s = 5);
	REJECT(0, (m.flags |= PROTO_SUBMIT_KEEP_ALIVE, m.keep_alive_s = -2));
	/* a max_draft without its flag, or out of 1..PROTO_MAX_DRAFT */
	REJECT(0, m.max_draft = 4);
	REJECT(0, (m.flags |= PROTO_SUBMIT_MAX_DRAFT, m.max_draft = 0));
	REJECT(0, (m.flags |= PROTO_SUBMIT_MAX_DRAFT, m.max_draft = PROTO_MAX_DRAFT + 1));
	/* two speculation modes at once */
	REJECT(0, m.flags |= PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_OFF);
	REJECT(0, m.flags |= PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_DRAFT);
	REJECT(0, m.flags |= PROTO_SUBMIT_SPEC_OFF | PROTO_SUBMIT_SPEC_DRAFT);
	/* Grammars: the flag without a kind, a kind without the flag, unknown
	 * kinds and flags, an empty GBNF or schema, text with JSON_OBJECT, too
	 * long a text. */
	static char long_grammar[PROTO_MAX_GRAMMAR + 1];
	REJECT(0, m.flags |= PROTO_SUBMIT_GRAMMAR);
	REJECT(0, m.grammar_kind = PROTO_GRAMMAR_JSON_OBJECT);
	REJECT(0, (m.grammar = S("root ::= \"a\""), m.grammar_kind = 0));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = 4));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_JSON_OBJECT,
		   m.grammar_flags = 2));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_GBNF));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_JSON_SCHEMA));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_JSON_OBJECT,
		   m.grammar = S("{}")));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_GBNF,
		   m.grammar = (struct proto_str){ long_grammar, PROTO_MAX_GRAMMAR + 1 }));
	REJECT(0, (m.flags |= PROTO_SUBMIT_GRAMMAR, m.grammar_kind = PROTO_GRAMMAR_GBNF,
		   m.grammar = (struct proto_str){ NULL, 3 }));
	REJECT(0, m.flags |= 1u << 31);
	REJECT(0, m.max_tokens = 0);
	REJECT(0, m.max_tokens = -1);
	REJECT(0, m.max_tokens = INT32_MIN);
	REJECT(0, m.temperature = -0.01f);
	REJECT(0, m.temperature = NAN);
	REJECT(0, m.temperature = INFINITY);
	REJECT(0, m.temperature = -INFINITY);
	REJECT(0, m.top_p = 0.0f);
	REJECT(0, m.top_p = -0.5f);
	REJECT(0, m.top_p = 1.0001f);
	REJECT(0, m.top_p = NAN);
	REJECT(0, m.top_p = INFINITY);
	REJECT(0, m.min_p = -0.01f);
	REJECT(0, m.min_p = 1.01f);
	REJECT(0, m.min_p = NAN);
	REJECT(0, m.repeat_penalty = 0.0f);
	REJECT(0, m.repeat_penalty = -1.0f);
	REJECT(0, m.repeat_penalty = NAN);
	REJECT(0, m.repeat_penalty = INFINITY);
	REJECT(0, m.repeat_last_n = -1);
	REJECT(0, m.presence_penalty = NAN);
	REJECT(0, m.presence_penalty = -INFINITY);
	REJECT(0, m.frequency_penalty = NAN);
	REJECT(0, m.frequency_penalty = INFINITY);
	/* Stops: too many, empty, too long, missing. */
	for (int i = 0; i <= PROTO_MAX_STOPS; i++)
		stops[i] = S("x");
	REJECT(0, (m.n_stops = PROTO_MAX_STOPS + 1, m.stops = stops));
	REJECT(0, (m.n_stops = UINT32_MAX, m.stops = stops));
	stops[3] = (struct proto_str){ "", 0 };
	REJECT(0, (m.n_stops = 4, m.stops = stops));
	memset(long_stop, 's', sizeof long_stop);
	stops[3] = (struct proto_str){ long_stop, PROTO_MAX_STOP_LEN + 1 };
	REJECT(0, (m.n_stops = 4, m.stops = stops));
	REJECT(0, m.stops = NULL);
	stops[3] = (struct proto_str){ NULL, 3 };
	REJECT(0, (m.n_stops = 4, m.stops = stops));
	/* Prompt or messages, never both, never neither in chat. */
	REJECT(0, (m.n_messages = 1, m.messages = example_msgs));
	REJECT(0, m.prompt.p = NULL);
	REJECT(1, m.n_messages = 0);
	REJECT(1, m.prompt = S("also a prompt"));
	REJECT(1, m.messages = NULL);
	for (int i = 0; i <= PROTO_MAX_MESSAGES; i++)
		msgs[i] = (struct proto_message){ PROTO_ROLE_USER, S("u") };
	REJECT(1, (m.n_messages = PROTO_MAX_MESSAGES + 1, m.messages = msgs));
	msgs[5].role = 0;
	REJECT(1, (m.n_messages = 6, m.messages = msgs));
	msgs[5].role = 4;
	REJECT(1, (m.n_messages = 6, m.messages = msgs));
	msgs[5].role = PROTO_ROLE_ASSISTANT;
	msgs[5].content = (struct proto_str){ NULL, 1 };
	REJECT(1, (m.n_messages = 6, m.messages = msgs));
#undef REJECT

	/* Over PROTO_MAX_PAYLOAD: refused by size, whatever CAP, and the
	 * bytes (which are not there) are never read. */
	m = submit_example(0);
	m.prompt = (struct proto_str){ "p", PROTO_MAX_PAYLOAD };
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EMSGSIZE);
	m.prompt = (struct proto_str){ "p", UINT32_MAX };
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EMSGSIZE);
	m = submit_example(1);
	for (int i = 0; i < PROTO_MAX_MESSAGES; i++)
		msgs[i] = (struct proto_message){ PROTO_ROLE_USER, { "m", UINT32_MAX } };
	m.n_messages = PROTO_MAX_MESSAGES;
	m.messages = msgs;
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EMSGSIZE);
}

/* A plain SUBMIT payload built by hand: the fixed part of submit_example(0)
 * with N_MESSAGES and N_STOPS as given, no strings yet. */
static void b_submit_fixed(struct bld *b, uint32_t flags, uint32_t n_stops, uint32_t n_messages)
{
	b->n = 0;
	b_u64(b, 1);
	b_u32(b, flags);
	b_u32(b, 0);
	b_u32(b, 16);
	b_u32(b, 0);
	b_f32(b, 1.0f);
	b_f32(b, 1.0f);
	b_f32(b, 0.0f);
	b_f32(b, 1.0f);
	b_u32(b, 0);
	b_f32(b, 0.0f);
	b_f32(b, 0.0f);
	b_u32(b, n_stops);
	b_u64(b, 0);
	b_u32(b, n_messages);
	b_u32(b, 0);
}

/* Each rule of SUBMIT, broken one at a time, on the way in. */
/* top_logprobs: up to PROTO_MAX_TOP_LOGPROBS, and only with LOGPROBS. */
static void test_submit_top_logprobs(void)
{
	struct proto_submit m = submit_example(0);
	ssize_t n;

	m.top_logprobs = PROTO_MAX_TOP_LOGPROBS;
	n = proto_encode_submit(buf, sizeof buf, &m);
	CHECK(n > 0);
	CHECK_INT_EQ(get_le32(buf + PROTO_HDR_SIZE + 68), PROTO_MAX_TOP_LOGPROBS);
	struct proto_frame f;
	struct proto_submit d;
	CHECK(proto_frame_parse(buf, (size_t)n, &f) == n);
	CHECK_INT_EQ(proto_decode_submit(&f, &sbuf, &d), 0);
	CHECK_INT_EQ(d.top_logprobs, PROTO_MAX_TOP_LOGPROBS);
	m.top_logprobs = PROTO_MAX_TOP_LOGPROBS + 1;
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EINVAL);
	m.top_logprobs = 1;
	m.flags &= ~(uint32_t)PROTO_SUBMIT_LOGPROBS;
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EINVAL);
}

/* MODEL: a name after everything else, only with PROTO_SUBMIT_MODEL, 1 to
 * PROTO_MAX_NAME bytes without a NUL, both ways. */
static void test_submit_model(void)
{
	static char name_max[PROTO_MAX_NAME + 1];
	struct proto_submit m, d;
	struct proto_frame f;
	const uint8_t *p;
	struct bld b;
	ssize_t n;

	/* After the stops of a completion, of a chat; after the grammar. */
	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_MODEL;
	m.model = S("smollm2");
	roundtrip_submit(&m, 8 + 107 + 4 + 7);
	p = buf + PROTO_HDR_SIZE;
	CHECK_INT_EQ(get_le32(p + 8), m.flags);
	CHECK_INT_EQ(get_le32(p + 107), 7);
	CHECK(memcmp(p + 111, "smollm2", 7) == 0);
	f = parse_whole(8 + 107 + 4 + 7, PROTO_SUBMIT);
	CHECK_INT_EQ(proto_decode_submit(&f, &sbuf, &d), 0);
	CHECK(d.model.p == (const char *)f.payload + 111); /* into the frame */
	CHECK_CAPS(proto_encode_submit(buf, cap, &m), 8 + 107 + 4 + 7);

	m = submit_example(1);
	m.flags |= PROTO_SUBMIT_MODEL;
	m.model = S("gemma-3-270m");
	roundtrip_submit(&m, 8 + 126 + 4 + 12);
	CHECK_INT_EQ(get_le32(buf + PROTO_HDR_SIZE + 126), 12);
	CHECK(memcmp(buf + PROTO_HDR_SIZE + 130, "gemma-3-270m", 12) == 0);

	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_GRAMMAR | PROTO_SUBMIT_MODEL;
	m.grammar_kind = PROTO_GRAMMAR_GBNF;
	m.grammar = S("root ::= \"a\"");
	m.model = S("qwen");
	roundtrip_submit(&m, 8 + 107 + 12 + 12 + 4 + 4);
	p = buf + PROTO_HDR_SIZE;
	CHECK_INT_EQ(get_le32(p + 107), PROTO_GRAMMAR_GBNF);
	CHECK_INT_EQ(get_le32(p + 115), 12);
	CHECK(memcmp(p + 119, "root ::= \"a\"", 12) == 0);
	CHECK_INT_EQ(get_le32(p + 131), 4);
	CHECK(memcmp(p + 135, "qwen", 4) == 0);
	check_exact_length(PROTO_SUBMIT, p, 107 + 12 + 12 + 4 + 4, dec_submit);

	/* Without the flag nothing is written, and nothing decodes. */
	m = submit_example(0);
	roundtrip_submit(&m, 8 + 107);

	/* KEEP_ALIVE: an i32 after the model, or after the stops without one */
	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_MODEL | PROTO_SUBMIT_KEEP_ALIVE;
	m.model = S("coder");
	m.keep_alive_s = 300;
	roundtrip_submit(&m, 8 + 107 + 4 + 5 + 4);
	CHECK_INT_EQ(get_le32(buf + PROTO_HDR_SIZE + 107 + 4 + 5), 300);
	m.flags &= ~(uint32_t)PROTO_SUBMIT_MODEL;
	m.model = (struct proto_str){ NULL, 0 };
	m.keep_alive_s = 0;
	roundtrip_submit(&m, 8 + 107 + 4);
	b_submit_fixed(&b, PROTO_SUBMIT_KEEP_ALIVE, 0, 0);
	b_str(&b, 1, 'p');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG); /* the i32 missing */
	b_u32(&b, (uint32_t)-1);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
	b_submit_fixed(&b, PROTO_SUBMIT_KEEP_ALIVE, 0, 0);
	b_str(&b, 1, 'p');
	b_u32(&b, (uint32_t)-2);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG); /* under -1 */

	/* MAX_DRAFT: a u32 after the keep-alive, or alone after the stops */
	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_KEEP_ALIVE | PROTO_SUBMIT_MAX_DRAFT;
	m.keep_alive_s = 60;
	m.max_draft = 3;
	roundtrip_submit(&m, 8 + 107 + 4 + 4);
	CHECK_INT_EQ(get_le32(buf + PROTO_HDR_SIZE + 107 + 4), 3);
	m.flags &= ~(uint32_t)PROTO_SUBMIT_KEEP_ALIVE;
	m.keep_alive_s = 0;
	roundtrip_submit(&m, 8 + 107 + 4);
	b_submit_fixed(&b, PROTO_SUBMIT_MAX_DRAFT, 0, 0);
	b_str(&b, 1, 'p');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG); /* the u32 missing */
	b_u32(&b, PROTO_MAX_DRAFT);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
	for (uint32_t bad_k = 0; bad_k <= PROTO_MAX_DRAFT + 1; bad_k += PROTO_MAX_DRAFT + 1) {
		b_submit_fixed(&b, PROTO_SUBMIT_MAX_DRAFT, 0, 0);
		b_str(&b, 1, 'p');
		b_u32(&b, bad_k);
		CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG); /* 0, or over 16 */
	}

	/* On the way out: the flag with an empty name or none, a name over
	 * the maximum, a NUL at the start, inside or at the end, a name
	 * without the flag. */
	memset(name_max, 'x', sizeof name_max);
#define REJECT(change) do { \
	m = submit_example(0); \
	m.flags |= PROTO_SUBMIT_MODEL; \
	m.model = S("smollm2"); \
	change; \
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), -EINVAL); \
} while (0)
	REJECT(m.model = S(""));
	REJECT((m.model = (struct proto_str){ NULL, 0 }));
	REJECT((m.model = (struct proto_str){ NULL, 3 }));
	REJECT((m.model = (struct proto_str){ name_max, PROTO_MAX_NAME + 1 }));
	REJECT((m.model = (struct proto_str){ name_max, UINT32_MAX }));
	REJECT(m.model = S("\0mollm2"));
	REJECT(m.model = S("smol\0m2"));
	REJECT(m.model = S("smollm2\0"));
	REJECT(m.flags &= ~(uint32_t)PROTO_SUBMIT_MODEL);
	REJECT((m.flags |= PROTO_SUBMIT_CHAT, m.prompt = (struct proto_str){ NULL, 0 },
		m.n_messages = 1, m.messages = example_msgs, m.model = S("")));
#undef REJECT
	m = submit_example(0);
	m.flags |= PROTO_SUBMIT_MODEL;
	m.model = (struct proto_str){ name_max, PROTO_MAX_NAME };
	CHECK_INT_EQ(proto_encode_submit(buf, sizeof buf, &m), 8 + 107 + 4 + PROTO_MAX_NAME);

	/* On the way in, built by hand: the flag and no name, an empty one,
	 * one over the maximum, a NUL inside, a length past the end, bytes
	 * after it, a name without the flag. */
#define MODEL_FRAME(flags) do { \
	b_submit_fixed(&b, (flags), 0, 0); \
	b_str(&b, 1, 'p'); \
} while (0)
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	b_str(&b, 0, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	b_str(&b, PROTO_MAX_NAME + 1, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	b_str(&b, PROTO_MAX_NAME, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
	for (size_t at = 0; at < 5; at += 2) {
		MODEL_FRAME(PROTO_SUBMIT_MODEL);
		b_str(&b, 5, 'n');
		b.b[b.n - 5 + at] = 0;
		CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	}
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	b_u32(&b, 6);
	memcpy(b.b + b.n, "qwen", 4);
	b.n += 4;
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	b_u32(&b, UINT32_MAX);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	MODEL_FRAME(PROTO_SUBMIT_MODEL);
	b_str(&b, 4, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
	b.b[b.n++] = 0;
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	MODEL_FRAME(0);
	b_str(&b, 4, 'n');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
#undef MODEL_FRAME

	/* An encoded one: every prefix and every longer version refused. */
	m = submit_example(1);
	m.flags |= PROTO_SUBMIT_MODEL;
	m.model = S("smollm2");
	n = proto_encode_submit(buf, sizeof buf, &m);
	CHECK(n > 0);
	if (n > 0)
		check_exact_length(PROTO_SUBMIT, buf + PROTO_HDR_SIZE, (size_t)n - PROTO_HDR_SIZE,
				   dec_submit);
}

static void test_submit_decode_rejects(void)
{
	struct proto_submit m = submit_example(0);
	uint8_t p[512], pc[512];
	size_t n, nc;
	struct bld b;

	n = (size_t)proto_encode_submit(buf, sizeof buf, &m) - PROTO_HDR_SIZE;
	memcpy(p, buf + PROTO_HDR_SIZE, n);
	m = submit_example(1);
	nc = (size_t)proto_encode_submit(buf, sizeof buf, &m) - PROTO_HDR_SIZE;
	memcpy(pc, buf + PROTO_HDR_SIZE, nc);

	check_exact_length(PROTO_SUBMIT, p, n, dec_submit);
	check_exact_length(PROTO_SUBMIT, pc, nc, dec_submit);
	{ /* a grammar's fields are read only with the flag, and all of them */
		uint8_t pg[512];
		size_t ng;
		m = submit_example(0);
		m.flags |= PROTO_SUBMIT_GRAMMAR;
		m.grammar_kind = PROTO_GRAMMAR_GBNF;
		m.grammar = S("root ::= \"a\"");
		ng = (size_t)proto_encode_submit(buf, sizeof buf, &m) - PROTO_HDR_SIZE;
		memcpy(pg, buf + PROTO_HDR_SIZE, ng);
		check_exact_length(PROTO_SUBMIT, pg, ng, dec_submit);
		CHECK_INT_EQ(decode_with_u32(PROTO_SUBMIT, pg, ng, n, 7, dec_submit),
			     -EBADMSG); /* kind 7 */
		m = submit_example(0);
	}
	CHECK_INT_EQ(decode_copy(PROTO_CANCEL, p, n, dec_submit), -EBADMSG);

#define BAD32(off, v) CHECK_INT_EQ(decode_with_u32(PROTO_SUBMIT, p, n, off, v, dec_submit), -EBADMSG)
#define BADF(off, x) BAD32(off, f2u(x))
	CHECK_INT_EQ(decode_with_u64(PROTO_SUBMIT, p, n, 0, 0, dec_submit), -EBADMSG);
	BAD32(8, 1u << 4);
	BAD32(8, 0x80000000u);
	BAD32(16, 0);
	BAD32(16, (uint32_t)-5);
	BADF(24, -1.0f);
	BADF(24, NAN);
	BADF(24, INFINITY);
	BAD32(24, 0xffc00001u);         /* a negative NaN */
	BADF(28, 0.0f);
	BADF(28, -0.0f);
	BADF(28, 1.5f);
	BADF(28, NAN);
	BADF(28, -INFINITY);
	BADF(32, -0.001f);
	BADF(32, 1.001f);
	BADF(32, NAN);
	BADF(36, 0.0f);
	BADF(36, -2.0f);
	BADF(36, NAN);
	BADF(36, INFINITY);
	BAD32(40, (uint32_t)-1);
	BADF(44, NAN);
	BADF(44, INFINITY);
	BADF(48, NAN);
	BADF(48, -INFINITY);
	BAD32(52, PROTO_MAX_STOPS + 1);
	BAD32(52, UINT32_MAX);
	BAD32(52, 3);                   /* claims a stop that is not there */
	BAD32(64, 1);                   /* a prompt with n_messages != 0 */
	BAD32(64, PROTO_MAX_MESSAGES + 1);
	BAD32(68, PROTO_MAX_TOP_LOGPROBS + 1); /* top_logprobs */
	BAD32(68, 0x80000000u);
	/* The prompt's length running past the end, by one and by a lot. */
	BAD32(72, 17);
	BAD32(72, UINT32_MAX);
	BAD32(72, UINT32_MAX - 71);
	BAD32(72, 0x80000000u);
	/* A stop's length, the same. */
	BAD32(92, 3);
	BAD32(92, UINT32_MAX);
	BAD32(98, UINT32_MAX - 8);
	CHECK_INT_EQ(decode_with_u32(PROTO_SUBMIT, p, n, 24, f2u(0.0f), dec_submit), 0);
#undef BAD32
#undef BADF

	/* Chat: the same payload without the flag, n_messages 0 or too many,
	 * a role outside 1..3, lengths running past the end. */
#define BADC(off, v) CHECK_INT_EQ(decode_with_u32(PROTO_SUBMIT, pc, nc, off, v, dec_submit), -EBADMSG)
	BADC(8, PROTO_SUBMIT_SEED);
	BADC(64, 0);
	BADC(64, PROTO_MAX_MESSAGES + 1);
	BADC(64, UINT32_MAX);
	BADC(72, 0);
	BADC(72, 4);
	BADC(72, UINT32_MAX);
	BADC(89, 0);
	BADC(89, 4);
	BADC(76, UINT32_MAX);
	BADC(76, 10);
	BADC(93, UINT32_MAX);
	BADC(107, UINT32_MAX - 106);
#undef BADC

	/* Stops: empty, over the maximum, exactly the maximum. */
	b_submit_fixed(&b, 0, 1, 0);
	b_str(&b, 1, 'p');
	b_str(&b, 0, 's');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	b_submit_fixed(&b, 0, 1, 0);
	b_str(&b, 1, 'p');
	b_str(&b, PROTO_MAX_STOP_LEN + 1, 's');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	b_submit_fixed(&b, 0, 1, 0);
	b_str(&b, 1, 'p');
	b_str(&b, PROTO_MAX_STOP_LEN, 's');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);

	/* Chat with the maximum of messages, and with one more. */
	b_submit_fixed(&b, PROTO_SUBMIT_CHAT, 0, PROTO_MAX_MESSAGES);
	for (int i = 0; i < PROTO_MAX_MESSAGES; i++) {
		b_u32(&b, PROTO_ROLE_USER);
		b_str(&b, 1, 'c');
	}
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
	b_submit_fixed(&b, PROTO_SUBMIT_CHAT, 0, PROTO_MAX_MESSAGES + 1);
	for (int i = 0; i < PROTO_MAX_MESSAGES + 1; i++) {
		b_u32(&b, PROTO_ROLE_USER);
		b_str(&b, 1, 'c');
	}
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	/* A chat payload whose message count is honest but carries a prompt too. */
	b_submit_fixed(&b, PROTO_SUBMIT_CHAT, 0, 1);
	b_u32(&b, PROTO_ROLE_USER);
	b_str(&b, 1, 'c');
	b_str(&b, 1, 'p');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	/* Only the fixed part: no prompt string at all. */
	b_submit_fixed(&b, 0, 0, 0);
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), -EBADMSG);
	b_str(&b, 0, 'p');
	CHECK_INT_EQ(decode_bld(PROTO_SUBMIT, &b, dec_submit), 0);
}

/* ---- CANCEL and RING_WAKE ---- */

static void test_cancel_ring_wake(void)
{
	static const uint8_t zero[1] = { 0 };
	struct proto_frame f;
	uint64_t id = 0;
	ssize_t n;

	n = proto_encode_cancel(buf, sizeof buf, UINT64_MAX);
	CHECK_INT_EQ(n, 16);
	f = parse_whole(n, PROTO_CANCEL);
	CHECK_INT_EQ(proto_decode_cancel(&f, &id), 0);
	CHECK(id == UINT64_MAX);
	check_exact_length(PROTO_CANCEL, f.payload, f.len, dec_cancel);
	CHECK_INT_EQ(decode_with_u64(PROTO_CANCEL, f.payload, f.len, 0, 0, dec_cancel), -EBADMSG);
	CHECK_INT_EQ(decode_copy(PROTO_HELLO, f.payload, f.len, dec_cancel), -EBADMSG);
	CHECK_INT_EQ(proto_encode_cancel(buf, sizeof buf, 0), -EINVAL);
	CHECK_CAPS(proto_encode_cancel(buf, cap, 3), 16);

	n = proto_encode_ring_wake(buf, sizeof buf);
	CHECK_INT_EQ(n, 8);
	f = parse_whole(n, PROTO_RING_WAKE);
	CHECK_INT_EQ(proto_decode_ring_wake(&f), 0);
	CHECK_INT_EQ(decode_copy(PROTO_RING_WAKE, zero, 0, dec_ring_wake), 0);
	CHECK_INT_EQ(decode_copy(PROTO_RING_WAKE, zero, 1, dec_ring_wake), -EBADMSG);
	CHECK_INT_EQ(decode_copy(PROTO_CANCEL, zero, 0, dec_ring_wake), -EBADMSG);
	CHECK_CAPS(proto_encode_ring_wake(buf, cap), 8);
}

/* ---- ERROR ---- */

static void test_error(void)
{
	struct proto_error m = { .id = 99, .code = PROTO_E_BUSY, .message = S("queue full") }, d;
	char msg[PROTO_MAX_ERRMSG + 1];
	struct proto_frame f;
	struct bld b;
	ssize_t n;

	n = proto_encode_error(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 16 + 4 + 10);
	f = parse_whole(n, PROTO_ERROR);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_error(&f, &d), 0);
	CHECK(d.id == 99);
	CHECK_INT_EQ(d.code, PROTO_E_BUSY);
	CHECK(str_eq(d.message, m.message));

	check_exact_length(PROTO_ERROR, f.payload, f.len, dec_error);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 8, 0, dec_error), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 8, PROTO_E__MAX, dec_error),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 12, 1, dec_error), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 16, 11, dec_error), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 16, UINT32_MAX, dec_error),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ERROR, f.payload, f.len, 16, UINT32_MAX - 19,
				     dec_error), -EBADMSG);
	/* id 0 is the connection, and an empty message is allowed. */
	CHECK_INT_EQ(decode_with_u64(PROTO_ERROR, f.payload, f.len, 0, 0, dec_error), 0);
	b.n = 0;
	b_u64(&b, 0);
	b_u32(&b, PROTO_E_RING);
	b_u32(&b, 0);
	b_str(&b, 0, 'e');
	CHECK_INT_EQ(decode_bld(PROTO_ERROR, &b, dec_error), 0);
	b.n = 16;
	b_str(&b, PROTO_MAX_ERRMSG, 'e');
	CHECK_INT_EQ(decode_bld(PROTO_ERROR, &b, dec_error), 0);
	b.n = 16;
	b_str(&b, PROTO_MAX_ERRMSG + 1, 'e');
	CHECK_INT_EQ(decode_bld(PROTO_ERROR, &b, dec_error), -EBADMSG);

	memset(msg, 'e', sizeof msg);
	m.message = (struct proto_str){ msg, PROTO_MAX_ERRMSG };
	CHECK_INT_EQ(proto_encode_error(buf, sizeof buf, &m), 8 + 16 + 4 + PROTO_MAX_ERRMSG);
	m.message.len++;
	CHECK_INT_EQ(proto_encode_error(buf, sizeof buf, &m), -EINVAL);
	m.message = (struct proto_str){ NULL, 1 };
	CHECK_INT_EQ(proto_encode_error(buf, sizeof buf, &m), -EINVAL);
	m.message = S("x");
	m.code = PROTO_E_OK;
	CHECK_INT_EQ(proto_encode_error(buf, sizeof buf, &m), -EINVAL);
	m.code = PROTO_E__MAX;
	CHECK_INT_EQ(proto_encode_error(buf, sizeof buf, &m), -EINVAL);
	m.code = PROTO_E_RING;
	CHECK_CAPS(proto_encode_error(buf, cap, &m), 8 + 16 + 4 + 1);
}

/* ---- ADMIN and ADMIN_REPLY ---- */

static void test_admin(void)
{
	struct proto_admin m = { .command = S("status"), .arg = S("verbose") }, d;
	char cmd[PROTO_MAX_ADMIN_ARG + 1];
	struct proto_frame f;
	struct bld b;
	ssize_t n;

	n = proto_encode_admin(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 4 + 4 + 6 + 4 + 7);
	f = parse_whole(n, PROTO_ADMIN);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_admin(&f, &d), 0);
	CHECK(str_eq(d.command, m.command));
	CHECK(str_eq(d.arg, m.arg));

	check_exact_length(PROTO_ADMIN, f.payload, f.len, dec_admin);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN, f.payload, f.len, 0, 1, dec_admin), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN, f.payload, f.len, 4, 0, dec_admin), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN, f.payload, f.len, 4, UINT32_MAX, dec_admin),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN, f.payload, f.len, 14, 8, dec_admin), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN, f.payload, f.len, 14, UINT32_MAX - 17,
				     dec_admin), -EBADMSG);

	memset(cmd, 'c', sizeof cmd);
	for (int over = 0; over < 2; over++) {
		b.n = 0;
		b_u32(&b, 0);
		b_str(&b, PROTO_MAX_ADMIN_CMD + over, 'c');
		b_str(&b, PROTO_MAX_ADMIN_ARG, 'a');
		CHECK_INT_EQ(decode_bld(PROTO_ADMIN, &b, dec_admin), over ? -EBADMSG : 0);
		b.n = 0;
		b_u32(&b, 0);
		b_str(&b, PROTO_MAX_ADMIN_CMD, 'c');
		b_str(&b, PROTO_MAX_ADMIN_ARG + over, 'a');
		CHECK_INT_EQ(decode_bld(PROTO_ADMIN, &b, dec_admin), over ? -EBADMSG : 0);

		m.command = (struct proto_str){ cmd, PROTO_MAX_ADMIN_CMD + over };
		m.arg = (struct proto_str){ cmd, PROTO_MAX_ADMIN_ARG };
		CHECK(proto_encode_admin(buf, sizeof buf, &m) == (over ? -EINVAL : 8 + 4 + 8 + 32 + 256));
		m.command = (struct proto_str){ cmd, PROTO_MAX_ADMIN_CMD };
		m.arg = (struct proto_str){ cmd, PROTO_MAX_ADMIN_ARG + over };
		CHECK(proto_encode_admin(buf, sizeof buf, &m) == (over ? -EINVAL : 8 + 4 + 8 + 32 + 256));
	}
	m.command = (struct proto_str){ "", 0 };
	m.arg = S("");
	CHECK_INT_EQ(proto_encode_admin(buf, sizeof buf, &m), -EINVAL);
	m.command = S("ps");
	n = proto_encode_admin(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 4 + 4 + 2 + 4);
	f = parse_whole(n, PROTO_ADMIN);
	CHECK_INT_EQ(proto_decode_admin(&f, &d), 0);
	CHECK_INT_EQ(d.arg.len, 0);
	CHECK_CAPS(proto_encode_admin(buf, cap, &m), n);
}

static void test_admin_reply(void)
{
	struct proto_admin_reply m = { .code = PROTO_E_OK, .body = S("{\"clients\":[]}") }, d;
	struct proto_frame f;
	char *big;
	ssize_t n;

	n = proto_encode_admin_reply(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, 8 + 8 + 4 + 14);
	f = parse_whole(n, PROTO_ADMIN_REPLY);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_decode_admin_reply(&f, &d), 0);
	CHECK_INT_EQ(d.code, PROTO_E_OK);
	CHECK(str_eq(d.body, m.body));

	check_exact_length(PROTO_ADMIN_REPLY, f.payload, f.len, dec_admin_reply);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 0, PROTO_E_PERM,
				     dec_admin_reply), 0);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 0, PROTO_E__MAX,
				     dec_admin_reply), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 4, 1, dec_admin_reply),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 8, 15, dec_admin_reply),
		     -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 8, UINT32_MAX,
				     dec_admin_reply), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(PROTO_ADMIN_REPLY, f.payload, f.len, 8, UINT32_MAX - 11,
				     dec_admin_reply), -EBADMSG);

	m.code = PROTO_E__MAX;
	CHECK_INT_EQ(proto_encode_admin_reply(buf, sizeof buf, &m), -EINVAL);
	m.code = PROTO_E_NOTFOUND;
	m.body = (struct proto_str){ NULL, 2 };
	CHECK_INT_EQ(proto_encode_admin_reply(buf, sizeof buf, &m), -EINVAL);

	/* The largest frame there is: a body filling PROTO_MAX_PAYLOAD exactly. */
	big = malloc(PROTO_MAX_PAYLOAD);
	if (!big)
		abort();
	memset(big, 'j', PROTO_MAX_PAYLOAD);
	m.code = PROTO_E_OK;
	m.body = (struct proto_str){ big, PROTO_MAX_PAYLOAD - 12 };
	n = proto_encode_admin_reply(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_MAX_FRAME);
	f = parse_whole(n, PROTO_ADMIN_REPLY);
	CHECK_INT_EQ(proto_decode_admin_reply(&f, &d), 0);
	CHECK_INT_EQ(d.body.len, PROTO_MAX_PAYLOAD - 12);
	CHECK_INT_EQ(proto_encode_admin_reply(buf, PROTO_MAX_FRAME - 1, &m), -EMSGSIZE);
	m.body.len++;
	CHECK_INT_EQ(proto_encode_admin_reply(buf, sizeof buf, &m), -EMSGSIZE);
	free(big);
}

/* ---- ring records ---- */

static void test_token(void)
{
	struct proto_token m = { .id = 12345, .token = 49151, .logprob = -1.25f,
				 .text = S("\xc3\xa9t\xc3\xa9") }, d;
	char text[PROTO_MAX_TOKEN_TEXT + 1];
	uint8_t p[PROTO_TOKEN_FIXED + 16];
	struct bld b;
	ssize_t n;

	n = proto_token_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_TOKEN_FIXED + 5);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_token_decode(buf, (size_t)n, &d), 0);
	CHECK(d.id == 12345);
	CHECK_INT_EQ(d.token, 49151);
	CHECK_INT_EQ(f2u(d.logprob), f2u(-1.25f));
	CHECK(str_eq(d.text, m.text));
	CHECK((const uint8_t *)d.text.p == buf + PROTO_TOKEN_FIXED);
	memcpy(p, buf, (size_t)n);

	check_exact_length(0, p, (size_t)n, dec_token);
	CHECK_INT_EQ(decode_with_u64(0, p, (size_t)n, 0, 0, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 8, (uint32_t)-1, dec_token), 0);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 8, (uint32_t)-2, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 8, 0x80000000u, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 12, f2u(NAN), dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 12, f2u(-INFINITY), dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 16, 6, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 16, 4, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 16, UINT32_MAX, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 16, UINT32_MAX - 23, dec_token), -EBADMSG);
	CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, 20, 1, dec_token), -EBADMSG);
	CHECK_INT_EQ(proto_token_decode(NULL, 0, &d), -EBADMSG);

	/* Alternatives: round trip, at most PROTO_MAX_TOP_LOGPROBS, each <= 0
	 * (or -inf) with an id >= 0, and exactly as many as n_top says. */
	m.n_top = PROTO_MAX_TOP_LOGPROBS;
	for (uint32_t i = 0; i < m.n_top; i++) {
		m.top_ids[i] = (int32_t)(i * 7);
		m.top_logprobs[i] = i == 3 ? -INFINITY : -0.25f * (float)i;
	}
	n = proto_token_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_TOKEN_FIXED + 5 + 8 * PROTO_MAX_TOP_LOGPROBS);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_token_decode(buf, (size_t)n, &d), 0);
	CHECK_INT_EQ(d.n_top, PROTO_MAX_TOP_LOGPROBS);
	for (uint32_t i = 0; i < d.n_top; i++) {
		CHECK_INT_EQ(d.top_ids[i], (int32_t)(i * 7));
		CHECK_INT_EQ(f2u(d.top_logprobs[i]), f2u(m.top_logprobs[i]));
	}
	CHECK(str_eq(d.text, m.text));
	CHECK_INT_EQ(proto_token_decode(buf, (size_t)n - 8, &d), -EBADMSG); /* one short */
	m.n_top = PROTO_MAX_TOP_LOGPROBS + 1;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.n_top = 2;
	m.top_logprobs[1] = 0.5f;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.top_logprobs[1] = NAN;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.top_logprobs[1] = -1.0f;
	m.top_ids[1] = -1;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.top_ids[1] = 1;
	n = proto_token_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_TOKEN_FIXED + 5 + 16);
	buf[PROTO_TOKEN_FIXED + 5 + 15] = 0x3f; /* the second logprob's top byte: -1 -> +1 */
	CHECK_INT_EQ(proto_token_decode(buf, (size_t)n, &d), -EBADMSG);
	m.n_top = 0;

	/* Text at its maximum and over it; an empty text at the end. */
	memset(text, 't', sizeof text);
	for (int over = 0; over < 2; over++) {
		b.n = 0;
		b_u64(&b, 1);
		b_u32(&b, 7);
		b_f32(&b, 0.0f);
		b_u32(&b, PROTO_MAX_TOKEN_TEXT + over);
		b_u32(&b, 0);
		memset(b.b + b.n, 't', PROTO_MAX_TOKEN_TEXT + over);
		b.n += PROTO_MAX_TOKEN_TEXT + over;
		CHECK_INT_EQ(decode_bld(0, &b, dec_token), over ? -EBADMSG : 0);
		m.text = (struct proto_str){ text, PROTO_MAX_TOKEN_TEXT + over };
		CHECK(proto_token_encode(buf, sizeof buf, &m) ==
		      (over ? -EINVAL : PROTO_TOKEN_FIXED + PROTO_MAX_TOKEN_TEXT));
	}
	m.text = (struct proto_str){ NULL, 0 };
	m.token = -1;
	n = proto_token_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_TOKEN_FIXED);
	CHECK_INT_EQ(proto_token_decode(buf, (size_t)n, &d), 0);
	CHECK_INT_EQ(d.token, -1);
	CHECK_INT_EQ(d.text.len, 0);
	CHECK_CAPS(proto_token_encode(buf, cap, &m), PROTO_TOKEN_FIXED);

	m = (struct proto_token){ .id = 1, .token = 1, .text = S("x") };
	m.id = 0;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.id = 1;
	m.token = -2;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.token = 1;
	m.logprob = NAN;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.logprob = INFINITY;
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
	m.logprob = 0.0f;
	m.text = (struct proto_str){ NULL, 1 };
	CHECK_INT_EQ(proto_token_encode(buf, sizeof buf, &m), -EINVAL);
}

static struct proto_final final_example(void)
{
	return (struct proto_final){
		.id = 0x0123456789abcdefull, .finish = PROTO_FIN_LENGTH,
		.prompt_tokens = 1000, .cached_tokens = 512, .generated_tokens = 128,
		.preemptions = 2, .queue_us = 1500, .prefill_us = 0x1234567890ull,
		.decode_us = UINT64_MAX,
	};
}

static void test_final(void)
{
	struct proto_final m = final_example(), d;
	char msg[PROTO_MAX_ERRMSG + 1];
	uint8_t p[PROTO_FINAL_FIXED + 64];
	struct bld b;
	ssize_t n;

	n = proto_final_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_FINAL_FIXED);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_final_decode(buf, (size_t)n, &d), 0);
	CHECK(d.id == m.id);
	CHECK_INT_EQ(d.finish, PROTO_FIN_LENGTH);
	CHECK_INT_EQ(d.code, 0);
	CHECK_INT_EQ(d.prompt_tokens, 1000);
	CHECK_INT_EQ(d.cached_tokens, 512);
	CHECK_INT_EQ(d.generated_tokens, 128);
	CHECK_INT_EQ(d.preemptions, 2);
	CHECK(d.queue_us == 1500);
	CHECK(d.prefill_us == 0x1234567890ull);
	CHECK(d.decode_us == UINT64_MAX);
	CHECK_INT_EQ(d.message.len, 0);

	m.finish = PROTO_FIN_ERROR;
	m.code = PROTO_E_INTERNAL;
	m.message = S("CUDA error: out of memory");
	n = proto_final_encode(buf, sizeof buf, &m);
	CHECK_INT_EQ(n, PROTO_FINAL_FIXED + 25);
	memset(&d, 0xff, sizeof d);
	CHECK_INT_EQ(proto_final_decode(buf, (size_t)n, &d), 0);
	CHECK_INT_EQ(d.finish, PROTO_FIN_ERROR);
	CHECK_INT_EQ(d.code, PROTO_E_INTERNAL);
	CHECK(str_eq(d.message, m.message));
	CHECK((const uint8_t *)d.message.p == buf + PROTO_FINAL_FIXED);
	memcpy(p, buf, (size_t)n);

#define BADF(off, v) CHECK_INT_EQ(decode_with_u32(0, p, (size_t)n, off, v, dec_final), -EBADMSG)
	check_exact_length(0, p, (size_t)n, dec_final);
	CHECK_INT_EQ(decode_with_u64(0, p, (size_t)n, 0, 0, dec_final), -EBADMSG);
	BADF(8, 0);
	BADF(8, 5);
	BADF(8, PROTO_FIN_STOP);        /* a code without an error */
	BADF(12, 0);                    /* an error without a code */
	BADF(12, PROTO_E__MAX);
	BADF(56, 26);
	BADF(56, UINT32_MAX);
	BADF(56, UINT32_MAX - 63);
	BADF(60, 1);
#undef BADF
	CHECK_INT_EQ(proto_final_decode(NULL, 0, &d), -EBADMSG);

	memset(msg, 'm', sizeof msg);
	for (int over = 0; over < 2; over++) {
		b.n = 0;
		b_u64(&b, 1);
		b_u32(&b, PROTO_FIN_ERROR);
		b_u32(&b, PROTO_E_INVAL);
		for (int i = 0; i < 4; i++)
			b_u32(&b, 0);
		for (int i = 0; i < 3; i++)
			b_u64(&b, 0);
		b_u32(&b, PROTO_MAX_ERRMSG + over);
		b_u32(&b, 0);
		memset(b.b + b.n, 'm', PROTO_MAX_ERRMSG + over);
		b.n += PROTO_MAX_ERRMSG + over;
		CHECK_INT_EQ(decode_bld(0, &b, dec_final), over ? -EBADMSG : 0);
		m.message = (struct proto_str){ msg, PROTO_MAX_ERRMSG + over };
		CHECK(proto_final_encode(buf, sizeof buf, &m) ==
		      (over ? -EINVAL : PROTO_FINAL_FIXED + PROTO_MAX_ERRMSG));
	}

#define REJECT(change) do { \
	m = final_example(); \
	change; \
	CHECK_INT_EQ(proto_final_encode(buf, sizeof buf, &m), -EINVAL); \
} while (0)
	REJECT(m.id = 0);
	REJECT(m.finish = 0);
	REJECT(m.finish = PROTO_FIN_ERROR + 1);
	REJECT(m.code = PROTO_E_LIMIT);
	REJECT(m.finish = PROTO_FIN_ERROR);
	REJECT((m.finish = PROTO_FIN_ERROR, m.code = PROTO_E__MAX));
	REJECT(m.message = ((struct proto_str){ NULL, 1 }));
#undef REJECT
	m = final_example();
	m.finish = PROTO_FIN_CANCELLED;
	CHECK_CAPS(proto_final_encode(buf, cap, &m), PROTO_FINAL_FIXED);
}

int main(void)
{
	test_names();
	test_layout_cancel();
	test_layout_hello();
	test_layout_ring_wake();
	test_layout_submit();
	test_layout_records();
	test_frame_parse();
	test_hello();
	test_welcome();
	test_submit_roundtrip();
	test_submit_encode_rejects();
	test_submit_decode_rejects();
	test_submit_model();
	test_cancel_ring_wake();
	test_error();
	test_admin();
	test_admin_reply();
	test_token();
	test_submit_top_logprobs();
	test_final();
	if (!test_failures)
		printf("test_proto: all checks passed\n");
	return test_result();
}
