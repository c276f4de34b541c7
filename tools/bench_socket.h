/* bench_socket.h - llm-bench's --socket mode: the same parallel workload as
 * in-process, but through a running llmd, its socket and its rings, one
 * connection (and one thread) per simulated client; and its --url mode, the
 * same through an OpenAI-compatible HTTP server (libllm's llm_connect_url).
 */
#ifndef LLMD_BENCH_SOCKET_H
#define LLMD_BENCH_SOCKET_H

#include <stddef.h>
#include <stdint.h>

struct bench_socket_params {
	const char *socket;          /* daemon socket (NULL: $LLMD_SOCKET, then the default) */
	const char *const *prompts;  /* (n) prompt text of each client */
	int n;                       /* concurrent clients, one request each */
	const char *system;          /* chat: system message, or NULL */
	int chat;                    /* 1: each prompt is a user message */
	int32_t max_tokens;
	float temperature;
	int32_t top_k;
	float top_p, min_p;
	uint64_t seed;
	int ignore_eos;
	unsigned spec_flags;         /* LLM_SPEC_NGRAM, LLM_SPEC_OFF or 0 (the daemon's) */
	int32_t max_draft;           /* proposals a step at most (llm_set_max_draft); 0: the
	                                daemon's */
	const char *url;             /* instead of SOCKET: an OpenAI-compatible API
	                                (llm_connect_url: http[s]://HOST:PORT/v1, unix:PATH) */
	const char *api_key;         /* its key, or NULL */
	const char *model_name;      /* the daemon's model every client names (llm_set_model);
	                                NULL: its default */
	int grammar_kind;            /* LLM_GRAMMAR_* constraining every output; 0: none */
	const char *grammar_text;    /* its GBNF or JSON Schema (NULL for LLM_GRAMMAR_JSON) */
};

struct bench_socket_seq {
	int32_t *gen;                /* (n_ids) generated ids; malloc'd */
	int n_ids;                   /* n_gen, or fewer from a server of the HTTP API that
	                                gives no ids */
	int n_gen;                   /* generated tokens */
	double ttft_s;               /* submit to first token */
	double decode_s;             /* first to last token */
	int finish;                  /* enum llm_finish */
	uint32_t prompt_tokens, cached_tokens;
	double queue_ms, prefill_ms; /* the daemon's own figures */
};

struct bench_socket_result {
	double wall_s;               /* first submit to last DONE */
	int64_t generated;
	int n;
	struct bench_socket_seq *seqs; /* (n); free with bench_socket_result_free */
};

/* Connects N clients, submits all requests together, reads every event.
 * Returns 0, or a negative errno with a message in ERR. */
int bench_socket_run(const struct bench_socket_params *p, struct bench_socket_result *ret,
		     char *err, size_t errlen);

void bench_socket_result_free(struct bench_socket_result *r);

#endif
