/* matmul_dp4a.cu - the matmul kernels that give a warp a weight row and
 * take __dp4a integer dot products: the 32-element types (Q4_0, Q4_1,
 * Q8_0) and the K-quants.  The plan and the activations' quantization are
 * matmul.cu's; the tensor-core and wide kernels live beside it.
 */
#include "matmul.cuh"

/* ---- matmul: 32-element blocks (Q4_0, Q4_1, Q8_0) ---- */

/* One warp per weight row; lane l (< 16) and l + 16 hold quant.c's float
 * lane l.  Full groups of 16 blocks: block b goes to lane b % 16, lane
 * l + 16 taking elements 16..31.  Then the ragged blocks, block b feeding
 * lanes 4t + b % 4 with the partial over elements 4t..4t+3 (half 0) and
 * 16+4t..16+4t+3 (half 1).  Every loop bound is uniform over the warp, so
 * the shuffles always see all 32 lanes. */
template <int TYPE>
static __global__ void matmul_q32_kernel(const mm_group g, int nb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	const int l = lane % 16, h = lane / 16;
	const uint8_t *wrow = m.w;
	const int b16 = nb - nb % 16;
	const int n_in = nb * QK;
	const int bytes = q32_traits<TYPE>::bytes;

	for (int t0 = 0; t0 < T; t0 += MM_TB) {
		const int nt = T - t0 < MM_TB ? T - t0 : MM_TB;
		float acc[MM_TB], macc[MM_TB];
		const uint8_t *xr[MM_TB];
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			acc[j] = 0.0f;
			macc[j] = 0.0f;
			xr[j] = xq + (size_t)(t0 + (j < nt ? j : 0)) * stride;
		}

		for (int b = l; b < b16; b += 16) {
			const uint8_t *blk = wrow + (size_t)b * bytes;
			int wc[4];
UNROLL
			for (int k = 0; k < 4; k++)
				wc[k] = w_codes<TYPE>(blk, h, k);
			const float dw = ld_f16(blk);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt) /* uniform: nt is the same in every lane */
					break;
				const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK + 16 * h);
				int s = 0;
UNROLL
				for (int k = 0; k < 4; k++)
					s += dot4<TYPE>(wc[k], __ldg(&a[k]));
				s += __shfl_xor_sync(MM_FULL, s, 16);
				const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
				const float dd = dw * __ldg(&ds[b]);
				acc[j] = fmaf((float)s, dd, acc[j]);
				if (TYPE == QT_Q4_1)
					macc[j] = fmaf(ld_f16(blk + 2), __ldg(&ds[nb + b]), macc[j]);
			}
		}

		/* The ragged end: blocks b16 + 4k + r feed lane 4t + r. */
		const int r = l % 4, tq = l / 4;
		for (int k = 0; b16 + 4 * k < nb; k++) {
			const int b = b16 + 4 * k + r;
			const bool ok = b < nb;
			const uint8_t *blk = wrow + (size_t)(ok ? b : b16) * bytes;
			int wc;
			if (TYPE == QT_Q8_0)
				wc = ld_i32(blk + q32_traits<TYPE>::qs + 16 * h + 4 * tq);
			else
				wc = (ld_i32(blk + q32_traits<TYPE>::qs + 4 * tq) >> (4 * h)) & 0x0f0f0f0f;
			const float dw = ld_f16(blk);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const int *a = reinterpret_cast<const int *>(
					xr[j] + (size_t)(ok ? b : b16) * QK + 16 * h + 4 * tq);
				int s = dot4<TYPE>(wc, __ldg(a));
				s += __shfl_xor_sync(MM_FULL, s, 16);
				if (ok) {
					const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
					acc[j] = fmaf((float)s, dw * __ldg(&ds[b]), acc[j]);
				}
			}
		}

		/* Q4_1's m*s of the ragged blocks: block b16 + l goes to lane l. */
		if (TYPE == QT_Q4_1 && b16 + l < nb) {
			const uint8_t *blk = wrow + (size_t)(b16 + l) * bytes;
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const float *ds = reinterpret_cast<const float *>(xr[j] + n_in);
				macc[j] = fmaf(ld_f16(blk + 2), __ldg(&ds[nb + b16 + l]), macc[j]);
			}
		}

		/* hsum16: (a[l] + a[l+8]), then +4, +2, +1; float addition
		 * commutes, so the xor butterfly gives its bits in lane 0. */
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			float v = acc[j] + macc[j];
			for (int off = 8; off > 0; off /= 2)
				v += __shfl_xor_sync(MM_FULL, v, off);
			if (lane == 0)
				m.out[(size_t)(t0 + j) * m.n_out] = v;
		}
	}
}

/* ---- matmul: K-quants (Q4_K, Q5_K, Q6_K) against Q8_K ---- */

/* The 6-bit scale and min of sub-block J of a Q4_K/Q5_K super-block. */
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
	if (j < 4) {
		*sc = __ldg(&q[j]) & 63;
		*m = __ldg(&q[j + 4]) & 63;
	} else {
		*sc = (__ldg(&q[j + 4]) & 0xf) | ((__ldg(&q[j - 4]) >> 6) << 4);
		*m = (__ldg(&q[j + 4]) >> 4) | ((__ldg(&q[j]) >> 6) << 4);
	}
}

/* The exact integer sums of super-block BLK against NT activation rows'
 * super-block B: SUMI (scaled codes) and, for Q4_K/Q5_K, SUMM (mins times
 * bsums); Q6_K folds its -32 into SUMI through the bsums. */
template <int TYPE>
static __device__ __forceinline__ void k_sums(const uint8_t *blk, const uint8_t *const *xr,
	int nt, int b, int n_in, int nsb, int *sumi, int *summ)
{
UNROLL
	for (int j = 0; j < MM_TB; j++)
		sumi[j] = summ[j] = 0;
	if (TYPE == QT_Q6_K) {
		const uint8_t *ql = blk, *qh = blk + 128;
		const int8_t *scales = reinterpret_cast<const int8_t *>(blk + 192);
		for (int g = 0; g < QK_K / 16; g++) {
			const int hf = g / 8, quarter = (g % 8) / 2, l0 = 16 * (g % 2);
			int wc[4];
UNROLL
			for (int k = 0; k < 4; k++) {
				const int l = l0 + 4 * k;
				const int lo = (ld_i32(ql + 64 * hf + (quarter & 1) * 32 + l) >>
						(4 * (quarter >> 1))) & 0x0f0f0f0f;
				const int hi = (ld_i32(qh + 32 * hf + l) >> (2 * quarter)) & 0x03030303;
				wc[k] = lo | hi << 4;
			}
			const int sc = __ldg(&scales[g]);
UNROLL
			for (int j = 0; j < MM_TB; j++) {
				if (j >= nt)
					break;
				const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK_K + 16 * g);
				const int *bs = reinterpret_cast<const int *>(xr[j] + n_in + (size_t)nsb * 4);
				int t = 0;
UNROLL
				for (int k = 0; k < 4; k++)
					t = __dp4a(wc[k], __ldg(&a[k]), t);
				sumi[j] += sc * (t - 32 * __ldg(&bs[b * 16 + g]));
			}
		}
		return;
	}
	const uint8_t *scales = blk + 4;
	const uint8_t *qh = blk + 16;                              /* Q5_K only */
	const uint8_t *qs = blk + (TYPE == QT_Q5_K ? 48 : 16);
	for (int s = 0; s < 8; s++) {
		int sc, m;
		scale_min_k4(s, scales, &sc, &m);
		int wc[8];
UNROLL
		for (int k = 0; k < 8; k++) {
			wc[k] = (ld_i32(qs + 32 * (s / 2) + 4 * k) >> (4 * (s & 1))) & 0x0f0f0f0f;
			if (TYPE == QT_Q5_K)
				wc[k] |= ((ld_i32(qh + 4 * k) >> s) & 0x01010101) << 4;
		}
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			const int *a = reinterpret_cast<const int *>(xr[j] + (size_t)b * QK_K + 32 * s);
			const int *bs = reinterpret_cast<const int *>(xr[j] + n_in + (size_t)nsb * 4);
			int t = 0;
UNROLL
			for (int k = 0; k < 8; k++)
				t = __dp4a(wc[k], __ldg(&a[k]), t);
			sumi[j] += sc * t;
			summ[j] += m * (__ldg(&bs[b * 16 + 2 * s]) + __ldg(&bs[b * 16 + 2 * s + 1]));
		}
	}
}

/* One warp per weight row: lane i computes super-block b0 + i's integer
 * sums, then the warp walks the 32 in order with one float accumulator, as
 * quant.c's dot_q45_k / dot_q6_k (every lane runs the same chain). */
template <int TYPE>
static __global__ void matmul_k_kernel(const mm_group g, int nsb, const uint8_t *__restrict__ xq,
	size_t stride, int T, int /* ks: 1 */)
{
	grid_dep_wait();
	const int lane = threadIdx.x % 32;
	const mm_row m = mm_pick(g, 1);
	if (!m.w) /* whole warps only */
		return;
	const uint8_t *wrow = m.w;
	const int n_in = nsb * QK_K;
	const int bytes = k_traits<TYPE>::bytes;

	for (int t0 = 0; t0 < T; t0 += MM_TB) {
		const int nt = T - t0 < MM_TB ? T - t0 : MM_TB;
		const uint8_t *xr[MM_TB];
		float acc[MM_TB];
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			acc[j] = 0.0f;
			xr[j] = xq + (size_t)(t0 + (j < nt ? j : 0)) * stride;
		}
		for (int b0 = 0; b0 < nsb; b0 += 32) {
			const int b = b0 + lane;
			int sumi[MM_TB], summ[MM_TB];
			float dw = 0, dminw = 0;
			if (b < nsb) {
				const uint8_t *blk = wrow + (size_t)b * bytes;
				k_sums<TYPE>(blk, xr, nt, b, n_in, nsb, sumi, summ);
				dw = ld_f16(blk + (TYPE == QT_Q6_K ? 208 : 0));
				dminw = TYPE == QT_Q6_K ? 0.0f : ld_f16(blk + 2);
			} else {
UNROLL
				for (int j = 0; j < MM_TB; j++)
					sumi[j] = summ[j] = 0;
			}
			const int n = nsb - b0 < 32 ? nsb - b0 : 32;
			for (int i = 0; i < n; i++) {
				const float dwi = __shfl_sync(MM_FULL, dw, i);
				const float dmi = __shfl_sync(MM_FULL, dminw, i);
UNROLL
				for (int j = 0; j < MM_TB; j++) {
					if (j >= nt)
						break;
					const int si = __shfl_sync(MM_FULL, sumi[j], i);
					const int mi = __shfl_sync(MM_FULL, summ[j], i);
					const float da = __ldg(reinterpret_cast<const float *>(xr[j] + n_in) + b0 + i);
					acc[j] = fmaf((float)si, dwi * da, acc[j]);
					if (TYPE != QT_Q6_K)
						acc[j] = fmaf((float)-mi, dmi * da, acc[j]);
				}
			}
		}
UNROLL
		for (int j = 0; j < MM_TB; j++) {
			if (j >= nt)
				break;
			if (lane == 0)
				m.out[(size_t)(t0 + j) * m.n_out] = acc[j];
		}
	}
}

/* ---- the launcher ---- */

/* The dp4a kernel of a supported TYPE, a warp a weight row. */
static mm_kernel mm_dp4a_kernel_of(uint32_t type)
{
	switch (type) {
	case QT_Q4_0: return matmul_q32_kernel<QT_Q4_0>;
	case QT_Q4_1: return matmul_q32_kernel<QT_Q4_1>;
	case QT_Q8_0: return matmul_q32_kernel<QT_Q8_0>;
	case QT_Q4_K: return matmul_k_kernel<QT_Q4_K>;
	case QT_Q5_K: return matmul_k_kernel<QT_Q5_K>;
	default:      return matmul_k_kernel<QT_Q6_K>;
	}
}

extern "C" int cuda_mm_dp4a(const struct mm_launch *l, uint32_t type, const struct cuda_launch *lc)
{
	return mm_launch_kernel(mm_dp4a_kernel_of(type), l, lc);
}

