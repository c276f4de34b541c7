/* cuda_backend.c - the backend ops table on CUDA: device memory, uploads and
 * the calls of the kernels' extern "C" launchers (cuda_ops.h).
 *
 * Plain C against the CUDA runtime API, built twice: against the real
 * toolkit's headers next to the nvcc-built kernels (libcudabackend_gpu.a,
 * for GPUs), and against the CPU emulator's callable-from-C stand-ins
 * (libcudabackend.a, --enable-cuda-emu).  It holds no kernels and does not
 * choose what runs (engine.c does).
 *
 * Device memory: the engine uploads every weight and norm vector at start-up
 * (load_weight) and attaches the KV pool (kv_attach), so what the model takes
 * is known before the pool is sized and a model that does not fit fails
 * there; the ops find a weight's device copy by its host pointer (a small
 * open-addressing map, which also uploads what was not loaded first).  The
 * KV pool's device copy mirrors the host pool's geometry, keyed by its base,
 * and the host memfd pool is never touched (nor made resident); positions
 * and block tables go up once per step (begin_step).  Activations are
 * cudaMalloc'd by the engine through alloc.  Streams: every launch and copy
 * runs in order on the backend's own non-blocking stream; the host waits
 * only for the logits (download).  Threads: the device is made current on
 * the thread that runs a step (the engine is built on another).
 *
 * Graphs: a decode step (every row wants logits) is padded to a bucket of
 * rows (1, 2, 4, 8, then multiples of 8 up to CB_GRAPH_MAX_ROWS; spare rows
 * have position -1, which the kernels skip) and to a power-of-two table
 * stride, and recorded once per (rows, stride) as a CUDA graph; later steps
 * of that shape upload their ids, positions and tables into the same device
 * buffers and replay it, one launch instead of ~15 per layer.  A graph names
 * the step buffers it was recorded with, so it is dropped when one of them
 * is reallocated (buf_gen).  Prefill steps run uncaptured.
 *
 * Matmuls: quantized weights go through our integer kernels (matmul.cu),
 * bit for bit the CPU's and batch invariant.  F32, F16 and BF16 weights go
 * through cuBLAS; so do quantized ones in matmuls of at least gemm_rows rows
 * when that is set (the set_gemm_rows op): weight tiles dequantized to
 * f16 and cublasGemmEx with f32 accumulation, tensor cores for prefill, at
 * the price of batch invariance (a row's arithmetic then depends on the
 * rows beside it).  Recorded (decode) steps always take the integer kernels.
 * The op before an integer matmul (the norms, attention, swiglu: their
 * NEXT) quantizes its output for it in the same launch (cb_fuse_begin), so
 * the matmul's own quantization launch is skipped.
 *
 * Attention tiles a prefill chunk's rows (cuda_attention with the host's
 * rows); recorded steps keep one row per block.
 *
 * Profile: with LLMD_CUDA_PROFILE set (to anything but 0), every launch
 * and cuBLAS call is timed between two events in the stream, keyed by its
 * name, its rows (the step's) and, for matmuls, the weight's type and
 * shape; the host reads them at each step's download, and
 * the write_profile op gives the caller the table (time, calls, time
 * per call, and for matmuls the weight bytes streamed per second).  Graphs
 * are off then (a replay hides its kernels), and so is nothing else: the
 * same kernels, one step at a time.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "backend.h"
#include "cuda_ops.h"
#include "quant.h"

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

static struct cuda_backend *cbk(struct backend *be)
{
	return (struct cuda_backend *)be;
}

/* ---- LLMD_CUDA_PROFILE ---- */

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

/* Adds the pending launches' times to their keys (waits for the last). */
static void cb_prof_read(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p || !p->n)
		return;
	if (cudaEventSynchronize(p->ev[2 * p->n - 1]) != cudaSuccess) {
		p->n = 0; /* lost (the step failed too); the slots are free again */
		return;
	}
	for (int i = 0; i < p->n; i++) {
		float ms = 0;
		if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == cudaSuccess)
			p->keys[p->key[i]].ms += ms;
	}
	p->n = 0;
}

/* Before a launch: its start event (launched steps only). */
static void cb_prof_begin(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p || cb->capturing)
		return;
	if (p->n == CB_PROF_PENDING)
		cb_prof_read(cb);
	p->open = cudaEventRecord(p->ev[2 * p->n], cb->stream) == cudaSuccess;
}

/* After it: its end event, and its key (CALL, or the one set in next). */
static void cb_prof_end(struct cuda_backend *cb, const char *call)
{
	struct cb_prof *p = cb->prof;
	char name[128];
	int k;

	if (!p || !p->open)
		return;
	p->open = 0;
	if (cudaEventRecord(p->ev[2 * p->n + 1], cb->stream) != cudaSuccess)
		return;
	snprintf(name, sizeof name, "%.100s T=%d", p->next[0] ? p->next : call, (int)cb->step_n);
	for (k = 0; k < p->n_keys && strcmp(p->keys[k].name, name); k++)
		;
	if (k == p->n_keys) {
		if (k == CB_PROF_KEYS) { /* the last collects the rest */
			k = CB_PROF_KEYS - 1;
			snprintf(p->keys[k].name, sizeof p->keys[k].name, "(more kinds of launch)");
		} else {
			snprintf(p->keys[p->n_keys++].name, sizeof p->keys[0].name, "%s", name);
		}
	}
	p->keys[k].calls++;
	p->keys[k].bytes += p->next_bytes;
	p->key[p->n++] = k;
	p->next[0] = 0;
	p->next_bytes = 0;
}

static int cb_prof_cmp(const void *a, const void *b)
{
	double x = ((const struct cb_prof_key *)a)->ms, y = ((const struct cb_prof_key *)b)->ms;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* The events go (NULL-safe). */
static void cb_prof_free(struct cuda_backend *cb)
{
	struct cb_prof *p = cb->prof;

	if (!p)
		return;
	for (int i = 0; i < 2 * CB_PROF_PENDING; i++)
		if (p->ev[i])
			cudaEventDestroy(p->ev[i]);
	free(p);
	cb->prof = NULL;
}

static int cb_write_profile(struct backend *be, FILE *f)
{
	struct cuda_backend *cb = cbk(be);
	struct cb_prof *p = cb->prof;
	double total = 0;

	if (cb->prof_failed)
		fprintf(f, "llmd cuda profile (LLMD_CUDA_PROFILE): none, cudaEventCreate failed\n");
	if (!p)
		return -ENODATA;
	cb_prof_read(cb);
	qsort(p->keys, (size_t)p->n_keys, sizeof p->keys[0], cb_prof_cmp);
	for (int k = 0; k < p->n_keys; k++)
		total += p->keys[k].ms;
	fprintf(f, "llmd cuda profile (LLMD_CUDA_PROFILE): %.3f ms in %d kinds of launch\n"
		"%10s %6s %8s %10s %7s  %s\n", total, p->n_keys, "ms", "%", "calls", "us/call", "GB/s",
		"launch (T = the step's rows)");
	for (int k = 0; k < p->n_keys; k++) {
		const struct cb_prof_key *e = &p->keys[k];
		char bw[16] = "";
		if (e->bytes > 0 && e->ms > 0)
			snprintf(bw, sizeof bw, "%7.0f", e->bytes / (e->ms * 1e-3) / 1e9);
		fprintf(f, "%10.3f %6.2f %8llu %10.2f %7s  %s\n", e->ms,
			total > 0 ? 100.0 * e->ms / total : 0.0, (unsigned long long)e->calls,
			e->calls ? 1e3 * e->ms / (double)e->calls : 0.0, bw, e->name);
	}
	return 0;
}

/* LLMD_CUDA_PROFILE: the events, made once. */
static void cb_prof_new(struct cuda_backend *cb)
{
	const char *v = getenv("LLMD_CUDA_PROFILE");

	if (!v || !*v || !strcmp(v, "0") || !(cb->prof = calloc(1, sizeof *cb->prof)))
		return;
	for (int i = 0; i < 2 * CB_PROF_PENDING; i++)
		if (cudaEventCreate(&cb->prof->ev[i]) != cudaSuccess) {
			cb->prof->ev[i] = NULL;
			cb_prof_free(cb);
			cb->prof_failed = 1;
			return;
		}
}

/* The next launch's key: matmul TYPE n_in=N n_out=A+B+..., TYPE the
 * weights' types in order of first appearance ("Q4_K+Q6_K" for a mixed
 * launch), and its bytes. */
static void cb_prof_matmul(struct cuda_backend *cb, const struct bk_weight *const *w, int n)
{
	struct cb_prof *p = cb->prof;
	size_t len = (size_t)snprintf(p->next, sizeof p->next, "matmul ");

	for (int i = 0; i < n; i++) {
		const struct qtype_info *qt = qtype_get(w[i]->type);
		int seen = 0;
		for (int j = 0; j < i; j++)
			seen |= w[j]->type == w[i]->type;
		if (!seen && len < sizeof p->next)
			len += (size_t)snprintf(p->next + len, sizeof p->next - len, "%s%s", i ? "+" : "",
						qt ? qt->name : "?");
	}
	if (len < sizeof p->next)
		len += (size_t)snprintf(p->next + len, sizeof p->next - len, " n_in=%lld n_out=",
					(long long)w[0]->n_in);
	p->next_bytes = 0;
	for (int i = 0; i < n; i++) {
		if (len < sizeof p->next)
			len += (size_t)snprintf(p->next + len, sizeof p->next - len, "%s%lld", i ? "+" : "",
						(long long)w[i]->n_out);
		p->next_bytes += (double)w[i]->n_out * (double)w[i]->row_bytes;
	}
}

/* A launcher's call EXPR, timed when profiling: its start event first. */
#define CB_TIMED(cb, expr) (cb_prof_begin(cb), (expr))

/* ---- errors ---- */

static int cb_fail_cuda(struct cuda_backend *cb, const char *call, cudaError_t e)
{
	snprintf(cb->last_err, sizeof cb->last_err, "%s: %s (%s)", call, cudaGetErrorString(e),
		 cudaGetErrorName(e));
	return -EIO;
}

static int cb_fail_blas(struct cuda_backend *cb, const char *call, cublasStatus_t s)
{
	snprintf(cb->last_err, sizeof cb->last_err, "%s: %s", call, cublasGetStatusName(s));
	return -EIO;
}

/* A launcher's negative errno, named. */
static int cb_launched(struct cuda_backend *cb, const char *call, int r)
{
	cb_prof_end(cb, call);
	cb->calls++;
	if (r < 0)
		snprintf(cb->last_err, sizeof cb->last_err, "%s: %s", call, strerror(-r));
	return r;
}

#define CB_CUDA(cb, call)                                         \
	do {                                                      \
		cudaError_t cb_e_ = (call);                       \
		(cb)->calls++;                                    \
		if (cb_e_ != cudaSuccess)                         \
			return cb_fail_cuda((cb), #call, cb_e_);  \
	} while (0)

static void cb_set_gemm_rows(struct backend *be, int32_t rows)
{
	cbk(be)->gemm_rows = rows > 0 ? rows : 0;
}

static const char *cb_last_error(const struct backend *be)
{
	return ((const struct cuda_backend *)be)->last_err;
}

/* ---- device buffers ---- */

/* Makes *P hold at least NEED bytes (contents not kept). */
static int cb_grow(struct cuda_backend *cb, void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	if (cb->capturing) { /* graph_begin sized everything first */
		snprintf(cb->last_err, sizeof cb->last_err,
			 "internal error: a step buffer (%zu bytes, %zu needed) would grow while a "
			 "CUDA graph is being recorded", *cap, need);
		return -EIO;
	}
	cb->buf_gen++; /* recorded graphs may name the old buffer */
	if (*p) {
		void *old = *p;
		*p = NULL;
		*cap = 0;
		CB_CUDA(cb, cudaFree(old));
	}
	need = need < 256 ? 256 : need + need / 2;
	CB_CUDA(cb, cudaMalloc(p, need));
	*cap = need;
	return 0;
}

static size_t cb_hash(const void *p, size_t cap)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
	return (size_t)(h >> 17) & (cap - 1);
}

/* The device copy of host buffer HOST (BYTES), uploaded at the first call:
 * weights live as long as the model, which outlives the engine. */
static int cb_device_copy(struct cuda_backend *cb, const void *host, size_t bytes, void **ret)
{
	struct cb_map_entry *e;

	if (cb->map_cap) {
		for (size_t i = cb_hash(host, cb->map_cap);; i = (i + 1) & (cb->map_cap - 1)) {
			e = &cb->map[i];
			if (!e->host)
				break;
			if (e->host == host) {
				if (e->bytes < bytes) {
					snprintf(cb->last_err, sizeof cb->last_err,
						 "a host buffer uploaded with %zu bytes is now used with %zu",
						 e->bytes, bytes);
					return -EINVAL;
				}
				*ret = e->dev;
				return 0;
			}
		}
	}
	if (2 * (cb->map_n + 1) > cb->map_cap) {
		size_t cap = cb->map_cap ? 2 * cb->map_cap : 64;
		struct cb_map_entry *m = calloc(cap, sizeof *m);
		if (!m) {
			snprintf(cb->last_err, sizeof cb->last_err, "out of memory");
			return -ENOMEM;
		}
		for (size_t j = 0; j < cb->map_cap; j++) {
			if (!cb->map[j].host)
				continue;
			size_t i = cb_hash(cb->map[j].host, cap);
			while (m[i].host)
				i = (i + 1) & (cap - 1);
			m[i] = cb->map[j];
		}
		free(cb->map);
		cb->map = m;
		cb->map_cap = cap;
	}
	if (cb->capturing) {
		snprintf(cb->last_err, sizeof cb->last_err,
			 "internal error: a weight (%zu bytes) uploaded while a CUDA graph is being "
			 "recorded", bytes);
		return -EIO;
	}
	size_t i = cb_hash(host, cb->map_cap);
	while (cb->map[i].host)
		i = (i + 1) & (cb->map_cap - 1);
	e = &cb->map[i];
	void *dev = NULL;
	CB_CUDA(cb, cudaMalloc(&dev, bytes));
	/* on the stream: the kernels that read it come after it in order */
	cudaError_t ce = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cb->stream);
	if (ce != cudaSuccess) {
		cudaFree(dev);
		return cb_fail_cuda(cb, "cudaMemcpy(weights)", ce);
	}
	e->host = host;
	e->dev = dev;
	e->bytes = bytes;
	cb->map_n++;
	*ret = dev;
	return 0;
}

/* *DW = *W with its data on the device. */
static int cb_weight(struct cuda_backend *cb, const struct bk_weight *w, struct bk_weight *dw)
{
	void *dev;
	int r = cb_device_copy(cb, w->data, (size_t)w->n_out * w->row_bytes, &dev);
	if (r < 0)
		return r;
	*dw = *w;
	dw->data = dev;
	size_t mm = cuda_matmul_scratch_bytes(dw, 1);
	if (w->type != QT_F32 && mm > cb->mm_row_bytes)
		cb->mm_row_bytes = mm;
	if ((w->type == QT_F16 || w->type == QT_BF16) && (size_t)w->n_in * 2 > cb->half_row_bytes)
		cb->half_row_bytes = (size_t)w->n_in * 2;
	return 0;
}

/* *DKV = *KV with base on the device mirror, allocated at the first call. */
static int cb_kv(struct cuda_backend *cb, const struct bk_kv *kv, struct bk_kv *dkv)
{
	size_t bytes = (size_t)kv->n_blocks * kv->block_bytes;

	if (cb->kv_dev && (cb->kv_host != kv->base || cb->kv_bytes != bytes)) {
		snprintf(cb->last_err, sizeof cb->last_err,
			 "one CUDA backend serves one KV pool (mirror of %zu bytes exists)", cb->kv_bytes);
		return -EINVAL;
	}
	if (!cb->kv_dev) {
		CB_CUDA(cb, cudaMalloc(&cb->kv_dev, bytes));
		cb->kv_host = kv->base;
		cb->kv_bytes = bytes;
		cb->kv_view = *kv;
		cb->kv_view.base = cb->kv_dev;
	}
	*dkv = *kv;
	dkv->base = cb->kv_dev;
	return 0;
}

/* Makes the backend's device current on the calling thread: the engine is
 * built on one thread and its steps run on another. */
static int cb_use_device(struct cuda_backend *cb)
{
	CB_CUDA(cb, cudaSetDevice(cb->device));
	return 0;
}

/* ---- the step's rows ---- */

static int cb_begin_step(struct backend *be, const struct bk_rows *rows)
{
	struct cuda_backend *cb = cbk(be);
	int r;

	if ((r = cb_use_device(cb)) < 0)
		return r;
	cb->step_n = rows->n;
	cb->step_pos = rows->pos;
	cb->step_table = rows->block_table;
	cb->step_ids = NULL;
	cb->step_bt = 0; /* tables are flattened at the first KV op, which knows block_tokens */
	if ((r = cb_grow(cb, (void **)&cb->d_pos, &cb->d_pos_cap, (size_t)rows->n * sizeof(int32_t))) < 0)
		return r;
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos, rows->pos, (size_t)rows->n * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	return 0;
}

/* Makes the host staging buffer (h_tables) hold at least BYTES. */
static int cb_stage(struct cuda_backend *cb, size_t bytes)
{
	if (bytes <= cb->h_tables_cap)
		return 0;
	int32_t *h = realloc(cb->h_tables, bytes);
	if (!h) {
		snprintf(cb->last_err, sizeof cb->last_err, "out of memory");
		return -ENOMEM;
	}
	cb->h_tables = h;
	cb->h_tables_cap = bytes;
	return 0;
}

/* Table entries the longest of ROWS' tables needs (positions 0..pos, BT
 * positions a block). */
static int32_t cb_table_need(const struct bk_rows *rows, int32_t bt)
{
	int32_t need = 1;

	for (int32_t t = 0; t < rows->n; t++)
		if (rows->pos[t] / bt + 1 > need)
			need = rows->pos[t] / bt + 1;
	return need;
}

/* ROWS' block tables into DST, STRIDE entries each; the entries past a
 * row's position are 0 (never read). */
static void cb_flatten_tables(const struct bk_rows *rows, int32_t bt, int32_t stride, int32_t *dst)
{
	for (int32_t t = 0; t < rows->n; t++, dst += stride) {
		int32_t need = rows->pos[t] / bt + 1;
		memcpy(dst, rows->block_table[t], (size_t)need * sizeof(int32_t));
		memset(dst + need, 0, (size_t)(stride - need) * sizeof(int32_t));
	}
}

/* Device positions and tables for ROWS (uploaded once per step). */
static int cb_rows(struct cuda_backend *cb, const struct bk_rows *rows, int32_t bt)
{
	int r;

	if (rows->n != cb->step_n || rows->pos != cb->step_pos || rows->block_table != cb->step_table) {
		/* ops called outside a step the engine began (tests, tools) */
		if ((r = cb_begin_step(&cb->be, rows)) < 0)
			return r;
	}
	if (cb->step_bt == bt)
		return 0;
	int32_t stride = cb_table_need(rows, bt);
	size_t bytes = (size_t)rows->n * (size_t)stride * sizeof(int32_t);
	if ((r = cb_stage(cb, bytes)) < 0)
		return r;
	cb_flatten_tables(rows, bt, stride, cb->h_tables);
	if ((r = cb_grow(cb, (void **)&cb->d_tables, &cb->d_tables_cap, bytes)) < 0)
		return r;
	/* from pageable memory: h_tables may be rewritten once this returns */
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_tables, cb->h_tables, bytes, cudaMemcpyHostToDevice,
				    cb->stream));
	cb->table_stride = stride;
	cb->step_bt = bt;
	return 0;
}

/* ---- the ops ---- */

static int cb_embed(struct backend *be, const struct bk_weight *w, const int32_t *ids, int32_t T,
		    float *out)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	int r;

	if ((r = cb_weight(cb, w, &dw)) < 0)
		return r;
	if (ids != cb->step_ids || T > cb->step_n) {
		if ((r = cb_grow(cb, (void **)&cb->d_ids, &cb->d_ids_cap, (size_t)T * sizeof(int32_t))) < 0)
			return r;
		CB_CUDA(cb, cudaMemcpyAsync(cb->d_ids, ids, (size_t)T * sizeof(int32_t),
					    cudaMemcpyHostToDevice, cb->stream));
	}
	return cb_launched(cb, "cuda_embed", CB_TIMED(cb, cuda_embed(&dw, cb->d_ids, T, out, &cb->launch)));
}

/* out (T, n_out) = x (T, n_in) · W^T for F32 weights, on cuBLAS: in
 * column-major terms out^T (n_out, T) = W (n_in, n_out)^T · x^T (n_in, T).
 * Pedantic fp32 (no TF32).  The reference cuBLAS of the emulator computes
 * each element alone (batch invariant); a real cuBLAS may pick algorithms
 * by T.  TODO(cuda): a batch-invariant F32/F16/BF16 kernel in matmul.cu. */
static int cb_matmul_f32(struct cuda_backend *cb, const struct bk_weight *dw, const float *x,
			 int32_t T, float *out)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t s;

	if (dw->row_bytes != (size_t)dw->n_in * sizeof(float) || dw->n_in > INT32_MAX ||
	    dw->n_out > INT32_MAX) {
		snprintf(cb->last_err, sizeof cb->last_err, "cublasGemmEx: padded F32 rows");
		return -ENOTSUP;
	}
	if (cb->prof)
		cb_prof_matmul(cb, &dw, 1);
	cb_prof_begin(cb);
	s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)dw->n_out, T, (int)dw->n_in, &one,
			 dw->data, CUDA_R_32F, (int)dw->n_in, x, CUDA_R_32F, (int)dw->n_in, &zero, out,
			 CUDA_R_32F, (int)dw->n_out, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
	cb_prof_end(cb, "cublasGemmEx");
	if (s != CUBLAS_STATUS_SUCCESS)
		return cb_fail_blas(cb, "cublasGemmEx", s);
	return 0;
}

/* out (T, n_out) = x · W^T on cuBLAS in half precision: x rounded to f16
 * (bf16 for BF16 weights) once, W as it is (F16, BF16) or dequantized to
 * f16 a tile of rows at a time, f32 accumulation and output.  With X NULL,
 * the scratch already holds x rounded for a weight of this type and n_in
 * (the rest of a matmul group): the scratch's size depends on those alone,
 * so it never grows (and loses them) between the group's weights. */
static int cb_matmul_half(struct cuda_backend *cb, const struct bk_weight *dw, const float *x,
			  int32_t T, float *out)
{
	const int bf16 = dw->type == QT_BF16, direct = dw->type == QT_F16 || bf16;
	const cudaDataType ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
	const int64_t n_in = dw->n_in, n_out = dw->n_out;
	const float one = 1.0f, zero = 0.0f;
	const size_t xb = ((size_t)T * (size_t)n_in * 2 + 255) / 256 * 256;
	int64_t tile = n_out;
	cublasStatus_t s;
	int r;

	if (n_in > INT32_MAX || n_out > INT32_MAX || (direct && dw->row_bytes != (size_t)n_in * 2)) {
		snprintf(cb->last_err, sizeof cb->last_err, "cublasGemmEx: %s weights of %lld x %lld",
			 direct ? "padded half" : "too large", (long long)n_out, (long long)n_in);
		return -ENOTSUP;
	}
	size_t need = xb;
	if (!direct) {
		tile = (int64_t)(CB_GEMM_TILE_BYTES / ((size_t)n_in * 2)) / 64 * 64;
		if (tile < 64)
			tile = 64;
		need += (size_t)tile * (size_t)n_in * 2; /* before the cut to n_out: see above */
		if (tile > n_out)
			tile = n_out;
	}
	if (!x && need > cb->gemm_scratch_cap) {
		snprintf(cb->last_err, sizeof cb->last_err, "internal error: no rounded rows to reuse");
		return -EIO;
	}
	if ((r = cb_grow(cb, &cb->gemm_scratch, &cb->gemm_scratch_cap, need)) < 0)
		return r;
	void *xh = cb->gemm_scratch, *wh = (char *)cb->gemm_scratch + xb;
	if (x && (r = cb_launched(cb, "cuda_to_half",
				  CB_TIMED(cb, cuda_to_half(x, (int64_t)T * n_in, bf16, xh, &cb->launch)))) < 0)
		return r;
	for (int64_t row0 = 0; row0 < n_out; row0 += tile) {
		const int64_t rows = n_out - row0 < tile ? n_out - row0 : tile;
		const void *a = (const char *)dw->data + (size_t)row0 * dw->row_bytes;
		if (!direct) {
			r = cb_launched(cb, "cuda_dequant_f16",
					CB_TIMED(cb, cuda_dequant_f16(dw, row0, rows, wh, &cb->launch)));
			if (r < 0)
				return r;
			a = wh;
		}
		/* column-major: out^T (rows, T) at out + row0, ld n_out */
		if (cb->prof)
			snprintf(cb->prof->next, sizeof cb->prof->next, "cublasGemmEx %s n_in=%lld n_out=%lld",
				 bf16 ? "bf16" : "f16", (long long)n_in, (long long)rows),
			cb->prof->next_bytes = (double)rows * (double)n_in * 2;
		cb_prof_begin(cb);
		s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, T, (int)n_in, &one, a, ht,
				 (int)n_in, xh, ht, (int)n_in, &zero, out + row0, CUDA_R_32F, (int)n_out,
				 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		cb_prof_end(cb, "cublasGemmEx");
		if (s != CUBLAS_STATUS_SUCCESS)
			return cb_fail_blas(cb, "cublasGemmEx", s);
	}
	return 0;
}

/* Whether device weight DW goes through cuBLAS in half precision for T rows. */
static int cb_mm_half(const struct cuda_backend *cb, const struct bk_weight *dw, int32_t T)
{
	return dw->type == QT_F16 || dw->type == QT_BF16 ||
	       (cb->gemm_rows > 0 && T >= cb->gemm_rows && !cb->capturing &&
		cuda_matmul_scratch_bytes(dw, 1) > 0);
}

/* Each weight on its path; runs of quantized ones of a type (a layer's q,
 * k and v; or of types that cuda_matmul_mixes) take one launch, and all
 * share one quantization of x (the weights share its type: Q4_K and Q6_K
 * both take Q8_K). */
static int cb_matmul(struct backend *be, const struct bk_weight *const *w, int nw, const float *x,
		     int32_t T, float *const *out)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw[CUDA_MM_GROUP];
	const struct bk_weight *run[CUDA_MM_GROUP];
	int r;

	int quantized = 0; /* x sits quantized in mm_scratch for this call */
	int halved = 0;    /* x sits rounded to half in gemm_scratch */
	/* the op before quantized x for us (cb_fuse_end), if nothing ran since */
	const int handed = cb->xq_src == x && cb->xq_T == T && cb->xq_calls == cb->calls;
	cb->xq_src = NULL;

	for (int k = 0; k < nw;) {
		if ((r = cb_weight(cb, w[k], &dw[0])) < 0)
			return r;
		if (dw[0].type == QT_F32) {
			r = cb_matmul_f32(cb, &dw[0], x, T, out[k]);
		} else if (cb_mm_half(cb, &dw[0], T)) {
			r = cb_matmul_half(cb, &dw[0], halved ? NULL : x, T, out[k]);
			halved = r == 0;
		} else if (dw[0].type == QT_Q5_0 || dw[0].type == QT_Q5_1) {
			snprintf(cb->last_err, sizeof cb->last_err,
				 "matmul: %s weights are not supported on CUDA yet",
				 qtype_get(dw[0].type) ? qtype_get(dw[0].type)->name : "these");
			r = -ENOTSUP;
		} else {
			/* this weight and those after it of its type, up to a launch's worth */
			int n = 1;
			run[0] = &dw[0];
			while (n < CUDA_MM_GROUP && k + n < nw && cuda_matmul_mixes(w[k + n]->type, dw[0].type, T, &cb->tuning)) {
				if ((r = cb_weight(cb, w[k + n], &dw[n])) < 0)
					return r;
				run[n] = &dw[n];
				n++;
			}
			size_t need = cuda_matmul_scratch_bytes(&dw[0], T);
			if (handed && dw[0].n_in == cb->xq_n && qtype_get(dw[0].type) &&
			    qtype_get(dw[0].type)->vec_type == cb->xq_vec)
				quantized = 1;
			if (cb->prof)
				cb_prof_matmul(cb, run, n);
			if (quantized || (r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, need)) == 0)
				r = cb_launched(cb, "cuda_matmul_q_group",
						CB_TIMED(cb, cuda_matmul_q_group(run, n, quantized ? NULL : x, T,
										 out + k, cb->mm_scratch,
										 &cb->launch)));
			if (r < 0)
				return r;
			quantized = 1;
			k += n;
			continue;
		}
		if (r < 0)
			return r;
		k++;
	}
	return 0;
}

/* Whether the op before NEXT's matmul may quantize its output (T rows of
 * N) for it: NEXT a weight that cb_matmul will run on its integer kernels
 * (those with a quantized scratch: Q4_0, Q4_1, Q8_0, the K-quants).  Then
 * 1, with mm_scratch grown for it, *RET_STRIDE its row stride and *DW the
 * device weight; else 0, or a negative errno. */
static int cb_fuse_begin(struct cuda_backend *cb, const struct bk_weight *next, int32_t T, int64_t n,
			 struct bk_weight *dw, size_t *ret_stride)
{
	const size_t stride = next && next->n_in == n ? cuda_matmul_scratch_bytes(next, 1) : 0;
	int r;

	if (!stride || T < 1)
		return 0;
	if ((r = cb_weight(cb, next, dw)) < 0)
		return r;
	if (cb_mm_half(cb, dw, T))
		return 0;
	if ((r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, stride * (size_t)T)) < 0)
		return r;
	*ret_stride = stride;
	return 1;
}

/* The launch R of a kernel that quantized OUT for DW (cb_fuse_begin): the
 * next cb_matmul on OUT takes mm_scratch as it is, if nothing runs before. */
static int cb_fuse_end(struct cuda_backend *cb, const char *call, int r, const float *out, int32_t T,
		       const struct bk_weight *dw)
{
	if ((r = cb_launched(cb, call, r)) < 0)
		return r;
	cb->xq_src = out;
	cb->xq_T = T;
	cb->xq_n = dw->n_in;
	cb->xq_vec = qtype_get(dw->type)->vec_type;
	cb->xq_calls = cb->calls;
	return 0;
}

static int cb_rope(struct backend *be, float *x, int32_t T, int32_t n_head, int32_t head_dim,
		   int32_t n_rot, const int32_t *pos, float freq_base, enum bk_rope_style style)
{
	struct cuda_backend *cb = cbk(be);
	const int32_t *dpos = cb->d_pos;
	int r;

	if (pos != cb->step_pos || T > cb->step_n) {
		if ((r = cb_grow(cb, (void **)&cb->d_pos2, &cb->d_pos2_cap, (size_t)T * sizeof(int32_t))) < 0)
			return r;
		CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos2, pos, (size_t)T * sizeof(int32_t),
					    cudaMemcpyHostToDevice, cb->stream));
		dpos = cb->d_pos2;
	}
	return cb_launched(cb, "cuda_rope", CB_TIMED(cb, cuda_rope(x, T, n_head, head_dim, n_rot, dpos,
								  freq_base, style, &cb->launch)));
}

static int cb_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
		       const struct bk_rows *rows, const float *k, const float *v)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	int r;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0)
		return r;
	return cb_launched(cb, "cuda_kv_store",
			   CB_TIMED(cb, cuda_kv_store(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
						      cb->table_stride, k, v, &cb->launch)));
}

static int cb_rope_kv_store(struct backend *be, const struct bk_kv *kv, int32_t layer,
			    const struct bk_rows *rows, const struct bk_attn *a, int32_t n_rot,
			    float freq_base, enum bk_rope_style style, float *q, float *k, const float *v)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	int r;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0)
		return r;
	return cb_launched(cb, "cuda_rope_kv_store",
			   CB_TIMED(cb, cuda_rope_kv_store(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
							   cb->table_stride, a, n_rot, freq_base, style, q, k, v,
							   &cb->launch)));
}

static int cb_attention(struct backend *be, const struct bk_kv *kv, int32_t layer,
			const struct bk_rows *rows, const struct bk_attn *a, const float *q, float *out,
			const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_kv dkv;
	struct bk_weight dw;
	size_t need, stride;
	int r, fused;

	if ((r = cb_kv(cb, kv, &dkv)) < 0 || (r = cb_rows(cb, rows, kv->block_tokens)) < 0 ||
	    (fused = r = cb_fuse_begin(cb, next, rows->n, (int64_t)a->n_head * a->head_dim, &dw, &stride)) < 0)
		return r;
	cb->attn = *a;
	cb->has_attn = 1;
	need = cuda_attention_scratch_bytes(&dkv, a, rows->n, cb->table_stride, &cb->tuning);
	if (!need) {
		snprintf(cb->last_err, sizeof cb->last_err, "cuda_attention: unsupported shapes");
		return -EINVAL;
	}
	if ((r = cb_grow(cb, &cb->att_scratch, &cb->att_scratch_cap, need)) < 0)
		return r;
	if (fused)
		return cb_fuse_end(cb, "cuda_attention_q8",
				   CB_TIMED(cb, cuda_attention_q8(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
								  cb->table_stride, a, q, out,
								  cb->capturing ? NULL : rows, cb->att_scratch,
								  qtype_get(dw.type)->vec_type, cb->mm_scratch,
								  stride, &cb->launch)),
				   out, rows->n, &dw);
	return cb_launched(cb, "cuda_attention",
			   CB_TIMED(cb, cuda_attention(&dkv, layer, rows->n, cb->d_pos, cb->d_tables,
						       cb->table_stride, a, q, out, cb->capturing ? NULL : rows,
						       cb->att_scratch, &cb->launch)));
}

static int cb_swiglu(struct backend *be, const float *g, const float *u, int64_t n, float *out,
		     const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	size_t stride;
	int r = 0;
	/* out as rows of next's input, when it is that */
	const int32_t T = next && next->n_in > 0 && n % next->n_in == 0 && n / next->n_in <= INT32_MAX
		? (int32_t)(n / next->n_in) : 0;

	if (T && (r = cb_fuse_begin(cb, next, T, next->n_in, &dw, &stride)) < 0)
		return r;
	if (r)
		return cb_fuse_end(cb, "cuda_swiglu_q8",
				   CB_TIMED(cb, cuda_swiglu_q8(g, u, T, next->n_in, out,
							       qtype_get(dw.type)->vec_type, cb->mm_scratch,
							       stride, &cb->launch)),
				   out, T, &dw);
	return cb_launched(cb, "cuda_swiglu", CB_TIMED(cb, cuda_swiglu(g, u, n, out, &cb->launch)));
}

static int cb_add(struct backend *be, float *x, const float *y, int64_t n)
{
	return cb_launched(cbk(be), "cuda_add", CB_TIMED(cbk(be), cuda_add(x, y, n, &cbk(be)->launch)));
}

/* add_rmsnorm, or rmsnorm with Y NULL (then x is only read), quantizing
 * out for NEXT when it may (cb_fuse_begin). */
static int cb_norm(struct backend *be, float *x, const float *y, const float *g, int32_t T, int64_t n,
		   float eps, float *out, const struct bk_weight *next)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	size_t stride;
	void *dg;
	int r;

	if ((r = cb_device_copy(cb, g, (size_t)n * sizeof(float), &dg)) < 0 ||
	    (r = cb_fuse_begin(cb, next, T, n, &dw, &stride)) < 0)
		return r;
	if (r) {
		const uint32_t vec = qtype_get(dw.type)->vec_type;
		return cb_fuse_end(cb, y ? "cuda_add_rmsnorm_q8" : "cuda_rmsnorm_q8",
				   y ? CB_TIMED(cb, cuda_add_rmsnorm_q8(x, y, dg, T, n, eps, out, vec, cb->mm_scratch, stride,
							   &cb->launch))
				     : CB_TIMED(cb, cuda_rmsnorm_q8(x, dg, T, n, eps, out, vec, cb->mm_scratch,
								    stride, &cb->launch)),
				   out, T, &dw);
	}
	if (y)
		return cb_launched(cb, "cuda_add_rmsnorm",
				   CB_TIMED(cb, cuda_add_rmsnorm(x, y, dg, T, n, eps, out, &cb->launch)));
	return cb_launched(cb, "cuda_rmsnorm",
			   CB_TIMED(cb, cuda_rmsnorm(x, dg, T, n, eps, out, &cb->launch)));
}

static int cb_rmsnorm(struct backend *be, const float *x, const float *g, int32_t T, int64_t n,
		      float eps, float *out, const struct bk_weight *next)
{
	return cb_norm(be, (float *)x, NULL, g, T, n, eps, out, next);
}

static int cb_add_rmsnorm(struct backend *be, float *x, const float *y, const float *g, int32_t T,
			  int64_t n, float eps, float *out, const struct bk_weight *next)
{
	return cb_norm(be, x, y, g, T, n, eps, out, next);
}

/* ---- memory hooks ---- */

/* 1: the ops read the device copy from now on, and find it by W's host
 * pointer alone (cb_device_copy reads the host bytes only at a weight's
 * first upload).  The copy is waited for, so that the caller may release
 * the host's bytes as soon as this returns (a pageable cudaMemcpyAsync may
 * still be reading them, and the emulator's runs when the stream does). */
static int cb_load_weight(struct backend *be, const struct bk_weight *w)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	int r = cb_weight(cb, w, &dw);

	if (r < 0)
		return r;
	CB_CUDA(cb, cudaStreamSynchronize(cb->stream));
	return 1;
}

static int cb_kv_attach(struct backend *be, const struct bk_kv *kv)
{
	struct bk_kv dkv;

	return cb_kv(cbk(be), kv, &dkv);
}

static void *cb_alloc(struct backend *be, size_t bytes)
{
	struct cuda_backend *cb = cbk(be);
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);

	if (e != cudaSuccess) {
		cb_fail_cuda(cb, "cudaMalloc(activations)", e);
		return NULL;
	}
	return p;
}

static void cb_release(struct backend *be, void *p)
{
	if (p)
		cudaFree(p);
}

static int cb_copy_rows(struct backend *be, float *dst, const float *src, int64_t n)
{
	struct cuda_backend *cb = cbk(be);

	CB_CUDA(cb, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
				    cb->stream));
	return 0;
}

/* The host's only wait: the step's logits. */
static int cb_download(struct backend *be, void *host_dst, const void *src, size_t bytes)
{
	struct cuda_backend *cb = cbk(be);

	CB_CUDA(cb, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
	CB_CUDA(cb, cudaStreamSynchronize(cb->stream));
	cb_prof_read(cb);
	return 0;
}

/* ---- graphs ---- */

/* Rows a graph of a step of N rows has: 1, 2, 4, 8, then multiples of 8. */
static int32_t cb_graph_rows(int32_t n)
{
	int32_t r = 1;

	if (n > 8)
		return (n + 7) / 8 * 8;
	while (r < n)
		r *= 2;
	return r;
}

static void cb_graph_drop(struct cb_graph *g)
{
	if (g->exec)
		cudaGraphExecDestroy(g->exec);
	memset(g, 0, sizeof *g);
}

/* Fills the step buffers for ROWS padded to TB rows of STRIDE table entries:
 * ids 0, position -1 and an empty table for the spare rows. */
static int cb_graph_inputs(struct cuda_backend *cb, const struct bk_rows *rows, const int32_t *ids,
			   int32_t TB, int32_t stride)
{
	const int32_t bt = cb->kv_view.block_tokens;
	const size_t n_tab = (size_t)TB * (size_t)stride;
	const size_t bytes = (2 * (size_t)TB + n_tab) * sizeof(int32_t);
	int32_t *h_ids, *h_pos, *h_tab;
	int r;

	if ((r = cb_stage(cb, bytes)) < 0)
		return r;
	h_ids = cb->h_tables;
	h_pos = h_ids + TB;
	h_tab = h_pos + TB;
	for (int32_t t = 0; t < TB; t++) {
		h_ids[t] = t < rows->n ? ids[t] : 0;
		h_pos[t] = t < rows->n ? rows->pos[t] : -1;
	}
	cb_flatten_tables(rows, bt, stride, h_tab);
	memset(h_tab + (size_t)rows->n * stride, 0, (size_t)(TB - rows->n) * stride * sizeof(int32_t));
	if ((r = cb_grow(cb, (void **)&cb->d_ids, &cb->d_ids_cap, (size_t)TB * sizeof(int32_t))) < 0 ||
	    (r = cb_grow(cb, (void **)&cb->d_pos, &cb->d_pos_cap, (size_t)TB * sizeof(int32_t))) < 0 ||
	    (r = cb_grow(cb, (void **)&cb->d_tables, &cb->d_tables_cap, n_tab * sizeof(int32_t))) < 0)
		return r;
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_ids, h_ids, (size_t)TB * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_pos, h_pos, (size_t)TB * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	CB_CUDA(cb, cudaMemcpyAsync(cb->d_tables, h_tab, n_tab * sizeof(int32_t),
				    cudaMemcpyHostToDevice, cb->stream));
	cb->step_n = TB;
	cb->step_pos = rows->pos;
	cb->step_table = rows->block_table;
	cb->step_ids = ids;
	cb->step_bt = bt;
	cb->table_stride = stride;
	return 0;
}

static int cb_graph_end(struct backend *be, int failed);

static int cb_graph_begin(struct backend *be, const struct bk_rows *rows, const int32_t *ids,
			  int32_t max_rows, int32_t *ret_rows)
{
	struct cuda_backend *cb = cbk(be);
	int32_t TB, need, stride = 4;
	size_t att;
	int r;

	if (cb->capturing)
		cb_graph_end(be, 1);
	/* the first steps run uncaptured: they attach the pool, upload every
	 * weight and show attention's shape, which size the buffers below;
	 * and every step when profiling (a replay hides its kernels) */
	if (!cb->kv_dev || !cb->has_attn || rows->n < 1 || rows->n > CB_GRAPH_MAX_ROWS || cb->prof)
		return 2;
	TB = cb_graph_rows(rows->n);
	if (TB > max_rows)
		TB = max_rows;
	if (TB < rows->n)
		return 2;
	need = cb_table_need(rows, cb->kv_view.block_tokens);
	while (stride < need)
		stride *= 2;
	att = cuda_attention_scratch_bytes(&cb->kv_view, &cb->attn, TB, stride, &cb->tuning);
	if (!att)
		return 2;
	if ((r = cb_use_device(cb)) < 0 ||
	    (r = cb_grow(cb, &cb->att_scratch, &cb->att_scratch_cap, att)) < 0 ||
	    (r = cb_grow(cb, &cb->mm_scratch, &cb->mm_scratch_cap, cb->mm_row_bytes * (size_t)TB)) < 0 ||
	    (r = cb_grow(cb, &cb->gemm_scratch, &cb->gemm_scratch_cap,
			 (cb->half_row_bytes * (size_t)TB + 255) / 256 * 256)) < 0 ||
	    (r = cb_graph_inputs(cb, rows, ids, TB, stride)) < 0)
		return r;

	struct cb_graph *g = NULL;
	for (int i = 0; i < CB_N_GRAPHS; i++) {
		struct cb_graph *x = &cb->graphs[i];
		if (x->exec && x->gen != cb->buf_gen)
			cb_graph_drop(x);
		else if (x->exec && x->rows == TB && x->stride == stride)
			g = x;
	}
	*ret_rows = TB;
	if (g) {
		g->used = ++cb->clock;
		CB_CUDA(cb, cudaGraphLaunch(g->exec, cb->stream));
		return 1;
	}
	/* thread-local: another thread's CUDA calls do not spoil the capture */
	CB_CUDA(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
	cb->capturing = 1;
	return 0;
}

static int cb_graph_end(struct backend *be, int failed)
{
	struct cuda_backend *cb = cbk(be);
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaError_t e;

	if (!cb->capturing)
		return 0;
	cb->capturing = 0;
	e = cudaStreamEndCapture(cb->stream, &graph);
	if (failed || e != cudaSuccess) {
		if (graph)
			cudaGraphDestroy(graph);
		return failed ? 0 : cb_fail_cuda(cb, "cudaStreamEndCapture", e);
	}
	e = cudaGraphInstantiate(&exec, graph, 0);
	cudaGraphDestroy(graph);
	if (e != cudaSuccess)
		return cb_fail_cuda(cb, "cudaGraphInstantiate", e);

	struct cb_graph *slot = &cb->graphs[0];
	for (int i = 0; i < CB_N_GRAPHS; i++) {
		if (!cb->graphs[i].exec) {
			slot = &cb->graphs[i];
			break;
		}
		if (cb->graphs[i].used < slot->used)
			slot = &cb->graphs[i];
	}
	cb_graph_drop(slot);
	slot->exec = exec;
	slot->rows = cb->step_n;
	slot->stride = cb->table_stride;
	slot->gen = cb->buf_gen;
	slot->used = ++cb->clock;
	CB_CUDA(cb, cudaGraphLaunch(exec, cb->stream));
	return 0;
}

static void cb_free(struct backend *be)
{
	struct cuda_backend *cb = cbk(be);

	if (!cb)
		return;
	cudaSetDevice(cb->device);
	if (cb->capturing)
		cb_graph_end(be, 1);
	cb_prof_free(cb);
	for (int i = 0; i < CB_N_GRAPHS; i++)
		cb_graph_drop(&cb->graphs[i]);
	for (size_t i = 0; i < cb->map_cap; i++)
		if (cb->map[i].host)
			cudaFree(cb->map[i].dev);
	free(cb->map);
	void *bufs[] = { cb->kv_dev, cb->d_pos, cb->d_tables, cb->d_ids, cb->d_pos2,
			 cb->mm_scratch, cb->att_scratch, cb->gemm_scratch, cb->blas_ws };
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		if (bufs[i])
			cudaFree(bufs[i]);
	free(cb->h_tables);
	if (cb->blas)
		cublasDestroy(cb->blas);
	if (cb->stream)
		cudaStreamDestroy(cb->stream);
	free(cb);
}

static int cb_device_info(struct backend *be, struct bk_device_info *ret)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cudaDeviceProp prop;
	size_t free_b = 0, total_b = 0;
	int r;

	if ((r = cb_use_device(cb)) < 0)
		return r;
	CB_CUDA(cb, cudaGetDeviceProperties(&prop, cb->device));
	CB_CUDA(cb, cudaMemGetInfo(&free_b, &total_b));
	snprintf(ret->name, sizeof ret->name, "%.127s", prop.name);
	ret->index = cb->device;
	ret->total_bytes = total_b;
	ret->free_bytes = free_b;
	return 0;
}

static const struct backend_ops cuda_ops = {
#ifdef LLMD_CUDA_EMU_H
	.name = "cuda-emu",
#else
	.name = "cuda",
#endif
	.free = cb_free,
	.device_info = cb_device_info,
	.embed = cb_embed,
	.rmsnorm = cb_rmsnorm,
	.matmul = cb_matmul,
	.rope = cb_rope,
	.kv_store = cb_kv_store,
	.attention = cb_attention,
	.swiglu = cb_swiglu,
	.add = cb_add,
	.alloc = cb_alloc,
	.release = cb_release,
	.begin_step = cb_begin_step,
	.copy_rows = cb_copy_rows,
	.download = cb_download,
	.graph_begin = cb_graph_begin,
	.graph_end = cb_graph_end,
	.load_weight = cb_load_weight,
	.kv_attach = cb_kv_attach,
	.add_rmsnorm = cb_add_rmsnorm,
	.rope_kv_store = cb_rope_kv_store,
	.last_error = cb_last_error,
	.write_profile = cb_write_profile,
	.set_gemm_rows = cb_set_gemm_rows,
};

int cuda_backend_emulated(void)
{
#ifdef LLMD_CUDA_EMU_H
	return 1;
#else
	return 0;
#endif
}

int cuda_backend_device_count(char *err, size_t errlen)
{
	cudaError_t e;
	int n = 0;

	if ((e = cudaGetDeviceCount(&n)) != cudaSuccess) {
		cudaGetLastError(); /* not sticky: clear it */
		snprintf(err, errlen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return -ENODEV;
	}
	if (n <= 0) {
		snprintf(err, errlen, "cudaGetDeviceCount: no CUDA device");
		return 0;
	}
	if (errlen)
		err[0] = 0;
	return n;
}

/* The launchers' view of the backend: its stream and TUNING (copied), PDL
 * where the device has it (compute capability 9.0 and up), its SMs. */
static void cb_tune(struct cuda_backend *cb, const struct cuda_tuning *tuning)
{
	int major = 0, sms = 0;

	if (tuning) {
		cb->tuning = *tuning;
	} else {
		cuda_tuning_defaults(&cb->tuning);
		cuda_tuning_from_env(&cb->tuning);
	}
	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cb->device) != cudaSuccess)
		major = 0;
	if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cb->device) != cudaSuccess)
		sms = 0;
	cb->launch.stream = cb->stream;
	cb->launch.tuning = &cb->tuning;
	cb->launch.pdl = cb->tuning.pdl && major >= 9;
	cb->launch.sms = sms > 0 ? sms : 0;
}

int cuda_backend_new(int device, const struct cuda_tuning *tuning, struct backend **ret, char *err,
		     size_t errlen)
{
	struct cuda_backend *cb;
	cudaError_t e;
	cublasStatus_t s;
	char why[200];
	int n;

	if ((n = cuda_backend_device_count(why, sizeof why)) <= 0) {
		snprintf(err, errlen, "no usable CUDA device: %s", why);
		return -ENODEV;
	}
	if (device < 0 || device >= n) {
		snprintf(err, errlen, "CUDA device %d does not exist (%d found)", device, n);
		return -ENODEV;
	}
	if ((e = cudaSetDevice(device)) != cudaSuccess) {
		snprintf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
		return -EIO;
	}
	cb = calloc(1, sizeof *cb);
	if (!cb) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cb->be.ops = &cuda_ops;
	cb->device = device;
	if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		snprintf(err, errlen, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
		cb->stream = NULL;
		cb_free(&cb->be);
		return -EIO;
	}
	cb_tune(cb, tuning);
	cb_prof_new(cb);
	if ((e = cudaMalloc(&cb->blas_ws, CB_BLAS_WORKSPACE)) != cudaSuccess) {
		snprintf(err, errlen, "cudaMalloc(%u MiB cuBLAS workspace): %s", CB_BLAS_WORKSPACE >> 20,
			 cudaGetErrorString(e));
		cb->blas_ws = NULL;
		cb_free(&cb->be);
		return -ENOMEM;
	}
	if ((s = cublasCreate(&cb->blas)) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasCreate: %s", cublasGetStatusName(s));
		cb->blas = NULL;
		cb_free(&cb->be);
		return -EIO;
	}
	if ((s = cublasSetStream(cb->blas, cb->stream)) != CUBLAS_STATUS_SUCCESS ||
	    (s = cublasSetWorkspace(cb->blas, cb->blas_ws, CB_BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasSetStream/cublasSetWorkspace: %s", cublasGetStatusName(s));
		cb_free(&cb->be);
		return -EIO;
	}
	*ret = &cb->be;
	return 0;
}
