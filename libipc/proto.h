/* proto.h - the llmd wire protocol: every frame on the Unix socket and every
 * record in the shared-memory ring, in one place.
 *
 * All integers are little-endian with the width their name says; floats are
 * IEEE-754 binary32 bit patterns in a u32.  Strings are a u32 byte length
 * followed by that many bytes, not NUL-terminated, not necessarily valid
 * UTF-8 (the daemon checks prompts itself).  Reserved fields must be zero on
 * send and are checked on receipt: a frame with a nonzero reserved field is
 * malformed.  Nothing here does I/O; encoders write whole frames into a
 * caller's buffer, decoders validate a whole payload and point into it.
 *
 * Frame on the socket: an 8-byte header then LEN payload bytes.
 *   u32 len        payload bytes, <= PROTO_MAX_PAYLOAD
 *   u16 type       enum proto_type
 *   u16 reserved   0
 *
 * Version history (PROTO_VERSION):
 *   1  2026-11  first version: HELLO/WELCOME with the ring memfd and eventfd,
 *               SUBMIT/CANCEL/RING_WAKE, ADMIN/ADMIN_REPLY, ERROR; TOKEN and
 *               FINAL ring records.
 *               Since 2026-11-27 WELCOME's second fd is the waiting end of a
 *               socket pair (usock_wake_pair) instead of an eventfd the
 *               daemon shared with the client: each signal is 8 bytes, so a
 *               client that reads it as an eventfd's counter still works,
 *               and the version stays 1.
 *               Since 2026-11-28 SUBMIT may carry a grammar
 *               (PROTO_SUBMIT_GRAMMAR): a flag older daemons refuse as a
 *               malformed frame, and a frame without it is unchanged.
 *               Since 2026-11-29 SUBMIT may name the model that serves it
 *               (PROTO_SUBMIT_MODEL, for a daemon of several models): older
 *               daemons refuse the flag as a malformed frame, and a frame
 *               without it is unchanged.  Its refusal, PROTO_E_NOMODEL, is
 *               a code older clients' decoders do not know: they take an
 *               ERROR or FINAL that carries it for a malformed one.
 *               Since 2026-11-29 SUBMIT may set its model's keep-alive
 *               (PROTO_SUBMIT_KEEP_ALIVE, an i32 after the model), which
 *               older daemons refuse as a malformed frame.
 *               Since 2026-11-29 SUBMIT may choose speculative decoding
 *               (PROTO_SUBMIT_SPEC_NGRAM, _OFF or _DRAFT): flags
 *               without payload, which older daemons refuse as a malformed
 *               frame.  Since 2026-11-29 it may bound the proposals
 *               (PROTO_SUBMIT_MAX_DRAFT, a u32 after the keep-alive), which
 *               older daemons refuse likewise.
 */
#ifndef LLMD_PROTO_H
#define LLMD_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PROTO_VERSION 1
#define PROTO_HDR_SIZE 8
#define PROTO_MAX_PAYLOAD (1u << 20)   /* 1 MiB: the longest frame anyone may send */
#define PROTO_MAX_FRAME (PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD)

/* Hard protocol maxima (the daemon's configured limits are usually lower). */
#define PROTO_MAX_STOPS 16
#define PROTO_MAX_STOP_LEN 256         /* bytes per stop string */
#define PROTO_MAX_MESSAGES 256         /* chat messages per SUBMIT */
#define PROTO_MAX_NAME 256             /* model, backend and template names */
#define PROTO_MAX_DRAFT 16             /* a SUBMIT's max_draft at most */
#define PROTO_MAX_ERRMSG 512           /* ERROR and FINAL messages */
#define PROTO_MAX_ADMIN_CMD 32
#define PROTO_MAX_ADMIN_ARG 256

enum proto_type {
	/* client -> daemon */
	PROTO_HELLO = 1,        /* first frame of a connection */
	PROTO_SUBMIT = 2,       /* a new request */
	PROTO_CANCEL = 3,       /* cancel a request */
	PROTO_RING_WAKE = 4,    /* no payload: "I consumed records; you were waiting for space" */
	PROTO_ADMIN = 5,        /* an admin command (llmctl) */
	/* daemon -> client */
	PROTO_WELCOME = 0x81,   /* answer to HELLO; carries two fds (SCM_RIGHTS): ring memfd,
	                           wake channel (usock.h) */
	PROTO_ERROR = 0x82,     /* a refused request (id != 0) or a connection-level error (id 0) */
	PROTO_ADMIN_REPLY = 0x83,
};

/* Error codes of ERROR frames and FINAL records. */
enum proto_err {
	PROTO_E_OK = 0,
	PROTO_E_BADFRAME = 1,   /* malformed frame; the daemon closes the connection */
	PROTO_E_VERSION = 2,    /* unsupported protocol version */
	PROTO_E_STATE = 3,      /* frame not allowed now (SUBMIT before HELLO, second HELLO) */
	PROTO_E_INVAL = 4,      /* bad parameter (sampling values, empty prompt, bad UTF-8...) */
	PROTO_E_LIMIT = 5,      /* over a per-client limit (requests in flight, max_tokens...) */
	PROTO_E_TOOBIG = 6,     /* prompt over the byte/token limit or the context */
	PROTO_E_BUSY = 7,       /* the daemon's queue is full; retry later */
	PROTO_E_DRAINING = 8,   /* the daemon is draining or stopping */
	PROTO_E_DUPLICATE = 9,  /* request id already live on this connection */
	PROTO_E_NOTFOUND = 10,  /* CANCEL of an unknown id; unknown admin command */
	PROTO_E_PERM = 11,      /* admin command from a non-admin */
	PROTO_E_NOTEMPLATE = 12,/* chat asked for, the model has no known chat template */
	PROTO_E_INTERNAL = 13,  /* the engine failed (see the message) */
	PROTO_E_RING = 14,      /* the client corrupted its ring; the connection is closed */
	PROTO_E_NOMODEL = 15,   /* no model by the name the request gives, or it cannot be loaded */
	PROTO_E__MAX = 16,
};

/* Short lowercase name of an error code ("limit"); "unknown" past the end. */
const char *proto_err_name(uint32_t code);
/* Name of a frame type ("SUBMIT"), or "?" . */
const char *proto_type_name(uint32_t type);

struct proto_str {
	const char *p;          /* into the decoded frame, or the caller's bytes to encode */
	uint32_t len;           /* bytes */
};

/* ---- frames ---- */

struct proto_frame {
	uint16_t type;          /* enum proto_type */
	uint32_t len;           /* payload bytes */
	const uint8_t *payload; /* (len) into the caller's buffer */
};

/* Looks for one whole frame at the start of BUF (AVAIL bytes).  Returns its
 * total size (header + payload) and fills RET; 0 when more bytes are needed;
 * -EBADMSG for a bad header (reserved bits, unknown type) or -EMSGSIZE for a
 * length over PROTO_MAX_PAYLOAD.  Any thread. */
ssize_t proto_frame_parse(const uint8_t *buf, size_t avail, struct proto_frame *ret);

/* HELLO payload (16 bytes). */
struct proto_hello {
	uint32_t version;       /* PROTO_VERSION */
	uint32_t flags;         /* 0 */
	uint32_t ring_bytes;    /* ring capacity wanted; 0 = the daemon's default */
	uint32_t reserved;      /* 0 */
};

/* WELCOME payload: fixed 48 bytes, then the strings model, backend, template. */
struct proto_welcome {
	uint32_t version;          /* PROTO_VERSION */
	uint32_t flags;            /* 0 */
	uint32_t ring_bytes;       /* data capacity of the ring passed along */
	uint32_t daemon_pid;
	uint32_t max_inflight;     /* requests live at once on this connection */
	uint32_t max_prompt_bytes;
	uint32_t max_prompt_tokens;
	uint32_t max_tokens;       /* per request */
	uint32_t n_ctx;            /* tokens per sequence */
	uint32_t n_vocab;
	uint32_t client_id;        /* the daemon's id for this connection (llmctl ps) */
	uint32_t reserved;         /* 0 */
	struct proto_str model;    /* model name (GGUF general.name or file name) */
	struct proto_str backend;  /* "cpu", "cuda", ... */
	struct proto_str chat_template; /* "chatml", ...; empty: chat unavailable */
};

enum proto_submit_flags {
	PROTO_SUBMIT_CHAT = 1u << 0,       /* MESSAGES, rendered with the model's template */
	PROTO_SUBMIT_LOGPROBS = 1u << 1,   /* fill each TOKEN record's logprob */
	PROTO_SUBMIT_IGNORE_EOS = 1u << 2, /* generate past end-of-generation tokens */
	PROTO_SUBMIT_SEED = 1u << 3,       /* SEED is given; else the daemon picks one */
	PROTO_SUBMIT_GRAMMAR = 1u << 4,    /* the output is constrained: GRAMMAR_KIND,
	                                      GRAMMAR_FLAGS and GRAMMAR follow the stops */
	PROTO_SUBMIT_MODEL = 1u << 5,      /* MODEL names the model that serves the request;
	                                      without it, the daemon's default model */
	PROTO_SUBMIT_SPEC_NGRAM = 1u << 6, /* speculative decoding by prompt lookup; */
	PROTO_SUBMIT_SPEC_OFF = 1u << 7,   /* ... none; */
	PROTO_SUBMIT_SPEC_DRAFT = 1u << 8, /* ... by the daemon's draft model; none of the
	                                      three: its spec.mode (at most one) */
	PROTO_SUBMIT_KEEP_ALIVE = 1u << 9, /* KEEP_ALIVE_S follows the model: how long the
	                                      model stays loaded once idle */
	PROTO_SUBMIT_MAX_DRAFT = 1u << 10, /* MAX_DRAFT follows the keep-alive: tokens the
	                                      request proposes a step at most */
	PROTO_SUBMIT__ALL = 0x7ff,
};

/* What constrains a PROTO_SUBMIT_GRAMMAR request's output. */
enum proto_grammar_kind {
	PROTO_GRAMMAR_GBNF = 1,        /* GRAMMAR is GBNF text (llama.cpp's syntax),
	                                  start rule "root" */
	PROTO_GRAMMAR_JSON_SCHEMA = 2, /* GRAMMAR is a JSON Schema document */
	PROTO_GRAMMAR_JSON_OBJECT = 3, /* any JSON object; GRAMMAR is empty */
};
#define PROTO_GRAMMAR_STRICT 1u          /* JSON_SCHEMA: OpenAI's strict mode (no
                                            properties beyond the schema's) */
#define PROTO_MAX_GRAMMAR (512u << 10)   /* bytes of GRAMMAR */

enum proto_role {
	PROTO_ROLE_SYSTEM = 1,
	PROTO_ROLE_USER = 2,
	PROTO_ROLE_ASSISTANT = 3,
};

struct proto_message {
	uint32_t role;             /* enum proto_role */
	struct proto_str content;
};

/* SUBMIT payload: fixed 72 bytes
 *   u64 id, u32 flags, i32 priority, i32 max_tokens, i32 top_k,
 *   f32 temperature, f32 top_p, f32 min_p, f32 repeat_penalty,
 *   i32 repeat_last_n, f32 presence_penalty, f32 frequency_penalty,
 *   u32 n_stops, u64 seed, u32 n_messages, u32 top_logprobs
 * then, with PROTO_SUBMIT_CHAT, N_MESSAGES x (u32 role, str content), else
 * one str prompt (and n_messages 0); then N_STOPS x str; then, with
 * PROTO_SUBMIT_GRAMMAR only, u32 grammar_kind, u32 grammar_flags, str
 * grammar; then, with PROTO_SUBMIT_MODEL only, str model; then, with
 * PROTO_SUBMIT_KEEP_ALIVE only, i32 keep_alive_s; then, with
 * PROTO_SUBMIT_MAX_DRAFT only, u32 max_draft. */
struct proto_submit {
	uint64_t id;               /* the client's id for this request, != 0, unique while live */
	uint32_t flags;            /* enum proto_submit_flags */
	int32_t priority;          /* higher first; the daemon may clamp it */
	int32_t max_tokens;        /* >= 1 */
	int32_t top_k;             /* <= 0: off */
	float temperature;         /* >= 0; 0 = greedy */
	float top_p;               /* (0, 1] */
	float min_p;               /* [0, 1] */
	float repeat_penalty;      /* > 0; 1 = off */
	int32_t repeat_last_n;     /* >= 0 */
	float presence_penalty;
	float frequency_penalty;
	uint64_t seed;
	struct proto_str prompt;   /* without PROTO_SUBMIT_CHAT */
	uint32_t n_messages;       /* <= PROTO_MAX_MESSAGES */
	const struct proto_message *messages; /* (n_messages) with PROTO_SUBMIT_CHAT */
	uint32_t n_stops;          /* <= PROTO_MAX_STOPS */
	const struct proto_str *stops; /* (n_stops) each 1..PROTO_MAX_STOP_LEN bytes */
	uint32_t top_logprobs;     /* with PROTO_SUBMIT_LOGPROBS: this many most likely tokens
	                              with each TOKEN (<= PROTO_MAX_TOP_LOGPROBS) */
	uint32_t grammar_kind;     /* with PROTO_SUBMIT_GRAMMAR: enum proto_grammar_kind */
	uint32_t grammar_flags;    /* PROTO_GRAMMAR_STRICT or 0 */
	struct proto_str grammar;  /* <= PROTO_MAX_GRAMMAR bytes; empty for JSON_OBJECT,
	                              not empty for the others */
	struct proto_str model;    /* with PROTO_SUBMIT_MODEL: the model's name,
	                              1..PROTO_MAX_NAME bytes, no NUL */
	int32_t keep_alive_s;      /* with PROTO_SUBMIT_KEEP_ALIVE: seconds the model stays
	                              loaded once idle, -1 for ever, 0 unloaded as soon as
	                              idle (Ollama's keep_alive); 0 without the flag */
	uint32_t max_draft;        /* with PROTO_SUBMIT_MAX_DRAFT: tokens its speculative
	                              decoding proposes a step at most, 1..PROTO_MAX_DRAFT;
	                              0 without the flag (the daemon's spec.max_draft) */
};

/* Storage for a decoded SUBMIT's arrays (the strings still point into the frame). */
struct proto_submit_buf {
	struct proto_message messages[PROTO_MAX_MESSAGES];
	struct proto_str stops[PROTO_MAX_STOPS];
};

/* CANCEL payload: u64 id (!= 0).  RING_WAKE payload: none. */

/* ERROR payload: u64 id, u32 code, u32 reserved, str message. */
struct proto_error {
	uint64_t id;               /* the refused request; 0 = the connection */
	uint32_t code;             /* enum proto_err */
	struct proto_str message;  /* <= PROTO_MAX_ERRMSG bytes */
};

/* ADMIN payload: u32 reserved, str command, str argument. */
struct proto_admin {
	struct proto_str command;  /* "status", "ps", ...: 1..PROTO_MAX_ADMIN_CMD bytes */
	struct proto_str arg;      /* <= PROTO_MAX_ADMIN_ARG bytes, may be empty */
};

/* ADMIN_REPLY payload: u32 code (enum proto_err), u32 reserved, str body
 * (a JSON document when code is 0, else a message). */
struct proto_admin_reply {
	uint32_t code;
	struct proto_str body;
};

/* Encoders write one whole frame (header and payload) into BUF (CAP bytes)
 * and return its size, or -EMSGSIZE when it does not fit CAP or
 * PROTO_MAX_PAYLOAD, or -EINVAL when the message breaks a protocol rule
 * (a field out of its range, a string over its maximum).  Any thread. */
ssize_t proto_encode_hello(uint8_t *buf, size_t cap, const struct proto_hello *m);
ssize_t proto_encode_welcome(uint8_t *buf, size_t cap, const struct proto_welcome *m);
ssize_t proto_encode_submit(uint8_t *buf, size_t cap, const struct proto_submit *m);
ssize_t proto_encode_cancel(uint8_t *buf, size_t cap, uint64_t id);
ssize_t proto_encode_ring_wake(uint8_t *buf, size_t cap);
ssize_t proto_encode_error(uint8_t *buf, size_t cap, const struct proto_error *m);
ssize_t proto_encode_admin(uint8_t *buf, size_t cap, const struct proto_admin *m);
ssize_t proto_encode_admin_reply(uint8_t *buf, size_t cap, const struct proto_admin_reply *m);

/* Decoders take a frame from proto_frame_parse of the matching type and
 * validate all of it: exact length (no trailing bytes), reserved fields zero,
 * counts and string lengths within their maxima, flags known, floats finite
 * and in range, SUBMIT id != 0 and max_tokens >= 1.  They return 0 and fill
 * RET (strings point into the frame), or -EBADMSG and leave RET in an
 * unspecified state.  Any thread. */
int proto_decode_hello(const struct proto_frame *f, struct proto_hello *ret);
int proto_decode_welcome(const struct proto_frame *f, struct proto_welcome *ret);
int proto_decode_submit(const struct proto_frame *f, struct proto_submit_buf *buf,
			struct proto_submit *ret);
int proto_decode_cancel(const struct proto_frame *f, uint64_t *ret_id);
int proto_decode_ring_wake(const struct proto_frame *f);
int proto_decode_error(const struct proto_frame *f, struct proto_error *ret);
int proto_decode_admin(const struct proto_frame *f, struct proto_admin *ret);
int proto_decode_admin_reply(const struct proto_frame *f, struct proto_admin_reply *ret);

/* ---- ring records (see ring.h for the ring itself) ---- */

enum proto_rec_type {
	PROTO_REC_TOKEN = 1,
	PROTO_REC_FINAL = 2,
};

/* TOKEN record payload: u64 id, i32 token, f32 logprob, u32 text_len,
 * u32 n_top, then TEXT_LEN bytes (complete UTF-8 sequences only), then
 * N_TOP x (i32 token, f32 logprob): the most likely tokens, best first, when
 * the request asked for top_logprobs. */
#define PROTO_MAX_TOP_LOGPROBS 20
struct proto_token {
	uint64_t id;               /* the request */
	int32_t token;             /* token id; -1 for text released at the end (held-back bytes) */
	float logprob;             /* 0 unless the request asked for logprobs */
	struct proto_str text;     /* <= PROTO_MAX_TOKEN_TEXT bytes */
	uint32_t n_top;            /* <= PROTO_MAX_TOP_LOGPROBS */
	int32_t top_ids[PROTO_MAX_TOP_LOGPROBS];
	float top_logprobs[PROTO_MAX_TOP_LOGPROBS]; /* <= 0, or -inf */
};
#define PROTO_MAX_TOKEN_TEXT 2048
#define PROTO_TOKEN_FIXED 24

enum proto_finish {
	PROTO_FIN_STOP = 1,        /* end-of-generation token or a stop string */
	PROTO_FIN_LENGTH = 2,      /* max_tokens or the context */
	PROTO_FIN_CANCELLED = 3,
	PROTO_FIN_ERROR = 4,       /* see code and message */
};

/* FINAL record payload: u64 id, u32 finish, u32 code, u32 prompt_tokens,
 * u32 cached_tokens, u32 generated_tokens, u32 preemptions, u64 queue_us,
 * u64 prefill_us, u64 decode_us, u32 msg_len, u32 reserved, then MSG_LEN
 * bytes.  The last record of every accepted request. */
struct proto_final {
	uint64_t id;
	uint32_t finish;           /* enum proto_finish */
	uint32_t code;             /* enum proto_err with PROTO_FIN_ERROR, else 0 */
	uint32_t prompt_tokens;
	uint32_t cached_tokens;    /* prompt tokens served by the prefix cache */
	uint32_t generated_tokens;
	uint32_t preemptions;
	uint64_t queue_us;         /* submit to admission */
	uint64_t prefill_us;       /* admission to first token */
	uint64_t decode_us;        /* first token to the end */
	struct proto_str message;  /* <= PROTO_MAX_ERRMSG bytes: the error with
	                              PROTO_FIN_ERROR; else a notice for the client
	                              (a priority the daemon clamped) or empty */
};
#define PROTO_FINAL_FIXED 64

/* Record encoders write the payload (not the ring's record header) into BUF
 * and return its size, or -EMSGSIZE / -EINVAL.  Record decoders validate a
 * payload of exactly N bytes: 0 or -EBADMSG. */
ssize_t proto_token_encode(uint8_t *buf, size_t cap, const struct proto_token *m);
ssize_t proto_final_encode(uint8_t *buf, size_t cap, const struct proto_final *m);
int proto_token_decode(const uint8_t *p, size_t n, struct proto_token *ret);
int proto_final_decode(const uint8_t *p, size_t n, struct proto_final *ret);

#endif
