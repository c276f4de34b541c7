/* engine.h - runs forward passes of a model over batches of tokens drawn from
 * many sequences at once, on a backend, with a paged KV pool.
 *
 * A step takes T token rows (any mix of prefill chunks and decode tokens of
 * different sequences, each row naming its position and its sequence's
 * block table), reads every weight once for all T rows, and returns the
 * logits of the rows that ask for them.  Which sequences exist, their
 * blocks, sampling and detokenizing live above this (sched.c).
 * Engine thread only.
 */
#ifndef LLMD_ENGINE_H
#define LLMD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

struct model;
struct engine;
struct kv_pool;
struct bk_device_info;

struct engine_params {
	int32_t n_threads;       /* CPU threads (the engine thread counts) */
	uint32_t kv_type;        /* QT_F16 (default), QT_F32 or QT_Q8_0 (head_dim a
	                            multiple of 32, or dividing 32) */
	int32_t kv_block_tokens; /* tokens per KV block (16) */
	int64_t kv_tokens;       /* pool capacity in tokens (rounded up to blocks) */
	int64_t kv_mib;          /* or, when kv_tokens is 0, in MiB (rounded down to blocks) */
	int32_t n_ctx;           /* longest sequence, tokens; 0 = the model's */
	int32_t max_batch;       /* token rows per step */
	int32_t backend;         /* ENGINE_BACKEND_CPU (default) or ENGINE_BACKEND_CUDA */
	int32_t device;          /* CUDA device index (0) */
};

#define ENGINE_BACKEND_CPU 0
#define ENGINE_BACKEND_CUDA 1 /* built with --enable-cuda-emu (on the CPU emulator) */

/* Defaults: 2 threads, f16 KV, 16-token blocks, 8192 tokens, n_ctx 0,
 * 512 rows. */
void engine_params_default(struct engine_params *p);

/* M must outlive the engine.  Returns 0, or a negative errno with a message
 * (-EINVAL among others for a q8_0 KV cache on heads it cannot hold;
 * -ENOTSUP for the CUDA backend in a build without one). */
int engine_new(const struct model *m, const struct engine_params *p, struct engine **ret,
	       char *err, size_t errlen);
void engine_free(struct engine *e); /* NULL-safe */

struct engine_batch {
	int32_t n;                    /* T rows */
	const int32_t *token;         /* (T) token ids */
	const int32_t *pos;           /* (T) each token's position in its sequence */
	const int32_t *const *table;  /* (T) the row's sequence's block table, whose
	                                 blocks cover positions 0..pos (the KV of
	                                 positions < pos already written) */
	const uint8_t *logits;        /* (T) 1 = return this row's logits; NULL = last row only */
};

/* Runs one step: writes each row's K/V into its block at its position, then
 * attends over positions 0..pos of its sequence.  Writes the logits of the
 * flagged rows, in row order, to LOGITS (n_flagged, n_vocab).  Returns the
 * number of logit rows, or -EINVAL (bad token, position, block id, or more
 * than max_batch rows); nothing is written then; -EIO (among others) when the
 * backend fails. */
int engine_step(struct engine *e, const struct engine_batch *b, float *logits);

int32_t engine_n_vocab(const struct engine *e);
int32_t engine_n_ctx(const struct engine *e);
int32_t engine_max_batch(const struct engine *e);
/* KV pool capacity in tokens (blocks * tokens per block). */
int64_t engine_kv_capacity(const struct engine *e);
/* The engine's KV pool: the scheduler allocates sequences' blocks from it. */
struct kv_pool *engine_kv_pool(const struct engine *e);
/* "cpu", "cuda", or "cuda-emu" (the CUDA backend on the CPU emulator). */
const char *engine_backend_name(const struct engine *e);
/* The device the backend runs on: its name and memory (total and free now,
 * 0 when unknown).  Engine thread only (the CUDA query is not thread-safe
 * with a running step). */
void engine_device_info(const struct engine *e, struct bk_device_info *ret);
/* What the backend's last failure was, naming the call ("" when it cannot
 * say).  Engine thread only. */
const char *engine_last_error(const struct engine *e);
/* 1 when a failed step leaves the backend unusable (a CUDA device error is
 * sticky): the daemon must fail what runs and exit so it is restarted. */
int engine_failure_is_sticky(const struct engine *e);

#endif
