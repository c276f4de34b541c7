/* libllm.c - libllm, the client library of llmd (llm.h): one handle is one
 * connection to the daemon, the consumer side of its token ring and the
 * waiting end of its wake channel.  It frames requests onto the socket and turns ring records and
 * ERROR frames back into events.  It never logs, never exits and never
 * raises SIGPIPE; the daemon's side of the same protocol is daemon/server.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "libllm_http.h"
#include "llm.h"
#include "proto.h"
#include "ring.h"
#include "usock.h"
#include "utf8.h"

_Static_assert(LLM_MAX_DRAFT == PROTO_MAX_DRAFT, "LLM_MAX_DRAFT");

#define IN_INITIAL (64u << 10)   /* first size of the input buffer; it grows to PROTO_MAX_FRAME */
#define READS_PER_CALL 16        /* socket reads per read_socket(): bounded work per wakeup */
#define ADMIN_POLL_MS 50         /* llm_admin re-checks this often for a reply another thread read */

/* A request the daemon's front end refused with an ERROR frame, waiting to be
 * delivered as its LLM_EV_DONE. */
struct pending_done {
	uint64_t id;
	uint32_t code;                     /* enum proto_err */
	uint32_t len;                      /* bytes of msg */
	char msg[PROTO_MAX_ERRMSG];        /* not NUL-terminated */
};

struct llm {
	pthread_mutex_t lock;              /* guards every field below */
	struct llm_http *http;             /* an OpenAI-compatible URL (libllm_http.c) instead
	                                      of the socket; then only info, last_id and the
	                                      messages below are used */
	bool http_reading;                 /* a thread is in llm_next_event (one at a time) */
	pthread_mutex_t admin_lock;        /* one llm_admin at a time; taken before lock */
	int sock;                          /* the connection; non-blocking after the handshake */
	int efd;                           /* the daemon's wake channel (usock_wake_pair's
	                                      waiting end): it pushed records */
	bool efd_done;                     /* the daemon closed its end: no longer polled */
	int wake_fd;                       /* our eventfd: a non-reader thread read frames */
	int epfd;                          /* llm_fd(): watches sock, efd and wake_fd */
	struct ring *ring;                 /* consumer side of the token ring */
	struct llm_info info;              /* from WELCOME */

	uint64_t last_id;                  /* the last request id handed out */
	char model[PROTO_MAX_NAME + 1];    /* llm_set_model's name for later submits,
	                                      NUL-terminated; "": the daemon's default */
	int keep_alive_set;                /* llm_set_keep_alive's: send KEEP_ALIVE_S */
	int32_t keep_alive_s;
	uint32_t max_draft;                /* llm_set_max_draft's, or 0: none sent */
	uint64_t *live;                    /* (n_live) submitted ids without their DONE yet */
	size_t n_live, cap_live;
	struct pending_done *pend;         /* (n_pend) FIFO; cap_pend >= cap_live, so a
	                                      push never allocates */
	size_t n_pend, cap_pend;

	uint8_t *in;                       /* (in_cap) bytes from the socket, in_len unparsed */
	size_t in_len, in_cap;
	bool sock_done;                    /* EOF, a read error, or we shut it down */
	bool ring_bad;                     /* the ring held a malformed record: never read again */

	uint32_t conn_code;                /* proto_err of an ERROR frame with id 0, else 0 */
	char conn_msg[PROTO_MAX_ERRMSG + 1];

	int fatal;                         /* 0, or what llm_next_event ends with (-EPIPE...) */
	uint32_t fatal_code;               /* proto_err the live requests then finish with */
	char fatal_msg[PROTO_MAX_ERRMSG + 64];

	uint64_t admin_sent;               /* ADMIN frames sent */
	uint64_t admin_recv;               /* ADMIN_REPLY frames received (replies come in order) */
	uint64_t admin_want;               /* the reply llm_admin waits for; 0: none */
	bool admin_have;                   /* it came: */
	uint32_t admin_code;               /*   its code (enum proto_err) */
	char *admin_body;                  /*   malloc'd, NUL-terminated */

	char evtext[PROTO_MAX_TOKEN_TEXT + PROTO_MAX_ERRMSG + 1]; /* the current event's text or
	                                                             message, NUL-terminated */
	char errmsg[PROTO_MAX_ERRMSG + 128]; /* for llm_errmsg */
};

/* ---- small helpers ---- */

static void set_msg(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_msg(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

#define set_err(h, ...) set_msg((h)->errmsg, sizeof (h)->errmsg, __VA_ARGS__)

/* Copies a protocol string into DST (CAP bytes) NUL-terminated, truncated. */
static void copy_str(char *dst, size_t cap, struct proto_str s)
{
	size_t n = s.len < cap - 1 ? s.len : cap - 1;

	if (n)
		memcpy(dst, s.p, n);
	dst[n] = 0;
}

/* Empties an eventfd; 1 when it had a count. */
static int drain_eventfd(int fd)
{
	uint64_t v;

	return read(fd, &v, sizeof v) == (ssize_t)sizeof v;
}

/* Empties the daemon's wake channel; 1 when it had signals.  Once the
 * daemon closed its end, the channel would read as ready for ever: it
 * leaves the poll and epoll sets (the socket tells how the connection
 * ended). */
static int drain_daemon_wake(struct llm *h)
{
	int r;

	if (h->efd_done)
		return 0;
	r = usock_wake_drain(h->efd);
	if (r == -EPIPE) {
		h->efd_done = true;
		epoll_ctl(h->epfd, EPOLL_CTL_DEL, h->efd, NULL);
	}
	return r > 0;
}

static void poke_wake(struct llm *h)
{
	uint64_t one = 1;

	if (write(h->wake_fd, &one, sizeof one) < 0) {
		/* EAGAIN: the counter is already huge, the reader will look anyway. */
	}
}

/* ---- live requests ---- */

static ssize_t live_find(const struct llm *h, uint64_t id)
{
	for (size_t i = 0; i < h->n_live; i++)
		if (h->live[i] == id)
			return (ssize_t)i;
	return -1;
}

/* Removes ID; true when it was live. */
static bool live_remove(struct llm *h, uint64_t id)
{
	ssize_t i = live_find(h, id);

	if (i < 0)
		return false;
	memmove(h->live + i, h->live + i + 1, (h->n_live - (size_t)i - 1) * sizeof *h->live);
	h->n_live--;
	return true;
}

/* Room for one more live id, and for its pending DONE should it be refused. */
static int live_reserve(struct llm *h)
{
	if (h->n_live == h->cap_live) {
		size_t cap = h->cap_live ? h->cap_live * 2 : 8;
		uint64_t *l = realloc(h->live, cap * sizeof *l);

		if (!l)
			return -ENOMEM;
		h->live = l;
		h->cap_live = cap;
	}
	if (h->cap_pend < h->cap_live) {
		struct pending_done *p = realloc(h->pend, h->cap_live * sizeof *p);

		if (!p)
			return -ENOMEM;
		h->pend = p;
		h->cap_pend = h->cap_live;
	}
	return 0;
}

/* ---- failure states ---- */

/* Records how llm_next_event will end once the ring and the pending events
 * are delivered; the first cause wins. */
static void set_fatal(struct llm *h, int err, uint32_t code, const char *msg)
{
	if (h->fatal)
		return;
	h->fatal = err;
	h->fatal_code = code;
	set_msg(h->fatal_msg, sizeof h->fatal_msg, "%s", msg);
}

/* The daemon broke the protocol: hang up (it cancels what runs) and fail. */
static void protocol_error(struct llm *h, const char *msg)
{
	set_fatal(h, -EPROTO, PROTO_E_INTERNAL, msg);
	shutdown(h->sock, SHUT_RDWR);
	h->sock_done = true;
}

/* EOF or a read error: what was already in the ring is still delivered. */
static void connection_lost(struct llm *h, int err)
{
	char msg[sizeof h->fatal_msg];

	h->sock_done = true;
	if (h->conn_code) {
		set_fatal(h, -EPIPE, h->conn_code, h->conn_msg);
		return;
	}
	if (err)
		set_msg(msg, sizeof msg, "the connection to the daemon failed: %s", strerror(-err));
	else
		set_msg(msg, sizeof msg, "the daemon closed the connection");
	set_fatal(h, -EPIPE, PROTO_E_INTERNAL, msg);
}

/* ---- sending ---- */

static int read_socket(struct llm *h);

/* Sends one whole frame.  On a full socket buffer it waits for room while
 * still reading what the daemon sends (so neither side can block the other),
 * and never gives up on a half-sent frame.  0 or -EPIPE.  Lock held. */
static int send_frame(struct llm *h, const uint8_t *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		ssize_t n = usock_send(h->sock, buf + off, len - off, NULL, 0);
		struct pollfd p;

		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n != -EAGAIN) {
			set_err(h, "cannot send to the daemon: %s", strerror(n ? (int)-n : EPIPE));
			return -EPIPE;
		}
		p.fd = h->sock;
		p.events = POLLOUT | (h->sock_done ? 0 : POLLIN);
		if (poll(&p, 1, -1) < 0) {
			if (errno == EINTR)
				continue;       /* a half-sent frame must still be finished */
			set_err(h, "poll: %s", strerror(errno));
			return -EPIPE;
		}
		if ((p.revents & POLLIN) && read_socket(h) > 0)
			poke_wake(h);
	}
	return 0;
}

static void send_ring_wake(struct llm *h)
{
	uint8_t buf[PROTO_HDR_SIZE];
	ssize_t n = proto_encode_ring_wake(buf, sizeof buf);

	/* A failure shows up as EOF on the next read. */
	if (n > 0)
		send_frame(h, buf, (size_t)n);
}

/* ---- receiving frames ---- */

static void handle_error_frame(struct llm *h, const struct proto_frame *f)
{
	struct proto_error e;
	struct pending_done *p;

	if (proto_decode_error(f, &e) < 0) {
		protocol_error(h, "the daemon sent a malformed ERROR frame");
		return;
	}
	if (e.id == 0) {
		/* The daemon closes after this; EOF reports it. */
		h->conn_code = e.code;
		copy_str(h->conn_msg, sizeof h->conn_msg, e.message);
		set_err(h, "%s", h->conn_msg);
		return;
	}
	if (!live_remove(h, e.id))
		return;         /* not ours (any more): ignore */
	p = &h->pend[h->n_pend++];
	p->id = e.id;
	p->code = e.code;
	p->len = e.message.len;
	if (p->len)
		memcpy(p->msg, e.message.p, p->len);
}

static void handle_admin_reply(struct llm *h, const struct proto_frame *f)
{
	struct proto_admin_reply a;

	if (proto_decode_admin_reply(f, &a) < 0) {
		protocol_error(h, "the daemon sent a malformed ADMIN_REPLY frame");
		return;
	}
	h->admin_recv++;
	if (h->admin_want != h->admin_recv)
		return;         /* the reply to an llm_admin that gave up (EINTR) */
	free(h->admin_body);
	h->admin_body = malloc((size_t)a.body.len + 1);
	if (!h->admin_body) {
		protocol_error(h, "out of memory for an admin reply");
		return;
	}
	if (a.body.len)
		memcpy(h->admin_body, a.body.p, a.body.len);
	h->admin_body[a.body.len] = 0;
	h->admin_code = a.code;
	h->admin_have = true;
}

static void parse_frames(struct llm *h)
{
	size_t off = 0;

	while (!h->sock_done) {
		struct proto_frame f;
		ssize_t n = proto_frame_parse(h->in + off, h->in_len - off, &f);
		char msg[128];

		if (n == 0)
			break;
		if (n < 0) {
			protocol_error(h, "the daemon sent a malformed frame");
			break;
		}
		switch (f.type) {
		case PROTO_ERROR:
			handle_error_frame(h, &f);
			break;
		case PROTO_ADMIN_REPLY:
			handle_admin_reply(h, &f);
			break;
		default:
			set_msg(msg, sizeof msg, "the daemon sent an unexpected %s frame",
				proto_type_name(f.type));
			protocol_error(h, msg);
			break;
		}
		off += (size_t)n;
	}
	if (h->sock_done) {
		h->in_len = 0;
		return;
	}
	memmove(h->in, h->in + off, h->in_len - off);
	h->in_len -= off;
}

/* Reads what the socket has now and handles the whole frames in it.  1 when
 * something happened (bytes, EOF), 0 when there was nothing.  Lock held. */
static int read_socket(struct llm *h)
{
	int progress = 0;

	for (int i = 0; i < READS_PER_CALL && !h->sock_done; i++) {
		int fds[USOCK_MAX_FDS], nfds = 0;
		size_t room;
		ssize_t n;

		if (h->in_len == h->in_cap) {
			size_t cap = h->in_cap * 2;
			uint8_t *p;

			if (cap > PROTO_MAX_FRAME)
				cap = PROTO_MAX_FRAME;
			if (cap <= h->in_cap) {
				/* parse_frames leaves less than one frame behind */
				protocol_error(h, "the daemon sent an oversized frame");
				return 1;
			}
			p = realloc(h->in, cap);
			if (!p) {
				protocol_error(h, "out of memory for the input buffer");
				return 1;
			}
			h->in = p;
			h->in_cap = cap;
		}
		room = h->in_cap - h->in_len;
		n = usock_recv(h->sock, h->in + h->in_len, room, fds, USOCK_MAX_FDS, &nfds);
		if (n == -EAGAIN)
			break;
		progress = 1;
		if (n > 0)
			while (nfds > 0)
				close(fds[--nfds]);     /* only WELCOME carries fds */
		if (n <= 0) {
			connection_lost(h, (int)n);
			break;
		}
		h->in_len += (size_t)n;
		parse_frames(h);
		if ((size_t)n < room)
			break;
	}
	return progress;
}

/* ---- delivering events ---- */

static void fill_done(struct llm *h, struct llm_event *ev, uint64_t id, uint32_t finish,
		      uint32_t code, const char *msg, size_t msg_len)
{
	memset(ev, 0, sizeof *ev);
	ev->kind = LLM_EV_DONE;
	ev->id = id;
	ev->token = -1;
	ev->text = "";
	ev->finish = (enum llm_finish)finish;
	ev->error_code = (int)code;
	if (msg_len > sizeof h->evtext - 1)
		msg_len = sizeof h->evtext - 1;
	if (msg_len)
		memcpy(h->evtext, msg, msg_len);
	h->evtext[msg_len] = 0;
	ev->message = h->evtext;
}

static void ring_broken(struct llm *h)
{
	h->ring_bad = true;
	set_fatal(h, -EPROTO, PROTO_E_INTERNAL, "the daemon wrote a malformed record into the ring");
	shutdown(h->sock, SHUT_RDWR);
	h->sock_done = true;
}

static void consume(struct llm *h)
{
	if (ring_consume(h->ring) == 1 && !h->sock_done)
		send_ring_wake(h);
}

/* The next ring record of a live request as an event: 1, or 0 when the ring
 * has none.  Records of ids that are not live (finished or refused already)
 * are skipped, as are record types this version does not know. */
static int take_ring(struct llm *h, struct llm_event *ev)
{
	for (;;) {
		struct ring_rec rec;
		struct proto_token t;
		struct proto_final fin;
		int r = ring_peek(h->ring, &rec);

		if (r == 0)
			return 0;
		if (r < 0) {
			ring_broken(h);
			return 0;
		}
		if (rec.type == PROTO_REC_TOKEN) {
			if (proto_token_decode(rec.payload, rec.len, &t) < 0) {
				ring_broken(h);
				return 0;
			}
			if (live_find(h, t.id) < 0) {
				consume(h);
				continue;
			}
			memset(ev, 0, sizeof *ev);
			ev->kind = LLM_EV_TOKEN;
			ev->id = t.id;
			ev->token = t.token;
			ev->logprob = t.logprob;
			if (t.text.len)
				memcpy(h->evtext, t.text.p, t.text.len);
			h->evtext[t.text.len] = 0;
			ev->text = h->evtext;
			ev->text_len = t.text.len;
			ev->message = "";
			consume(h);
			return 1;
		}
		if (rec.type == PROTO_REC_FINAL) {
			if (proto_final_decode(rec.payload, rec.len, &fin) < 0) {
				ring_broken(h);
				return 0;
			}
			if (!live_remove(h, fin.id)) {
				consume(h);
				continue;
			}
			fill_done(h, ev, fin.id, fin.finish, fin.code, fin.message.p, fin.message.len);
			ev->prompt_tokens = fin.prompt_tokens;
			ev->cached_tokens = fin.cached_tokens;
			ev->generated_tokens = fin.generated_tokens;
			ev->preemptions = fin.preemptions;
			ev->queue_ms = fin.queue_us / 1000.0;
			ev->prefill_ms = fin.prefill_us / 1000.0;
			ev->decode_ms = fin.decode_us / 1000.0;
			consume(h);
			return 1;
		}
		consume(h);
	}
}

/* One event if there is one: ring records first, then refusals, then, once
 * the connection is gone, an error DONE for each live request and finally
 * the connection's error.  1, 0 (nothing now) or a negative errno. */
static int deliver(struct llm *h, struct llm_event *ev)
{
	if (!h->ring_bad && take_ring(h, ev))
		return 1;
	if (h->n_pend) {
		struct pending_done *p = &h->pend[0];

		fill_done(h, ev, p->id, LLM_FINISH_ERROR, p->code, p->msg, p->len);
		memmove(h->pend, h->pend + 1, --h->n_pend * sizeof *h->pend);
		return 1;
	}
	if (h->fatal) {
		if (h->n_live) {
			uint64_t id = h->live[0];

			live_remove(h, id);
			fill_done(h, ev, id, LLM_FINISH_ERROR, h->fatal_code, h->fatal_msg,
				  strlen(h->fatal_msg));
			return 1;
		}
		set_err(h, "%s", h->fatal_msg);
		return h->fatal;
	}
	return 0;
}

/* ---- connecting ---- */

static void llm_free(struct llm *h)
{
	if (!h)
		return;
	if (h->epfd >= 0)
		close(h->epfd);
	if (h->wake_fd >= 0)
		close(h->wake_fd);
	if (h->efd >= 0)
		close(h->efd);
	if (h->sock >= 0)
		close(h->sock);
	ring_free(h->ring);
	llm_http_close(h->http);
	free(h->in);
	free(h->live);
	free(h->pend);
	free(h->admin_body);
	pthread_mutex_destroy(&h->admin_lock);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

/* What a connection-level refusal means as an errno. */
static int refusal_errno(uint32_t code)
{
	switch (code) {
	case PROTO_E_PERM: return -EPERM;
	case PROTO_E_VERSION: return -EPROTONOSUPPORT;
	case PROTO_E_LIMIT: return -EUSERS;
	case PROTO_E_BUSY: return -EBUSY;
	case PROTO_E_DRAINING: return -ESHUTDOWN;
	default: return -ECONNREFUSED;
	}
}

static int take_welcome(struct llm *h, const struct proto_frame *f, int *fds, int nfds,
			char *msg, size_t msglen)
{
	struct proto_welcome w;
	char e[256];
	int r;

	if (proto_decode_welcome(f, &w) < 0) {
		set_msg(msg, msglen, "the daemon sent a malformed WELCOME");
		return -EPROTO;
	}
	if (w.version != PROTO_VERSION) {
		set_msg(msg, msglen, "the daemon speaks protocol version %u, this libllm %u",
			w.version, PROTO_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (nfds != 2) {
		set_msg(msg, msglen, "the daemon passed %d file descriptors with WELCOME, not 2",
			nfds);
		return -EPROTO;
	}
	r = ring_attach(fds[0], &h->ring, e, sizeof e);
	if (r < 0) {
		set_msg(msg, msglen, "cannot map the ring the daemon passed: %s", e);
		return r;
	}
	close(fds[0]);          /* the mapping keeps the memfd alive */
	fds[0] = -1;
	h->efd = fds[1];
	fds[1] = -1;
	if (fcntl(h->efd, F_SETFL, fcntl(h->efd, F_GETFL) | O_NONBLOCK) < 0) {
		r = -errno;
		set_msg(msg, msglen, "the daemon's wake channel: %s", strerror(-r));
		return r;
	}
	h->info.protocol = w.version;
	h->info.daemon_pid = w.daemon_pid;
	h->info.client_id = w.client_id;
	h->info.ring_bytes = ring_capacity(h->ring);
	h->info.max_inflight = w.max_inflight;
	h->info.max_prompt_bytes = w.max_prompt_bytes;
	h->info.max_prompt_tokens = w.max_prompt_tokens;
	h->info.max_tokens = w.max_tokens;
	h->info.n_ctx = w.n_ctx;
	h->info.n_vocab = w.n_vocab;
	copy_str(h->info.model, sizeof h->info.model, w.model);
	copy_str(h->info.backend, sizeof h->info.backend, w.backend);
	copy_str(h->info.chat_template, sizeof h->info.chat_template, w.chat_template);
	return 0;
}

/* HELLO, then WELCOME with its two fds (or ERROR).  The socket is blocking
 * here; poll first so that a signal interrupts the wait (-EINTR). */
static int handshake(struct llm *h, uint32_t ring_bytes, char *msg, size_t msglen)
{
	struct proto_hello hello = { .version = PROTO_VERSION, .ring_bytes = ring_bytes };
	uint8_t buf[PROTO_HDR_SIZE + 16];
	int got[2] = { -1, -1 }, ngot = 0, r;
	ssize_t n = proto_encode_hello(buf, sizeof buf, &hello);

	if (n < 0) {
		set_msg(msg, msglen, "cannot encode HELLO: %s", strerror((int)-n));
		return (int)n;
	}
	for (size_t off = 0; off < (size_t)n;) {
		ssize_t k = usock_send(h->sock, buf + off, (size_t)n - off, NULL, 0);

		if (k < 0) {
			set_msg(msg, msglen, "cannot send HELLO: %s", strerror((int)-k));
			return (int)k;
		}
		off += (size_t)k;
	}
	for (;;) {
		struct pollfd p = { .fd = h->sock, .events = POLLIN };
		struct proto_frame f;
		int fds[USOCK_MAX_FDS], nfds = 0;

		n = proto_frame_parse(h->in, h->in_len, &f);
		if (n < 0) {
			set_msg(msg, msglen, "the daemon sent a malformed frame");
			r = -EPROTO;
			goto out;
		}
		if (n > 0) {
			if (f.type == PROTO_WELCOME) {
				r = take_welcome(h, &f, got, ngot, msg, msglen);
			} else if (f.type == PROTO_ERROR) {
				struct proto_error e;

				if (proto_decode_error(&f, &e) < 0) {
					set_msg(msg, msglen, "the daemon sent a malformed ERROR");
					r = -EPROTO;
				} else {
					set_msg(msg, msglen, "the daemon refused the connection: %.*s",
						(int)e.message.len, e.message.p);
					r = refusal_errno(e.code);
				}
			} else {
				set_msg(msg, msglen, "the daemon answered HELLO with %s",
					proto_type_name(f.type));
				r = -EPROTO;
			}
			if (r == 0) {
				h->in_len -= (size_t)n;
				memmove(h->in, h->in + n, h->in_len);
			}
			goto out;
		}
		if (h->in_len == h->in_cap) {
			set_msg(msg, msglen, "the daemon's answer to HELLO is too long");
			r = -EPROTO;
			goto out;
		}
		if (poll(&p, 1, -1) < 0) {
			r = -errno;
			set_msg(msg, msglen, "waiting for the daemon's WELCOME: %s", strerror(-r));
			goto out;
		}
		n = usock_recv(h->sock, h->in + h->in_len, h->in_cap - h->in_len, fds,
			       USOCK_MAX_FDS, &nfds);
		if (n <= 0) {
			r = n ? (int)n : -EPIPE;
			set_msg(msg, msglen, "the daemon closed the connection during the handshake%s%s",
				n ? ": " : "", n ? strerror((int)-n) : "");
			goto out;
		}
		for (int i = 0; i < nfds; i++) {
			if (ngot < 2)
				got[ngot] = fds[i];
			else
				close(fds[i]);
			ngot++;         /* more than 2 fails take_welcome */
		}
		h->in_len += (size_t)n;
	}
out:
	for (int i = 0; i < 2; i++)
		if (got[i] >= 0)
			close(got[i]);
	return r;
}

int llm_connect(const char *path, uint32_t ring_bytes, struct llm **ret, char *err, size_t errlen)
{
	struct epoll_event e = { .events = EPOLLIN };
	char msg[PROTO_MAX_ERRMSG + 128];
	struct llm *h;
	int r;

	if (!ret) {
		set_msg(err, errlen, "llm_connect: no place for the handle");
		return -EINVAL;
	}
	if (!path) {
		path = getenv("LLMD_SOCKET");
		if (!path || !*path)
			path = LLM_DEFAULT_SOCKET;
	}
	h = calloc(1, sizeof *h);
	if (!h) {
		set_msg(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->sock = h->efd = h->wake_fd = h->epfd = -1;
	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->admin_lock, NULL);
	h->in_cap = IN_INITIAL;
	h->in = malloc(h->in_cap);
	if (!h->in) {
		r = -ENOMEM;
		set_msg(msg, sizeof msg, "out of memory");
		goto fail;
	}
	h->sock = usock_connect(path, NULL, 0);
	if (h->sock < 0) {
		r = h->sock;
		set_msg(msg, sizeof msg, "cannot connect to %s: %s", path, strerror(-r));
		goto fail;
	}
	r = handshake(h, ring_bytes, msg, sizeof msg);
	if (r < 0)
		goto fail;
	if (fcntl(h->sock, F_SETFL, fcntl(h->sock, F_GETFL) | O_NONBLOCK) < 0) {
		r = -errno;
		set_msg(msg, sizeof msg, "socket: %s", strerror(-r));
		goto fail;
	}
	h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	h->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (h->wake_fd < 0 || h->epfd < 0) {
		r = -errno;
		set_msg(msg, sizeof msg, "cannot create the event fd: %s", strerror(-r));
		goto fail;
	}
	e.data.fd = h->sock;
	if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->sock, &e) == 0) {
		e.data.fd = h->efd;
		if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->efd, &e) == 0) {
			e.data.fd = h->wake_fd;
			r = epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->wake_fd, &e);
		} else {
			r = -1;
		}
	} else {
		r = -1;
	}
	if (r < 0) {
		r = -errno;
		set_msg(msg, sizeof msg, "epoll: %s", strerror(-r));
		goto fail;
	}
	if (h->in_len)
		parse_frames(h);        /* frames that came right behind WELCOME */
	*ret = h;
	return 0;
fail:
	set_msg(err, errlen, "%s", msg);
	llm_free(h);
	return r;
}

int llm_connect_url(const char *url, const char *api_key, struct llm **ret, char *err, size_t errlen)
{
	char msg[PROTO_MAX_ERRMSG + 1200];
	struct llm *h;
	int r;

	if (!ret) {
		set_msg(err, errlen, "llm_connect_url: no place for the handle");
		return -EINVAL;
	}
	if (!url || !*url)
		url = getenv("LLM_URL");
	if (!url || !*url) {
		set_msg(err, errlen, "llm_connect_url: no URL (and LLM_URL is not set)");
		return -EINVAL;
	}
	if (!api_key)
		api_key = getenv("LLM_API_KEY");
	if (!(h = calloc(1, sizeof *h))) {
		set_msg(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->sock = h->efd = h->wake_fd = h->epfd = -1;
	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->admin_lock, NULL);
	r = llm_http_open(url, api_key, &h->http, &h->info, msg, sizeof msg);
	if (r < 0) {
		set_msg(err, errlen, "%s", msg);
		llm_free(h);
		return r;
	}
	*ret = h;
	return 0;
}

void llm_close(struct llm *h)
{
	llm_free(h);
}

const char *llm_errmsg(struct llm *h)
{
	if (!h)
		return "no handle";
	return h->errmsg[0] ? h->errmsg : "no error";
}

void llm_get_info(struct llm *h, struct llm_info *ret)
{
	pthread_mutex_lock(&h->lock);
	*ret = h->info;
	pthread_mutex_unlock(&h->lock);
}

/* ---- requests ---- */

void llm_request_init(struct llm_request *r)
{
	memset(r, 0, sizeof *r);
	r->max_tokens = 256;
	r->temperature = 0.8f;
	r->top_k = 40;
	r->top_p = 0.95f;
	r->min_p = 0.05f;
	r->repeat_penalty = 1.0f;
	r->repeat_last_n = 64;
}

/* Checks R against the protocol and the daemon's limits; 0 or -EINVAL with
 * the reason in errmsg.  *RET_BYTES gets the prompt's size. */
static int check_request(struct llm *h, const struct llm_request *r, uint64_t *ret_bytes)
{
	uint64_t bytes = 0;

	if ((r->prompt != NULL) == (r->messages != NULL)) {
		set_err(h, "a request needs exactly one of prompt and messages");
		return -EINVAL;
	}
	if (r->prompt) {
		size_t bad;
		bytes = strlen(r->prompt);
		if ((bad = utf8_check(r->prompt, bytes)) < bytes) {
			set_err(h, "the prompt is not valid UTF-8 at byte %zu (0x%02x)", bad,
				(unsigned char)r->prompt[bad]);
			return -EINVAL;
		}
	} else {
		if (r->n_messages < 1 || r->n_messages > PROTO_MAX_MESSAGES) {
			set_err(h, "a chat needs 1 to %d messages, not %d", PROTO_MAX_MESSAGES,
				r->n_messages);
			return -EINVAL;
		}
		for (int i = 0; i < r->n_messages; i++) {
			const struct llm_message *m = &r->messages[i];
			size_t n, bad;

			if (m->role < LLM_ROLE_SYSTEM || m->role > LLM_ROLE_ASSISTANT || !m->content) {
				set_err(h, "message %d: %s", i,
					m->content ? "unknown role" : "no content");
				return -EINVAL;
			}
			n = strlen(m->content);
			if ((bad = utf8_check(m->content, n)) < n) {
				set_err(h, "message %d is not valid UTF-8 at byte %zu (0x%02x)", i, bad,
					(unsigned char)m->content[bad]);
				return -EINVAL;
			}
			bytes += n;
		}
	}
	if (h->info.max_prompt_bytes && bytes > h->info.max_prompt_bytes) {
		set_err(h, "the prompt has %llu bytes; the daemon takes at most %u "
			"(its limits.prompt_bytes)", (unsigned long long)bytes, h->info.max_prompt_bytes);
		return -EINVAL;
	}
	if (r->max_tokens < 1) {
		set_err(h, "max_tokens must be at least 1, not %d", r->max_tokens);
		return -EINVAL;
	}
	if (r->n_stops < 0 || r->n_stops > PROTO_MAX_STOPS || (r->n_stops && !r->stops)) {
		set_err(h, "at most %d stop strings, not %d", PROTO_MAX_STOPS, r->n_stops);
		return -EINVAL;
	}
	for (int i = 0; i < r->n_stops; i++) {
		size_t n = r->stops[i] ? strlen(r->stops[i]) : 0;

		if (n < 1 || n > PROTO_MAX_STOP_LEN) {
			set_err(h, "stop string %d must have 1 to %d bytes", i, PROTO_MAX_STOP_LEN);
			return -EINVAL;
		}
	}
	/* Written so that NaN fails every test. */
	if (!(r->temperature >= 0 && isfinite(r->temperature))) {
		set_err(h, "temperature must be a number >= 0");
		return -EINVAL;
	}
	if (!(r->top_p > 0 && r->top_p <= 1)) {
		set_err(h, "top_p must be in (0, 1]");
		return -EINVAL;
	}
	if (!(r->min_p >= 0 && r->min_p <= 1)) {
		set_err(h, "min_p must be in [0, 1]");
		return -EINVAL;
	}
	if (!(r->repeat_penalty > 0 && isfinite(r->repeat_penalty))) {
		set_err(h, "repeat_penalty must be a number > 0");
		return -EINVAL;
	}
	if (r->repeat_last_n < 0) {
		set_err(h, "repeat_last_n must be >= 0");
		return -EINVAL;
	}
	if (!isfinite(r->presence_penalty) || !isfinite(r->frequency_penalty)) {
		set_err(h, "presence and frequency penalties must be finite numbers");
		return -EINVAL;
	}
	if (r->flags & ~(unsigned)(LLM_LOGPROBS | LLM_IGNORE_EOS | LLM_SPEC_NGRAM | LLM_SPEC_OFF |
				   LLM_SPEC_DRAFT)) {
		set_err(h, "unknown request flags 0x%x", r->flags);
		return -EINVAL;
	}
	if (__builtin_popcount(r->flags & (LLM_SPEC_NGRAM | LLM_SPEC_OFF | LLM_SPEC_DRAFT)) > 1) {
		set_err(h, "at most one of LLM_SPEC_NGRAM, LLM_SPEC_OFF and LLM_SPEC_DRAFT");
		return -EINVAL;
	}
	*ret_bytes = bytes;
	return 0;
}

/* G's kind and text, for either protocol: 0 or -EINVAL. */
static int check_grammar(struct llm *h, const struct llm_grammar *g)
{
	if (!g)
		return 0;
	if (g->kind < LLM_GRAMMAR_GBNF || g->kind > LLM_GRAMMAR_JSON || (g->flags & ~LLM_GRAMMAR_STRICT)) {
		set_err(h, "unknown grammar kind %d or flags 0x%x", (int)g->kind, g->flags);
		return -EINVAL;
	}
	if ((g->kind == LLM_GRAMMAR_JSON) != !g->text || (g->text && !g->text[0])) {
		set_err(h, "%s", g->kind == LLM_GRAMMAR_JSON ? "LLM_GRAMMAR_JSON takes no text" :
							 "the grammar's text is empty");
		return -EINVAL;
	}
	if (g->text && strlen(g->text) > PROTO_MAX_GRAMMAR) {
		set_err(h, "the grammar is %zu bytes, over the limit of %u", strlen(g->text),
			PROTO_MAX_GRAMMAR);
		return -EINVAL;
	}
	return 0;
}

/* llm_submit over HTTP: checked as for the daemon, then one transfer. */
static int submit_http(struct llm *h, const struct llm_request *r, const struct llm_grammar *g,
		       uint64_t *ret_id)
{
	char msg[PROTO_MAX_ERRMSG + 1];
	uint64_t bytes;
	int rc;

	pthread_mutex_lock(&h->lock);
	if ((rc = check_request(h, r, &bytes)) == 0 && (rc = check_grammar(h, g)) == 0) {
		if ((rc = llm_http_submit(h->http, r, g, h->model, h->keep_alive_set ? &h->keep_alive_s : NULL,
					  h->max_draft, h->last_id + 1, msg, sizeof msg)) < 0)
			set_err(h, "%s", msg);
		else
			*ret_id = ++h->last_id;
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int llm_submit(struct llm *h, const struct llm_request *r, uint64_t *ret_id)
{
	return llm_submit_grammar(h, r, NULL, ret_id);
}

int llm_set_keep_alive(struct llm *h, int32_t seconds)
{
	if (!h)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (seconds < -1 && seconds != LLM_KEEP_ALIVE_UNSET) {
		set_err(h, "keep_alive is seconds, -1 (for ever) or 0 (unload when idle), not %d",
			(int)seconds);
		pthread_mutex_unlock(&h->lock);
		return -EINVAL;
	}
	h->keep_alive_set = seconds != LLM_KEEP_ALIVE_UNSET;
	h->keep_alive_s = h->keep_alive_set ? seconds : 0;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int llm_set_max_draft(struct llm *h, int32_t k)
{
	if (!h)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (k < 0 || k > LLM_MAX_DRAFT) {
		set_err(h, "max_draft is 1..%d tokens, or 0 for the daemon's, not %d", LLM_MAX_DRAFT,
			(int)k);
		pthread_mutex_unlock(&h->lock);
		return -EINVAL;
	}
	h->max_draft = (uint32_t)k;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int llm_set_model(struct llm *h, const char *name)
{
	size_t len = name ? strnlen(name, PROTO_MAX_NAME + 1) : 0;

	if (!h)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (len > PROTO_MAX_NAME) {
		set_err(h, "a model's name has at most %d bytes, not %zu", PROTO_MAX_NAME,
			strlen(name));
		pthread_mutex_unlock(&h->lock);
		return -EINVAL;
	}
	if (len)
		memcpy(h->model, name, len);
	h->model[len] = 0;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int llm_submit_grammar(struct llm *h, const struct llm_request *r, const struct llm_grammar *g,
		       uint64_t *ret_id)
{
	struct proto_str stops[PROTO_MAX_STOPS];
	struct proto_message *msgs = NULL;
	struct proto_submit s;
	uint64_t prompt_bytes, size;
	uint8_t *buf = NULL;
	ssize_t n;
	int rc;

	if (!h || !r)
		return -EINVAL;
	if (h->http)
		return submit_http(h, r, g, ret_id);
	pthread_mutex_lock(&h->lock);
	rc = check_request(h, r, &prompt_bytes);
	if (rc == 0)
		rc = check_grammar(h, g);
	if (rc < 0)
		goto out;
	if (h->fatal || h->sock_done || h->conn_code) {
		/* After an ERROR with id 0 the daemon only closes. */
		set_err(h, "%s", h->fatal ? h->fatal_msg :
				 h->conn_code ? h->conn_msg : "the daemon closed the connection");
		rc = -EPIPE;
		goto out;
	}
	if (h->info.max_inflight && h->n_live >= h->info.max_inflight) {
		set_err(h, "%zu requests are live; the daemon allows %u on a connection",
			h->n_live, h->info.max_inflight);
		rc = -ENOBUFS;
		goto out;
	}
	rc = live_reserve(h);
	if (rc < 0) {
		set_err(h, "out of memory");
		goto out;
	}

	memset(&s, 0, sizeof s);
	s.id = h->last_id + 1;
	s.flags = (r->messages ? PROTO_SUBMIT_CHAT : 0) |
		  (r->flags & LLM_LOGPROBS ? PROTO_SUBMIT_LOGPROBS : 0) |
		  (r->flags & LLM_IGNORE_EOS ? PROTO_SUBMIT_IGNORE_EOS : 0) |
		  (r->flags & LLM_SPEC_NGRAM ? PROTO_SUBMIT_SPEC_NGRAM : 0) |
		  (r->flags & LLM_SPEC_OFF ? PROTO_SUBMIT_SPEC_OFF : 0) |
		  (r->flags & LLM_SPEC_DRAFT ? PROTO_SUBMIT_SPEC_DRAFT : 0) |
		  (r->has_seed ? PROTO_SUBMIT_SEED : 0);
	s.priority = r->priority;
	s.max_tokens = r->max_tokens;
	s.top_k = r->top_k;
	s.temperature = r->temperature;
	s.top_p = r->top_p;
	s.min_p = r->min_p;
	s.repeat_penalty = r->repeat_penalty;
	s.repeat_last_n = r->repeat_last_n;
	s.presence_penalty = r->presence_penalty;
	s.frequency_penalty = r->frequency_penalty;
	s.seed = r->has_seed ? r->seed : 0;
	size = PROTO_HDR_SIZE + 72 + prompt_bytes;
	if (r->messages) {
		msgs = malloc((size_t)r->n_messages * sizeof *msgs);
		if (!msgs) {
			set_err(h, "out of memory");
			rc = -ENOMEM;
			goto out;
		}
		for (int i = 0; i < r->n_messages; i++) {
			msgs[i].role = (uint32_t)r->messages[i].role;
			msgs[i].content.p = r->messages[i].content;
			msgs[i].content.len = (uint32_t)strlen(r->messages[i].content);
		}
		s.n_messages = (uint32_t)r->n_messages;
		s.messages = msgs;
		size += 8 * (uint64_t)r->n_messages;
	} else {
		s.prompt.p = r->prompt;
		s.prompt.len = (uint32_t)prompt_bytes;
		size += 4;
	}
	for (int i = 0; i < r->n_stops; i++) {
		stops[i].p = r->stops[i];
		stops[i].len = (uint32_t)strlen(r->stops[i]);
		size += 4 + stops[i].len;
	}
	s.n_stops = (uint32_t)r->n_stops;
	s.stops = stops;
	if (g) {
		s.flags |= PROTO_SUBMIT_GRAMMAR;
		s.grammar_kind = g->kind == LLM_GRAMMAR_GBNF ? PROTO_GRAMMAR_GBNF :
				 g->kind == LLM_GRAMMAR_JSON_SCHEMA ? PROTO_GRAMMAR_JSON_SCHEMA :
								      PROTO_GRAMMAR_JSON_OBJECT;
		s.grammar_flags = g->flags & LLM_GRAMMAR_STRICT ? PROTO_GRAMMAR_STRICT : 0;
		s.grammar = (struct proto_str){ g->text, g->text ? (uint32_t)strlen(g->text) : 0 };
		size += 12 + s.grammar.len;
	}
	if (h->model[0]) {
		s.flags |= PROTO_SUBMIT_MODEL;
		s.model = (struct proto_str){ h->model, (uint32_t)strlen(h->model) };
		size += 4 + s.model.len;
	}
	if (h->keep_alive_set) {
		s.flags |= PROTO_SUBMIT_KEEP_ALIVE;
		s.keep_alive_s = h->keep_alive_s;
		size += 4;
	}
	if (h->max_draft) {
		s.flags |= PROTO_SUBMIT_MAX_DRAFT;
		s.max_draft = h->max_draft;
		size += 4;
	}
	if (size > PROTO_MAX_FRAME) {
		set_err(h, "the request takes %llu bytes; a frame holds at most %u",
			(unsigned long long)size, PROTO_MAX_FRAME);
		rc = -EINVAL;
		goto out;
	}
	buf = malloc((size_t)size);
	if (!buf) {
		set_err(h, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	n = proto_encode_submit(buf, (size_t)size, &s);
	if (n < 0) {
		set_err(h, "cannot encode the request: %s", strerror((int)-n));
		rc = -EINVAL;
		goto out;
	}
	rc = send_frame(h, buf, (size_t)n);
	if (rc < 0)
		goto out;
	h->last_id = s.id;
	h->live[h->n_live++] = s.id;
	if (ret_id)
		*ret_id = s.id;
out:
	pthread_mutex_unlock(&h->lock);
	free(buf);
	free(msgs);
	return rc;
}

int llm_cancel(struct llm *h, uint64_t id)
{
	uint8_t buf[PROTO_HDR_SIZE + 8];
	ssize_t n;
	int rc;

	if (!h)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (h->http) {
		rc = llm_http_cancel(h->http, id);
		if (rc < 0)
			set_err(h, "request %llu is not live", (unsigned long long)id);
		pthread_mutex_unlock(&h->lock);
		return rc;
	}
	if (live_find(h, id) < 0) {
		set_err(h, "request %llu is not live", (unsigned long long)id);
		rc = -ENOENT;
	} else if (h->sock_done) {
		/* Its DONE is already on its way from the lost connection. */
		rc = 0;
	} else {
		n = proto_encode_cancel(buf, sizeof buf, id);
		rc = n < 0 ? (int)n : send_frame(h, buf, (size_t)n);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* ---- events ---- */

int llm_next_event(struct llm *h, struct llm_event *ev, int timeout_ms)
{
	int64_t deadline = timeout_ms > 0 ? clock_ms() + timeout_ms : 0;
	int rc;

	if (!h || !ev)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (h->http) {
		char msg[PROTO_MAX_ERRMSG + 1];
		if (h->http_reading) {
			set_err(h, "another thread is reading this handle's events (over HTTP one at a time)");
			rc = -EBUSY;
		} else {
			h->http_reading = true;
			rc = llm_http_next_event(h->http, ev, timeout_ms, &h->lock, msg, sizeof msg);
			h->http_reading = false;
			if (rc < 0)
				set_err(h, "%s", msg);
		}
		pthread_mutex_unlock(&h->lock);
		return rc;
	}
	for (;;) {
		struct pollfd p[3];
		int np = 0, wait, pr;

		rc = deliver(h, ev);
		if (rc)
			break;
		if (read_socket(h))
			continue;
		/* Cleared before sleeping: a push after this signals them again. */
		if (drain_daemon_wake(h) | drain_eventfd(h->wake_fd))
			continue;
		if (timeout_ms < 0) {
			wait = -1;
		} else {
			int64_t left = timeout_ms > 0 ? deadline - clock_ms() : 0;

			if (left <= 0)
				break;  /* rc == 0: timeout */
			wait = (int)left;
		}
		if (!h->efd_done)
			p[np++] = (struct pollfd){ .fd = h->efd, .events = POLLIN };
		p[np++] = (struct pollfd){ .fd = h->wake_fd, .events = POLLIN };
		if (!h->sock_done)
			p[np++] = (struct pollfd){ .fd = h->sock, .events = POLLIN };
		pthread_mutex_unlock(&h->lock);
		pr = poll(p, (nfds_t)np, wait);
		rc = pr < 0 ? -errno : 0;
		pthread_mutex_lock(&h->lock);
		if (rc < 0) {
			if (rc == -EINTR)
				set_err(h, "interrupted");
			else
				set_err(h, "poll: %s", strerror(-rc));
			break;
		}
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int llm_fd(struct llm *h)
{
	return !h ? -EINVAL : h->http ? llm_http_fd(h->http) : h->epfd;
}

/* ---- admin ---- */

static int admin_errno(uint32_t code)
{
	switch (code) {
	case PROTO_E_PERM: return -EPERM;
	case PROTO_E_NOTFOUND: return -ENOENT;
	case PROTO_E_INVAL: return -EINVAL;
	default: return -EIO;
	}
}

int llm_admin(struct llm *h, const char *cmd, const char *arg, char **ret_body)
{
	uint8_t buf[PROTO_HDR_SIZE + 12 + PROTO_MAX_ADMIN_CMD + PROTO_MAX_ADMIN_ARG];
	struct proto_admin a;
	ssize_t n;
	int rc;

	if (!h || !cmd || !ret_body)
		return -EINVAL;
	if (h->http) {
		pthread_mutex_lock(&h->lock);
		set_err(h, "admin commands go to llmd's socket, not to an HTTP API");
		pthread_mutex_unlock(&h->lock);
		return -EOPNOTSUPP;
	}
	if (!arg)
		arg = "";
	pthread_mutex_lock(&h->admin_lock);
	pthread_mutex_lock(&h->lock);
	a.command.p = cmd;
	a.command.len = (uint32_t)strnlen(cmd, PROTO_MAX_ADMIN_CMD + 1);
	a.arg.p = arg;
	a.arg.len = (uint32_t)strnlen(arg, PROTO_MAX_ADMIN_ARG + 1);
	n = proto_encode_admin(buf, sizeof buf, &a);
	if (n < 0) {
		set_err(h, "an admin command has 1 to %d bytes and its argument at most %d",
			PROTO_MAX_ADMIN_CMD, PROTO_MAX_ADMIN_ARG);
		rc = -EINVAL;
		goto out;
	}
	if (h->sock_done) {
		set_err(h, "%s", h->fatal ? h->fatal_msg : "the daemon closed the connection");
		rc = -EPIPE;
		goto out;
	}
	rc = send_frame(h, buf, (size_t)n);
	if (rc < 0)
		goto out;
	h->admin_want = ++h->admin_sent;
	h->admin_have = false;
	while (!h->admin_have) {
		struct pollfd p = { .fd = h->sock, .events = POLLIN };

		if (h->sock_done) {
			set_err(h, "%s", h->fatal ? h->fatal_msg : "the daemon closed the connection");
			rc = -EPIPE;
			goto out;
		}
		if (read_socket(h)) {
			poke_wake(h);   /* whatever else came is for llm_next_event */
			continue;
		}
		pthread_mutex_unlock(&h->lock);
		rc = poll(&p, 1, ADMIN_POLL_MS) < 0 ? -errno : 0;
		pthread_mutex_lock(&h->lock);
		if (rc < 0) {
			set_err(h, "%s", rc == -EINTR ? "interrupted" : strerror(-rc));
			goto out;
		}
	}
	if (h->admin_code == PROTO_E_OK) {
		*ret_body = h->admin_body;
		rc = 0;
	} else {
		set_err(h, "%s", h->admin_body);
		free(h->admin_body);
		rc = admin_errno(h->admin_code);
	}
	h->admin_body = NULL;
	h->admin_have = false;
out:
	h->admin_want = 0;
	pthread_mutex_unlock(&h->lock);
	pthread_mutex_unlock(&h->admin_lock);
	return rc;
}
