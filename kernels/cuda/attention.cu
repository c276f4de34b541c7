/* attention.cu - the paged KV pool on CUDA: kv_store writes a step's K/V
 * rows into the pool (F32, F16, Q8_0 exactly as the CPU backend does) and
 * attention reads them back through each row's block table.
 *
 * Attention is flash decoding: a row's positions 0..pos are cut into splits
 * of ATTN_SPLIT_TOKENS positions (rounded up to whole KV blocks), doubled
 * as the row grows past ATTN_MAX_SPLITS of them; one CUDA
 * block per (row, kv head, split) streams its split a tile of positions at
 * a time with online softmax for every query head of the kv head's group
 * (GQA: the group shares each K/V tile loaded into shared memory; scores
 * and weighted V spread over lanes, attn_split_lanes_kernel) and writes a
 * partial (max, sum, acc[head_dim]) per query head;
 * attn_reduce_lanes_kernel combines a row's partials.  The split size is a
 * function of the row's position alone, so is its arithmetic
 * (batch invariance).  The reduction may also quantize its rows for the
 * o projection's matmul (as the norms do for theirs: quant_q8.cuh), saving
 * that matmul its own quantization launch.  Prefill rows (several rows of
 * one sequence at consecutive positions) share a split block, up to qrows
 * of them: each K/V tile is read from the pool once for all of them (flash
 * attention over a tile of queries), while each row keeps the very
 * operations it runs alone.
 */
#include "cuda_compat.h"

#include <errno.h>
#include <math.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "quant.h"
}

#include "cuda_mma.h"
#include "cuda_ops.h"
#include "quant_q8.cuh"
#include "rope.cuh"

/* A row's splits: the tuning's attn_split positions each (rounded up to
 * whole KV blocks; ATTN_SPLIT_TOKENS without one), doubled as often as it
 * takes for ATTN_MAX_SPLITS of them to cover the row (attn_split_size); a
 * test may set both. */
#ifndef ATTN_SPLIT_TOKENS
#define ATTN_SPLIT_TOKENS 16
#endif
#ifndef ATTN_MAX_SPLITS
#define ATTN_MAX_SPLITS 32
#endif

/* Positions per split at the shortest with TUNING (NULL: ATTN_SPLIT_TOKENS). */
static int32_t attn_split_tokens(const struct cuda_tuning *tuning)
{
	return tuning && tuning->attn_split >= 1 ? tuning->attn_split : ATTN_SPLIT_TOKENS;
}

#define ATTN_MAX_TILE 32          /* positions of K/V staged in shared memory at once */
static_assert(ATTN_MAX_TILE <= 32, "the online softmax gives each position of a tile a lane");
#define ATTN_ROW_CHUNK 64         /* rows per launch pair: bounds the scratch */
#define ATTN_MAX_QROWS 16         /* rows of one sequence a split block takes at once */
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_MAX_GROUP 64
#define ATTN_SMEM_LIMIT (48 * 1024) /* dynamic shared memory without opt-in */
#define KV_STORE_THREADS 128      /* whole warps: the Q8_0 path shuffles */
static_assert(Q8K_THREADS == QK_K, "a block of the quantizing reduction is one Q8_K super-block");

/* The pool of one layer as a kernel sees it (passed by value). */
struct kv_view {
	char *base;
	uint32_t type;
	int32_t block_tokens;
	int32_t layer;
	int32_t kv_dim;
	size_t row_bytes;
	size_t block_bytes;
};

/* Start of the row (K when which == 0, V when 1) of position P. */
static __device__ __forceinline__ char *kv_row(const kv_view &kv, const int32_t *table, int which,
	int32_t p)
{
	const int32_t b = table[p / kv.block_tokens];
	const int32_t t = p % kv.block_tokens;
	return kv.base + (size_t)b * kv.block_bytes +
		(((size_t)kv.layer * 2 + which) * kv.block_tokens + t) * kv.row_bytes;
}

/* Element E of a pool row as a float: the CPU's conversion (Q8_0: the int8
 * times its block's f16 scale, one float product). */
static __device__ __forceinline__ float kv_elem(const char *row, uint32_t type, int32_t e)
{
	if (type == QT_F32)
		return reinterpret_cast<const float *>(row)[e];
	if (type == QT_F16)
		return __half2float(reinterpret_cast<const __half *>(row)[e]);
	const char *blk = row + (size_t)(e / QK) * sizeof(struct block_q8_0);
	const float d = __half2float(*reinterpret_cast<const __half *>(blk));
	return (float)reinterpret_cast<const int8_t *>(blk + sizeof(qt_f16))[e % QK] * d;
}

/* ---- kv_store ---- */

/* One block per (row, K or V): F32 copies, F16 rounds to nearest even, Q8_0
 * gives each 32-element block to one warp: amax by shuffles, then
 * d = amax / 127, id = 127 / amax, q = round-half-even(x * id) as quant.c's
 * quantize_q8_0 (IEEE divisions and a lone multiply: nothing to contract).
 * A thread loads KV_STORE_BATCH elements (blocks) before it stores any. */
#define KV_STORE_BATCH 4
/* SRC (kv_dim floats) into the pool row at DST, converted to the pool's type. */
static __device__ __forceinline__ void kv_store_row(const kv_view &kv, char *dst, const float *src)
{
	if (kv.type != QT_Q8_0) {
		const int nt = blockDim.x;
		for (int c0 = threadIdx.x; c0 < kv.kv_dim; c0 += KV_STORE_BATCH * nt) {
			float x[KV_STORE_BATCH];
UNROLL
			for (int j = 0; j < KV_STORE_BATCH; j++)
				x[j] = c0 + j * nt < kv.kv_dim ? src[c0 + j * nt] : 0.0f;
UNROLL
			for (int j = 0; j < KV_STORE_BATCH; j++) {
				const int c = c0 + j * nt;
				if (c >= kv.kv_dim)
					continue;
				if (kv.type == QT_F32)
					reinterpret_cast<float *>(dst)[c] = x[j];
				else
					reinterpret_cast<__half *>(dst)[c] = __float2half_rn(x[j]);
			}
		}
		return;
	}
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
	const int nb = kv.kv_dim / QK;
	for (int b0 = warp; b0 < nb; b0 += KV_STORE_BATCH * n_warps) { /* uniform across the warp */
		float x[KV_STORE_BATCH];
UNROLL
		for (int j = 0; j < KV_STORE_BATCH; j++)
			x[j] = b0 + j * n_warps < nb ? src[(b0 + j * n_warps) * QK + lane] : 0.0f;
UNROLL
		for (int j = 0; j < KV_STORE_BATCH; j++) {
			const int b = b0 + j * n_warps;
			if (b >= nb)
				continue;
			float amax = fabsf(x[j]);
			for (int off = 16; off > 0; off /= 2)
				amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
			const float d = amax / 127.0f;
			const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
			char *blk = dst + (size_t)b * sizeof(struct block_q8_0);
			reinterpret_cast<int8_t *>(blk + sizeof(qt_f16))[lane] = (int8_t)__float2int_rn(x[j] * id);
			if (lane == 0)
				*reinterpret_cast<__half *>(blk) = __float2half_rn(d);
		}
	}
}

static __global__ void kv_store_kernel(kv_view kv, const int32_t *__restrict__ pos,
	const int32_t *__restrict__ tables, int32_t table_stride, const float *__restrict__ k,
	const float *__restrict__ v)
{
	grid_dep_wait();
	const int32_t t = blockIdx.x;
	const int which = blockIdx.y;
	if (pos[t] < 0) /* a padding row: nothing to store */
		return;
	kv_store_row(kv, kv_row(kv, tables + (size_t)t * table_stride, which, pos[t]),
		     (which ? v : k) + (size_t)t * kv.kv_dim);
}

/* rope_kernel on q and k, then kv_store_kernel, in one launch: grid
 * (T, QB + 2), blockIdx.y < QB rotates the row's q heads HQ * y .. (a
 * decode step's many q heads over several blocks), QB rotates its k heads
 * and then stores them (the barrier makes the block's rotated k visible to
 * all its threads), QB + 1 stores its v.  Each block builds the cos/sin
 * table in dynamic shared memory (rope.cuh).  A padding row (negative
 * position) is left alone. */
static __global__ void rope_kv_store_kernel(kv_view kv, const int32_t *__restrict__ pos,
	const int32_t *__restrict__ tables, int32_t table_stride, float *q, float *k,
	const float *__restrict__ v, int32_t n_head, int32_t head_dim, int32_t n_rot,
	rope_angles ra, int neox, int32_t hq)
{
	grid_dep_wait();
	DYN_SHARED(float2, cs);
	const int32_t t = blockIdx.x;
	const int32_t qb = (n_head + hq - 1) / hq, y = blockIdx.y;
	const int32_t p = pos[t];
	if (p < 0)
		return;
	if (y <= qb) {
		rope_table(cs, p, n_rot / 2, ra);
		__syncthreads();
		if (y < qb) {
			const int32_t h0 = y * hq;
			rope_rotate(q + ((size_t)t * n_head + h0) * head_dim, cs, min(hq, n_head - h0), head_dim,
				    n_rot / 2, neox);
			return;
		}
		rope_rotate(k + (size_t)t * kv.kv_dim, cs, kv.kv_dim / head_dim, head_dim, n_rot / 2, neox);
		__syncthreads();
	}
	const int which = y - qb; /* 0: k, 1: v */
	const float *src = (which ? v : k) + (size_t)t * kv.kv_dim;
	kv_store_row(kv, kv_row(kv, tables + (size_t)t * table_stride, which, p), src);
}

/* ---- attention ---- */

struct attn_shape {
	int32_t n_head;
	int32_t n_head_kv;
	int32_t head_dim;
	int32_t group;      /* n_head / n_head_kv */
	float scale;
	int32_t window;     /* sliding window (bk_attn's); 0: none */
	int32_t split_pos;  /* positions per split at the shortest: whole KV blocks */
	int32_t max_splits; /* splits of a row at the most (ATTN_MAX_SPLITS) */
	int32_t n_splits;   /* splits per row in the grid (and the scratch) */
	int32_t tile;       /* positions per shared-memory tile */
	int32_t qrows;      /* rows of one sequence per split block (1 .. ATTN_MAX_QROWS) */
	int32_t vec_load;   /* a head's pool rows load 4 elements at a time (kv_elem4) */
};

/* Floats between consecutive positions of a staged K or V tile: the head
 * plus 4 when whole float4s fit (16-byte rows whose float4 loads spread
 * over the banks: a stride of 4 mod 32 words), else plus 1 (no bank
 * conflicts). */
static __host__ __device__ __forceinline__ int32_t attn_kstride(int32_t hd)
{
	return hd % 4 ? hd + 1 : hd + 4;
}

/* Floats of shared memory a split block of R rows uses (see the carve-up
 * in attn_carve); R positions as ints after them. */
static size_t attn_smem_floats(int32_t R, int32_t group, int32_t hd, int32_t tile)
{
	return (size_t)2 * R * group * hd        /* q, acc */
		+ (size_t)2 * tile * attn_kstride(hd) /* K, V tiles */
		+ (size_t)R * group * tile        /* scores, then weights */
		+ (size_t)3 * R * group           /* running max, sum; correction */
		+ (size_t)R;                      /* the rows' positions */
}

/* Positions per split of a row at position P: sh.split_pos doubled until
 * sh.max_splits splits cover positions 0..P.  Short rows get many small
 * splits (blocks: a decode step's few rows fill the GPU), long ones at most
 * max_splits partials; and it depends on P alone (batch invariance: a
 * row tile's rows share it, attn_row_tiles). */
static __host__ __device__ __forceinline__ int32_t attn_split_size(int32_t p, int32_t split_pos,
	int32_t max_splits)
{
	int64_t S = split_pos;
	while (S * max_splits < (int64_t)p + 1)
		S *= 2;
	return (int32_t)S;
}

/* Four consecutive elements E.. of a pool row as loaded, before kv_cvt4:
 * whole loads of 16 bytes of F32, 8 of F16 (x, y), a Q8_0 block's scale
 * and 4 codes (2-byte aligned: x the scale, y and z two 16-bit loads).
 * The row is aligned for them (attn_plan's vec_load) and E % 4 == 0.
 * Apart from kv_cvt4 so that a tile's loads can be issued well before
 * anything waits on them (attn_split_lanes_kernel's prefetch). */
static __device__ __forceinline__ uint4 kv_load4(const char *row, uint32_t type, int32_t e)
{
	if (type == QT_F32)
		return __ldg(reinterpret_cast<const uint4 *>(row) + e / 4);
	if (type == QT_F16) {
		const uint2 h = __ldg(reinterpret_cast<const uint2 *>(row) + e / 4);
		return make_uint4(h.x, h.y, 0u, 0u);
	}
	const char *blk = row + (size_t)(e / QK) * sizeof(struct block_q8_0);
	const unsigned short *c = reinterpret_cast<const unsigned short *>(blk + sizeof(qt_f16) + e % QK);
	return make_uint4(__ldg(reinterpret_cast<const unsigned short *>(blk)), __ldg(c), __ldg(c + 1), 0u);
}

/* kv_load4's words as the four floats kv_elem gives. */
static __device__ __forceinline__ float4 kv_cvt4(uint4 w, uint32_t type)
{
	if (type == QT_F32)
		return make_float4(__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z),
				   __uint_as_float(w.w));
	if (type == QT_F16)
		return make_float4(__half2float(__ushort_as_half((unsigned short)(w.x & 0xffffu))),
				   __half2float(__ushort_as_half((unsigned short)(w.x >> 16))),
				   __half2float(__ushort_as_half((unsigned short)(w.y & 0xffffu))),
				   __half2float(__ushort_as_half((unsigned short)(w.y >> 16))));
	const float d = __half2float(__ushort_as_half((unsigned short)w.x));
	return make_float4((float)(int8_t)(w.y & 0xffu) * d, (float)(int8_t)(w.y >> 8) * d,
			   (float)(int8_t)(w.z & 0xffu) * d, (float)(int8_t)(w.z >> 8) * d);
}

static __device__ __forceinline__ float4 kv_elem4(const char *row, uint32_t type, int32_t e)
{
	return kv_cvt4(kv_load4(row, type, e), type);
}

/* Loads a thread has in flight at once while it stages (attn_begin). */
#define ATTN_LOAD_BATCH 4

/* The dot product of QG and KR (HD floats) over the elements (HD % 4 ==
 * 0: the float4s) FIRST, FIRST + STEP, ...: with HD % 4 == 0 four fmaf
 * chains, one per element of a float4, summed as (0 + 1) + (2 + 3); else
 * one chain in order.  A function of the two vectors alone (batch
 * invariance).  attn_dot_lanes takes a lane's share. */
static __device__ __forceinline__ float attn_dot_strided(const float *qg, const float *kr, int32_t hd,
	int first, int step)
{
	if (hd % 4) {
		float dot = 0.0f;
		for (int c = first; c < hd; c += step)
			dot = fmaf(qg[c], kr[c], dot);
		return dot;
	}
	const float4 *q4 = reinterpret_cast<const float4 *>(qg), *k4 = reinterpret_cast<const float4 *>(kr);
	float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
UNROLL4
	for (int c = first; c < hd / 4; c += step) {
		const float4 x = q4[c], y = k4[c];
		a.x = fmaf(x.x, y.x, a.x);
		a.y = fmaf(x.y, y.y, a.y);
		a.z = fmaf(x.z, y.z, a.z);
		a.w = fmaf(x.w, y.w, a.w);
	}
	return (a.x + a.y) + (a.z + a.w);
}

/* A split block's shared memory (attn_smem_floats), carved up. */
struct attn_smem {
	float *qs;   /* (R, G, hd) the rows' query heads */
	float *acc;  /* (R, G, hd) their weighted V sums */
	float *kt;   /* (tile, ks) the staged K tile */
	float *vt;   /* (tile, ks) and V tile */
	float *sc;   /* (R, G, tile) scores, then weights */
	float *m;    /* (R, G) running max */
	float *l;    /* (R, G) running sum */
	float *corr; /* (R, G) this tile's rescaling of acc */
	int32_t *rp; /* (R) the rows' positions */
};

static __device__ __forceinline__ attn_smem attn_carve(float *smem, int32_t RG, int32_t hd, int32_t tile,
	int32_t ks)
{
	attn_smem a;
	a.qs = smem;
	a.acc = a.qs + RG * hd;
	a.kt = a.acc + RG * hd;
	a.vt = a.kt + tile * ks;
	a.sc = a.vt + tile * ks;
	a.m = a.sc + RG * tile;
	a.l = a.m + RG;
	a.corr = a.l + RG;
	a.rp = reinterpret_cast<int32_t *>(a.corr + RG);
	return a;
}

/* A split block's start: its rows' query heads of kv head HK into shared
 * memory (ATTN_LOAD_BATCH loads a thread in flight: a decode row's heads
 * are one batch), acc zeroed, the running max and sum reset, the rows'
 * positions.  Visible to the block after its next barrier. */
static __device__ __forceinline__ void attn_begin(const attn_smem &a, const attn_shape &sh,
	const int32_t *__restrict__ pos, const float *__restrict__ q, int32_t t0, int32_t R, int32_t hk)
{
	const int32_t G = sh.group, hd = sh.head_dim, RG = R * G;
	const int tid = threadIdx.x, nt = blockDim.x;
	for (int i0 = tid; i0 < RG * hd; i0 += ATTN_LOAD_BATCH * nt) {
		float x[ATTN_LOAD_BATCH];
UNROLL
		for (int j = 0; j < ATTN_LOAD_BATCH; j++) {
			const int i = i0 + j * nt, r = i / (G * hd), gc = i % (G * hd);
			x[j] = i < RG * hd ? __ldg(&q[((size_t)(t0 + r) * sh.n_head + (size_t)hk * G) * hd + gc]) : 0.0f;
		}
UNROLL
		for (int j = 0; j < ATTN_LOAD_BATCH; j++) {
			const int i = i0 + j * nt;
			if (i < RG * hd) {
				a.qs[i] = x[j];
				a.acc[i] = 0.0f;
			}
		}
	}
	for (int g = tid; g < RG; g += nt) {
		a.m[g] = -INFINITY;
		a.l[g] = 0.0f;
	}
	for (int r = tid; r < R; r += nt)
		a.rp[r] = pos[t0 + r];
}

/* A split block's end, after a barrier: each row's partial (max, sum,
 * acc) of split S for its query heads, at
 * (((row - row0) * n_head + h) * n_splits + s) * (hd + 2); a split past
 * the row's last position writes nothing (the reduction never reads it). */
static __device__ __forceinline__ void attn_write_partial(const attn_smem &a, const attn_shape &sh,
	int32_t t0, int32_t R, int32_t hk, int32_t row0, int32_t s, int32_t p0, float *__restrict__ partial)
{
	const int32_t G = sh.group, hd = sh.head_dim, RG = R * G;
	const size_t stride = (size_t)hd + 2;
	for (int i = threadIdx.x; i < RG * hd; i += blockDim.x) {
		const int rg = i / hd, c = i % hd, r = rg / G, g = rg % G;
		if (a.rp[r] < p0)
			continue; /* this split is past the row's position */
		const int32_t h = hk * G + g;
		float *pp = partial + (((size_t)(t0 + r - row0) * sh.n_head + h) * sh.n_splits + s) * stride;
		pp[2 + c] = a.acc[i];
		if (c == 0) {
			pp[0] = a.m[rg];
			pp[1] = a.l[rg];
		}
	}
}

/* A split block's rows and positions (attn_split_lanes_kernel's grid). */
struct attn_rows {
	int32_t t0;           /* the first row */
	int32_t R;            /* rows, of one sequence at consecutive positions */
	int32_t p0, P1;       /* the split's positions [p0, P1) the block reads */
	const int32_t *table; /* the last row's block table: it covers them all */
	int32_t n_split;      /* the tile's splits that hold positions (0: padding rows) */
};

/* This block's attn_rows in *RET; false when it has no position (padding
 * rows, or a split past the last row's position): the whole block then
 * leaves, before any barrier (t0, R and n_split are set either way). */
static __device__ __forceinline__ bool attn_rows_of(const int32_t *__restrict__ pos,
	const int32_t *__restrict__ tables, int32_t table_stride, const attn_shape &sh, int32_t row0,
	const int32_t *__restrict__ tiles, int32_t tile_base, attn_rows *ret)
{
	const int32_t t0 = tiles ? tiles[2 * (tile_base + blockIdx.z)] : row0 + (int32_t)blockIdx.z;
	const int32_t R = tiles ? tiles[2 * (tile_base + blockIdx.z) + 1] : 1;
	const int32_t last = pos[t0 + R - 1];  /* the tile's largest position */
	const int32_t S = attn_split_size(last, sh.split_pos, sh.max_splits); /* every row's */
	const int32_t p0 = (int32_t)blockIdx.x * S;
	ret->t0 = t0;
	ret->R = R;
	ret->n_split = last < 0 ? 0 : last / S + 1;
	if (last < 0 || p0 >= last + 1)
		return false;
	ret->p0 = p0;
	ret->P1 = min(p0 + S, last + 1);
	ret->table = tables + (size_t)(t0 + R - 1) * table_stride;
	return true;
}

/* ---- combining the splits ---- */

/* The combination of one row's partials for one query head:
 * out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the row's
 * splits that hold positions (attn_splits_of: none for a padding row,
 * P < 0, whose output is zeros), M their largest max. */
static __device__ __forceinline__ int32_t attn_splits_of(int32_t p, const attn_shape &sh)
{
	return p < 0 ? 0 : p / attn_split_size(p, sh.split_pos, sh.max_splits) + 1;
}

/* A warp's part of the combination of one row's partials for one query
 * head (PP, the first split's; STRIDE floats apart), each split's
 * weight taken once: lane s of each 32 takes split
 * s's max for M (exact in any order), then W[s] = expf(m_s - M); lane 0
 * sums l_s * W[s] in split order and returns 1 / sum (0 without splits),
 * which the other lanes must not use.  Reads through L2 (__ldcg): the
 * split kernel's partials, each read once. */
static __device__ __forceinline__ float attn_head_weights(const float *pp, size_t stride, int32_t n_act,
	float *w, int lane)
{
	float M = -INFINITY;
	for (int32_t s = lane; s < n_act; s += 32)
		M = fmaxf(M, __ldcg(&pp[s * stride]));
UNROLL
	for (int off = 16; off > 0; off /= 2)
		M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
	for (int32_t s = lane; s < n_act; s += 32)
		w[s] = expf(__ldcg(&pp[s * stride]) - M);
	__syncwarp(); /* lane 0 reads every lane's weights */
	float L = 0.0f;
	if (lane == 0)
		for (int32_t s = 0; s < n_act; s++)
			L = fmaf(__ldcg(&pp[s * stride + 1]), w[s], L);
	return n_act > 0 ? 1.0f / L : 0.0f;
}

/* Element C's weighted sum over the splits (PP the
 * first split's partial of its head, W attn_head_weights'), in split
 * order. */
static __device__ __forceinline__ float attn_weighted(const float *pp, size_t stride, int32_t n_act,
	const float *w, int c)
{
	float a = 0.0f;
UNROLL4
	for (int32_t s = 0; s < n_act; s++)
		a = fmaf(__ldcg(&pp[s * stride + 2 + c]), w[s], a);
	return a;
}

/* ---- the split kernel, lanes version ----
 *
 * The first split kernel (removed: 2-7% slower, see llm-bench(1)) spent a
 * thread per score and per output element on a
 * chain as long as the head (scores) or the tile (weighted V), with 4 warps
 * a block and tiles cut at KV block edges (16 positions at the default
 * block size); on an H200 (ncu, 8B shapes at 4096 positions) it issued 0.2
 * instructions a cycle per scheduler, waiting on those chains and on its
 * tiles' loads, at 5% of DRAM bandwidth.  This one has 8 warps, shorter
 * chains side by side,
 * and fewer, longer tiles:
 *   - a tile is sh.tile positions from the split's start, across KV block
 *     edges (each position's row from the table);
 *   - a score is ATTN_DOT_LANES lanes' (lane j takes the float4s j, j + 8,
 *     ... of the head in four fmaf chains, attn_dot_strided), summed by
 *     xor shuffles (attn_dot_lanes);
 *   - the softmax's max and sum over a tile are xor shuffles across the
 *     warp, lane r holding position r;
 *   - a weighted V column is ATTN_V_PHASES chains (positions r = ph mod 4)
 *     summed by shuffles (attn_phase_sum4), then added to acc * corr by
 *     one fmaf;
 *   - the next tile's loads are issued (into registers, as loaded: attn_pf)
 *     before the current tile is computed, and converted and stored after.
 * A row's bits are a function of the row alone (its
 * tiles start at its split's start whatever the row tile): batch
 * invariance, prefill == decode. */
#define ATTN_LANES_THREADS 256
#define ATTN_DOT_LANES 8 /* lanes of one score's dot product */
#define ATTN_V_PHASES 4  /* interleaved position chains of a weighted V column */
#define ATTN_PREFETCH 4  /* float4 units of K (and of V) a thread loads ahead:
			  * a tile of 32 positions of a 128-wide head */
static_assert(ATTN_DOT_LANES * ATTN_V_PHASES == 32, "a warp is 4 scores' lanes, 8 V columns' phases");

/* The dot product of QG and KR by the ATTN_DOT_LANES lanes of this
 * lane's group (every lane of the warp calls it): lane j's part over the
 * float4s (elements) j, j + ATTN_DOT_LANES, ... (attn_dot_strided), the
 * parts summed by xor shuffles 4, 2, 1, which give every lane of the
 * group the same bits (each add has the same two operands, in either
 * order). */
static __device__ __forceinline__ float attn_dot_lanes(const float *qg, const float *kr, int32_t hd)
{
	float d = attn_dot_strided(qg, kr, hd, threadIdx.x % ATTN_DOT_LANES, ATTN_DOT_LANES);
UNROLL
	for (int off = ATTN_DOT_LANES / 2; off > 0; off /= 2)
		d += __shfl_xor_sync(0xffffffffu, d, off);
	return d;
}

/* The sum over the warp's 4 phases (lane groups GRP 0..3, lanes 8 apart)
 * of each lane's V, as ((ph0 + ph1) + (ph2 + ph3)) per component, by
 * three shuffles (a reduce-scatter: each lane ends with one component):
 * lanes of odd GRP keep z, w and pass x, y to their partner 8 away,
 * which keeps x, y; then GRP < 2 keep the first of their two, GRP >= 2
 * the second.  Returns the sum of component attn_phase_comp(GRP). */
static __device__ __forceinline__ int attn_phase_comp(int grp)
{
	return 2 * (grp & 1) + (grp >> 1);
}

static __device__ __forceinline__ float attn_phase_sum4(float4 v, int grp)
{
	const bool odd = grp & 1, high = grp >= 2;
	/* the pair this lane keeps, and the pair it passes */
	const float k0 = odd ? v.z : v.x, k1 = odd ? v.w : v.y;
	const float s0 = odd ? v.x : v.z, s1 = odd ? v.y : v.w;
	/* (ph0 + ph1) at even GRP, (ph1 + ph0) at odd: the same bits */
	const float a0 = k0 + __shfl_xor_sync(0xffffffffu, s0, ATTN_DOT_LANES);
	const float a1 = k1 + __shfl_xor_sync(0xffffffffu, s1, ATTN_DOT_LANES);
	const float keep = high ? a1 : a0, pass = high ? a0 : a1;
	return keep + __shfl_xor_sync(0xffffffffu, pass, 2 * ATTN_DOT_LANES);
}

/* attn_phase_sum4 of one float (heads of no whole float4s): the same
 * ((ph0 + ph1) + (ph2 + ph3)), in every lane. */
static __device__ __forceinline__ float attn_phase_sum(float x)
{
	x += __shfl_xor_sync(0xffffffffu, x, ATTN_DOT_LANES);
	return x + __shfl_xor_sync(0xffffffffu, x, 2 * ATTN_DOT_LANES);
}

/* A thread's first ATTN_PREFETCH float4 units of a tile: unit u (thread +
 * j * blockDim) is position r = u / (hd / 4), float4 u % (hd / 4) of the
 * head, the same for every tile; so are its byte offsets in a pool row
 * (of the data: F32/F16 the floats or halves, Q8_0 the codes; and of
 * Q8_0's block scale) and its float offset in the staged tile. */
struct attn_units {
	int32_t r[ATTN_PREFETCH];      /* position in the tile */
	uint32_t data[ATTN_PREFETCH];  /* bytes from the row's start to its data */
	uint32_t scale[ATTN_PREFETCH]; /* to its Q8_0 block's scale (other types: 0) */
	int32_t so[ATTN_PREFETCH];     /* floats from KT's (VT's) start */
};

static __device__ __forceinline__ attn_units attn_units_of(const kv_view &kv, const attn_shape &sh,
	int32_t hk, int32_t ks)
{
	attn_units u;
	const int32_t upr = sh.head_dim / 4;
UNROLL
	for (int j = 0; j < ATTN_PREFETCH; j++) {
		const int x = threadIdx.x + j * blockDim.x;
		const int32_t r = x / upr, c = x % upr, e = hk * sh.head_dim + c * 4;
		u.r[j] = r;
		u.so[j] = r * ks + c * 4;
		if (kv.type == QT_Q8_0) {
			u.scale[j] = (uint32_t)(e / QK * sizeof(struct block_q8_0));
			u.data[j] = u.scale[j] + (uint32_t)(sizeof(qt_f16) + e % QK);
		} else {
			u.scale[j] = 0;
			u.data[j] = (uint32_t)e * (kv.type == QT_F32 ? 4u : 2u);
		}
	}
	return u;
}

/* kv_load4's words from a row at BASE, by attn_units' offsets. */
static __device__ __forceinline__ uint4 attn_load_unit(const char *base, uint32_t type, uint32_t data,
	uint32_t scale)
{
	if (type == QT_F32)
		return __ldg(reinterpret_cast<const uint4 *>(base + data));
	if (type == QT_F16) {
		const uint2 h = __ldg(reinterpret_cast<const uint2 *>(base + data));
		return make_uint4(h.x, h.y, 0u, 0u);
	}
	const unsigned short *c = reinterpret_cast<const unsigned short *>(base + data);
	return make_uint4(__ldg(reinterpret_cast<const unsigned short *>(base + scale)), __ldg(c), __ldg(c + 1),
			  0u);
}

/* The thread's units of a tile as loaded. */
struct attn_pf {
	uint4 k[ATTN_PREFETCH]; /* unit j of K, kv_load4's words */
	uint4 v[ATTN_PREFETCH]; /* and of V */
};

/* Issues the loads of the thread's units of the tile at position P (N
 * positions; V rows VOFS bytes past their K rows). */
static __device__ __forceinline__ void attn_prefetch(const kv_view &kv, const int32_t *table, int32_t p,
	int32_t n, size_t vofs, const attn_units &u, attn_pf &pf)
{
UNROLL
	for (int j = 0; j < ATTN_PREFETCH; j++)
		if (u.r[j] < n) {
			const char *kr = kv_row(kv, table, 0, p + u.r[j]);
			pf.k[j] = attn_load_unit(kr, kv.type, u.data[j], u.scale[j]);
			pf.v[j] = attn_load_unit(kr + vofs, kv.type, u.data[j], u.scale[j]);
		}
}

/* Stages the tile at P (N positions) into KT and VT (rows KS floats
 * apart): with vec_load, the units attn_prefetch loaded (PF) converted
 * (kv_cvt4) and stored, then any units past them (heads over 128 wide)
 * loaded and stored; else an element at a time (kv_elem). */
static __device__ __forceinline__ void attn_stage_lanes(const kv_view &kv, const attn_shape &sh,
	const int32_t *table, int32_t p, int32_t n, int32_t hk, size_t vofs, const attn_units &u,
	const attn_pf &pf, float *kt, float *vt, int32_t ks)
{
	const int32_t hd = sh.head_dim;
	const int tid = threadIdx.x, nt = blockDim.x;
	if (!sh.vec_load) {
		for (int i = tid; i < n * hd; i += nt) {
			const int r = i / hd, c = i % hd;
			const char *kr = kv_row(kv, table, 0, p + r);
			kt[r * ks + c] = kv_elem(kr, kv.type, hk * hd + c);
			vt[r * ks + c] = kv_elem(kr + vofs, kv.type, hk * hd + c);
		}
		return;
	}
UNROLL
	for (int j = 0; j < ATTN_PREFETCH; j++)
		if (u.r[j] < n) {
			*reinterpret_cast<float4 *>(kt + u.so[j]) = kv_cvt4(pf.k[j], kv.type);
			*reinterpret_cast<float4 *>(vt + u.so[j]) = kv_cvt4(pf.v[j], kv.type);
		}
	const int32_t upr = hd / 4, units = n * upr;
	for (int x = tid + ATTN_PREFETCH * nt; x < units; x += nt) {
		const int r = x / upr, e = hk * hd + x % upr * 4, o = r * ks + x % upr * 4;
		const char *kr = kv_row(kv, table, 0, p + r);
		const float4 kx = kv_elem4(kr, kv.type, e), vx = kv_elem4(kr + vofs, kv.type, e);
		*reinterpret_cast<float4 *>(kt + o) = kx;
		*reinterpret_cast<float4 *>(vt + o) = vx;
	}
}

/* grid (n_splits, n_head_kv, row tiles of this chunk; attn_rows_of) and
 * partials (attn_write_partial), with ATTN_LANES_THREADS
 * threads and the tiles and arithmetic described above. */
static __global__ void __launch_bounds__(ATTN_LANES_THREADS, 2)
attn_split_lanes_kernel(kv_view kv, const int32_t *__restrict__ pos, const int32_t *__restrict__ tables,
	int32_t table_stride, attn_shape sh, int32_t row0, const int32_t *__restrict__ tiles, int32_t tile_base,
	const float *__restrict__ q, float *__restrict__ partial)
{
	grid_dep_wait();
	DYN_SHARED(float, smem);
	attn_rows b;
	if (!attn_rows_of(pos, tables, table_stride, sh, row0, tiles, tile_base, &b))
		return;
	const int32_t hk = blockIdx.y, s = blockIdx.x, t0 = b.t0, R = b.R, p0 = b.p0, P1 = b.P1;
	const int32_t G = sh.group, hd = sh.head_dim, ks = attn_kstride(hd), tile = sh.tile;
	const int32_t RG = R * G;
	const size_t vofs = (size_t)kv.block_tokens * kv.row_bytes; /* a V row past its K row */
	const int32_t *table = b.table;
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
	/* the lane's group of ATTN_DOT_LANES: its position among the 4 a
	 * warp scores at once, its phase of a V column; CL: its column */
	const int grp = lane / ATTN_DOT_LANES, cl = lane % ATTN_DOT_LANES;

	const attn_smem sm = attn_carve(smem, RG, hd, tile, ks);
	attn_begin(sm, sh, pos, q, t0, R, hk);

	attn_units un;
	attn_pf pf;
	int32_t n = min(P1 - p0, tile);
	if (sh.vec_load) {
		un = attn_units_of(kv, sh, hk, ks);
		attn_prefetch(kv, table, p0, n, vofs, un, pf);
	}
	for (int32_t p = p0; p < P1;) {
		attn_stage_lanes(kv, sh, table, p, n, hk, vofs, un, pf, sm.kt, sm.vt, ks);
		__syncthreads(); /* (the first time, also q and the rows' state) */
		const int32_t pn = p + n, nn = min(P1 - pn, tile);
		if (sh.vec_load && nn > 0)
			attn_prefetch(kv, table, pn, nn, vofs, un, pf);

		/* scores: warp item k is (row-head rg, positions 4i.. 4i + 3),
		 * lane group grp taking position 4i + grp */
		const int32_t nq = (n + 3) / 4;
		for (int k = warp; k < RG * nq; k += n_warps) { /* uniform across the warp */
			const int rg = k / nq, r = k % nq * 4 + grp;
			const int rr = min(r, n - 1); /* past the tile: a staged row, result unused */
			const float d = attn_dot_lanes(sm.qs + rg * hd, sm.kt + rr * ks, hd);
			if (cl == 0 && r < n && r <= sm.rp[rg / G] - p)
				sm.sc[rg * tile + r] = d * sh.scale;
		}
		__syncthreads();
		/* online softmax, a warp per (row, head), lane r at position p + r */
		for (int rg = warp; rg < RG; rg += n_warps) {
			const int32_t nr = min(n, sm.rp[rg / G] + 1 - p); /* uniform across the warp */
			if (nr <= 0)
				continue; /* the row ended before this tile */
			float *sg = sm.sc + rg * tile;
			/* positions before the row's sliding window weigh 0, like
			 * the CPU's masked ones; a split or tile wholly before it
			 * keeps the empty state (max -inf, sum 0, acc 0) */
			const int32_t lo = sh.window ? sm.rp[rg / G] - sh.window + 1 : 0;
			const bool live = lane < nr && p + lane >= lo;
			const float s_r = live ? sg[lane] : -INFINITY;
			/* lane 0 alone reads (and later writes) the row's state:
			 * the others' reads would race its writes, shuffles
			 * order no memory; the max is the same either way */
			const float m_old = lane == 0 ? sm.m[rg] : -INFINITY;
			float mx = fmaxf(m_old, s_r);
UNROLL
			for (int off = 16; off > 0; off /= 2)
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
			const float w = live ? expf(s_r - mx) : 0.0f;
			float sum = w;
UNROLL
			for (int off = 16; off > 0; off /= 2)
				sum += __shfl_xor_sync(0xffffffffu, sum, off);
			if (lane < nr)
				sg[lane] = w;
			if (lane == 0) {
				const float cr = mx > m_old ? expf(m_old - mx) : 1.0f; /* 0 on the first tile */
				sm.l[rg] = fmaf(sm.l[rg], cr, sum);
				sm.m[rg] = mx;
				sm.corr[rg] = cr;
			}
		}
		__syncthreads();
		/* acc = acc * corr + sum_r w_r v_r: warp item k is (rg, 8
		 * columns: float4s where the head is whole float4s, else
		 * elements), lane (grp, cl) summing column cl's positions
		 * r = grp mod 4 */
		const int32_t cw = hd % 4 ? 1 : 4, cn = hd / cw, ncg = (cn + 7) / 8;
		for (int k = warp; k < RG * ncg; k += n_warps) { /* uniform across the warp */
			const int rg = k / ncg, c = k % ncg * 8 + cl;
			const int32_t nr = min(n, sm.rp[rg / G] + 1 - p);
			if (nr <= 0)
				continue;
			const int cc = c < cn ? c : 0; /* past the head: column 0, result unused */
			const float *wg = sm.sc + rg * tile;
			float *ag = sm.acc + rg * hd + cc * cw;
			const float cr = sm.corr[rg];
			if (cw == 1) {
				float v = 0.0f;
				for (int r = grp; r < nr; r += ATTN_V_PHASES)
					v = fmaf(wg[r], sm.vt[r * ks + cc], v);
				v = attn_phase_sum(v);
				if (grp == 0 && c < cn)
					ag[0] = fmaf(ag[0], cr, v);
				continue;
			}
			float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
UNROLL4
			for (int r = grp; r < nr; r += ATTN_V_PHASES) {
				const float w = wg[r];
				const float4 x = *reinterpret_cast<const float4 *>(sm.vt + r * ks + cc * 4);
				v.x = fmaf(w, x.x, v.x);
				v.y = fmaf(w, x.y, v.y);
				v.z = fmaf(w, x.z, v.z);
				v.w = fmaf(w, x.w, v.w);
			}
			const float t = attn_phase_sum4(v, grp);
			if (c < cn) { /* each of the 4 lanes its component */
				float *o = ag + attn_phase_comp(grp);
				*o = fmaf(*o, cr, t);
			}
		}
		__syncthreads(); /* the next tile overwrites kt, vt, sc */
		p = pn;
		n = nn;
	}
	attn_write_partial(sm, sh, b.t0, b.R, hk, row0, s, b.p0, partial);
}

/* The combination of a row's partials (attn_splits_of's comment): a warp
 * per head of the block takes the splits a lane each for the max, then
 * their weights w_s = expf(m_s - M) once into shared memory (lane 0 sums
 * l_s * w_s in split order), and each thread sums its element's
 * acc_s * w_s in split order.
 * grid (N / Q8K_THREADS rounded up, rows of this chunk), Q8K_THREADS
 * threads: thread i of block b takes element e = b * Q8K_THREADS + i of
 * its row; VEC 0 writes OUT only, else also quantizes each row of OUT
 * (N = n_head * head_dim, a whole number of VEC's blocks) into Q8_0,
 * Q8_1 or Q8_K at XQ + t * XQ_STRIDE, the bytes the matmul's own
 * quantizer writes (quant_q8.cuh).  Dynamic shared memory: attn_reduce_smem(). */
static __host__ __device__ __forceinline__ int32_t attn_reduce_heads(int32_t hd)
{
	return (Q8K_THREADS - 1) / hd + 2; /* heads a block's elements can touch */
}

static size_t attn_reduce_smem(const attn_shape &sh)
{
	return (size_t)attn_reduce_heads(sh.head_dim) * (sh.n_splits + 1) * sizeof(float);
}

static __global__ void attn_reduce_lanes_kernel(const int32_t *__restrict__ pos, attn_shape sh,
	int32_t row0, const float *__restrict__ partial, float *__restrict__ out, uint32_t vec,
	uint8_t *__restrict__ xq, size_t xq_stride)
{
	grid_dep_wait();
	__shared__ float s_ax[Q8K_THREADS / 32], s_v[Q8K_THREADS / 32];
	DYN_SHARED(float, sw); /* (heads, n_splits) weights, then (heads) 1 / L */
	const int32_t t = row0 + blockIdx.y, hd = sh.head_dim, n = sh.n_head * hd, ns = sh.n_splits;
	const int32_t e0 = (int32_t)blockIdx.x * Q8K_THREADS, e = e0 + threadIdx.x;
	const int32_t h0 = e0 / hd, nh = min(sh.n_head, (e0 + Q8K_THREADS - 1) / hd + 1) - h0;
	float *inv = sw + (size_t)attn_reduce_heads(hd) * ns;
	const size_t stride = (size_t)hd + 2;
	const float *rows = partial + (size_t)blockIdx.y * sh.n_head * ns * stride;
	const int32_t n_act = attn_splits_of(pos[t], sh);
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	for (int32_t j = warp; j < nh; j += Q8K_THREADS / 32) { /* uniform across the warp */
		const float iv = attn_head_weights(rows + (size_t)(h0 + j) * ns * stride, stride, n_act,
						   sw + (size_t)j * ns, lane);
		if (lane == 0)
			inv[j] = iv;
	}
	__syncthreads();
	if (e >= n) /* whole warps, past the last 32-element block (never for Q8_K) */
		return;
	const int32_t j = e / hd - h0, c = e % hd;
	const float v = attn_weighted(rows + (size_t)(h0 + j) * ns * stride, stride, n_act, sw + (size_t)j * ns, c) *
			inv[j];
	out[(size_t)t * n + e] = v;
	if (!vec)
		return;
	uint8_t *row = xq + (size_t)t * xq_stride;
	if (vec == QT_Q8_K)
		q8k_block_store(v, (int)blockIdx.x, n / QK_K, n, row, s_ax, s_v);
	else
		q8_block_store(v, threadIdx.x % 32, e / 32, n / 32, n, vec == QT_Q8_1, row);
}

/* ---- launchers ---- */

static int launched(void)
{
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* 0 when KV describes a pool these kernels read, else a negative errno. */
static int kv_check(const struct bk_kv *kv, int32_t layer)
{
	if (!kv || !kv->base || kv->block_tokens < 1 || kv->n_blocks < 1 || kv->n_layer < 1 ||
	    kv->kv_dim < 1 || layer < 0 || layer >= kv->n_layer)
		return -EINVAL;
	size_t want;
	switch (kv->type) {
	case QT_F32: want = (size_t)kv->kv_dim * 4; break;
	case QT_F16: want = (size_t)kv->kv_dim * 2; break;
	case QT_Q8_0:
		if (kv->kv_dim % QK)
			return -EINVAL;
		want = (size_t)kv->kv_dim / QK * sizeof(struct block_q8_0);
		break;
	default: return -ENOTSUP;
	}
	if (kv->row_bytes != want || kv->block_bytes < 2 * (size_t)kv->n_layer * kv->block_tokens * want)
		return -EINVAL;
	return 0;
}

static kv_view kv_view_of(const struct bk_kv *kv, int32_t layer)
{
	kv_view v;
	v.base = (char *)kv->base;
	v.type = kv->type;
	v.block_tokens = kv->block_tokens;
	v.layer = layer;
	v.kv_dim = kv->kv_dim;
	v.row_bytes = kv->row_bytes;
	v.block_bytes = kv->block_bytes;
	return v;
}

extern "C" int cuda_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
	const int32_t *tables, int32_t table_stride, const float *k, const float *v, const struct cuda_launch *lc)
{
	int err = kv_check(kv, layer);
	if (err)
		return err;
	if (T < 0 || table_stride < 1)
		return -EINVAL;
	if (T == 0)
		return 0;
	if (!pos || !tables || !k || !v)
		return -EINVAL;
	LAUNCH_ON(lc, kv_store_kernel, dim3((unsigned)T, 2), KV_STORE_THREADS, 0, kv_view_of(kv, layer), pos,
		tables, table_stride, k, v);
	return launched();
}

extern "C" int cuda_rope_kv_store(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
	const int32_t *tables, int32_t table_stride, const struct bk_attn *a, const struct bk_rope *rp,
	float *q, float *k, const float *v, const struct cuda_launch *lc)
{
	int err = kv_check(kv, layer);
	if (err)
		return err;
	if (!rp)
		return -EINVAL;
	const int32_t n_rot = rp->n_rot;
	if (T < 0 || table_stride < 1 || !a || a->n_head < 1 || a->n_head_kv < 1 || a->head_dim < 1 ||
	    (int64_t)a->n_head_kv * a->head_dim != kv->kv_dim || n_rot < 0 || n_rot > a->head_dim ||
	    n_rot % 2 || n_rot > ROPE_MAX_ROT || (rp->style != BK_ROPE_NORMAL && rp->style != BK_ROPE_NEOX) ||
	    (int64_t)a->n_head * (n_rot / 2) > INT32_MAX)
		return -EINVAL;
	if (T == 0)
		return 0;
	if (!pos || !tables || !q || !k || !v)
		return -EINVAL;
	/* q heads per block: about ROPE_BATCH pairs a thread, at least a head */
	const int32_t n_pair = n_rot / 2;
	const int32_t hq = n_pair ? (int32_t)std::max<int64_t>(1, (int64_t)ROPE_BATCH * KV_STORE_THREADS / n_pair)
				  : a->n_head;
	const int32_t qb = (a->n_head + hq - 1) / hq;
	LAUNCH_ON(lc, rope_kv_store_kernel, dim3((unsigned)T, (unsigned)qb + 2), KV_STORE_THREADS,
		(size_t)n_pair * sizeof(float2), kv_view_of(kv, layer), pos,
		tables, table_stride, q, k, v, a->n_head, a->head_dim, n_rot, rope_angles_of(rp, rp->freq_factors),
		rp->style == BK_ROPE_NEOX, hq);
	return launched();
}

/* The shapes of a call, or a negative errno. */
static int attn_plan(const struct bk_kv *kv, const struct bk_attn *a, int32_t table_stride,
	int32_t split_tokens, attn_shape *sh)
{
	if (!a || a->n_head_kv < 1 || a->n_head < 1 || a->n_head % a->n_head_kv || a->head_dim < 1 ||
	    (int64_t)a->head_dim * a->n_head_kv != kv->kv_dim || table_stride < 1)
		return -EINVAL;
	if (a->head_dim > ATTN_MAX_HEAD_DIM || a->n_head / a->n_head_kv > ATTN_MAX_GROUP)
		return -EINVAL;
	if (kv->type == QT_Q8_0 && a->head_dim % QK && QK % a->head_dim)
		return -EINVAL;
	sh->n_head = a->n_head;
	sh->n_head_kv = a->n_head_kv;
	sh->head_dim = a->head_dim;
	sh->group = a->n_head / a->n_head_kv;
	sh->scale = a->scale;
	sh->window = a->window > 0 ? a->window : 0;
	const int32_t bt = kv->block_tokens;
	const int64_t blocks_per_split = (split_tokens + bt - 1) / bt;
	sh->split_pos = (int32_t)(blocks_per_split * bt);
	sh->max_splits = ATTN_MAX_SPLITS;
	/* a row at position p < table_stride * bt has splits of at least
	 * split_pos positions, and never more than max_splits of them */
	const int64_t n = ((int64_t)table_stride + blocks_per_split - 1) / blocks_per_split;
	sh->n_splits = (int32_t)(n < sh->max_splits ? n : sh->max_splits);
	/* the tile first, as one row needs it (a row's arithmetic depends on
	 * it), then as many rows per block as fit beside it */
	int32_t tile = ATTN_MAX_TILE;
	while (tile > 1 && attn_smem_floats(1, sh->group, sh->head_dim, tile) * 4 > ATTN_SMEM_LIMIT)
		tile /= 2;
	if (attn_smem_floats(1, sh->group, sh->head_dim, tile) * 4 > ATTN_SMEM_LIMIT)
		return -ENOTSUP;
	sh->tile = tile;
	/* kv_elem4's loads: 4-element pieces of a head, each whole words of
	 * a row the pool keeps aligned to them (every row of every block) */
	const size_t align = kv->type == QT_F32 ? 16 : kv->type == QT_F16 ? 8 : 2;
	sh->vec_load = sh->head_dim % 4 == 0 && (uintptr_t)kv->base % align == 0 &&
		       kv->row_bytes % align == 0 && kv->block_bytes % align == 0;
	sh->qrows = ATTN_MAX_QROWS;
	while (sh->qrows > 1 &&
	       attn_smem_floats(sh->qrows, sh->group, sh->head_dim, tile) * 4 > ATTN_SMEM_LIMIT)
		sh->qrows /= 2;
	return 0;
}

/* Scratch: the partials of a chunk's rows, then the row-tile list.  Bytes
 * of scratch before the list, with the partials of ROWS rows. */
static size_t attn_tiles_offset(size_t rows, const attn_shape &sh)
{
	const size_t b = rows * sh.n_head * sh.n_splits * ((size_t)sh.head_dim + 2) * sizeof(float);
	return (b + 15) / 16 * 16;
}

/* The row tiles of HOST's rows (see attn_rows_of): runs of rows of one
 * table at consecutive positions, cut at QROWS rows, at row chunks and
 * where the split size changes (its rows share the last one's). */
static void attn_row_tiles(const struct bk_rows *host, const attn_shape &sh, std::vector<int32_t> &tiles)
{
	const int32_t T = host->n, qrows = sh.qrows;
	tiles.clear();
	for (int32_t t = 0; t < T;) {
		const int32_t to_chunk = ATTN_ROW_CHUNK - t % ATTN_ROW_CHUNK;
		int32_t n = bk_rows_run(host, t, qrows < to_chunk ? qrows : to_chunk);
		const int32_t S = attn_split_size(host->pos[t], sh.split_pos, sh.max_splits);
		for (int32_t k = 1; k < n; k++)
			if (attn_split_size(host->pos[t + k], sh.split_pos, sh.max_splits) != S) {
				n = k;
				break;
			}
		tiles.push_back(t);
		tiles.push_back(n);
		t += n;
	}
}

extern "C" int32_t cuda_attention_qrows(const struct bk_kv *kv, const struct bk_attn *a)
{
	attn_shape sh;
	if (!kv || kv_check(kv, 0) || attn_plan(kv, a, 1, ATTN_SPLIT_TOKENS, &sh))
		return 0;
	return sh.qrows;
}

extern "C" size_t cuda_attention_scratch_bytes(const struct bk_kv *kv, const struct bk_attn *a,
	int32_t T, int32_t table_stride, const struct cuda_tuning *tuning)
{
	attn_shape sh;
	if (T < 1 || !kv || kv_check(kv, 0) ||
	    attn_plan(kv, a, table_stride, attn_split_tokens(tuning), &sh))
		return 0;
	const size_t rows = T < ATTN_ROW_CHUNK ? (size_t)T : ATTN_ROW_CHUNK;
	return attn_tiles_offset(rows, sh) + (size_t)T * 2 * sizeof(int32_t);
}

/* cuda_attention, and with VEC (not 0) cuda_attention_q8. */
static int attn_run(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
	const int32_t *tables, int32_t table_stride, const struct bk_attn *a, const float *q,
	float *out, const struct bk_rows *host, void *scratch, uint32_t vec, void *xq, size_t xq_stride,
	const struct cuda_launch *lc)
{
	int err = kv_check(kv, layer);
	if (err)
		return err;
	attn_shape sh;
	err = attn_plan(kv, a, table_stride, attn_split_tokens(lc ? lc->tuning : NULL), &sh);
	if (err)
		return err;
	if (T < 0 || (host && (host->n != T || !host->pos || !host->block_table)))
		return -EINVAL;
	if (T == 0)
		return 0;
	if (!pos || !tables || !q || !out || !scratch)
		return -EINVAL;
	const kv_view view = kv_view_of(kv, layer);
	const int64_t q8_blocks = ((int64_t)sh.n_head * sh.head_dim + Q8K_THREADS - 1) / Q8K_THREADS;
	cudaStream_t st = (cudaStream_t)cuda_launch_stream(lc);
	float *partial = (float *)scratch;
	const size_t chunk_rows = T < ATTN_ROW_CHUNK ? (size_t)T : ATTN_ROW_CHUNK;
	int32_t *d_tiles = NULL;
	std::vector<int32_t> tiles;
	if (host && sh.qrows > 1) {
		attn_row_tiles(host, sh, tiles);
		if (tiles.size() / 2 < (size_t)T) { /* some rows share a block: upload the list */
			d_tiles = (int32_t *)((char *)scratch + attn_tiles_offset(chunk_rows, sh));
			if (cudaMemcpyAsync(d_tiles, tiles.data(), tiles.size() * sizeof(int32_t),
					    cudaMemcpyHostToDevice, st) != cudaSuccess)
				return -EIO;
		}
	}
	const int32_t R = d_tiles ? sh.qrows : 1;
	const size_t smem = attn_smem_floats(R, sh.group, sh.head_dim, sh.tile) * sizeof(float);
	size_t ti = 0; /* the first tile of the chunk */
	for (int32_t row0 = 0; row0 < T; row0 += ATTN_ROW_CHUNK) {
		const int32_t rows = T - row0 < ATTN_ROW_CHUNK ? T - row0 : ATTN_ROW_CHUNK;
		size_t n_tiles = (size_t)rows, tj = ti;
		if (d_tiles) {
			while (tj < tiles.size() / 2 && tiles[2 * tj] < row0 + rows)
				tj++;
			n_tiles = tj - ti;
		}
		const dim3 grid((unsigned)sh.n_splits, (unsigned)sh.n_head_kv, (unsigned)n_tiles);
		LAUNCH_ON(lc, attn_split_lanes_kernel, grid, ATTN_LANES_THREADS, smem, view, pos, tables,
			table_stride, sh, row0, (const int32_t *)d_tiles, (int32_t)ti, q, partial);
		if ((err = launched()))
			return err;
		ti = tj;
		LAUNCH_ON(lc, attn_reduce_lanes_kernel, dim3((unsigned)q8_blocks, (unsigned)rows), Q8K_THREADS,
			attn_reduce_smem(sh), pos, sh, row0, (const float *)partial, out, vec, (uint8_t *)xq,
			xq_stride);
		if ((err = launched()))
			return err;
	}
	return 0;
}

extern "C" int cuda_attention(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
	const int32_t *tables, int32_t table_stride, const struct bk_attn *a, const float *q,
	float *out, const struct bk_rows *host, void *scratch, const struct cuda_launch *lc)
{
	return attn_run(kv, layer, T, pos, tables, table_stride, a, q, out, host, scratch, 0, NULL, 0, lc);
}

extern "C" int cuda_attention_q8(const struct bk_kv *kv, int32_t layer, int32_t T, const int32_t *pos,
	const int32_t *tables, int32_t table_stride, const struct bk_attn *a, const float *q,
	float *out, const struct bk_rows *host, void *scratch, uint32_t vec, void *xq, size_t xq_stride,
	const struct cuda_launch *lc)
{
	const int64_t n = a ? (int64_t)a->n_head * a->head_dim : 0;
	const size_t need = n > 0 && n <= INT32_MAX ? q8_row_bytes(vec, n) : 0;
	if (!need || xq_stride < need || xq_stride % 16 || (uintptr_t)xq % 16 || (T > 0 && !xq))
		return -EINVAL;
	return attn_run(kv, layer, T, pos, tables, table_stride, a, q, out, host, scratch, vec, xq, xq_stride,
			lc);
}
