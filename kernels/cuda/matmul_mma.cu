/* matmul_mma.cu - the matmul kernels on the int8 tensor cores
 * (mma.sync m16n8k32, cuda_mma.h): a warp per 16 weight rows, split-K over
 * up to 16 warps.  The plan and the activations' quantization are
 * matmul.cu's; the dp4a and wide kernels live beside it.
 */
#include "matmul.cuh"

/* ---- matmul: 32-element blocks on the tensor cores ----
 *
 * mma_s8_m16n8k32 (cuda_mma.h) takes one block's whole integer dot product
 * for 16 weight rows by 8 activation rows at once: its k = 32 is a block.
 * The float steps stay matmul_q32_kernel's, per (weight row, activation
 * row) pair: the sums are the same integers, so every output has the same
 * bits on either path, and the path may follow T without breaking batch
 * invariance.  A warp takes 16 weight rows and walks quant.c's 16 float
 * lanes one at a time, in the order hsum16's tree adds them (l = 0, 8, 4,
 * 12, 2, ...: four bits reversed), folding each finished lane into the
 * tree at once, so it keeps 6 floats per pair rather than 32. */

/* An A fragment's 4 codes of a Q4_0 block as signed bytes: nibble n is
 * n - 8 (n ^ 8 with bits 4..7 set where n < 8), the same integer sum as
 * dot4's -8 * sum(a). */
static __device__ __forceinline__ int q4_0_signed(int n)
{
	const unsigned u = (unsigned)n;
	return (int)(u ^ 0x08080808u ^ ((~u & 0x08080808u) * 0x1eu));
}

/* This lane's A fragment of block BLK0 (row g) and BLK1 (row g + 8):
 * elements 4q..4q+3 and 16+4q..16+4q+3 of each. */
template <int TYPE>
static __device__ __forceinline__ void mma_a_codes(const uint8_t *blk0, const uint8_t *blk1, int q, int a[4])
{
	a[0] = w_codes<TYPE>(blk0, 0, q);
	a[1] = w_codes<TYPE>(blk1, 0, q);
	a[2] = w_codes<TYPE>(blk0, 1, q);
	a[3] = w_codes<TYPE>(blk1, 1, q);
	if (TYPE == QT_Q4_0)
UNROLL
		for (int i = 0; i < 4; i++)
			a[i] = q4_0_signed(a[i]);
}

/* Block B of the lane's weight rows W0, W1 against every column tile:
 * ACC[tile][i] += its integer dot (piece PIECE only where >= 0: the
 * elements 4 * PIECE.. and 16 + 4 * PIECE.., a ragged block's share of one
 * lane) times the scales, as matmul_q32_kernel does; Q4_1's m * s into
 * MACC for whole blocks.  XB: the lane's B column of each tile; DA: the
 * scales of its D columns 2q, 2q + 1. */
template <int TYPE, int NT>
static __device__ __forceinline__ void mma_block(const uint8_t *w0, const uint8_t *w1, int b, int q, int piece,
	const uint8_t *const *xb, const float *const (*da)[2], int nb, float (*acc)[4], float (*macc)[4])
{
	const int bytes = q32_traits<TYPE>::bytes;
	const uint8_t *blk0 = w0 + (size_t)b * bytes, *blk1 = w1 + (size_t)b * bytes;
	int a[4];
	mma_a_codes<TYPE>(blk0, blk1, q, a);
	if (piece >= 0 && piece != q)
UNROLL
		for (int i = 0; i < 4; i++)
			a[i] = 0;
	const float dw0 = ld_f16(blk0), dw1 = ld_f16(blk1);
UNROLL
	for (int n = 0; n < NT; n++) {
		const int *x = reinterpret_cast<const int *>(xb[n] + (size_t)b * QK);
		const int bf[2] = { __ldg(&x[q]), __ldg(&x[4 + q]) };
		int d[4] = { 0, 0, 0, 0 };
		mma_s8_m16n8k32(d, a, bf);
		const float da0 = __ldg(&da[n][0][b]), da1 = __ldg(&da[n][1][b]);
		acc[n][0] = fmaf((float)d[0], dw0 * da0, acc[n][0]);
		acc[n][1] = fmaf((float)d[1], dw0 * da1, acc[n][1]);
		acc[n][2] = fmaf((float)d[2], dw1 * da0, acc[n][2]);
		acc[n][3] = fmaf((float)d[3], dw1 * da1, acc[n][3]);
		if (TYPE == QT_Q4_1 && piece < 0) {
			const float mw0 = ld_f16(blk0 + 2), mw1 = ld_f16(blk1 + 2);
			const float s0 = __ldg(&da[n][0][nb + b]), s1 = __ldg(&da[n][1][nb + b]);
			macc[n][0] = fmaf(mw0, s0, macc[n][0]);
			macc[n][1] = fmaf(mw0, s1, macc[n][1]);
			macc[n][2] = fmaf(mw1, s0, macc[n][2]);
			macc[n][3] = fmaf(mw1, s1, macc[n][3]);
		}
	}
}

/* Row R of a tensor-core warp's 16 weight rows: the weight's last one where
 * R is past its end (read, never stored). */
static __device__ __forceinline__ const uint8_t *mma_w_row(const mm_row &m, int r)
{
	return m.w + (size_t)(r < m.rows ? r : m.rows - 1) * m.row_bytes;
}

/* The activation rows lane 4g + q reads in a pass of NT tiles from row T0:
 * XB[n], tile n's B column g; XC[n][c], its D column 2q + c.  Rows past T
 * read row T - 1 (never stored). */
template <int NT>
static __device__ __forceinline__ void mma_x_rows(const uint8_t *xq, size_t stride, int T, int t0, int g, int q,
	const uint8_t **xb, const uint8_t *(*xc)[2])
{
UNROLL
	for (int n = 0; n < NT; n++) {
		const int tb = t0 + 8 * n + g, tc = t0 + 8 * n + 2 * q;
		xb[n] = xq + (size_t)(tb < T ? tb : T - 1) * stride;
UNROLL
		for (int c = 0; c < 2; c++)
			xc[n][c] = xq + (size_t)(tc + c < T ? tc + c : T - 1) * stride;
	}
}

/* Lane 4g + q's outputs V of a pass of NT tiles from row T0 (D's layout:
 * weight rows g, g + 8 by activation rows 2q, 2q + 1 of each tile), those
 * past the weight's end or T left out. */
template <int NT>
static __device__ __forceinline__ void mma_store(const mm_row &m, int g, int q, int t0, int T, const float (*v)[4])
{
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++) {
			const int row = g + 8 * (i / 2), col = t0 + 8 * n + 2 * q + i % 2;
			if (row < m.rows && col < T)
				m.out[(size_t)col * m.n_out + row] = v[n][i];
		}
}

/* Float lane L of quant.c's 16 for the lane's weight rows W0, W1 (rows g,
 * g + 8) and each tile's columns: its blocks L, L + 16, ..., its piece of
 * the ragged end (blocks B16 + 4k + L % 4, piece L / 4 of each), Q4_1's
 * m * s of ragged block B16 + L; CUR gets acc + macc per output. */
template <int TYPE, int NT>
static __device__ __forceinline__ void q32_lane(const uint8_t *w0, const uint8_t *w1, int l, int b16, int nb,
	int q, const uint8_t *const *xb, const float *const (*da)[2], float (*cur)[4])
{
	float acc[NT][4], macc[NT][4];
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++)
			acc[n][i] = macc[n][i] = 0.0f;
	for (int b = l; b < b16; b += 16)
		mma_block<TYPE, NT>(w0, w1, b, q, -1, xb, da, nb, acc, macc);
	for (int b = b16 + l % 4; b < nb; b += 4)
		mma_block<TYPE, NT>(w0, w1, b, q, l / 4, xb, da, nb, acc, macc);
	if (TYPE == QT_Q4_1 && b16 + l < nb) {
		const int b = b16 + l;
		const float mw0 = ld_f16(w0 + (size_t)b * q32_traits<TYPE>::bytes + 2);
		const float mw1 = ld_f16(w1 + (size_t)b * q32_traits<TYPE>::bytes + 2);
UNROLL
		for (int n = 0; n < NT; n++) {
			const float s0 = __ldg(&da[n][0][nb + b]), s1 = __ldg(&da[n][1][nb + b]);
			macc[n][0] = fmaf(mw0, s0, macc[n][0]);
			macc[n][1] = fmaf(mw0, s1, macc[n][1]);
			macc[n][2] = fmaf(mw1, s0, macc[n][2]);
			macc[n][3] = fmaf(mw1, s1, macc[n][3]);
		}
	}
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++)
			cur[n][i] = acc[n][i] + macc[n][i];
}

/* The float lane that comes LI-th in hsum16's order: LI's 4 bits reversed. */
static __device__ __forceinline__ int hsum16_lane(int li)
{
	return (li & 1) << 3 | (li & 2) << 1 | (li & 4) >> 1 | (li & 8) >> 3;
}

/* Float lane number LI of hsum16's order (hsum16_lane) into the tree:
 * merged while LI's low bits are ones; the last lands in V. */
template <int NT>
static __device__ __forceinline__ void q32_tree(int li, float (*cur)[4], float (*tree)[NT][4], float (*v)[4])
{
UNROLL
	for (int n = 0; n < NT; n++)
UNROLL
		for (int i = 0; i < 4; i++) {
			float c = cur[n][i];
			int k = 0;
			for (; k < 4 && (li >> k & 1); k++)
				c = tree[k][n][i] + c;
			if (k < 4)
				tree[k][n][i] = c;
			else
				v[n][i] = c;
		}
}

/* One warp per 16 weight rows (A's rows g, g + 8 in lane 4g + q), NT
 * tiles of 8 activation rows per pass over them (D's columns 2q, 2q + 1).
 * Rows past the weight's end or T read the last real one and are not
 * stored.  Every loop bound is uniform over the warp.
 *
 * Split-K (KS > 1, a block of KS warps on one run of 16 rows): warp kw
 * takes float lanes number kw, kw + KS, ... (of hsum16's order) and leaves
 * each lane's sums in shared memory (PART: 16 x NT x 4 floats per thread
 * of a warp, mm_split_smem); then warp 0 adds them up the tree in order:
 * the same operations, so the same bits, with 16 / KS times fewer blocks
 * in a row for each warp to walk. */
template <int TYPE, int NT>
static __global__ void matmul_q32_mma_kernel(const mm_group g, int nb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4, kw = ks > 1 ? (int)threadIdx.x / 32 : 0;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float, part);
	const uint8_t *w0 = mma_w_row(m, gr), *w1 = mma_w_row(m, gr + 8);
	const int b16 = nb - nb % 16;
	const int n_in = nb * QK;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2]; /* each D column's d, then (Q8_1) s */
		mma_x_rows<NT>(xq, stride, T, t0, gr, q, xb, xc);
UNROLL
		for (int n = 0; n < NT; n++)
UNROLL
			for (int c = 0; c < 2; c++)
				da[n][c] = reinterpret_cast<const float *>(xc[n][c] + n_in);
		/* hsum16's tree: level k holds the sum of 2^k finished lanes */
		float tree[4][NT][4];
		float v[NT][4];
		float cur[NT][4];
		if (ks == 1) {
UNROLL
			for (int li = 0; li < 16; li++) {
				const int l = hsum16_lane(li);
				q32_lane<TYPE, NT>(w0, w1, l, b16, nb, q, xb, da, cur);
				q32_tree<NT>(li, cur, tree, v);
			}
		} else {
			for (int li = kw; li < 16; li += ks) {
				const int l = hsum16_lane(li);
				q32_lane<TYPE, NT>(w0, w1, l, b16, nb, q, xb, da, cur);
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						part[((li * NT + n) * 4 + i) * 32 + lane] = cur[n][i];
			}
			__syncthreads();
			if (kw == 0)
UNROLL
				for (int li = 0; li < 16; li++) {
UNROLL
					for (int n = 0; n < NT; n++)
UNROLL
						for (int i = 0; i < 4; i++)
							cur[n][i] = part[((li * NT + n) * 4 + i) * 32 + lane];
					q32_tree<NT>(li, cur, tree, v);
				}
			__syncthreads(); /* read: the next pass may write */
		}
		if (kw == 0)
			mma_store<NT>(m, gr, q, t0, T, v);
	}
}

/* ---- matmul: K-quants on the tensor cores ----
 *
 * A warp takes 16 weight rows (A's rows g, g + 8 in lane 4g + q) against
 * NT tiles of 8 activation rows a pass, each A fragment shared by the NT
 * mmas.  A 32-element slice of a super-block is mma_s8_m16n8k32's k.  Each
 * sub-block's integer dot times its integer scale (and Q4_K/Q5_K's mins
 * times the activations' sums) sums exactly into the super-block's sumi
 * and summ, then matmul_k_kernel's two fmas per super-block in order: the
 * integers of k_sums and the same float steps, so the same bits.
 *
 * An mma's k need not be the elements in order, only the same order in A
 * and B: lane 4g + q takes elements 8q..8q+7 of a slice as its k = 4q..
 * and 16+4q.. pieces, so each piece pair is one 8-byte run of the weights'
 * bytes and of the activations'.
 *
 * Q4_K / Q5_K (matmul_k45_mma_kernel): a sub-block is a slice; a row's
 * codes for two sub-blocks (the low and high nibbles of the same bytes)
 * are one 8-byte load, a super-block's head (d, dmin, 12 bytes of scales)
 * one 16-byte load, its 6-bit scales and mins unpacked four at a time; the
 * mins term takes the activations' int16 sums over 32 codes (quant_q8.cuh)
 * through four dp2a per (weight row, activation row).  Those loads are
 * whole words where every row starts 16-byte aligned (ALIGNED: cudaMalloc'd
 * weights do, and 144 and 176 bytes per super-block keep each one so),
 * 16-bit ones otherwise. */

/* The start of a K-quant pass of NT tiles from row T0: XB[n], tile n's B
 * column from element 8q (the lane's k pieces); XC[n][c], its D column
 * 2q + c's row and DA[n][c] that row's d per super-block; ACC zero. */
template <int NT>
static __device__ __forceinline__ void mma_k_pass(const uint8_t *xq, size_t stride, int T, int t0, int g, int q,
	int n_in, const uint8_t **xb, const uint8_t *(*xc)[2], const float *(*da)[2], float (*acc)[4])
{
	mma_x_rows<NT>(xq, stride, T, t0, g, q, xb, xc);
UNROLL
	for (int n = 0; n < NT; n++) {
		xb[n] += 8 * q;
UNROLL
		for (int c = 0; c < 2; c++)
			da[n][c] = reinterpret_cast<const float *>(xc[n][c] + n_in);
UNROLL
		for (int i = 0; i < 4; i++)
			acc[n][i] = 0.0f;
	}
}

/* 8 (16) bytes at P: whole words where ALIGNED, else 16-bit loads. */
template <bool ALIGNED>
static __device__ __forceinline__ uint2 ld_u2(const uint8_t *p)
{
	if (ALIGNED)
		return __ldg(reinterpret_cast<const uint2 *>(p));
	return make_uint2((unsigned)ld_i32(p), (unsigned)ld_i32(p + 4));
}

template <bool ALIGNED>
static __device__ __forceinline__ uint4 ld_u4(const uint8_t *p)
{
	if (ALIGNED)
		return __ldg(reinterpret_cast<const uint4 *>(p));
	return make_uint4((unsigned)ld_i32(p), (unsigned)ld_i32(p + 4), (unsigned)ld_i32(p + 8),
			  (unsigned)ld_i32(p + 12));
}

/* The K-quant kernels' pointers N super-blocks on: the weight rows W (at
 * BYTES per super-block), each tile's B column XB, its D columns' d (DA)
 * and, where BS is not NULL, their int16 sums. */
template <int NT>
static __device__ __forceinline__ void k_advance(int n, int bytes, const uint8_t **w, const uint8_t **xb,
	const float *(*da)[2], const uint4 *(*bs)[2])
{
	w[0] += (size_t)n * bytes;
	w[1] += (size_t)n * bytes;
UNROLL
	for (int t = 0; t < NT; t++) {
		xb[t] += (size_t)n * QK_K;
UNROLL
		for (int c = 0; c < 2; c++) {
			da[t][c] += n;
			if (bs)
				bs[t][c] += n;
		}
	}
}

/* A K-quant warp's part in split-K (KS warps of a block on one run of
 * rows, warp KW taking super-blocks KW, KW + KS, ...; KS 1: none): PART,
 * the block's shared memory for k_chain's two buffers, and the chunks of
 * KS super-blocks done so far, which pick the buffer. */
struct k_split {
	int ks;       /* warps on the run */
	int kw;       /* this warp's index among them */
	int chunk;    /* chunks done (k_chain counts them) */
	float4 *part; /* (2, ks, NT * 4, 32) float4: the block's dynamic shared memory */
};

/* A super-block's float steps for each output of the lane, in order:
 * acc = fma(F.x, F.y, acc), then (NF 2: Q4_K/Q5_K's mins) fma(F.z, F.w).
 * KS 1: at once.  Split-K: the chunk's N real super-blocks go through a
 * buffer of KS x NT x 4 float4 per thread of a warp, and warp 0 applies
 * them in super-block order: the same operations, so the same bits; only
 * for the outputs in the pass's first COLS activation rows (D's column
 * 8t + 2q + i % 2: the others are never stored, and at T = 1 they are 7
 * of every 8).  Every thread of the block calls it, once per chunk. */
template <int NT, int NF>
static __device__ __forceinline__ void k_chain(const float4 (*f)[4], float (*acc)[4], k_split &sp, int n,
	int lane, int cols)
{
	const int ks = sp.ks, kw = sp.kw;
	if (ks == 1) {
UNROLL
		for (int t = 0; t < NT; t++)
UNROLL
			for (int i = 0; i < 4; i++) {
				acc[t][i] = fmaf(f[t][i].x, f[t][i].y, acc[t][i]);
				if (NF == 2)
					acc[t][i] = fmaf(f[t][i].z, f[t][i].w, acc[t][i]);
			}
		return;
	}
	float4 *buf = sp.part + (size_t)(sp.chunk++ & 1) * ks * NT * 4 * 32;
	const int c0 = 2 * (lane % 4); /* the lane's first D column of a tile */
	if (kw < n)
UNROLL
		for (int t = 0; t < NT; t++)
UNROLL
			for (int i = 0; i < 4; i++)
				if (8 * t + c0 + i % 2 < cols)
					buf[((kw * NT + t) * 4 + i) * 32 + lane] = f[t][i];
	__syncthreads(); /* and buffer chunk + 1's last readers are done */
	if (kw == 0)
		for (int s = 0; s < n; s++)
UNROLL
			for (int t = 0; t < NT; t++)
UNROLL
				for (int i = 0; i < 4; i++) {
					if (8 * t + c0 + i % 2 >= cols)
						continue;
					const float4 v = buf[((s * NT + t) * 4 + i) * 32 + lane];
					acc[t][i] = fmaf(v.x, v.y, acc[t][i]);
					if (NF == 2)
						acc[t][i] = fmaf(v.z, v.w, acc[t][i]);
				}
}

template <int TYPE, int NT, bool ALIGNED>
static __global__ void matmul_k45_mma_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float4, part);
	k_split sp = { ks, ks > 1 ? (int)threadIdx.x / 32 : 0, 0, part };
	const int bytes = k_traits<TYPE>::bytes;
	const int n_in = nsb * QK_K;
	const size_t bs32 = q8k_bs32_offset(n_in);
	const int qs = TYPE == QT_Q5_K ? 48 : 16;
	const unsigned lo4 = 0x0f0f0f0fu;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		/* pointers that step a super-block at a time: the weight rows'
		 * bytes 8q.. (of the codes, and of Q5_K's high bits), each B
		 * column's codes 8q.., each D column's d and int16 sums */
		const uint8_t *w[2] = { mma_w_row(m, gr) + 8 * q, mma_w_row(m, gr + 8) + 8 * q };
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2];
		const uint4 *bs[NT][2];
		float acc[NT][4];
		mma_k_pass<NT>(xq, stride, T, t0, gr, q, n_in, xb, xc, da, acc);
UNROLL
		for (int n = 0; n < NT; n++)
UNROLL
			for (int c = 0; c < 2; c++)
				bs[n][c] = reinterpret_cast<const uint4 *>(xc[n][c] + bs32);
		k_advance<NT>(sp.kw, bytes, w, xb, da, bs);

		for (int b0 = 0; b0 < nsb; b0 += ks) {
			float4 f[NT][4];
			/* the weight rows' bytes 8q.. of this super-block */
			const uint8_t *wr[2] = { w[0], w[1] };
			if (b0 + sp.kw < nsb) {
				float dw[2], dm[2];
				unsigned sc[2][2], mn[2][2];
				uint2 qh[2];
UNROLL
				for (int r = 0; r < 2; r++) {
					const uint4 h = ld_u4<ALIGNED>(wr[r] - 8 * q);
					dw[r] = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
					dm[r] = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
					k4_scales_packed(h.y, h.z, h.w, sc[r], mn[r]);
					if (TYPE == QT_Q5_K)
						qh[r] = ld_u2<ALIGNED>(wr[r] + 16);
				}
				int sumi[NT][4];
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						sumi[n][i] = 0;
UNROLL
				for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles), 2p + 1 */
					uint2 c[2];
UNROLL
					for (int r = 0; r < 2; r++)
						c[r] = ld_u2<ALIGNED>(wr[r] + qs + 32 * p);
UNROLL
					for (int hi = 0; hi < 2; hi++) {
						const int s = 2 * p + hi;
						/* a[0], a[2]: row g's elements 8q.., 8q+4..; a[1], a[3]: row g + 8's */
						unsigned a[4] = { c[0].x >> 4 * hi & lo4, c[1].x >> 4 * hi & lo4,
								  c[0].y >> 4 * hi & lo4, c[1].y >> 4 * hi & lo4 };
						if (TYPE == QT_Q5_K) {
							const unsigned h5[4] = { qh[0].x, qh[1].x, qh[0].y, qh[1].y };
UNROLL
							for (int i = 0; i < 4; i++)
								a[i] |= (h5[i] >> s & 0x01010101u) << 4;
						}
						const int ai[4] = { (int)a[0], (int)a[1], (int)a[2], (int)a[3] };
						/* byte s % 4 of the packed scales, zero-extended: one PRMT */
						const int s0 = (int)__byte_perm(sc[0][s / 4], 0, 0x4440 | s % 4);
						const int s1 = (int)__byte_perm(sc[1][s / 4], 0, 0x4440 | s % 4);
UNROLL
						for (int n = 0; n < NT; n++) {
							const uint2 v = __ldg(reinterpret_cast<const uint2 *>(xb[n] + 32 * s));
							const int bf[2] = { (int)v.x, (int)v.y };
							int d[4] = { 0, 0, 0, 0 };
							mma_s8_m16n8k32(d, ai, bf);
							sumi[n][0] += s0 * d[0];
							sumi[n][1] += s0 * d[1];
							sumi[n][2] += s1 * d[2];
							sumi[n][3] += s1 * d[3];
						}
					}
				}
				/* the mins against the sums over 32 codes, then the two fmas */
UNROLL
				for (int n = 0; n < NT; n++) {
UNROLL
					for (int c = 0; c < 2; c++) {
						const uint4 b4 = __ldg(bs[n][c]);
						const float dac = __ldg(da[n][c]);
UNROLL
						for (int r = 0; r < 2; r++) {
							int summ = __dp2a_lo((int)b4.x, (int)mn[r][0], 0);
							summ = __dp2a_hi((int)b4.y, (int)mn[r][0], summ);
							summ = __dp2a_lo((int)b4.z, (int)mn[r][1], summ);
							summ = __dp2a_hi((int)b4.w, (int)mn[r][1], summ);
							const int i = 2 * r + c;
							f[n][i] = make_float4((float)sumi[n][i], dw[r] * dac, (float)-summ,
									      dm[r] * dac);
						}
					}
				}
			}
			k_chain<NT, 2>(f, acc, sp, nsb - b0 < ks ? nsb - b0 : ks, lane, T - t0);
			k_advance<NT>(ks, bytes, w, xb, da, bs);
		}
		if (sp.kw == 0)
			mma_store<NT>(m, gr, q, t0, T, acc);
	}
}

/* Q6_K (matmul_q6k_mma_kernel): a slice holds two 16-element sub-blocks,
 * lanes q < 2 the first and q >= 2 the second, so each slice takes two
 * mmas per tile with the other sub-block's codes zero, times its scale
 * into sumi.  A row's low nibbles for quarters 0 and 2 (1 and 3) of a half
 * are the same bytes, and its high bits for all four one 8-byte run: a
 * half's codes are three 8-byte runs per row, read 16 bits at a time since
 * 210 bytes per super-block leave rows only 2-byte aligned.  The codes are
 * made signed (c - 32), so no bsums. */
template <int NT>
static __global__ void matmul_q6k_mma_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int ks)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32, gr = lane / 4, q = lane % 4;
	const mm_row m = mm_pick(g, MMA_ROWS, ks);
	if (!m.w) /* whole warps (split-K: the whole block) only */
		return;
	DYN_SHARED(float4, part);
	k_split sp = { ks, ks > 1 ? (int)threadIdx.x / 32 : 0, 0, part };
	const int n_in = nsb * QK_K;
	const int bytes = k_traits<QT_Q6_K>::bytes;
	const bool first = q < 2; /* this lane's elements are a slice's first sub-block */
	const unsigned lo4 = 0x0f0f0f0fu;

	for (int t0 = 0; t0 < T; t0 += 8 * NT) {
		/* pointers that step a super-block at a time: the weight rows,
		 * each B column's codes 8q.., each D column's d */
		const uint8_t *w[2] = { mma_w_row(m, gr), mma_w_row(m, gr + 8) };
		const uint8_t *xb[NT], *xc[NT][2];
		const float *da[NT][2];
		float acc[NT][4];
		mma_k_pass<NT>(xq, stride, T, t0, gr, q, n_in, xb, xc, da, acc);
		k_advance<NT>(sp.kw, bytes, w, xb, da, NULL);

		for (int b0 = 0; b0 < nsb; b0 += ks) {
			float4 f[NT][4];
			/* the weight rows of this super-block */
			const uint8_t *wr[2] = { w[0], w[1] };
			if (b0 + sp.kw < nsb) {
				int sumi[NT][4];
UNROLL
				for (int n = 0; n < NT; n++)
UNROLL
					for (int i = 0; i < 4; i++)
						sumi[n][i] = 0;
UNROLL
				for (int hf = 0; hf < 2; hf++) {
					/* [row][word]: ql for quarters 0/2 and 1/3, qh for all */
					int l02[2][2], l13[2][2], h[2][2];
UNROLL
					for (int r = 0; r < 2; r++)
UNROLL
						for (int k = 0; k < 2; k++) {
							l02[r][k] = ld_i32(wr[r] + 64 * hf + 8 * q + 4 * k);
							l13[r][k] = ld_i32(wr[r] + 64 * hf + 32 + 8 * q + 4 * k);
							h[r][k] = ld_i32(wr[r] + 128 + 32 * hf + 8 * q + 4 * k);
						}
UNROLL
					for (int quarter = 0; quarter < 4; quarter++) {
						const int s = 4 * hf + quarter;
						int c[2][2];
UNROLL
						for (int r = 0; r < 2; r++)
UNROLL
							for (int k = 0; k < 2; k++) {
								const int lo = ((quarter & 1 ? l13[r][k] : l02[r][k]) >> 4 * (quarter >> 1)) & lo4;
								const int hi = (h[r][k] >> 2 * quarter) & 0x03030303;
								c[r][k] = q6_k_signed(lo | hi << 4);
							}
						/* a[0], a[2]: row g's elements 8q.., 8q+4..; a[1], a[3]: row g + 8's */
						const int a0[4] = { first ? c[0][0] : 0, first ? c[1][0] : 0,
								    first ? c[0][1] : 0, first ? c[1][1] : 0 };
						const int a1[4] = { first ? 0 : c[0][0], first ? 0 : c[1][0],
								    first ? 0 : c[0][1], first ? 0 : c[1][1] };
						int sc[2][2];
UNROLL
						for (int r = 0; r < 2; r++) {
							sc[r][0] = __ldg(reinterpret_cast<const int8_t *>(wr[r] + 192 + 2 * s));
							sc[r][1] = __ldg(reinterpret_cast<const int8_t *>(wr[r] + 192 + 2 * s + 1));
						}
UNROLL
						for (int n = 0; n < NT; n++) {
							const uint2 v = __ldg(reinterpret_cast<const uint2 *>(xb[n] + 32 * s));
							const int bf[2] = { (int)v.x, (int)v.y };
							int d0[4] = { 0, 0, 0, 0 }, d1[4] = { 0, 0, 0, 0 };
							mma_s8_m16n8k32(d0, a0, bf);
							mma_s8_m16n8k32(d1, a1, bf);
UNROLL
							for (int i = 0; i < 4; i++)
								sumi[n][i] += sc[i / 2][0] * d0[i] + sc[i / 2][1] * d1[i];
						}
					}
				}
				const float dw[2] = { ld_f16(wr[0] + 208), ld_f16(wr[1] + 208) };
UNROLL
				for (int n = 0; n < NT; n++) {
UNROLL
					for (int c = 0; c < 2; c++) {
						const float dac = __ldg(da[n][c]);
UNROLL
						for (int r = 0; r < 2; r++)
							f[n][2 * r + c] = make_float4((float)sumi[n][2 * r + c], dw[r] * dac,
										      0.0f, 0.0f);
					}
				}
			}
			k_chain<NT, 1>(f, acc, sp, nsb - b0 < ks ? nsb - b0 : ks, lane, T - t0);
			k_advance<NT>(ks, bytes, w, xb, da, NULL);
		}
		if (sp.kw == 0)
			mma_store<NT>(m, gr, q, t0, T, acc);
	}
}

/* ---- the launcher ---- */

/* The tensor-core kernel of a supported TYPE with NT tiles of 8 activation
 * rows a pass (the 32-element types at most 2); ALIGNED: every row
 * 16-byte aligned (mm_aligned16). */
template <int NT>
static mm_kernel mm_mma_kernel_of(uint32_t type, int aligned)
{
	const int nq = NT < 2 ? NT : 2;
	switch (type) {
	case QT_Q4_0: return matmul_q32_mma_kernel<QT_Q4_0, nq>;
	case QT_Q4_1: return matmul_q32_mma_kernel<QT_Q4_1, nq>;
	case QT_Q8_0: return matmul_q32_mma_kernel<QT_Q8_0, nq>;
	case QT_Q4_K:
		return aligned ? matmul_k45_mma_kernel<QT_Q4_K, NT, true>
			       : matmul_k45_mma_kernel<QT_Q4_K, NT, false>;
	case QT_Q5_K:
		return aligned ? matmul_k45_mma_kernel<QT_Q5_K, NT, true>
			       : matmul_k45_mma_kernel<QT_Q5_K, NT, false>;
	default:      return matmul_q6k_mma_kernel<NT>;
	}
}

extern "C" int cuda_mm_mma(const struct mm_launch *l, uint32_t type, int aligned, int nt,
	const struct cuda_launch *lc)
{
	const mm_kernel kernel = nt <= 1 ? mm_mma_kernel_of<1>(type, aligned)
			       : nt == 2 ? mm_mma_kernel_of<2>(type, aligned) : mm_mma_kernel_of<4>(type, aligned);
	return mm_launch_kernel(kernel, l, lc);
}
