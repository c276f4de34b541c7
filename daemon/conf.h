/* conf.h - llmd's settings: defaults, llmd.conf (inih) and command-line
 * overrides of the form SECTION.KEY=VALUE.  Every option is documented in
 * etc/llmd.conf and llmd.conf(5); this table is the single source of the
 * names.  Event-loop thread (and main before it starts).
 */
#ifndef LLMD_CONF_H
#define LLMD_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "backend.h" /* struct cuda_tuning */

#ifndef LLMD_SYSCONFDIR
#define LLMD_SYSCONFDIR "/etc"          /* configure's sysconfdir, set by the Makefile */
#endif
#define LLMD_DEFAULT_CONFIG LLMD_SYSCONFDIR "/llmd/llmd.conf"
#define LLMD_DEFAULT_SOCKET "/run/llmd/llmd.sock"

#define LLMD_MAX_MODELS 8            /* models one daemon serves: [model] and [models] */
#define LLMD_MODEL_NAME_MAX 64       /* bytes of a model's name */

/* A model of [models]: NAME = PATH. */
struct llmd_conf_model {
	char name[LLMD_MODEL_NAME_MAX + 1];
	char path[1024];
	int32_t pinned;                /* NAME.pinned: loaded at start, never unloaded */
	int32_t keep_alive_s;          /* NAME.keep_alive: seconds; -2 = memory.keep_alive */
	int32_t n_ctx;                 /* NAME.n_ctx: tokens per sequence; -1 = kv.n_ctx */
	int64_t pool_tokens;           /* NAME.pool_tokens: its KV pool; -1 = kv.pool_* */
	char chat_template[1024];      /* NAME.chat_template: a Jinja file; "" = the model's */
	char draft_model[1024];        /* NAME.draft_model: a GGUF of its vocabulary whose
	                                  tokens it verifies (speculative decoding); "" = none */
};

struct llmd_conf {
	/* [model] */
	char model_path[1024];         /* the GGUF file: the default model */
	char model_name[LLMD_MODEL_NAME_MAX + 1]; /* its name; "" = the file's name less .gguf */
	int32_t model_mmap;            /* 1 = map the file; 0 = read it into private memory */
	char chat_template[1024];      /* a Jinja file that replaces the model's own
	                                  template; "" = the model's */
	/* [server] */
	char socket_path[108];         /* Unix socket, when not socket-activated */
	mode_t socket_mode;            /* file mode of the socket we bind (0660) */
	char socket_group[64];         /* group of the socket we bind; "" = ours */
	char admin_group[64];          /* members may run admin commands (root always may) */
	int32_t grace_s;               /* SIGTERM: seconds in-flight requests may finish */
	/* [http] */
	char http_socket[108];         /* the HTTP front's Unix socket: auto, off, or a path */
	char http_listen[128];         /* TCP: PORT (loopback), HOST:PORT; "" = none */
	char http_keys_file[1024];     /* "NAME KEY" lines; TCP needs it */
	int32_t http_max_body_kib;     /* request bodies, KiB */
	int32_t http_timeout_s;        /* reading a request (and writing an answer) may take this */
	/* [device] */
	char backend[16];              /* auto | cpu | cuda */
	int32_t device_index;          /* CUDA device */
	int32_t threads;               /* CPU threads; 0 = one per online core (at most 256) */
	int32_t graphs;                /* 1 = replay decode steps from CUDA graphs */
	int32_t gemm_rows;             /* CUDA: matmuls of >= this many rows on cuBLAS f16; 0 never */
	/* [cuda] */
	struct cuda_tuning cuda;       /* the CUDA kernels' speed knobs (backend.h says each) */
	/* [kv] */
	int64_t pool_mb;               /* KV pool size, MiB (used when pool_tokens is 0);
	                                  both 0 = automatic (see gpu_mem_fraction) */
	int64_t pool_tokens;           /* or its size in tokens; 0 = use pool_mb */
	double gpu_mem_fraction;       /* automatic pool on a GPU: this share (0, 1] of the
	                                  memory free after the model; on the CPU 256 MiB */
	int32_t block_tokens;          /* tokens per KV block */
	char kv_type[8];               /* f16 | f32 | q8_0 */
	int32_t n_ctx;                 /* tokens per sequence; 0 = the model's */
	/* [sched] */
	int32_t max_seqs;              /* sequences running at once */
	int32_t max_batched_tokens;    /* token rows per step */
	int32_t max_queue;             /* requests waiting before "busy" */
	int32_t prefix_cache;          /* 1 = on */
	int32_t step_ms;               /* step-time budget while sequences decode, ms; 0 = off */
	/* [spec] */
	char spec_mode[8];             /* off | ngram | draft: speculative decoding for
	                                  requests that do not choose */
	int32_t spec_max_draft;        /* tokens a sequence proposes a step at most */
	int32_t spec_min_match;        /* the n-gram that must recur (prompt lookup) */
	char spec_draft_model[1024];   /* the draft model's GGUF (the default model's
	                                  vocabulary); "" = none */
	/* [limits] */
	int32_t max_connections;       /* connections at once, all users */
	int32_t connections_per_uid;
	int32_t requests_per_connection; /* live requests per connection */
	int32_t requests_per_uid;      /* live requests per user, all connections */
	int32_t prompt_bytes;          /* prompt text (or all chat messages) per request */
	int32_t prompt_tokens;         /* tokens per prompt; 0 = n_ctx - 1 */
	int32_t max_tokens;            /* generated tokens per request */
	int32_t max_priority;          /* non-admins' priorities are clamped to +-this */
	int32_t ring_kib;              /* default ring per connection, KiB */
	int32_t ring_max_kib;          /* the most a client may ask for, KiB */
	int32_t admin_connections;     /* connections over max_connections kept for admins */
	int32_t output_kib;            /* replies a connection has not read before llmd stops
	                                  reading its frames, KiB */
	int32_t hello_timeout_s;       /* a connection must send HELLO within this; 0 = never */
	int32_t frame_timeout_s;       /* a frame begun must finish within this; 0 = never */
	int32_t idle_timeout_s;        /* a connection with no request live and no frame for
	                                  this long is closed; 0 = never */
	/* [memory] */
	int64_t budget_mb;             /* weights + KV of the models loaded at once, MiB;
	                                  0 = automatic */
	int32_t keep_alive_s;          /* a model idle this long is unloaded; -1 = never */
	/* [models]: more models, served beside the default one */
	struct llmd_conf_model models[LLMD_MAX_MODELS - 1];
	int32_t n_models;
};

/* Fills C with the documented defaults. */
void conf_default(struct llmd_conf *c);

/* Reads PATH into C (over what is there).  Returns 0, -ENOENT when the file
 * does not exist, or a negative errno with "PATH:LINE: message" in ERR for
 * an unknown section/key or a bad value. */
int conf_load(struct llmd_conf *c, const char *path, char *err, size_t errlen);

/* Applies one "section.key=value" override.  0 or -EINVAL with a message. */
int conf_set(struct llmd_conf *c, const char *assignment, char *err, size_t errlen);

/* 1 if NAME may name a model: 1..LLMD_MODEL_NAME_MAX bytes of letters,
 * digits and . _ - : (a file name's stem usually is one). */
int conf_model_name_ok(const char *name);

/* The name a model at PATH gets without one: the file's name less .gguf,
 * with any byte conf_model_name_ok refuses made '_'. */
void conf_model_name_of(const char *path, char *out, size_t cap);

/* Applies VALUE to SECTION/KEY.  0, -ENOENT (unknown key) or -EINVAL.
 * Section "models" takes any KEY that is a model name (its PATH); an empty
 * VALUE removes that model. */
int conf_apply(struct llmd_conf *c, const char *section, const char *key, const char *value,
		 char *err, size_t errlen);

/* Cross-checks the settings (ranges, one of pool_mb/pool_tokens...).  0 or
 * -EINVAL with a message. */
int conf_check(const struct llmd_conf *c, char *err, size_t errlen);

/* Writes every setting as "section.key = value" lines (llmd --print-config). */
void conf_print(const struct llmd_conf *c, FILE *out);

#endif
