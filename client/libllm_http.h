/* libllm_http.h - libllm's second transport (internal): an OpenAI-compatible
 * HTTP API (llmd's HTTP front, vLLM, SGLang, llama-server) instead of
 * llmd's socket and rings, behind the same llm_* calls.  libllm.c owns the
 * handle and its lock and calls these with the lock held.
 */
#ifndef LLMD_LIBLLM_HTTP_H
#define LLMD_LIBLLM_HTTP_H

#include <pthread.h>
#include <stddef.h>

#include "llm.h"

struct llm_http;

/* Opens URL ("http[s]://HOST[:PORT]/v1", or "unix:PATH" for llmd's HTTP
 * socket) with KEY (NULL: none; sent as Authorization: Bearer), and asks
 * GET /models for the model, to fail early with the server's own words.
 * Fills INFO.  0 or a negative errno with MSG. */
int llm_http_open(const char *url, const char *key, struct llm_http **ret, struct llm_info *info,
		  char *msg, size_t msglen);
void llm_http_close(struct llm_http *hh);

/* One streaming request, constrained by G (NULL: not) as response_format
 * or llama-server's "grammar" says, for MODEL (the body's "model"; NULL or
 * "": the first model GET /models named), with the body's "keep_alive"
 * when KEEP_ALIVE is not NULL and "speculative.n_max" when MAX_DRAFT is
 * not 0; its id is ID.  0 or a negative errno with
 * MSG (-EINVAL for a JSON schema that is not JSON). */
int llm_http_submit(struct llm_http *hh, const struct llm_request *r, const struct llm_grammar *g,
		    const char *model, const int32_t *keep_alive, uint32_t max_draft, uint64_t id, char *msg,
		    size_t msglen);

/* llm_fd's: readable when llm_http_next_event may have something. */
int llm_http_fd(struct llm_http *hh);

/* Ends request ID (its connection closes, which cancels it on llmd) with a
 * DONE of LLM_FINISH_CANCELLED.  0 or -ENOENT. */
int llm_http_cancel(struct llm_http *hh, uint64_t id);

/* As llm_next_event: 1 with EV (its strings valid until the next call), 0
 * on timeout, or a negative errno with MSG.  LOCK (the handle's, held) is
 * let go while waiting, so that other threads may submit and cancel. */
int llm_http_next_event(struct llm_http *hh, struct llm_event *ev, int timeout_ms,
			pthread_mutex_t *lock, char *msg, size_t msglen);

#endif
