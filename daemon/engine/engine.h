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
#include <stdio.h>

#include "backend.h" /* struct cuda_tuning */

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
	int64_t kv_mib;          /* or, when kv_tokens is 0, in MiB (rounded down to blocks);
	                            both 0: sized automatically (engine_new) */
	double kv_gpu_fraction;  /* automatic size on a device: this share (0, 1] of the
	                            device memory left free after the model (0.9) */
	int32_t n_ctx;           /* longest sequence, tokens (at least MODEL_MIN_CTX);
	                            0 = the model's */
	int32_t max_batch;       /* token rows per step */
	int32_t backend;         /* ENGINE_BACKEND_CPU (default) or ENGINE_BACKEND_CUDA */
	int32_t device;          /* CUDA device index (0) */
	int32_t graphs;          /* 1: replay decode steps from recorded graphs where the
	                            backend can (CUDA); 0: launch every op (default 1) */
	int32_t gemm_rows;       /* CUDA: quantized matmuls of at least this many rows run
	                            on cuBLAS in f16 (fast prefill, not batch invariant);
	                            0: never (default) */
	const struct engine *threads_of; /* CPU: run on this engine's worker threads rather
	                            than start n_threads of its own; the one thread that
	                            steps both must never step them at once (a draft
	                            model beside its target); NULL: its own (default) */
	struct cuda_tuning cuda; /* CUDA: how the kernels run (backend.h); default
	                            cuda_tuning_defaults() with the LLMD_CUDA_* environment
	                            variables over it (cuda_tuning_from_env) */
};

#define ENGINE_BACKEND_CPU 0
#define ENGINE_BACKEND_CUDA 1 /* on a GPU (nvcc build) or on the CPU emulator
                                 (--enable-cuda-emu), whichever the binary links */

/* The automatic KV pool when the backend's memory is the host's. */
#define ENGINE_KV_MIB_HOST 256

/* Defaults: 2 threads, f16 KV, 16-token blocks, 8192 tokens, n_ctx 0,
 * 512 rows, CPU, device 0, kv_gpu_fraction 0.9, graphs on, and the CUDA
 * tuning's defaults under the LLMD_CUDA_* environment (what llm-bench and
 * the tests run with; llmd sets its own from llmd.conf). */
void engine_params_default(struct engine_params *p);

/* ---- choosing the backend ---- */

/* What CUDA backend this binary links, and the devices it sees. */
#define ENGINE_CUDA_NONE 0      /* built without one */
#define ENGINE_CUDA_EMULATED 1  /* --enable-cuda-emu: the kernels on the CPU emulator */
#define ENGINE_CUDA_DEVICE 2    /* nvcc's build, for GPUs */

struct engine_cuda_probe {
	int32_t kind;            /* ENGINE_CUDA_* */
	int32_t n_devices;       /* devices the CUDA runtime sees (0 when none, or NONE) */
	char why[200];           /* when n_devices is 0: the runtime's reason, or why
	                            there is no backend */
};

/* Fills RET for this binary: asks the CUDA runtime (initializing it) when a
 * CUDA backend is linked.  Any one thread at a time. */
void engine_cuda_probe(struct engine_cuda_probe *ret);

/* What device.backend WANT ("auto", "cpu" or "cuda") with device INDEX
 * means given PROBE: "cpu" is the CPU; "cuda" is the CUDA backend, or an
 * error when the binary has none (-ENOTSUP) or the device is not there
 * (-ENODEV); "auto" is CUDA when the binary links nvcc's backend and the
 * runtime sees device INDEX, else the CPU (the emulator is never chosen by
 * auto; a device INDEX past the devices seen is -ENODEV).  Returns 0 with
 * *RET_BACKEND set and a line saying what was chosen and why in MSG, or a
 * negative errno with the reason in MSG.  Pure: tests pass made-up probes. */
int engine_choose_backend(const char *want, int32_t index, const struct engine_cuda_probe *probe,
			  int32_t *ret_backend, char *msg, size_t msglen);

/* M must outlive the engine.  Returns 0, or a negative errno with a message
 * (-EINVAL among others for a q8_0 KV cache on heads it cannot hold;
 * -ENOTSUP for the CUDA backend in a build without one; -ENODEV without the
 * device; -ENOMEM when the model and the KV pool do not fit, naming the
 * sizes).
 *
 * The KV pool: kv_tokens, else kv_mib; when both are 0, ENGINE_KV_MIB_HOST
 * MiB on a backend whose memory is the host's, and on a device
 * kv_gpu_fraction of the memory left free once the weights are uploaded and
 * the step buffers allocated.  On a device the model (weights and step
 * buffers) plus the pool, or plus the smallest pool (max_batch tokens, whole
 * blocks) when it is automatic, must fit the free memory measured first. */
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

/* From now on E runs on FROM's CPU worker threads and stops its own (as
 * engine_params.threads_of, for an engine made elsewhere: a model loaded
 * on another thread, installed beside FROM): one thread must step both,
 * never at once.  1 when shared; 0 when not (another backend, another
 * thread count, already shared).  That thread only. */
int engine_share_threads(struct engine *e, const struct engine *from);

/* Steps recorded as graphs (graphs on, a backend that records) and steps
 * replayed from them, so far. */
void engine_graph_stats(const struct engine *e, uint64_t *recorded, uint64_t *replayed);

/* ---- where a step's time goes ----
 *
 * With the profile on, engine_step times each op of the forward pass (wall
 * clock around the backend call) and adds it up per kind, apart for steps
 * of one row (a lone decode) and steps of more.  The times are the host's:
 * on the CPU backend, the op's whole run; on a device backend, which runs
 * ops asynchronously, little more than the launches, and nothing of steps
 * replayed from a graph.  Costs two clock reads per op when on. */
enum engine_op {
	ENGINE_OP_EMBED,     /* embedding rows and the first norm */
	ENGINE_OP_QKV,       /* the q, k and v projections */
	ENGINE_OP_ROPE_KV,   /* RoPE and the K/V stores into the pool */
	ENGINE_OP_ATTENTION,
	ENGINE_OP_O,         /* the attention output projection */
	ENGINE_OP_ADD_NORM,  /* residual adds with the norms after them */
	ENGINE_OP_GATE_UP,   /* the FFN's gate and up projections */
	ENGINE_OP_SWIGLU,
	ENGINE_OP_DOWN,      /* the FFN's down projection */
	ENGINE_OP_OUTPUT,    /* the output norm and the logits' projection */
	ENGINE_N_OPS
};

struct engine_profile {
	double op_s[2][ENGINE_N_OPS]; /* [0: one-row steps, 1: others][op]: seconds */
	uint64_t steps[2];            /* forward passes timed */
	uint64_t rows[2];             /* their token rows */
};

/* Turns the profile on (clearing it) or off. */
void engine_set_profile(struct engine *e, int on);
void engine_get_profile(const struct engine *e, struct engine_profile *p);
/* "qkv", "attention", ...: a short name for OP. */
const char *engine_op_name(enum engine_op op);

/* 0 when the backend made its own copy of every weight at engine_new (a
 * GPU backend's upload) and its ops never read the model's again: if no
 * other engine runs on the model, the caller may then release the model's
 * weights (model_release_weights), e.g. so that a mapped model file may be
 * replaced.  1 when the ops read the model's weights (the CPU backend reads
 * those it keeps no packed copy of).  Any thread. */
int engine_reads_model_weights(const struct engine *e);
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
/* Writes the device's per-launch profile (LLMD_CUDA_PROFILE on the CUDA
 * backend: the backend's write_profile op) to F: 0, or -ENODATA when the
 * backend keeps none.  Engine thread only; the CLIs and llmd call it
 * before engine_free. */
int engine_write_device_profile(struct engine *e, FILE *f);
/* 1 when a failed step leaves the backend unusable (a CUDA device error is
 * sticky): the daemon must fail what runs and exit so it is restarted. */
int engine_failure_is_sticky(const struct engine *e);

#endif
