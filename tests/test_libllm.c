/* test_libllm.c - libllm against a fake daemon made of libipc: a thread that
 * listens on a temporary socket, answers HELLO with WELCOME, a ring and an
 * eventfd, then plays a script (tokens, refusals, a full ring, admin
 * replies, hang-ups) while the test drives the real client library.
 * llm_connect_url's side has a fake HTTP server of the same kind (scenario
 * 7).  No model and no real daemon are involved.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "llm.h"
#include "proto.h"
#include "ring.h"
#include "testutil.h"
#include "usock.h"

#define IO_TIMEOUT_MS 5000

/* ---- the fake daemon ---- */

struct fake {
	char dir[64];                 /* mkdtemp'd directory holding the socket */
	char path[96];                /* the socket */
	int lfd;                      /* listening socket */
	int cfd;                      /* the accepted client; fake thread only */
	struct ring *ring;            /* producer side */
	int efd;                      /* the eventfd passed to the client */
	uint32_t ring_cap;            /* ring capacity to create */
	uint32_t max_inflight;
	uint32_t refuse_code;         /* nonzero: answer HELLO with this ERROR */
	struct proto_hello hello;     /* what the client sent */
	uint8_t *in;                  /* (PROTO_MAX_FRAME) buffered input */
	size_t in_len;
	uint8_t *cur;                 /* (PROTO_MAX_FRAME) the frame last read */
	struct proto_frame frame;     /* it, pointing into cur */
	int wakes;                    /* RING_WAKE frames seen */
	void (*script)(struct fake *);
	pthread_t thr;
};

static void fake_write(struct fake *f, const uint8_t *buf, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t n = usock_send(f->cfd, buf + off, len - off, NULL, 0);

		if (n <= 0) {
			fprintf(stderr, "fake daemon: send: %s\n", strerror((int)-n));
			test_failures++;
			return;
		}
		off += (size_t)n;
	}
}

/* Reads the next frame into f->frame: its type, 0 at EOF, -ETIMEDOUT. */
static int fake_read(struct fake *f)
{
	for (;;) {
		struct pollfd p = { .fd = f->cfd, .events = POLLIN };
		ssize_t n = proto_frame_parse(f->in, f->in_len, &f->frame);
		int fds[USOCK_MAX_FDS], nfds = 0;

		if (n > 0) {
			memcpy(f->cur, f->in, (size_t)n);
			f->frame.payload = f->cur + PROTO_HDR_SIZE;
			memmove(f->in, f->in + n, f->in_len - (size_t)n);
			f->in_len -= (size_t)n;
			return f->frame.type;
		}
		CHECK(n == 0);
		if (n < 0)
			return 0;
		if (poll(&p, 1, IO_TIMEOUT_MS) != 1)
			return -ETIMEDOUT;
		n = usock_recv(f->cfd, f->in + f->in_len, PROTO_MAX_FRAME - f->in_len, fds,
			       USOCK_MAX_FDS, &nfds);
		if (n <= 0)
			return 0;
		CHECK_INT_EQ(nfds, 0);
		f->in_len += (size_t)n;
	}
}

/* The next frame that is not a RING_WAKE (those are counted). */
static int fake_next(struct fake *f)
{
	int t;

	while ((t = fake_read(f)) == PROTO_RING_WAKE)
		f->wakes++;
	return t;
}

static void fake_expect_submit(struct fake *f, uint64_t id, struct proto_submit *ret,
			       struct proto_submit_buf *buf)
{
	struct proto_submit s;
	static struct proto_submit_buf sb;
	int t = fake_next(f);

	CHECK_INT_EQ(t, PROTO_SUBMIT);
	if (t != PROTO_SUBMIT)
		return;
	if (!buf)
		buf = &sb;
	if (!ret)
		ret = &s;
	CHECK_INT_EQ(proto_decode_submit(&f->frame, buf, ret), 0);
	CHECK_INT_EQ(ret->id, id);
}

static void fake_expect_cancel(struct fake *f, uint64_t id)
{
	uint64_t got = 0;
	int t = fake_next(f);

	CHECK_INT_EQ(t, PROTO_CANCEL);
	if (t == PROTO_CANCEL) {
		CHECK_INT_EQ(proto_decode_cancel(&f->frame, &got), 0);
		CHECK_INT_EQ(got, id);
	}
}

static void fake_expect_admin(struct fake *f, const char *cmd, const char *arg)
{
	struct proto_admin a;
	int t = fake_next(f);

	CHECK_INT_EQ(t, PROTO_ADMIN);
	if (t != PROTO_ADMIN)
		return;
	CHECK_INT_EQ(proto_decode_admin(&f->frame, &a), 0);
	CHECK(a.command.len == strlen(cmd) && !memcmp(a.command.p, cmd, a.command.len));
	CHECK(a.arg.len == strlen(arg) && !memcmp(a.arg.p, arg, a.arg.len));
}

static void fake_send_error(struct fake *f, uint64_t id, uint32_t code, const char *msg)
{
	struct proto_error e = { id, code, { msg, (uint32_t)strlen(msg) } };
	uint8_t buf[PROTO_HDR_SIZE + 16 + PROTO_MAX_ERRMSG + 4];
	ssize_t n = proto_encode_error(buf, sizeof buf, &e);

	CHECK(n > 0);
	if (n > 0)
		fake_write(f, buf, (size_t)n);
}

static void fake_send_admin_reply(struct fake *f, uint32_t code, const char *body)
{
	struct proto_admin_reply a = { code, { body, (uint32_t)strlen(body) } };
	uint8_t buf[4096];
	ssize_t n = proto_encode_admin_reply(buf, sizeof buf, &a);

	CHECK(n > 0);
	if (n > 0)
		fake_write(f, buf, (size_t)n);
}

static void fake_signal(struct fake *f)
{
	uint64_t one = 1;

	CHECK(write(f->efd, &one, sizeof one) == sizeof one);
}

/* Pushes one record, waiting for RING_WAKE frames while the ring is full,
 * as the real daemon holds a sequence until its client reads. */
static void fake_push(struct fake *f, uint16_t type, const uint8_t *p, size_t n)
{
	int r;

	while ((r = ring_push(f->ring, type, p, n, NULL, 0)) == -EAGAIN) {
		int t;

		fake_signal(f);
		t = fake_read(f);
		CHECK_INT_EQ(t, PROTO_RING_WAKE);
		if (t != PROTO_RING_WAKE)
			return;
		f->wakes++;
	}
	CHECK_INT_EQ(r, 0);
}

static void fake_token(struct fake *f, uint64_t id, int32_t token, const char *text)
{
	struct proto_token t = { .id = id, .token = token, .text = { text, (uint32_t)strlen(text) } };
	uint8_t buf[PROTO_TOKEN_FIXED + PROTO_MAX_TOKEN_TEXT];
	ssize_t n;

	t.logprob = -0.25f * (float)(token & 7);
	n = proto_token_encode(buf, sizeof buf, &t);
	CHECK(n > 0);
	if (n > 0)
		fake_push(f, PROTO_REC_TOKEN, buf, (size_t)n);
}

static void fake_final(struct fake *f, uint64_t id, uint32_t finish, uint32_t code,
		       const char *msg, uint32_t generated)
{
	struct proto_final m = {
		.id = id, .finish = finish, .code = code, .prompt_tokens = 7,
		.cached_tokens = 4, .generated_tokens = generated, .preemptions = 1,
		.queue_us = 1500, .prefill_us = 2500, .decode_us = 10000,
		.message = { msg, (uint32_t)strlen(msg) },
	};
	uint8_t buf[PROTO_FINAL_FIXED + PROTO_MAX_ERRMSG];
	ssize_t n = proto_final_encode(buf, sizeof buf, &m);

	CHECK(n > 0);
	if (n > 0)
		fake_push(f, PROTO_REC_FINAL, buf, (size_t)n);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct pollfd p = { .fd = f->lfd, .events = POLLIN };
	char err[256];
	int t;

	if (poll(&p, 1, IO_TIMEOUT_MS) != 1) {
		fprintf(stderr, "fake daemon: nobody connected\n");
		test_failures++;
		return NULL;
	}
	f->cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	CHECK(f->cfd >= 0);
	if (f->cfd < 0)
		return NULL;
	t = fake_read(f);
	CHECK_INT_EQ(t, PROTO_HELLO);
	if (t == PROTO_HELLO)
		CHECK_INT_EQ(proto_decode_hello(&f->frame, &f->hello), 0);
	CHECK_INT_EQ(f->hello.version, PROTO_VERSION);
	if (f->refuse_code) {
		fake_send_error(f, 0, f->refuse_code, "llmd is stopping");
	} else {
		struct proto_welcome w = {
			.version = PROTO_VERSION, .ring_bytes = f->ring_cap, .daemon_pid = 4242,
			.max_inflight = f->max_inflight, .max_prompt_bytes = 100,
			.max_prompt_tokens = 50, .max_tokens = 512, .n_ctx = 2048,
			.n_vocab = 49152, .client_id = 17,
			.model = { "fake-model", 10 }, .backend = { "cpu", 3 },
			.chat_template = { "chatml", 6 },
		};
		uint8_t buf[1024];
		ssize_t n;
		int fds[2];

		CHECK_INT_EQ(ring_create(f->ring_cap, &f->ring, err, sizeof err), 0);
		f->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		CHECK(f->efd >= 0);
		fds[0] = ring_fd(f->ring);
		fds[1] = f->efd;
		n = proto_encode_welcome(buf, sizeof buf, &w);
		CHECK(n > 0);
		CHECK_INT_EQ(usock_send(f->cfd, buf, (size_t)n, fds, 2), n);
		if (f->script)
			f->script(f);
	}
	close(f->cfd);
	return NULL;
}

static void fake_start(struct fake *f, uint32_t ring_cap, uint32_t max_inflight,
		       void (*script)(struct fake *))
{
	char err[256];

	memset(f, 0, sizeof *f);
	f->efd = f->cfd = -1;
	f->ring_cap = ring_cap;
	f->max_inflight = max_inflight;
	f->script = script;
	f->in = malloc(PROTO_MAX_FRAME);
	f->cur = malloc(PROTO_MAX_FRAME);
	snprintf(f->dir, sizeof f->dir, "/tmp/test_libllm.XXXXXX");
	if (!f->in || !f->cur || !mkdtemp(f->dir)) {
		perror("test_libllm: setup");
		exit(1);
	}
	snprintf(f->path, sizeof f->path, "%s/llmd.sock", f->dir);
	f->lfd = usock_listen(f->path, 0600, 8, err, sizeof err);
	if (f->lfd < 0) {
		fprintf(stderr, "test_libllm: %s\n", err);
		exit(1);
	}
}

static void fake_run(struct fake *f)
{
	pthread_create(&f->thr, NULL, fake_main, f);
}

static void fake_stop(struct fake *f)
{
	pthread_join(f->thr, NULL);
	close(f->lfd);
	if (f->efd >= 0)
		close(f->efd);
	ring_free(f->ring);
	unlink(f->path);
	rmdir(f->dir);
	free(f->in);
	free(f->cur);
}

/* ---- client-side helpers ---- */

static struct llm *connect_to(struct fake *f, uint32_t ring_bytes)
{
	char err[256] = "";
	struct llm *h = NULL;
	int r = llm_connect(f->path, ring_bytes, &h, err, sizeof err);

	if (r < 0) {
		fprintf(stderr, "llm_connect: %s\n", err);
		exit(1);
	}
	return h;
}

static int next(struct llm *h, struct llm_event *ev)
{
	return llm_next_event(h, ev, IO_TIMEOUT_MS);
}

static uint64_t submit_prompt(struct llm *h, const char *prompt)
{
	struct llm_request r;
	uint64_t id = 0;

	llm_request_init(&r);
	r.prompt = prompt;
	CHECK_INT_EQ(llm_submit(h, &r, &id), 0);
	return id;
}

/* ---- scenario 1: tokens, refusals, limits, cancel, admin, hang-up ---- */

static void script_basic(struct fake *f)
{
	struct proto_submit s;
	struct proto_submit_buf sb;

	/* 1: streamed tokens and a FINAL */
	fake_expect_submit(f, 1, &s, &sb);
	CHECK(s.prompt.len == 9 && !memcmp(s.prompt.p, "Say hello", 9));
	CHECK_INT_EQ(s.max_tokens, 16);
	CHECK_INT_EQ(s.flags, PROTO_SUBMIT_SEED | PROTO_SUBMIT_LOGPROBS);
	CHECK_INT_EQ(s.seed, 99);
	CHECK(s.temperature == 0.0f && s.top_k == 40);
	CHECK_INT_EQ(s.n_stops, 1);
	CHECK(s.n_stops == 1 && s.stops[0].len == 1 && s.stops[0].p[0] == '\n');
	fake_token(f, 1, 100, "Hel");
	fake_token(f, 1, 101, "lo");
	fake_final(f, 1, PROTO_FIN_STOP, 0, "", 2);
	fake_signal(f);

	/* 2: a chat the front end refuses */
	fake_expect_submit(f, 2, &s, &sb);
	CHECK_INT_EQ(s.flags, PROTO_SUBMIT_CHAT);
	CHECK_INT_EQ(s.n_messages, 2);
	CHECK(s.n_messages == 2 && s.messages[0].role == PROTO_ROLE_SYSTEM &&
	      s.messages[1].role == PROTO_ROLE_USER && s.messages[1].content.len == 2);
	fake_send_error(f, 2, PROTO_E_TOOBIG, "prompt is too long");

	/* 3, 4: the in-flight limit, a cancel, stray errors */
	fake_expect_submit(f, 3, NULL, NULL);
	fake_expect_submit(f, 4, NULL, NULL);
	fake_expect_cancel(f, 3);
	fake_send_error(f, 1, PROTO_E_INVAL, "stray: 1 is finished");
	fake_send_error(f, 77, PROTO_E_INVAL, "stray: 77 was never submitted");
	fake_final(f, 3, PROTO_FIN_CANCELLED, 0, "", 0);
	fake_final(f, 4, PROTO_FIN_ERROR, PROTO_E_BUSY, "the queue is full", 0);
	fake_signal(f);

	/* The bad requests must not have sent anything: next is 5, 6, ADMIN. */
	fake_expect_submit(f, 5, &s, &sb);
	CHECK_INT_EQ(s.flags & (PROTO_SUBMIT_GRAMMAR | PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_OFF), 0);
	fake_expect_submit(f, 6, &s, &sb);
	CHECK_INT_EQ(s.flags & PROTO_SUBMIT_GRAMMAR, PROTO_SUBMIT_GRAMMAR);
	CHECK_INT_EQ(s.flags & (PROTO_SUBMIT_SPEC_NGRAM | PROTO_SUBMIT_SPEC_OFF), PROTO_SUBMIT_SPEC_OFF);
	CHECK_INT_EQ(s.grammar_kind, PROTO_GRAMMAR_JSON_SCHEMA);
	CHECK_INT_EQ(s.grammar_flags, PROTO_GRAMMAR_STRICT);
	CHECK(s.grammar.len == 17 && !memcmp(s.grammar.p, "{\"type\":\"object\"}", 17));
	fake_expect_admin(f, "status", "");
	fake_token(f, 5, 7, "x");
	fake_signal(f);
	fake_send_error(f, 6, PROTO_E_LIMIT, "max_tokens over the limit");
	fake_send_admin_reply(f, 0, "{\"ok\":true}");
	fake_expect_admin(f, "drain", "now");
	fake_send_admin_reply(f, PROTO_E_PERM, "permission denied");
	fake_expect_admin(f, "nope", "");
	fake_send_admin_reply(f, PROTO_E_NOTFOUND, "unknown command nope");

	/* 7: hang up with 5 finished in the ring and 7 still live */
	fake_expect_submit(f, 7, NULL, NULL);
	fake_final(f, 5, PROTO_FIN_STOP, 0, "", 1);
	fake_signal(f);
}

static void check_bad_requests(struct llm *h)
{
	struct llm_message m[2] = { { LLM_ROLE_USER, "hi" }, { (enum llm_role)9, "x" } };
	const char *stops[PROTO_MAX_STOPS + 1];
	char long_stop[PROTO_MAX_STOP_LEN + 2], big[200];
	struct llm_request r;
	uint64_t id = 12345;

	for (int i = 0; i <= PROTO_MAX_STOPS; i++)
		stops[i] = "s";
	memset(long_stop, 'a', sizeof long_stop - 1);
	long_stop[sizeof long_stop - 1] = 0;
	memset(big, 'b', sizeof big - 1);
	big[sizeof big - 1] = 0;

#define BAD(stmt) do { \
		llm_request_init(&r); r.prompt = "ok"; stmt; \
		CHECK_INT_EQ(llm_submit(h, &r, &id), -EINVAL); \
		CHECK(strlen(llm_errmsg(h)) > 0); \
	} while (0)
	BAD(r.prompt = NULL);                              /* neither */
	BAD(r.messages = m; r.n_messages = 1);             /* both */
	BAD(r.prompt = NULL; r.messages = m; r.n_messages = 0);
	BAD(r.prompt = NULL; r.messages = m; r.n_messages = 2);  /* bad role */
	BAD(r.max_tokens = 0);
	BAD(r.n_stops = PROTO_MAX_STOPS + 1; r.stops = stops);
	BAD(stops[0] = long_stop; r.n_stops = 1; r.stops = stops);
	BAD(stops[0] = ""; r.n_stops = 1; r.stops = stops);
	BAD(r.temperature = NAN);
	BAD(r.temperature = -1);
	BAD(r.top_p = 0);
	BAD(r.min_p = 1.5f);
	BAD(r.repeat_penalty = 0);
	BAD(r.presence_penalty = INFINITY);
	BAD(r.flags = 1u << 9);
	BAD(r.flags = LLM_SPEC_NGRAM | LLM_SPEC_OFF);      /* two speculation modes */
	BAD(r.flags = LLM_SPEC_DRAFT | LLM_SPEC_OFF);
	BAD(r.prompt = big);                               /* over max_prompt_bytes (100) */
	CHECK(strstr(llm_errmsg(h), "limits.prompt_bytes") != NULL); /* says what to change */
	BAD(r.prompt = "\xc3\x28");                        /* invalid UTF-8 */
	BAD(r.prompt = "\xed\xa0\x80");                    /* a surrogate */
	BAD(r.prompt = "ok \xe2\x82");                    /* truncated: says where */
	CHECK(strstr(llm_errmsg(h), "at byte 3 (0xe2)") != NULL);
#undef BAD
	/* Grammars: unknown kinds and flags, text where none goes and none
	 * where it must. */
	static const struct llm_grammar bad_g[] = {
		{ 0, 0, "root ::= \"a\"" }, { 4, 0, "x" }, { LLM_GRAMMAR_GBNF, 2, "root ::= \"a\"" },
		{ LLM_GRAMMAR_GBNF, 0, NULL }, { LLM_GRAMMAR_GBNF, 0, "" },
		{ LLM_GRAMMAR_JSON_SCHEMA, 0, NULL }, { LLM_GRAMMAR_JSON, 0, "{}" },
	};
	for (size_t i = 0; i < sizeof bad_g / sizeof bad_g[0]; i++) {
		llm_request_init(&r);
		r.prompt = "ok";
		CHECK_INT_EQ(llm_submit_grammar(h, &r, &bad_g[i], &id), -EINVAL);
		CHECK(strlen(llm_errmsg(h)) > 0);
	}
	CHECK_INT_EQ(id, 12345);                           /* untouched on failure */
	stops[0] = "s";
	CHECK_INT_EQ(llm_submit(h, NULL, &id), -EINVAL);
}

static void test_basic(void)
{
	struct llm_message chat[2] = { { LLM_ROLE_SYSTEM, "Be brief." }, { LLM_ROLE_USER, "Hi" } };
	const char *nl[1] = { "\n" };
	struct llm_event ev;
	struct llm_info info;
	struct llm_request r;
	struct pollfd p;
	struct fake f;
	struct llm *h;
	uint64_t id = 0, id5, id6;
	char *body = NULL;
	int64_t t0;

	fake_start(&f, 65536, 2, script_basic);
	fake_run(&f);
	h = connect_to(&f, 0);

	llm_get_info(h, &info);
	CHECK_INT_EQ(info.protocol, PROTO_VERSION);
	CHECK_INT_EQ(info.daemon_pid, 4242);
	CHECK_INT_EQ(info.client_id, 17);
	CHECK_INT_EQ(info.ring_bytes, 65536);
	CHECK_INT_EQ(info.max_inflight, 2);
	CHECK_INT_EQ(info.max_prompt_bytes, 100);
	CHECK_INT_EQ(info.n_vocab, 49152);
	CHECK_STR_EQ(info.model, "fake-model");
	CHECK_STR_EQ(info.backend, "cpu");
	CHECK_STR_EQ(info.chat_template, "chatml");

	/* Nothing comes: timeouts 0 and 50 ms return 0, the latter after ~50 ms. */
	CHECK_INT_EQ(llm_next_event(h, &ev, 0), 0);
	t0 = clock_ms();
	CHECK_INT_EQ(llm_next_event(h, &ev, 50), 0);
	CHECK(clock_ms() - t0 >= 45);
	p = (struct pollfd){ .fd = llm_fd(h), .events = POLLIN };
	CHECK_INT_EQ(poll(&p, 1, 0), 0);

	/* 1: "Hel", "lo", then DONE with the usage */
	llm_request_init(&r);
	CHECK_INT_EQ(r.max_tokens, 256);
	CHECK(r.temperature == 0.8f && r.top_k == 40 && r.top_p == 0.95f && r.min_p == 0.05f);
	CHECK(r.repeat_penalty == 1.0f && r.repeat_last_n == 64 && !r.has_seed && !r.flags);
	r.prompt = "Say hello";
	r.max_tokens = 16;
	r.temperature = 0;
	r.has_seed = 1;
	r.seed = 99;
	r.flags = LLM_LOGPROBS;
	r.stops = nl;
	r.n_stops = 1;
	CHECK_INT_EQ(llm_submit(h, &r, &id), 0);
	CHECK_INT_EQ(id, 1);
	CHECK_INT_EQ(poll(&p, 1, IO_TIMEOUT_MS), 1);       /* llm_fd wakes on a push */
	CHECK_INT_EQ(llm_next_event(h, &ev, 0), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_TOKEN);
	CHECK_INT_EQ(ev.id, 1);
	CHECK_INT_EQ(ev.token, 100);
	CHECK_STR_EQ(ev.text, "Hel");
	CHECK_INT_EQ(ev.text_len, 3);
	CHECK(ev.logprob == -1.0f);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_TOKEN);
	CHECK_STR_EQ(ev.text, "lo");
	CHECK(ev.logprob == -1.25f);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 1);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	CHECK_INT_EQ(ev.error_code, 0);
	CHECK_INT_EQ(ev.prompt_tokens, 7);
	CHECK_INT_EQ(ev.cached_tokens, 4);
	CHECK_INT_EQ(ev.generated_tokens, 2);
	CHECK_INT_EQ(ev.preemptions, 1);
	CHECK(fabs(ev.queue_ms - 1.5) < 1e-9 && fabs(ev.prefill_ms - 2.5) < 1e-9 &&
	      fabs(ev.decode_ms - 10.0) < 1e-9);
	CHECK_INT_EQ(llm_next_event(h, &ev, 0), 0);
	CHECK_INT_EQ(poll(&p, 1, 0), 0);                   /* drained: llm_fd quiet again */

	/* 2: a refusal by ERROR frame becomes DONE with LLM_FINISH_ERROR */
	llm_request_init(&r);
	r.messages = chat;
	r.n_messages = 2;
	r.temperature = 0.7f;
	CHECK_INT_EQ(llm_submit(h, &r, &id), 0);
	CHECK_INT_EQ(id, 2);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 2);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_TOOBIG);
	CHECK_STR_EQ(ev.message, "prompt is too long");

	/* 3, 4: max_inflight is 2; cancel of an unknown id; cancel of 3 */
	CHECK_INT_EQ(submit_prompt(h, "a"), 3);
	CHECK_INT_EQ(submit_prompt(h, "b"), 4);
	llm_request_init(&r);
	r.prompt = "c";
	CHECK_INT_EQ(llm_submit(h, &r, &id), -ENOBUFS);
	CHECK_INT_EQ(llm_cancel(h, 99), -ENOENT);
	CHECK_INT_EQ(llm_cancel(h, 1), -ENOENT);           /* finished already */
	CHECK_INT_EQ(llm_cancel(h, 3), 0);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 3);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_CANCELLED);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.id, 4);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_BUSY);
	CHECK_STR_EQ(ev.message, "the queue is full");
	/* The stray ERRORs for 1 and 77 produce nothing. */
	CHECK_INT_EQ(llm_next_event(h, &ev, 100), 0);

	/* Bad requests are refused before anything is sent. */
	check_bad_requests(h);

	/* 5, 6 and ADMIN: what arrives meanwhile is kept for llm_next_event. */
	id5 = submit_prompt(h, "five");
	{ /* 6 carries a JSON schema */
		struct llm_request r6;
		struct llm_grammar g = { LLM_GRAMMAR_JSON_SCHEMA, LLM_GRAMMAR_STRICT, "{\"type\":\"object\"}" };
		llm_request_init(&r6);
		r6.prompt = "six";
		r6.flags = LLM_SPEC_OFF;
		CHECK_INT_EQ(llm_submit_grammar(h, &r6, &g, &id6), 0);
	}
	CHECK_INT_EQ(id5, 5);
	CHECK_INT_EQ(id6, 6);
	CHECK_INT_EQ(llm_admin(h, "status", NULL, &body), 0);
	CHECK_STR_EQ(body, "{\"ok\":true}");
	free(body);
	body = NULL;
	CHECK_INT_EQ(poll(&p, 1, IO_TIMEOUT_MS), 1);       /* kept events wake llm_fd */
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_TOKEN);
	CHECK_INT_EQ(ev.id, 5);
	CHECK_STR_EQ(ev.text, "x");
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 6);
	CHECK_INT_EQ(ev.error_code, PROTO_E_LIMIT);
	CHECK_STR_EQ(ev.message, "max_tokens over the limit");
	CHECK_INT_EQ(llm_admin(h, "drain", "now", &body), -EPERM);
	CHECK(body == NULL);
	CHECK_STR_EQ(llm_errmsg(h), "permission denied");
	CHECK_INT_EQ(llm_admin(h, "nope", NULL, &body), -ENOENT);
	CHECK_STR_EQ(llm_errmsg(h), "unknown command nope");
	CHECK_INT_EQ(llm_admin(h, "", NULL, &body), -EINVAL);

	/* 7: the daemon hangs up.  5's FINAL in the ring still comes, then 7
	 * fails, then -EPIPE for good. */
	CHECK_INT_EQ(submit_prompt(h, "seven"), 7);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 5);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 7);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_INTERNAL);
	CHECK_STR_EQ(ev.message, "the daemon closed the connection");
	CHECK_INT_EQ(next(h, &ev), -EPIPE);
	CHECK_INT_EQ(llm_next_event(h, &ev, 0), -EPIPE);
	CHECK_INT_EQ(llm_cancel(h, 7), -ENOENT);
	llm_request_init(&r);
	r.prompt = "eight";
	CHECK_INT_EQ(llm_submit(h, &r, &id), -EPIPE);
	CHECK_INT_EQ(llm_admin(h, "status", NULL, &body), -EPIPE);

	llm_close(h);
	fake_stop(&f);
}

/* ---- scenario 2: a 4096-byte ring that fills up ---- */

#define N_FULL 300

static void script_ring_full(struct fake *f)
{
	char text[64];

	fake_expect_submit(f, 1, NULL, NULL);
	for (int i = 0; i < N_FULL; i++) {
		snprintf(text, sizeof text, "tok%03d-%s", i, "padding-padding-padding-padding");
		fake_token(f, 1, i, text);
		if (i % 16 == 15)
			fake_signal(f);
	}
	fake_final(f, 1, PROTO_FIN_LENGTH, 0, "", N_FULL);
	fake_signal(f);
	/* Count the late RING_WAKEs until the client hangs up. */
	while (fake_read(f) == PROTO_RING_WAKE)
		f->wakes++;
}

static void test_ring_full(void)
{
	struct llm_event ev;
	struct fake f;
	struct llm *h;
	char want[64];
	int n = 0, r;

	fake_start(&f, RING_MIN_CAPACITY, 4, script_ring_full);
	fake_run(&f);
	h = connect_to(&f, RING_MIN_CAPACITY);
	CHECK_INT_EQ(submit_prompt(h, "fill it"), 1);
	usleep(100 * 1000);     /* let the fake daemon fill the ring */
	while ((r = next(h, &ev)) == 1 && ev.kind == LLM_EV_TOKEN) {
		snprintf(want, sizeof want, "tok%03d-%s", n, "padding-padding-padding-padding");
		CHECK_INT_EQ(ev.token, n);
		CHECK_STR_EQ(ev.text, want);
		n++;
	}
	CHECK_INT_EQ(r, 1);
	CHECK_INT_EQ(n, N_FULL);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_LENGTH);
	CHECK_INT_EQ(ev.generated_tokens, N_FULL);
	llm_close(h);
	fake_stop(&f);
	/* After the join: the fake daemon thread wrote these. */
	CHECK_INT_EQ(f.hello.ring_bytes, RING_MIN_CAPACITY);
	CHECK(f.wakes >= 1);
}

/* ---- scenario 3: refusals, split frames, connection-level errors ---- */

static void test_connect_errors(void)
{
	char err[256] = "";
	struct llm *h = NULL;
	struct fake f;
	int r;

	r = llm_connect("/nonexistent/llmd.sock", 0, &h, err, sizeof err);
	CHECK_INT_EQ(r, -ENOENT);
	CHECK(h == NULL);
	CHECK_STR_EQ(err, "cannot connect to /nonexistent/llmd.sock: No such file or directory");

	fake_start(&f, 65536, 4, NULL);
	f.refuse_code = PROTO_E_DRAINING;
	fake_run(&f);
	r = llm_connect(f.path, 0, &h, err, sizeof err);
	CHECK_INT_EQ(r, -ESHUTDOWN);
	CHECK(h == NULL);
	CHECK_STR_EQ(err, "the daemon refused the connection: llmd is stopping");
	fake_stop(&f);
}

static void script_split(struct fake *f)
{
	struct proto_error e = { 1, PROTO_E_NOTEMPLATE, { "no chat template", 16 } };
	uint8_t buf[256];
	ssize_t n = proto_encode_error(buf, sizeof buf, &e);

	fake_expect_submit(f, 1, NULL, NULL);
	/* One byte at a time: the client must reassemble the frame. */
	for (ssize_t i = 0; i < n; i++) {
		fake_write(f, buf + i, 1);
		usleep(1000);
	}
	fake_expect_submit(f, 2, NULL, NULL);
	fake_send_error(f, 0, PROTO_E_DRAINING, "the daemon is shutting down");
}

static void test_split_and_conn_error(void)
{
	struct llm_event ev;
	char err[256] = "";
	struct llm *h = NULL;
	struct fake f;

	fake_start(&f, 8192, 4, script_split);
	fake_run(&f);
	/* A NULL path means $LLMD_SOCKET. */
	setenv("LLMD_SOCKET", f.path, 1);
	CHECK_INT_EQ(llm_connect(NULL, 8192, &h, err, sizeof err), 0);
	unsetenv("LLMD_SOCKET");
	if (!h) {
		fprintf(stderr, "llm_connect: %s\n", err);
		exit(1);
	}
	CHECK_INT_EQ(submit_prompt(h, "chat please"), 1);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 1);
	CHECK_INT_EQ(ev.error_code, PROTO_E_NOTEMPLATE);
	CHECK_STR_EQ(ev.message, "no chat template");

	/* A connection-level ERROR, then EOF: the live request gets its code
	 * and message, and llm_errmsg keeps the message. */
	CHECK_INT_EQ(submit_prompt(h, "two"), 2);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 2);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_DRAINING);
	CHECK_STR_EQ(ev.message, "the daemon is shutting down");
	CHECK_INT_EQ(next(h, &ev), -EPIPE);
	CHECK_STR_EQ(llm_errmsg(h), "the daemon is shutting down");
	llm_close(h);
	fake_stop(&f);
	CHECK_INT_EQ(f.hello.ring_bytes, 8192);
}

static void script_malformed(struct fake *f)
{
	static const uint8_t junk[3] = { 1, 2, 3 };

	fake_expect_submit(f, 1, NULL, NULL);
	CHECK_INT_EQ(ring_push(f->ring, PROTO_REC_TOKEN, junk, sizeof junk, NULL, 0), 0);
	fake_signal(f);
	CHECK_INT_EQ(fake_read(f), 0);   /* the client hangs up */
}

static void test_malformed_record(void)
{
	struct llm_event ev;
	struct fake f;
	struct llm *h;

	fake_start(&f, 65536, 4, script_malformed);
	fake_run(&f);
	h = connect_to(&f, 0);
	CHECK_INT_EQ(submit_prompt(h, "x"), 1);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 1);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(next(h, &ev), -EPROTO);
	fake_stop(&f);
	llm_close(h);
}

/* ---- scenario 5: one thread waits for events while another submits ---- */

static void script_threads(struct fake *f)
{
	fake_expect_submit(f, 1, NULL, NULL);
	fake_token(f, 1, 5, "hi");
	fake_final(f, 1, PROTO_FIN_STOP, 0, "", 1);
	fake_signal(f);
}

struct reader {
	struct llm *h;
	int kinds[4];                 /* the events' kinds, in order */
	int n;
	int rc;                       /* the last llm_next_event result */
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	struct llm_event ev;

	/* Blocks with no request live yet: llm_submit must not wait for it. */
	while (rd->n < 4 && (rd->rc = llm_next_event(rd->h, &ev, -1)) == 1) {
		rd->kinds[rd->n++] = ev.kind;
		if (ev.kind == LLM_EV_DONE)
			break;
	}
	return NULL;
}

static void test_threads(void)
{
	struct reader rd = { 0 };
	pthread_t t;
	struct fake f;

	fake_start(&f, 65536, 4, script_threads);
	fake_run(&f);
	rd.h = connect_to(&f, 0);
	pthread_create(&t, NULL, reader_main, &rd);
	usleep(20 * 1000);
	CHECK_INT_EQ(submit_prompt(rd.h, "from another thread"), 1);
	pthread_join(t, NULL);
	CHECK_INT_EQ(rd.rc, 1);
	CHECK_INT_EQ(rd.n, 2);
	CHECK_INT_EQ(rd.kinds[0], LLM_EV_TOKEN);
	CHECK_INT_EQ(rd.kinds[1], LLM_EV_DONE);
	llm_close(rd.h);
	fake_stop(&f);
}

/* ---- scenario 6: llm_set_model names the model in SUBMIT ---- */

static char name_256[PROTO_MAX_NAME + 1];     /* 256 'q's, NUL-terminated */

/* The next SUBMIT is ID, names MODEL (NULL: no model, no flag), sets the
 * keep-alive KA (LLM_KEEP_ALIVE_UNSET: no flag) and max_draft MD (0: no
 * flag). */
static void fake_expect_model_ka_md(struct fake *f, uint64_t id, const char *model, int32_t ka,
				    uint32_t md)
{
	struct proto_submit s;
	struct proto_submit_buf sb;

	memset(&s, 0, sizeof s);
	fake_expect_submit(f, id, &s, &sb);
	CHECK_INT_EQ(s.flags & PROTO_SUBMIT_KEEP_ALIVE, ka == LLM_KEEP_ALIVE_UNSET ? 0 : PROTO_SUBMIT_KEEP_ALIVE);
	CHECK_INT_EQ(s.keep_alive_s, ka == LLM_KEEP_ALIVE_UNSET ? 0 : ka);
	CHECK_INT_EQ(s.flags & PROTO_SUBMIT_MAX_DRAFT, md ? PROTO_SUBMIT_MAX_DRAFT : 0);
	CHECK_INT_EQ(s.max_draft, md);
	if (!model) {
		CHECK_INT_EQ(s.flags & PROTO_SUBMIT_MODEL, 0);
		CHECK_INT_EQ(s.model.len, 0);
		return;
	}
	CHECK_INT_EQ(s.flags & PROTO_SUBMIT_MODEL, PROTO_SUBMIT_MODEL);
	CHECK_INT_EQ(s.model.len, strlen(model));
	CHECK(s.model.len == strlen(model) && !memcmp(s.model.p, model, s.model.len));
}

static void fake_expect_model(struct fake *f, uint64_t id, const char *model)
{
	fake_expect_model_ka_md(f, id, model, LLM_KEEP_ALIVE_UNSET, 0);
}

static void script_model(struct fake *f)
{
	struct proto_submit s;
	struct proto_submit_buf sb;

	fake_expect_model(f, 1, NULL);                 /* before llm_set_model */
	fake_final(f, 1, PROTO_FIN_STOP, 0, "", 0);
	fake_signal(f);
	fake_expect_model(f, 2, "gemma-3-270m");       /* a chat, refused by ERROR */
	fake_send_error(f, 2, PROTO_E_NOMODEL, "no model named 'gemma-3-270m' is served here");
	memset(&s, 0, sizeof s);                       /* grammar and model together */
	fake_expect_submit(f, 3, &s, &sb);
	CHECK_INT_EQ(s.flags & (PROTO_SUBMIT_GRAMMAR | PROTO_SUBMIT_MODEL),
		     PROTO_SUBMIT_GRAMMAR | PROTO_SUBMIT_MODEL);
	CHECK_INT_EQ(s.grammar_kind, PROTO_GRAMMAR_JSON_OBJECT);
	CHECK(s.model.len == 12 && !memcmp(s.model.p, "gemma-3-270m", 12));
	fake_final(f, 3, PROTO_FIN_ERROR, PROTO_E_NOMODEL, "gemma-3-270m cannot be loaded", 0);
	fake_signal(f);
	fake_expect_model(f, 4, "gemma-3-270m");       /* the too-long name changed nothing */
	fake_expect_model_ka_md(f, 5, name_256, 300, 4); /* the longest name, a keep-alive,
	                                                    a max_draft */
	fake_expect_model_ka_md(f, 6, "copied", 0, 0); /* the caller's buffer changed since */
	fake_expect_model(f, 7, NULL);                 /* "" */
	fake_expect_model(f, 8, NULL);                 /* NULL */
	for (uint64_t id = 4; id <= 8; id++)
		fake_final(f, id, PROTO_FIN_STOP, 0, "", 0);
	fake_signal(f);
	CHECK_INT_EQ(fake_next(f), 0);                 /* the client hangs up */
}

static void test_set_model(void)
{
	struct llm_message chat[1] = { { LLM_ROLE_USER, "Hi" } };
	struct llm_grammar g = { LLM_GRAMMAR_JSON, 0, NULL };
	char too_long[PROTO_MAX_NAME + 2], mine[16];
	struct llm_request r;
	struct llm_event ev;
	struct fake f;
	struct llm *h;
	uint64_t id = 0;

	memset(name_256, 'q', PROTO_MAX_NAME);
	memset(too_long, 'q', PROTO_MAX_NAME + 1);
	too_long[PROTO_MAX_NAME + 1] = 0;
	fake_start(&f, 65536, 8, script_model);
	fake_run(&f);
	h = connect_to(&f, 0);

	CHECK_INT_EQ(llm_set_model(NULL, "x"), -EINVAL);
	CHECK_INT_EQ(submit_prompt(h, "one"), 1);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);

	/* The daemon's refusals: by an ERROR frame, by a FINAL record. */
	CHECK_INT_EQ(llm_set_model(h, "gemma-3-270m"), 0);
	llm_request_init(&r);
	r.messages = chat;
	r.n_messages = 1;
	CHECK_INT_EQ(llm_submit(h, &r, &id), 0);
	CHECK_INT_EQ(id, 2);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.kind, LLM_EV_DONE);
	CHECK_INT_EQ(ev.id, 2);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_NOMODEL);
	CHECK_STR_EQ(ev.message, "no model named 'gemma-3-270m' is served here");
	llm_request_init(&r);
	r.prompt = "three";
	CHECK_INT_EQ(llm_submit_grammar(h, &r, &g, &id), 0);
	CHECK_INT_EQ(id, 3);
	CHECK_INT_EQ(next(h, &ev), 1);
	CHECK_INT_EQ(ev.id, 3);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_NOMODEL);
	CHECK_STR_EQ(ev.message, "gemma-3-270m cannot be loaded");

	/* 257 bytes: refused, saying so, and the name before stays. */
	CHECK_INT_EQ(llm_set_model(h, too_long), -EINVAL);
	CHECK(strstr(llm_errmsg(h), "at most 256 bytes") != NULL);
	CHECK_INT_EQ(submit_prompt(h, "four"), 4);
	CHECK_INT_EQ(llm_set_model(h, name_256), 0);
	CHECK_INT_EQ(llm_set_keep_alive(h, -2), -EINVAL);
	CHECK(strstr(llm_errmsg(h), "-1 (for ever)") != NULL);
	CHECK_INT_EQ(llm_set_keep_alive(h, 300), 0);
	CHECK_INT_EQ(llm_set_max_draft(h, LLM_MAX_DRAFT + 1), -EINVAL);
	CHECK(strstr(llm_errmsg(h), "max_draft is 1..16") != NULL);
	CHECK_INT_EQ(llm_set_max_draft(h, -1), -EINVAL);
	CHECK_INT_EQ(llm_set_max_draft(h, 4), 0);
	CHECK_INT_EQ(submit_prompt(h, "five"), 5);
	CHECK_INT_EQ(llm_set_max_draft(h, 0), 0);
	snprintf(mine, sizeof mine, "copied");
	CHECK_INT_EQ(llm_set_model(h, mine), 0);
	snprintf(mine, sizeof mine, "overwritten");
	CHECK_INT_EQ(llm_set_keep_alive(h, 0), 0);
	CHECK_INT_EQ(submit_prompt(h, "six"), 6);
	CHECK_INT_EQ(llm_set_keep_alive(h, LLM_KEEP_ALIVE_UNSET), 0);
	CHECK_INT_EQ(llm_set_model(h, ""), 0);
	CHECK_INT_EQ(submit_prompt(h, "seven"), 7);
	CHECK_INT_EQ(llm_set_model(h, "again"), 0);
	CHECK_INT_EQ(llm_set_model(h, NULL), 0);
	CHECK_INT_EQ(submit_prompt(h, "eight"), 8);
	for (uint64_t want = 4; want <= 8; want++) {
		CHECK_INT_EQ(next(h, &ev), 1);
		CHECK_INT_EQ(ev.id, want);
		CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	}
	llm_close(h);
	fake_stop(&f);
}

/* ---- scenario 7: over HTTP the name is the body's "model" ---- */

/* A fake OpenAI-compatible server on a Unix socket: one request per
 * connection (it answers Connection: close), bodies kept for the checks. */
struct fake_http {
	char dir[64];                 /* mkdtemp'd directory holding the socket */
	char path[96];                /* the socket */
	char url[112];                /* "unix:" PATH, for llm_connect_url */
	int lfd;
	int n_posts;                  /* POSTs to answer, then the thread ends */
	char bodies[4][2048];         /* (n_posts) the POSTs' bodies, NUL-terminated */
	pthread_t thr;
};

/* Reads one request on FD: its first line into LINE, its body into BODY. */
static int http_read_request(int fd, char *line, size_t linelen, char *body, size_t bodylen)
{
	char req[8192];
	size_t n = 0, want = 0;
	char *end = NULL;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (end && n >= (size_t)(end + 4 - req) + want)
			break;
		if (n == sizeof req - 1 || poll(&p, 1, IO_TIMEOUT_MS) != 1 ||
		    (k = recv(fd, req + n, sizeof req - 1 - n, 0)) <= 0)
			return -1;
		n += (size_t)k;
		req[n] = 0;
		if (!end && (end = strstr(req, "\r\n\r\n"))) {
			const char *cl = strcasestr(req, "\r\ncontent-length:");
			want = cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0;
		}
	}
	snprintf(line, linelen, "%.*s", (int)strcspn(req, "\r"), req);
	snprintf(body, bodylen, "%.*s", (int)want, end + 4);
	return 0;
}

static void http_reply(int fd, int status, const char *type, const char *body)
{
	char head[256];
	int n = snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Type: %s\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n", status, type, strlen(body));

	CHECK(send(fd, head, (size_t)n, MSG_NOSIGNAL) == n);
	CHECK(send(fd, body, strlen(body), MSG_NOSIGNAL) == (ssize_t)strlen(body));
}

static void *fake_http_main(void *arg)
{
	static const char models[] = "{\"object\":\"list\",\"data\":[{\"id\":\"first-model\"},"
				     "{\"id\":\"second-model\"}]}";
	static const char stream[] =
		"data: {\"choices\":[{\"text\":\"ok\",\"token_ids\":[5],\"finish_reason\":\"stop\"}]}\n\n"
		"data: [DONE]\n\n";
	static const char no_model[] = "{\"error\":{\"message\":\"the model 'third-model' is not "
				       "served here\",\"type\":\"invalid_request_error\",\"param\":"
				       "\"model\",\"code\":\"model_not_found\"}}";
	struct fake_http *fh = arg;
	int posts = 0;

	while (posts < fh->n_posts) {
		struct pollfd p = { .fd = fh->lfd, .events = POLLIN };
		char line[256], body[2048];
		int fd;

		if (poll(&p, 1, IO_TIMEOUT_MS) != 1) {
			fprintf(stderr, "fake http: nobody connected\n");
			test_failures++;
			return NULL;
		}
		fd = accept4(fh->lfd, NULL, NULL, SOCK_CLOEXEC);
		CHECK(fd >= 0);
		if (fd < 0)
			return NULL;
		if (http_read_request(fd, line, sizeof line, body, sizeof body) < 0) {
			close(fd);      /* a connection curl opened and left */
			continue;
		}
		if (!strncmp(line, "GET /v1/models ", 15)) {
			http_reply(fd, 200, "application/json", models);
		} else {
			CHECK_STR_EQ(line, "POST /v1/completions HTTP/1.1");
			snprintf(fh->bodies[posts], sizeof fh->bodies[posts], "%s", body);
			/* the third POST names a model the server does not have */
			if (posts == 2)
				http_reply(fd, 404, "application/json", no_model);
			else
				http_reply(fd, 200, "text/event-stream", stream);
			posts++;
		}
		close(fd);
	}
	return NULL;
}

/* Submits PROMPT on H and reads its events up to DONE, which goes to EV. */
static void http_round(struct llm *h, const char *prompt, struct llm_event *ev)
{
	int r;

	submit_prompt(h, prompt);
	while ((r = next(h, ev)) == 1 && ev->kind != LLM_EV_DONE)
		;
	CHECK_INT_EQ(r, 1);
}

static void test_set_model_http(void)
{
	struct fake_http fh = { .n_posts = 4 };
	char err[256] = "";
	struct llm_event ev;
	struct llm_info info;
	struct llm *h = NULL;

	snprintf(fh.dir, sizeof fh.dir, "/tmp/test_libllm.XXXXXX");
	if (!mkdtemp(fh.dir)) {
		perror("test_libllm: mkdtemp");
		exit(1);
	}
	snprintf(fh.path, sizeof fh.path, "%s/http.sock", fh.dir);
	snprintf(fh.url, sizeof fh.url, "unix:%s", fh.path);
	fh.lfd = usock_listen(fh.path, 0600, 8, err, sizeof err);
	if (fh.lfd < 0) {
		fprintf(stderr, "test_libllm: %s\n", err);
		exit(1);
	}
	pthread_create(&fh.thr, NULL, fake_http_main, &fh);
	CHECK_INT_EQ(llm_connect_url(fh.url, NULL, &h, err, sizeof err), 0);
	if (!h) {
		fprintf(stderr, "llm_connect_url: %s\n", err);
		exit(1);
	}
	llm_get_info(h, &info);
	CHECK_STR_EQ(info.model, "first-model");

	http_round(h, "one", &ev);                     /* GET /models' first */
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	CHECK_INT_EQ(llm_set_model(h, "second-model"), 0);
	CHECK_INT_EQ(llm_set_keep_alive(h, 600), 0);
	CHECK_INT_EQ(llm_set_max_draft(h, 5), 0);
	http_round(h, "two", &ev);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	CHECK_INT_EQ(llm_set_keep_alive(h, LLM_KEEP_ALIVE_UNSET), 0);
	CHECK_INT_EQ(llm_set_max_draft(h, 0), 0);
	CHECK_INT_EQ(llm_set_model(h, "third-model"), 0);
	http_round(h, "three", &ev);                   /* 404, model_not_found */
	CHECK_INT_EQ(ev.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(ev.error_code, PROTO_E_NOMODEL);
	CHECK(strstr(ev.message, "'third-model' is not served here") != NULL);
	CHECK_INT_EQ(llm_set_model(h, NULL), 0);
	http_round(h, "four", &ev);
	CHECK_INT_EQ(ev.finish, LLM_FINISH_STOP);
	llm_close(h);
	pthread_join(fh.thr, NULL);

	CHECK(strstr(fh.bodies[0], "\"model\":\"first-model\"") != NULL);
	CHECK(strstr(fh.bodies[0], "\"prompt\":\"one\"") != NULL);
	CHECK(strstr(fh.bodies[1], "\"model\":\"second-model\"") != NULL);
	CHECK(strstr(fh.bodies[0], "keep_alive") == NULL);
	CHECK(strstr(fh.bodies[1], "\"keep_alive\":600") != NULL);
	CHECK(strstr(fh.bodies[2], "keep_alive") == NULL);
	CHECK(strstr(fh.bodies[0], "speculative.n_max") == NULL);
	CHECK(strstr(fh.bodies[1], "\"speculative.n_max\":5") != NULL);
	CHECK(strstr(fh.bodies[2], "speculative.n_max") == NULL);
	CHECK(strstr(fh.bodies[2], "\"model\":\"third-model\"") != NULL);
	CHECK(strstr(fh.bodies[3], "\"model\":\"first-model\"") != NULL);
	close(fh.lfd);
	unlink(fh.path);
	rmdir(fh.dir);
}

int main(void)
{
	alarm(60);
	test_basic();
	test_ring_full();
	test_connect_errors();
	test_split_and_conn_error();
	test_malformed_record();
	test_threads();
	test_set_model();
	test_set_model_http();
	return test_result();
}
