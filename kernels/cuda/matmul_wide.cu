/* matmul_wide.cu - the one-row Q4_K and Q6_K matmul kernels that read a
 * weight row 512 bytes a load, alone or as one launch for a group mixing
 * the two.  The plan and the activations' quantization are matmul.cu's;
 * the dp4a and tensor-core kernels live beside it.
 */
#include "matmul.cuh"

/* ---- matmul: Q4_K and Q6_K rows read whole (one activation row) ----
 *
 * At T = 1 the tensor-core kernels waste 7 of the mma's 8 columns and read
 * 8 rows' 32 bytes a load, and their split-K (to have enough warps for
 * HBM) costs a barrier a chunk.
 * Here (the tuning's mm_wide) one warp takes one weight row, reading it 512
 * bytes a load: lane 8c + k takes 16-byte piece k of super-block 4i + c's
 * codes (so a load is 4 super-blocks' codes, contiguous but for their
 * 16-byte heads), U such rounds' loads in flight before any is used.  A
 * piece is 16 codes of sub-block 2j (low nibbles) and the same 16 of
 * 2j + 1 (high), j = k / 2: two dp4a chains times their 6-bit scales; the
 * even pieces add sub-blocks 2j and 2j + 1's mins times the activations'
 * sums over 32 codes.  The 8 lanes of a super-block add those exactly
 * (integers), and the two fmas per super-block then run in order from
 * shared memory, as matmul_k_kernel's: so the same bits. */
#define MM_WIDE_WARPS MM_WARPS /* rows (warps) per block */

/* A super-block's float steps, as matmul_k_kernel takes them: Q4_K's two
 * fmas (sumi * d, -summ * dmin), Q6_K's one. */
static __device__ __forceinline__ float wide_step(float4 v, float acc)
{
	return fmaf(v.z, v.w, fmaf(v.x, v.y, acc));
}

static __device__ __forceinline__ float wide_step(float2 v, float acc)
{
	return fmaf(v.x, v.y, acc);
}

/* A wide warp's chunk from super-block B0: its steps, left in ST by each
 * super-block's lane 0, applied to ACC in super-block order. */
template <int U, typename S>
static __device__ __forceinline__ float wide_chain(const S *st, int b0, int nsb, float acc)
{
	__syncwarp(); /* the chunk's steps are in shared memory */
	const int n = nsb - b0 < 4 * U ? nsb - b0 : 4 * U;
	for (int i = 0; i < n; i++)
		acc = wide_step(st[i], acc);
	__syncwarp(); /* read before the next chunk's writes */
	return acc;
}

/* matmul_q4k_wide_kernel's work after its wait, which
 * matmul_kq_wide_kernel's Q4_K blocks run too. */
template <int U>
static __device__ __forceinline__ void matmul_q4k_wide_body(const mm_group &g, int nsb,
	const uint8_t *__restrict__ xq, size_t stride, int T)
{
	__shared__ float4 steps[MM_WIDE_WARPS][4 * U];
	const int lane = threadIdx.x % 32, c = lane / 8, k = lane % 8, j = k / 2, h = k % 2;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	float4 *st = steps[threadIdx.x / 32];
	const int n_in = nsb * QK_K;
	const int8_t *x = reinterpret_cast<const int8_t *>(xq);
	const float *xd = reinterpret_cast<const float *>(xq + n_in);
	const unsigned *bs = reinterpret_cast<const unsigned *>(xq + q8k_bs32_offset(n_in));
	float acc = 0.0f;

	for (int b0 = 0; b0 < nsb; b0 += 4 * U) {
		uint4 code[U], head[U], xa[U], xb[U];
		unsigned bsw[U];
		float da[U];
UNROLL
		for (int u = 0; u < U; u++) { /* every load of the U rounds first */
			const int sb0 = b0 + 4 * u + c, sb = sb0 < nsb ? sb0 : nsb - 1;
			const uint8_t *blk = m.w + (size_t)sb * k_traits<QT_Q4_K>::bytes;
			head[u] = __ldg(reinterpret_cast<const uint4 *>(blk));
			code[u] = __ldg(reinterpret_cast<const uint4 *>(blk + 16 + 16 * k));
			xa[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + 64 * j + 16 * h));
			xb[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + 64 * j + 32 + 16 * h));
			bsw[u] = __ldg(&bs[4 * sb + j]);
			da[u] = __ldg(&xd[sb]);
		}
UNROLL
		for (int u = 0; u < U; u++) {
			const unsigned cw[4] = { code[u].x, code[u].y, code[u].z, code[u].w };
			const unsigned aw[4] = { xa[u].x, xa[u].y, xa[u].z, xa[u].w };
			const unsigned bw[4] = { xb[u].x, xb[u].y, xb[u].z, xb[u].w };
			int slo = 0, shi = 0;
UNROLL
			for (int i = 0; i < 4; i++) {
				slo = __dp4a((int)(cw[i] & 0x0f0f0f0fu), (int)aw[i], slo);
				shi = __dp4a((int)(cw[i] >> 4 & 0x0f0f0f0fu), (int)bw[i], shi);
			}
			unsigned sc[2], mn[2];
			k4_scales_packed(head[u].y, head[u].z, head[u].w, sc, mn);
			/* sub-blocks 2j, 2j + 1: bytes 2 (j % 2) and + 1 of word j / 2 */
			const unsigned scw = j < 2 ? sc[0] : sc[1], mnw = j < 2 ? mn[0] : mn[1];
			const int sel = 2 * (j % 2);
			int sumi = (int)__byte_perm(scw, 0, 0x4440 | sel) * slo +
				   (int)__byte_perm(scw, 0, 0x4440 | (sel + 1)) * shi;
			int summ = h ? 0
				 : j % 2 ? __dp2a_hi((int)bsw[u], (int)mnw, 0) : __dp2a_lo((int)bsw[u], (int)mnw, 0);
UNROLL
			for (int off = 1; off < 8; off *= 2) {
				sumi += __shfl_xor_sync(MM_FULL, sumi, off);
				summ += __shfl_xor_sync(MM_FULL, summ, off);
			}
			if (k == 0) {
				const float dw = __half2float(__ushort_as_half((unsigned short)(head[u].x & 0xffffu)));
				const float dm = __half2float(__ushort_as_half((unsigned short)(head[u].x >> 16)));
				st[4 * u + c] = make_float4((float)sumi, dw * da[u], (float)-summ, dm * da[u]);
			}
		}
		acc = wide_chain<U>(st, b0, nsb, acc);
	}
	if (lane == 0)
		m.out[0] = acc;
}

template <int U>
static __global__ void matmul_q4k_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	matmul_q4k_wide_body<U>(g, nsb, xq, stride, T);
}

/* Q6_K a row a warp: as Q4_K's, lane 8c + k on super-block 4i + c, its
 * piece k = 4 hf + 2 q + p (hf: the half of 128 elements, q: quarter q
 * and q + 2 of it, p: elements 16p.. of each quarter): 16 bytes of ql
 * (quarter q's low nibbles, q + 2's high ones) and the 16 bytes of qh that
 * hold both quarters' top bits, 32 codes made signed (c - 32, as
 * matmul_q6k_mma_kernel) into two dp4a chains times their groups' int8
 * scales.  210 bytes a super-block leave them only 2-byte aligned: each
 * 16 bytes are 5 aligned words funnel-shifted into 4. */
static __device__ __forceinline__ uint4 ld_u4_a2(const uint8_t *p)
{
	const unsigned *a = reinterpret_cast<const unsigned *>(p - ((uintptr_t)p & 2));
	const unsigned sh = ((unsigned)(uintptr_t)p & 2) * 8;
	unsigned w[5];
UNROLL
	for (int i = 0; i < 5; i++)
		w[i] = __ldg(&a[i]);
	return make_uint4(__funnelshift_r(w[0], w[1], sh), __funnelshift_r(w[1], w[2], sh),
			  __funnelshift_r(w[2], w[3], sh), __funnelshift_r(w[3], w[4], sh));
}

/* matmul_q6k_wide_kernel's work after its wait, which
 * matmul_kq_wide_kernel's Q6_K blocks run too. */
template <int U>
static __device__ __forceinline__ void matmul_q6k_wide_body(const mm_group &g, int nsb,
	const uint8_t *__restrict__ xq, size_t stride, int T)
{
	__shared__ float2 steps[MM_WIDE_WARPS][4 * U];
	const int lane = threadIdx.x % 32, c = lane / 8, k = lane % 8;
	const int hf = k / 4, q = k / 2 % 2, p = k % 2;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	float2 *st = steps[threadIdx.x / 32];
	const int n_in = nsb * QK_K;
	const int8_t *x = reinterpret_cast<const int8_t *>(xq);
	const float *xd = reinterpret_cast<const float *>(xq + n_in);
	const int e0 = 128 * hf + 32 * q + 16 * p; /* the low nibbles' first element; + 64 the high's */
	const int grp = e0 / 16;                   /* their scales: groups grp and grp + 4 */
	float acc = 0.0f;

	for (int b0 = 0; b0 < nsb; b0 += 4 * U) {
		uint4 ql[U], qh[U], xa[U], xb[U];
		int sc0[U], sc1[U];
		float dw[U], da[U];
UNROLL
		for (int u = 0; u < U; u++) { /* every load of the U rounds first */
			const int sb0 = b0 + 4 * u + c, sb = sb0 < nsb ? sb0 : nsb - 1;
			const uint8_t *blk = m.w + (size_t)sb * k_traits<QT_Q6_K>::bytes;
			ql[u] = ld_u4_a2(blk + 64 * hf + 32 * q + 16 * p);
			qh[u] = ld_u4_a2(blk + 128 + 32 * hf + 16 * p);
			sc0[u] = __ldg(reinterpret_cast<const int8_t *>(blk + 192 + grp));
			sc1[u] = __ldg(reinterpret_cast<const int8_t *>(blk + 192 + grp + 4));
			dw[u] = ld_f16(blk + 208);
			xa[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + e0));
			xb[u] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)sb * QK_K + e0 + 64));
			da[u] = __ldg(&xd[sb]);
		}
UNROLL
		for (int u = 0; u < U; u++) {
			const unsigned lw[4] = { ql[u].x, ql[u].y, ql[u].z, ql[u].w };
			const unsigned hw[4] = { qh[u].x, qh[u].y, qh[u].z, qh[u].w };
			const unsigned aw[4] = { xa[u].x, xa[u].y, xa[u].z, xa[u].w };
			const unsigned bw[4] = { xb[u].x, xb[u].y, xb[u].z, xb[u].w };
			int t0 = 0, t1 = 0;
UNROLL
			for (int i = 0; i < 4; i++) {
				const unsigned lo = (lw[i] & 0x0f0f0f0fu) | (hw[i] >> 2 * q & 0x03030303u) << 4;
				const unsigned hi = (lw[i] >> 4 & 0x0f0f0f0fu) | (hw[i] >> (2 * q + 4) & 0x03030303u) << 4;
				t0 = __dp4a(q6_k_signed((int)lo), (int)aw[i], t0);
				t1 = __dp4a(q6_k_signed((int)hi), (int)bw[i], t1);
			}
			int sumi = sc0[u] * t0 + sc1[u] * t1;
UNROLL
			for (int off = 1; off < 8; off *= 2)
				sumi += __shfl_xor_sync(MM_FULL, sumi, off);
			if (k == 0)
				st[4 * u + c] = make_float2((float)sumi, dw[u] * da[u]);
		}
		acc = wide_chain<U>(st, b0, nsb, acc);
	}
	if (lane == 0)
		m.out[0] = acc;
}

template <int U>
static __global__ void matmul_q6k_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	matmul_q6k_wide_body<U>(g, nsb, xq, stride, T);
}

/* ---- Q4_K and Q6_K weights in one launch ----
 *
 * One row of a group of Q4_K and Q6_K weights sharing their input (a
 * Q4_K_M model's q and k are Q4_K, its v Q6_K in half the layers) takes
 * one launch of the wide kernels rather than one a type, with
 * the tuning's mm_mixed: each block runs its member's type's body, the
 * same code as alone, so the same bits. */

/* Whether this block's member of G (mm_member) is Q6_K, read with
 * constant indices as mm_pick does. */
static __device__ __forceinline__ bool mm_member_q6(const mm_group &g)
{
	const int k0 = mm_member(g);
	bool q6 = false;
UNROLL
	for (int k = 0; k < CUDA_MM_GROUP; k++)
		if (k == k0)
			q6 = g.q6[k];
	return q6;
}

template <int U>
static __global__ void matmul_kq_wide_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	if (mm_member_q6(g)) /* uniform across the block */
		matmul_q6k_wide_body<U>(g, nsb, xq, stride, T);
	else
		matmul_q4k_wide_body<U>(g, nsb, xq, stride, T);
}

/* ---- the launcher ---- */

/* The wide kernel of TYPE with ROUNDS of loads in flight. */
static mm_kernel mm_wide_kernel(int rounds, uint32_t type)
{
	switch (rounds) {
	case 1:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<1> : matmul_q4k_wide_kernel<1>;
	case 2:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<2> : matmul_q4k_wide_kernel<2>;
	case 4:  return type == QT_Q6_K ? matmul_q6k_wide_kernel<4> : matmul_q4k_wide_kernel<4>;
	default: return type == QT_Q6_K ? matmul_q6k_wide_kernel<8> : matmul_q4k_wide_kernel<8>;
	}
}

/* The mixed Q4_K / Q6_K group's kernel (matmul_kq_wide_kernel). */
static mm_kernel mm_kq_kernel(int rounds)
{
	switch (rounds) {
	case 1:  return matmul_kq_wide_kernel<1>;
	case 2:  return matmul_kq_wide_kernel<2>;
	case 4:  return matmul_kq_wide_kernel<4>;
	default: return matmul_kq_wide_kernel<8>;
	}
}

extern "C" int cuda_mm_wide(const struct mm_launch *l, uint32_t type, int rounds, int mixed,
	const struct cuda_launch *lc)
{
	return mm_launch_kernel(mixed ? mm_kq_kernel(rounds) : mm_wide_kernel(rounds, type), l, lc);
}
