/* cuda_private.h - the CUDA backend's private header: struct
 * cuda_backend and what its files (cuda_backend.c, cuda_weights.c,
 * cuda_graphs.c, cuda_profile.c, cuda_step.c) share.  Nothing outside kernels/cuda
 * includes it; the public interface is backend.h.
 */
#ifndef LLMD_CUDA_PRIVATE_H
#define LLMD_CUDA_PRIVATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "backend.h"
#include "cuda_ops.h"

/* Bytes of one f16 weight tile of the cuBLAS path: its rows are dequantized
 * a tile at a time into scratch (small on the emulator, so that the tests
 * cross tiles). */
#ifdef LLMD_CUDA_EMU_H
#define CB_GEMM_TILE_BYTES (32u << 10)
#else
#define CB_GEMM_TILE_BYTES (16u << 20)
#endif

#define CB_GRAPH_MAX_ROWS 256 /* decode steps with more rows run uncaptured */
#define CB_N_GRAPHS 48         /* instantiated graphs kept (least recently used goes) */
/* cuBLAS's scratch, so that it allocates nothing while a stream is
 * captured: the 32 MiB NVIDIA advises for Hopper; 1 MiB on the emulator,
 * whose reference GEMM needs none. */
#ifdef LLMD_CUDA_EMU_H
#define CB_BLAS_WORKSPACE (1u << 20)
#else
#define CB_BLAS_WORKSPACE (32u << 20)
#endif

/* A recorded decode step. */
struct cb_graph {
	cudaGraphExec_t exec;        /* NULL: a free slot */
	int32_t rows, stride;        /* its shape: padded rows, table stride */
	uint64_t gen;                /* buf_gen it was recorded at */
	uint64_t used;               /* clock of its last launch */
};

/* One host buffer's device copy. */
struct cb_map_entry {
	const void *host;  /* key: the host pointer the engine passes; NULL = empty */
	void *dev;         /* (bytes) device copy; owned */
	size_t bytes;
};

struct cuda_backend {
	struct backend be;
	int device;                  /* CUDA device index */
	cublasHandle_t blas;         /* for F32 weights; owned */
	void *blas_ws;               /* its workspace (CB_BLAS_WORKSPACE); owned */
	cudaStream_t stream;         /* every launch and copy, in order; owned */
	struct cuda_tuning tuning;   /* how the kernels run (cuda_backend_new's, resolved) */
	struct cuda_launch launch;   /* what every launcher gets: stream, &tuning, PDL, SMs */
	struct cb_map_entry *map;    /* (map_cap) host -> device copies of weights and norms */
	size_t map_cap;              /* power of two, 0 before the first copy */
	size_t map_n;                /* entries in use */
	/* The KV pool's device mirror. */
	const void *kv_host;         /* the host pool's base it mirrors */
	void *kv_dev;                /* (n_blocks, block_bytes); owned */
	size_t kv_bytes;
	/* The current step's rows, as begin_step saw them (host pointers, for identity). */
	int32_t step_n;
	const int32_t *step_pos;
	const int32_t *const *step_table;
	const int32_t *step_ids;     /* token ids already on the device (a graph step), or NULL */
	int32_t step_bt;             /* block_tokens the tables were flattened for; 0 = not yet */
	int32_t table_stride;        /* int32 per flattened table: the longest table needed */
	int32_t *d_pos;              /* (cap) device positions of the step's rows */
	size_t d_pos_cap;            /* bytes */
	int32_t *d_tables;           /* (T, table_stride) device block tables */
	size_t d_tables_cap;         /* bytes */
	int32_t *h_tables;           /* (T, table_stride) host staging */
	size_t h_tables_cap;         /* bytes */
	int32_t *d_ids;              /* token ids for embed */
	size_t d_ids_cap;            /* bytes */
	int32_t *d_pos2;             /* positions rope gets from outside a step */
	size_t d_pos2_cap;           /* bytes */
	void *mm_scratch;            /* quantized activations for cuda_matmul_q */
	size_t mm_scratch_cap;       /* bytes */
	/* An op's output that its launch also quantized into mm_scratch for
	 * the matmul after it (add_rmsnorm's or swiglu's NEXT): valid while no
	 * device call has been made since (calls == xq_calls). */
	const float *xq_src;         /* the rows quantized (device); NULL: none */
	int32_t xq_T;                /* rows */
	int64_t xq_n;                /* elements per row */
	uint32_t xq_vec;             /* QT_Q8_0, QT_Q8_1 or QT_Q8_K */
	uint64_t xq_calls;           /* calls when it was launched */
	uint64_t calls;              /* launches and runtime calls made, counted */
	void *att_scratch;           /* attention partials */
	size_t att_scratch_cap;      /* bytes */
	void *gemm_scratch;          /* the cuBLAS path's f16 activations and weight tile */
	size_t gemm_scratch_cap;     /* bytes */
	int32_t gemm_rows;           /* quantized matmuls of >= this many rows use cuBLAS; 0 never */
	/* What a graph step sizes its buffers by before recording. */
	size_t mm_row_bytes;         /* the largest matmul scratch per row of any weight */
	size_t half_row_bytes;       /* the largest f16 activation row of an F16/BF16 weight */
	struct bk_kv kv_view;        /* the attached pool (geometry) */
	struct bk_attn attn;         /* the last attention's shape; valid when has_attn */
	int has_attn;
	/* Graphs. */
	int capturing;               /* between graph_begin returning 0 and graph_end */
	uint64_t buf_gen;            /* bumped whenever cb_grow reallocates */
	uint64_t clock;
	struct cb_graph graphs[CB_N_GRAPHS];
	struct cb_prof *prof;        /* LLMD_CUDA_PROFILE: launch times; else NULL */
	int prof_failed;             /* LLMD_CUDA_PROFILE set, but no events for it */
	char last_err[256];          /* the last failure, with the call named */
};

#define CB_PROF_PENDING 1024 /* timed launches between two reads */
#define CB_PROF_KEYS 256

struct cb_prof_key {
	char name[128]; /* "launch T=rows", a matmul's with type and shape */
	double ms;      /* device time, summed */
	uint64_t calls; /* launches timed */
	double bytes;   /* weight bytes read, summed (matmuls) */
};

struct cb_prof {
	cudaEvent_t ev[2 * CB_PROF_PENDING]; /* start, end of each pending launch */
	int key[CB_PROF_PENDING];             /* its key */
	int n;                                /* pending */
	int open;                             /* ev[2n] recorded, its end not yet */
	char next[96];                        /* the next launch's key, when set */
	double next_bytes;
	struct cb_prof_key keys[CB_PROF_KEYS];
	int n_keys;
};

static inline struct cuda_backend *cbk(struct backend *be)
{
	return (struct cuda_backend *)be;
}

/* A launcher's call EXPR, timed when profiling: its start event first. */
#define CB_TIMED(cb, expr) (cb_prof_begin(cb), (expr))

/* A runtime call, counted; a failure named in last_err, returning -EIO. */
#define CB_CUDA(cb, call)                                         \
	do {                                                      \
		cudaError_t cb_e_ = (call);                       \
		(cb)->calls++;                                    \
		if (cb_e_ != cudaSuccess)                         \
			return cb_fail_cuda((cb), #call, cb_e_);  \
	} while (0)

/* ---- across the backend's files (engine thread, as the ops) ---- */

/* cuda_profile.c: LLMD_CUDA_PROFILE */
void cb_prof_new(struct cuda_backend *cb);
void cb_prof_free(struct cuda_backend *cb);
void cb_prof_begin(struct cuda_backend *cb);
void cb_prof_end(struct cuda_backend *cb, const char *call);
void cb_prof_read(struct cuda_backend *cb);
void cb_prof_matmul(struct cuda_backend *cb, const struct bk_weight *const *w, int n);
int cb_write_profile(struct backend *be, FILE *f);

/* cuda_backend.c: a launcher's result, timed and named */
int cb_launched(struct cuda_backend *cb, const char *call, int r);

/* cuda_step.c: errors, step buffers, the step's rows (below the others) */
int cb_fail_cuda(struct cuda_backend *cb, const char *call, cudaError_t e);
int cb_grow(struct cuda_backend *cb, void **p, size_t *cap, size_t need);
int cb_use_device(struct cuda_backend *cb);
int cb_stage(struct cuda_backend *cb, size_t bytes);
int32_t cb_table_need(const struct bk_rows *rows, int32_t bt);
void cb_flatten_tables(const struct bk_rows *rows, int32_t bt, int32_t stride, int32_t *dst);

/* cuda_weights.c: the weight cache and the KV pool's mirror */
int cb_device_copy(struct cuda_backend *cb, const void *host, size_t bytes, void **ret);
int cb_weight(struct cuda_backend *cb, const struct bk_weight *w, struct bk_weight *dw);
int cb_kv(struct cuda_backend *cb, const struct bk_kv *kv, struct bk_kv *dkv);
int cb_load_weight(struct backend *be, const struct bk_weight *w);
int cb_kv_attach(struct backend *be, const struct bk_kv *kv);

/* cuda_graphs.c: recorded decode steps */
int cb_graph_begin(struct backend *be, const struct bk_rows *rows, const int32_t *ids, int32_t max_rows,
		   int32_t *ret_rows);
int cb_graph_end(struct backend *be, int failed);
void cb_graph_drop(struct cb_graph *g);

#endif
