/* llm.h - libllm, the client library of llmd, the local LLM inference daemon.
 *
 * Connect to the daemon's Unix socket, submit completions or chats, and read
 * their tokens as they are generated: they arrive through a shared-memory
 * ring, so streaming costs no system call per token.  One handle is one
 * connection; every function may be called from any thread (a handle has
 * its own lock), but events are delivered to whichever thread reads them.
 *
 * Errors are negative errno values; llm_errmsg() says more about the last
 * one on the handle.  Documented in libllm(3).
 */
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llm;

/* Default socket: $LLMD_SOCKET, else this. */
#define LLM_DEFAULT_SOCKET "/run/llmd/llmd.sock"

/* Connects to the daemon at PATH (NULL: $LLMD_SOCKET, then
 * LLM_DEFAULT_SOCKET) and does the handshake.  RING_BYTES is the ring
 * capacity to ask for (0: the daemon's default).  Returns 0 and a handle,
 * or a negative errno; then, when ERR is not NULL, a message goes there. */
int llm_connect(const char *path, uint32_t ring_bytes, struct llm **ret, char *err, size_t errlen);

/* Or an OpenAI-compatible HTTP API instead of llmd's socket: URL is its
 * base ("http://HOST:PORT/v1", https too; "unix:PATH" for llmd's HTTP
 * socket; NULL: $LLM_URL), API_KEY its key (NULL: $LLM_API_KEY; sent as
 * Authorization: Bearer).  The same calls then go over HTTP (libcurl), one
 * streaming request each, with these differences: token ids come only from
 * servers that honour return_token_ids (llmd, vLLM), else each event's
 * token is -2; queue, prefill and decode times are 0; llm_admin returns
 * -EOPNOTSUPP; one thread at a time reads events.  GET
 * /models is asked at once, so a wrong URL or key fails here. */
int llm_connect_url(const char *url, const char *api_key, struct llm **ret, char *err, size_t errlen);

/* Cancels nothing, closes the connection (the daemon cancels what is still
 * running) and frees the handle.  NULL-safe. */
void llm_close(struct llm *h);

/* The message for the last error on H (never NULL). */
const char *llm_errmsg(struct llm *h);

struct llm_info {
	uint32_t protocol;         /* protocol version */
	uint32_t daemon_pid;
	uint32_t client_id;        /* the daemon's id for this connection */
	uint32_t ring_bytes;
	uint32_t max_inflight;     /* requests live at once on this connection */
	uint32_t max_prompt_bytes;
	uint32_t max_prompt_tokens;
	uint32_t max_tokens;
	uint32_t n_ctx;
	uint32_t n_vocab;
	char model[257];
	char backend[65];
	char chat_template[65];    /* empty: the model has no known chat template */
};

/* What the daemon said at the handshake. */
void llm_get_info(struct llm *h, struct llm_info *ret);

enum llm_role { LLM_ROLE_SYSTEM = 1, LLM_ROLE_USER = 2, LLM_ROLE_ASSISTANT = 3 };

struct llm_message {
	enum llm_role role;
	const char *content;       /* NUL-terminated UTF-8 */
};

enum llm_flags {
	LLM_LOGPROBS = 1u << 1,    /* report each token's log-probability */
	LLM_IGNORE_EOS = 1u << 2,  /* keep going past end-of-generation */
	LLM_SPEC_NGRAM = 1u << 3,  /* speculative decoding by prompt lookup (the output is
	                              the same; repetitive text comes faster) */
	LLM_SPEC_OFF = 1u << 4,    /* no speculative decoding; */
	LLM_SPEC_DRAFT = 1u << 5,  /* ... by the daemon's draft model (spec.draft_model);
	                              none of the three: the daemon's spec.mode (at most
	                              one; since LIBLLM_1.2) */
};

struct llm_request {
	const char *prompt;                 /* completion: NUL-terminated UTF-8 */
	const struct llm_message *messages; /* or chat: N_MESSAGES messages (prompt NULL) */
	int n_messages;
	int32_t max_tokens;        /* >= 1 */
	int32_t priority;          /* higher first */
	float temperature;         /* 0: greedy */
	int32_t top_k;             /* <= 0: off */
	float top_p;               /* 1: off */
	float min_p;               /* 0: off */
	float repeat_penalty;      /* 1: off */
	int32_t repeat_last_n;
	float presence_penalty;
	float frequency_penalty;
	int has_seed;              /* 1: use SEED, else the daemon picks one */
	uint64_t seed;
	const char *const *stops;  /* N_STOPS stop strings */
	int n_stops;
	unsigned flags;            /* enum llm_flags */
};

/* Fills R with the defaults: 256 tokens, priority 0, temperature 0.8,
 * top_k 40, top_p 0.95, min_p 0.05, penalties off (1.0, 64, 0, 0), no
 * seed, no stops, no flags.  Set prompt or messages. */
void llm_request_init(struct llm_request *r);

/* Submits R.  Returns 0 and the request's id (> 0, unique on this handle),
 * or a negative errno (-EINVAL for a bad request, -ENOBUFS when the
 * connection already has max_inflight requests, -EPIPE when the daemon
 * went away).  Refusals by the daemon arrive later as an LLM_EV_DONE event
 * with LLM_FINISH_ERROR. */
int llm_submit(struct llm *h, const struct llm_request *r, uint64_t *ret_id);

/* What may constrain a request's output (structured output). */
enum llm_grammar_kind {
	LLM_GRAMMAR_GBNF = 1,        /* TEXT is a GBNF grammar (llama.cpp's syntax),
	                                start rule "root" */
	LLM_GRAMMAR_JSON_SCHEMA = 2, /* TEXT is a JSON Schema document: the output is
	                                JSON that it accepts */
	LLM_GRAMMAR_JSON = 3,        /* any JSON object; TEXT is NULL */
};
#define LLM_GRAMMAR_STRICT 1u    /* JSON_SCHEMA: OpenAI's strict mode (an object
                                    without additionalProperties allows none) */

struct llm_grammar {
	enum llm_grammar_kind kind;
	unsigned flags;            /* LLM_GRAMMAR_STRICT or 0 */
	const char *text;          /* NUL-terminated; NULL with LLM_GRAMMAR_JSON */
};

/* llm_submit with the output constrained by G (NULL: unconstrained): each
 * token is drawn from those the grammar allows, and the request stops when
 * the text is complete.  A grammar or schema that does not compile is
 * refused by the daemon (an LLM_EV_DONE with LLM_FINISH_ERROR naming the
 * place); a text left incomplete by max_tokens ends with LLM_FINISH_LENGTH
 * and a message saying so.  Since LIBLLM_1.1. */
int llm_submit_grammar(struct llm *h, const struct llm_request *r, const struct llm_grammar *g,
		       uint64_t *ret_id);

/* Names the model that serves the later submits on H (llm_submit and
 * llm_submit_grammar), for a daemon that serves several (llmctl models
 * lists them); NAME is copied.  NULL or "" goes back to the daemon's
 * default model.  Returns 0, or -EINVAL for a name over 256 bytes (the
 * previous one stays).  A name the daemon does not serve is refused per
 * request: an LLM_EV_DONE with LLM_FINISH_ERROR and error_code 15
 * (nomodel).  Over HTTP the name is the body's "model" (default: the first
 * of GET /models).  llm_get_info still describes the default model.
 * Since LIBLLM_1.2. */
int llm_set_model(struct llm *h, const char *name);

/* How long the model of the later submits on H stays loaded once idle, as
 * Ollama's keep_alive: SECONDS, -1 for ever, 0 unloaded as soon as its
 * requests end (the daemon's default model and pinned models stay
 * whatever); each request's value replaces the model's.  LLM_KEEP_ALIVE_UNSET
 * goes back to sending none (the model keeps its own).  Returns 0, or
 * -EINVAL below -1.  Over HTTP it is the body's "keep_alive".  Since
 * LIBLLM_1.2. */
#define LLM_KEEP_ALIVE_UNSET INT32_MIN
int llm_set_keep_alive(struct llm *h, int32_t seconds);

/* The most tokens speculative decoding proposes a step for the later
 * submits on H (LLM_SPEC_NGRAM, LLM_SPEC_DRAFT or the daemon's spec.mode):
 * K in 1..LLM_MAX_DRAFT, or 0 for the daemon's spec.max_draft (the
 * default).  Fewer proposals waste less of a busy step when they are
 * rejected; more pay on text that repeats at length.  The output is the
 * same either way.  Returns 0, or -EINVAL outside 0..LLM_MAX_DRAFT.  Over
 * HTTP it is the body's "speculative.n_max" (llama-server's name).  Since
 * LIBLLM_1.2. */
#define LLM_MAX_DRAFT 16
int llm_set_max_draft(struct llm *h, int32_t k);

/* Asks the daemon to cancel request ID; its LLM_EV_DONE event (finish
 * LLM_FINISH_CANCELLED, unless it ended first) follows.  0, -ENOENT for an
 * id not live on this handle, or another negative errno. */
int llm_cancel(struct llm *h, uint64_t id);

enum llm_event_kind {
	LLM_EV_TOKEN = 1,          /* a generated token and its text */
	LLM_EV_DONE = 2,           /* the request is over: no more events for its id */
};

enum llm_finish {
	LLM_FINISH_STOP = 1,       /* end-of-generation token or a stop string */
	LLM_FINISH_LENGTH = 2,     /* max_tokens or the context */
	LLM_FINISH_CANCELLED = 3,
	LLM_FINISH_ERROR = 4,      /* see error and message */
};

struct llm_event {
	enum llm_event_kind kind;
	uint64_t id;               /* the request */
	/* LLM_EV_TOKEN */
	int32_t token;             /* -1: text released at the end, no new token */
	float logprob;
	const char *text;          /* complete UTF-8, NUL-terminated; valid until the next
	                              llm_next_event on this handle */
	size_t text_len;
	/* LLM_EV_DONE */
	enum llm_finish finish;
	int error_code;            /* the daemon's error code (libllm(3)), 0 unless ERROR */
	const char *message;       /* with LLM_FINISH_ERROR, the error; else a notice from the
	                              daemon ("priority 50 was clamped to 10 ...") or "";
	                              same lifetime as text */
	uint32_t prompt_tokens, cached_tokens, generated_tokens, preemptions;
	double queue_ms, prefill_ms, decode_ms;
};

/* Waits up to TIMEOUT_MS (-1: forever, 0: poll) for the next event of any
 * request on H.  Returns 1 with EV filled, 0 on timeout, or a negative
 * errno (-EPIPE: the daemon closed the connection; every live request then
 * gets an LLM_EV_DONE with LLM_FINISH_ERROR first).  -EINTR when a signal
 * interrupted the wait. */
int llm_next_event(struct llm *h, struct llm_event *ev, int timeout_ms);

/* A file descriptor that polls readable when llm_next_event(h, ev, 0) may
 * have something, for the caller's own event loop.  Owned by the handle. */
int llm_fd(struct llm *h);

/* Sends admin command CMD with ARG (may be NULL) and waits for the reply.
 * Returns 0 with *RET_BODY a malloc'd NUL-terminated JSON document, or a
 * negative errno (-EPERM for a non-admin, -ENOENT for an unknown command)
 * with the daemon's message in llm_errmsg.  Events that arrive meanwhile
 * are kept for llm_next_event. */
int llm_admin(struct llm *h, const char *cmd, const char *arg, char **ret_body);

#ifdef __cplusplus
}
#endif
#endif
