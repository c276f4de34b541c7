/* matmul.cu - quantized matrix products for small T (decode): out (T, n_out)
 * = x (T, n_in) · W^T with W in its ggml block format.  This file holds the
 * plan (which kernel, split-K, the grid), the activations' quantizers and
 * the extern "C" launchers; the kernels of step 2 live in matmul_dp4a.cu,
 * matmul_mma.cu and matmul_wide.cu, what they share in matmul.cuh.
 *
 * Two launches per call, as the CPU backend does it (kernels/cpu_backend.c,
 * kernels/quant.c), for up to CUDA_MM_GROUP weights sharing the input (a
 * layer's q, k and v; gate and up), whose rows one grid covers:
 *   1. the activation rows are quantized on the device into the weight
 *      type's vec type (Q8_0 for Q4_0/Q8_0, Q8_1 for Q4_1, Q8_K for the
 *      K-quants) with the CPU's arithmetic (id = 127 / amax, round half to
 *      even, f16 scales rounded to nearest even), into SCRATCH;
 *   2. one warp per weight row takes integer dot products (__dp4a) block by
 *      block and reproduces the CPU's float steps exactly (quant.c, "the one
 *      every path reproduces bit for bit"): for 32-element blocks, 16 float
 *      lanes fed by fma in block order (lane l of the warp and lane l + 16
 *      each take half of a block's integer dot and add them exactly with one
 *      shuffle), a ragged tail in groups of four, Q4_1's m*s lanes, then the
 *      same tree sum as hsum16; for the K-quants, one float accumulator over
 *      the super-blocks in order, each lane computing one super-block's
 *      integer sums and the warp broadcasting them in order.
 * Step 2 runs on the int8 tensor cores instead from T = 2 (the K-quants
 * from T = 1, after the wide kernels below; mma.sync m16n8k32,
 * cuda_mma.h): one warp per 16 weight rows takes each 32-element block's
 * (or sub-block's) integer dot for 8 activation rows at a time (from
 * T = 9 for 16 at once, the K-quants from T = 17 for 32, sharing the
 * weights' fragment), exactly the integers dp4a gives, and then the same
 * float steps per (weight row, activation row) pair.  At T = 1 it wastes
 * 7 of the mma's 8 columns, and still issues several times fewer
 * instructions per weight byte than the K-quants' dp4a kernel (a lane per
 * super-block, a serial broadcast); the 32-element types' dp4a kernel is
 * the faster at T = 1 (struct cuda_tuning's mma_min_t moves the threshold).
 * One row of Q4_K or Q6_K takes a warp per weight row reading 512 bytes a
 * load (matmul_q4k_wide_kernel, the tuning's mm_wide).
 * A launch with too few runs of 16 rows to keep the memory busy (an 8B
 * model's 4096-row matrices: 256 warps) gives each run a block of up to
 * 16 warps, within one wave of resident warps (split-K, mm_split): they
 * share its blocks and leave their float steps' operands in shared memory
 * for warp 0 to apply in order.
 * So the result equals the CPU backend's bit for bit on either path, and
 * each output depends only on its own weight row and activation row: not
 * on T, on the other rows or on the launch shape (batch invariance).
 *
 * The scratch rows are not ggml blocks but a device-friendly layout of the
 * same values: per activation row, the int8 codes (n_in bytes), then the
 * block scales as float (already rounded through f16 where the CPU stores
 * f16), then Q8_1's s (float) or Q8_K's bsums (int32, then int16 sums over
 * 32 codes; quant_q8.cuh).  Rows are 16-byte aligned.
 *
 * Large T (prefill) may go through dequantized fp16 weight tiles and
 * cublasGemmEx instead (cuda_backend.c, gemm_rows; rows.cu makes the tiles).
 */
#include "matmul.cuh"

/* ---- scratch layout ---- */

/* Bytes of one quantized activation row of N_IN elements for weight TYPE,
 * or 0 when the type is not supported here. */
static size_t mm_xq_stride(uint32_t type, int64_t n_in)
{
	uint32_t vec;
	switch (type) {
	case QT_Q4_0:
	case QT_Q8_0:
		vec = QT_Q8_0;
		break;
	case QT_Q4_1:
		vec = QT_Q8_1;
		break;
	case QT_Q4_K:
	case QT_Q5_K:
	case QT_Q6_K:
		vec = QT_Q8_K;
		break;
	default:
		return 0;
	}
	return (q8_row_bytes(vec, n_in) + 15) & ~(size_t)15;
}

/* ---- activation quantization: Q8_0 / Q8_1 ---- */

/* One warp per 32-element block of one row: lane i takes element i. */
static __global__ void quantize_q8_kernel(const float *__restrict__ x, int n_in, int T,
	int with_sum, uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	const int nb = n_in / QK;
	const long long gw = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
	const int lane = threadIdx.x % 32;
	if (gw >= (long long)T * nb) /* whole warps only */
		return;
	const int t = (int)(gw / nb), b = (int)(gw % nb);
	q8_block_store(x[(size_t)t * n_in + (size_t)b * QK + lane], lane, b, nb, n_in, with_sum,
		       xq + (size_t)t * stride);
}

/* ---- activation quantization: Q8_K ---- */

/* One block of 256 threads per super-block: thread i takes element i. */
static __global__ void quantize_q8k_kernel(const float *__restrict__ x, int n_in,
	uint8_t *__restrict__ xq, size_t stride)
{
	grid_dep_wait();
	__shared__ float s_ax[Q8K_THREADS / 32], s_v[Q8K_THREADS / 32];
	const int nsb = n_in / QK_K;
	const int t = blockIdx.x / nsb, b = blockIdx.x % nsb;

	q8k_block_store(x[(size_t)t * n_in + (size_t)b * QK_K + threadIdx.x], b, nsb, n_in,
			xq + (size_t)t * stride, s_ax, s_v);
}

/* ---- launchers ---- */

/* Bytes per block of a supported weight type and its block size, or 0. */
static size_t mm_block_bytes(uint32_t type, int *ret_blck)
{
	switch (type) {
	case QT_Q4_0: *ret_blck = QK; return 18;
	case QT_Q4_1: *ret_blck = QK; return 20;
	case QT_Q8_0: *ret_blck = QK; return 34;
	case QT_Q4_K: *ret_blck = QK_K; return 144;
	case QT_Q5_K: *ret_blck = QK_K; return 176;
	case QT_Q6_K: *ret_blck = QK_K; return 210;
	default: *ret_blck = 0; return 0;
	}
}

extern "C" size_t cuda_matmul_scratch_bytes(const struct bk_weight *w, int32_t T)
{
	if (!w || T < 1 || w->n_in <= 0)
		return 0;
	return mm_xq_stride(w->type, w->n_in) * (size_t)T;
}

/* The wide kernels' rounds of loads with tuning T (mm_wide): 0 (off), 1,
 * 2, 4 or 8; below 0, the default 2 (cuda_mm_bench on an H200: 1 and 2
 * best, 4 some 15% slower). */
static int mm_wide_rounds(const struct cuda_tuning *t)
{
	const int32_t r = t->mm_wide;
	return r < 0 ? 2 : r <= 2 ? r : r <= 4 ? 4 : 8;
}

/* Whether one launch may take weights of types A and B over T rows
 * (mm_mixed; matmul_kq_wide_kernel): Q4_K and Q6_K, one row, the wide
 * kernels on.  On by default: on an H200, an 8B Q4_K_M decode step 1-2.6%
 * faster. */
static int mm_mixes(const struct cuda_tuning *tu, uint32_t a, uint32_t b, int32_t T)
{
	return tu->mm_mixed && mm_wide_rounds(tu) && T == 1 && (a == QT_Q4_K || a == QT_Q6_K) &&
	       (b == QT_Q4_K || b == QT_Q6_K);
}

extern "C" int cuda_matmul_mixes(uint32_t a, uint32_t b, int32_t T, const struct cuda_tuning *tuning)
{
	struct cuda_tuning def;
	if (!tuning) {
		cuda_tuning_defaults(&def);
		tuning = &def;
	}
	return a == b || mm_mixes(tuning, a, b, T);
}

/* Weight W's checks against the group's first, G0 (NULL: W is the first). */
static int mm_check(const struct cuda_tuning *tu, const struct bk_weight *w, const struct bk_weight *g0,
	int32_t T)
{
	int blck;

	if (!w || !w->data || T < 1)
		return -EINVAL;
	const size_t bb = mm_block_bytes(w->type, &blck);
	if (!bb)
		return -ENOTSUP; /* F32/F16/BF16 weights: not on this path */
	if (g0 && ((w->type != g0->type && !mm_mixes(tu, w->type, g0->type, T)) || w->n_in != g0->n_in))
		return -EINVAL;
	if (w->n_in <= 0 || w->n_in % blck || w->n_in > (1 << 24) || w->n_out <= 0 ||
	    w->n_out > (1 << 24) || (int64_t)T * w->n_out > ((int64_t)1 << 31) - 1)
		return -EINVAL;
	if (w->row_bytes < (size_t)(w->n_in / blck) * bb || w->row_bytes % 2 || (uintptr_t)w->data % 2)
		return -EINVAL;
	return 0;
}

/* Whether a matmul of TYPE over T activation rows takes the tensor-core
 * kernels (the same bits as the others; T only picks the faster): from
 * tuning TU's mma_min_t rows; below 1, the default: the K-quants always (at
 * T = 1 the wide kernels first, mm_use_wide), the 32-element types from
 * T = 2 (one row is faster on dp4a: a warp a row). */
static int mm_use_mma(const struct cuda_tuning *tu, uint32_t type, int32_t T)
{
	int blck;
	if (!mm_block_bytes(type, &blck))
		return 0;
	return T >= (tu->mma_min_t >= 1 ? tu->mma_min_t : blck == QK ? 2 : 1);
}

/* Whether weights WS (NW, of one type) are read a word at a time: every
 * row 16-byte aligned (matmul_k45_mma_kernel's ALIGNED). */
static int mm_aligned16(const struct bk_weight *const *ws, int nw)
{
	for (int k = 0; k < nw; k++)
		if ((uintptr_t)ws[k]->data % 16 || ws[k]->row_bytes % 16)
			return 0;
	return 1;
}

/* The warps a launch's split-K may have in all: tuning TU's mm_warps, or
 * below 1 one wave of the kernels' resident warps on SMS multiprocessors
 * (0: the current device's; per SM: some 24 of the K-quant kernels at
 * their ~80 registers; 12 for the 32-element ones, whose split adds a
 * shared-memory tree), so that no launch leaves a last wave mostly empty.
 * On an H200 (cuda_mm_bench): an 8B's gate+up at T = 2..8 (1792 runs)
 * 17-21% faster unsplit than split in two waves; its down (256 runs)
 * wants the 8 warps a run that stay within the one wave. */
static long long mm_split_target(const struct cuda_tuning *tu, int sms, int blck)
{
	if (tu->mm_warps >= 1)
		return tu->mm_warps;
	if (sms < 1) {
		int dev = 0, n = 0;
		sms = cudaGetDevice(&dev) == cudaSuccess &&
			      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0
		      ? n : 132;
	}
	return (long long)sms * (blck == QK ? 12 : 24);
}

/* The warps per run of 16 rows (KS) of a tensor-core launch over RUNS runs
 * of blocks of BLCK elements, NB of them per row, NT tiles a pass: the
 * most powers of two that keep the launch within mm_split_target's warps,
 * at most the 16 float lanes of the 32-element types or the super-blocks
 * of a row of the K-quants, and within 32 KiB of shared memory
 * (mm_split_smem). */
static int mm_split(const struct cuda_tuning *tu, int sms, int blck, int nb, int nt, long long runs)
{
	int cap = blck == QK ? 16 : nt == 1 ? 8 : nt == 2 ? 4 : 1;
	if (cap > tu->mm_split)
		cap = tu->mm_split < 1 ? 1 : tu->mm_split;
	const long long target = mm_split_target(tu, sms, blck);
	int ks = 1;
	while (ks * 2 <= cap && runs * ks * 2 <= target && (blck == QK || ks * 2 <= nb))
		ks *= 2;
	return ks;
}

/* The shared memory of a split-K launch (KS > 1): the 32-element kernels'
 * 16 float lanes, or the K-quants' two chunks of KS super-blocks' float4
 * steps, NT x 4 outputs per thread of a warp. */
static size_t mm_split_smem(int blck, int nt, int ks)
{
	if (ks < 2)
		return 0;
	return blck == QK ? (size_t)16 * nt * 4 * 32 * sizeof(float) : k_part_bytes(ks, nt);
}

/* Whether a matmul of TYPE over T activation rows reads its weight rows
 * whole (matmul_q4k_wide_kernel: Q4_K, 16-byte aligned rows; or
 * matmul_q6k_wide_kernel; T = 1) with mm_wide_rounds of loads in flight
 * (0: never). */
static int mm_use_wide(const struct cuda_tuning *tu, uint32_t type, int aligned, int32_t T)
{
	return mm_wide_rounds(tu) && ((type == QT_Q4_K && aligned) || type == QT_Q6_K) && T == 1;
}

/* L on its family's kernel: the mixed Q4_K / Q6_K group's, the wide
 * ones (one row of Q4_K or Q6_K), the tensor cores' (MMA) with 1 tile of
 * 8 activation rows a pass up to T = 8, 2 up to 16, then 4; or dp4a's. */
static int mm_launch_family(const struct mm_launch *l, const struct cuda_tuning *tu, uint32_t type,
	int mixed, int wide, int mma, int aligned, const struct cuda_launch *lc)
{
	if (mixed || wide)
		return cuda_mm_wide(l, type, mm_wide_rounds(tu), mixed, lc);
	if (mma)
		return cuda_mm_mma(l, type, aligned, l->T <= 8 ? 1 : l->T <= 16 ? 2 : 4, lc);
	return cuda_mm_dp4a(l, type, lc);
}

/* cuda_matmul_q_group; with X NULL, SCRATCH already holds the rows
 * quantized. */
static int matmul_q(const struct bk_weight *const *ws, int nw, const float *x, int32_t T,
	float *const *outs, void *scratch, const struct cuda_launch *lc)
{
	struct cuda_tuning def;
	const struct cuda_tuning *tu = cuda_launch_tuning(lc, &def);
	struct mm_group g;
	long long blocks = 0;
	int blck, r;

	if (!ws || !outs || nw < 1 || nw > CUDA_MM_GROUP || !scratch || (uintptr_t)scratch % 16 ||
	    (uintptr_t)x % 4)
		return -EINVAL;
	for (int k = 0; k < nw; k++) {
		if ((r = mm_check(tu, ws[k], k ? ws[0] : NULL, T)) < 0)
			return r;
		if (!outs[k] || (uintptr_t)outs[k] % 4)
			return -EINVAL;
	}
	int mixed = 0, aligned_k4 = 1; /* of the Q4_K members, for a mixed group */
	for (int k = 0; k < nw; k++) {
		mixed |= ws[k]->type != ws[0]->type;
		if (ws[k]->type == QT_Q4_K)
			aligned_k4 &= mm_aligned16(&ws[k], 1);
	}
	if (mixed && !aligned_k4)
		return -EINVAL; /* (the wide Q4_K kernel, 16-byte rows) */
	const int aligned = mm_aligned16(ws, nw);
	const int wide = mixed || mm_use_wide(tu, ws[0]->type, aligned, T);
	const int mma = !wide && mm_use_mma(tu, ws[0]->type, T);
	mm_block_bytes(ws[0]->type, &blck);
	const int nbk = (int)(ws[0]->n_in / blck);
	const int nt = T <= 8 ? 1 : T <= 16 || blck == QK ? 2 : 4;
	long long runs = 0; /* of 16 weight rows, for the tensor cores */
	for (int k = 0; k < nw; k++)
		runs += (ws[k]->n_out + MMA_ROWS - 1) / MMA_ROWS;
	const int ks = mma ? mm_split(tu, lc ? lc->sms : 0, blck, nbk, nt, runs) : 1;
	const int rows_per_block = ks > 1 ? MMA_ROWS : MM_WARPS * (mma ? MMA_ROWS : 1);
	const unsigned threads = 32u * (ks > 1 ? ks : MM_WARPS);
	const size_t smem = mm_split_smem(blck, nt, ks);
	for (int k = 0; k < CUDA_MM_GROUP; k++) {
		const int used = k < nw;
		g.w[k] = used ? (const uint8_t *)ws[k]->data : NULL;
		g.out[k] = used ? outs[k] : NULL;
		g.row_bytes[k] = used ? ws[k]->row_bytes : 0;
		g.n_out[k] = used ? (int)ws[k]->n_out : 0;
		g.first[k] = used ? (int)blocks : INT_MAX;
		if (used)
			blocks += (ws[k]->n_out + rows_per_block - 1) / rows_per_block;
	}
	if (blocks > 0x7fffffffLL)
		return -EINVAL;
	g.first[CUDA_MM_GROUP] = INT_MAX;
	for (int k = 0; k < CUDA_MM_GROUP; k++)
		g.q6[k] = k < nw && ws[k]->type == QT_Q6_K;

	const struct bk_weight *w = ws[0];
	const int n_in = (int)w->n_in;
	const size_t stride = mm_xq_stride(w->type, w->n_in);
	uint8_t *xq = (uint8_t *)scratch;
	struct mm_launch l = { g, 0, xq, stride, (int)T, ks, (unsigned)blocks, threads, smem };

	if (blck == QK) {
		const int nb = n_in / QK;
		const long long warps = (long long)T * nb;
		const long long qblocks = (warps + MMQ_WARPS - 1) / MMQ_WARPS;
		if (qblocks > 0x7fffffffLL)
			return -EINVAL;
		if (x) {
			LAUNCH_ON(lc, quantize_q8_kernel, (unsigned)qblocks, MMQ_WARPS * 32, 0, x, n_in,
			       (int)T, w->type == QT_Q4_1 ? 1 : 0, xq, stride);
			if (mm_launched())
				return -EIO;
		}
		l.nb = nb;
		return mm_launch_family(&l, tu, w->type, mixed, wide, mma, aligned, lc);
	}

	const int nsb = n_in / QK_K;
	if ((long long)T * nsb > 0x7fffffffLL)
		return -EINVAL;
	if (x) {
		LAUNCH_ON(lc, quantize_q8k_kernel, (unsigned)(T * nsb), MMQK_THREADS, 0, x, n_in, xq, stride);
		if (mm_launched())
			return -EIO;
	}
	l.nb = nsb;
	return mm_launch_family(&l, tu, w->type, mixed, wide, mma, aligned, lc);
}

extern "C" int cuda_matmul_q_group(const struct bk_weight *const *w, int nw, const float *x, int32_t T,
	float *const *out, void *scratch, const struct cuda_launch *lc)
{
	return matmul_q(w, nw, x, T, out, scratch, lc);
}

extern "C" int cuda_matmul_q(const struct bk_weight *w, const float *x, int32_t T, float *out,
	void *scratch, const struct cuda_launch *lc)
{
	return x ? matmul_q(&w, 1, x, T, &out, scratch, lc) : -EINVAL;
}
