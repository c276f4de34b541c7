/* test_cuda_rows.cc - kernels/cuda/rows.cu (embed, rmsnorm, rope, swiglu,
 * add, add fused with rmsnorm, those two and swiglu fused with the next
 * matmul's activation quantization, the half-precision copies for cuBLAS), compiled here as
 * C++ against the CUDA emulator, equals the CPU backend on random inputs
 * of several shapes, in every thread order.
 *
 * Tolerances, in ulps of the CPU's value (measured figures are printed):
 *   embed, add, swiglu, rope: 0 (bit-identical).  The kernels repeat the CPU's
 *     operations one for one with the same roundings (__fmul_rn keeps nvcc
 *     from fusing a product into an add, RoPE's theta_scale is the host's
 *     powf and its theta the same running float product), and the emulator's
 *     expf/sinf/cosf are the host's.  Built by nvcc for a GPU
 *     (test_cuda_rows_gpu), swiglu and rope differ by CUDA's expf/sinf/cosf
 *     (<= 2 ulp): swiglu within LIBM_ULPS, rope within rope_matches's
 *     absolute bound (its outputs cancel; ulps would mislead).
 *   rmsnorm (and add_rmsnorm's output): 2.  Both sum the squares in double, but in a different order
 *     (per-thread strides, warp butterfly, warps in order, vs sequential),
 *     so the double sum may differ in its last bits, and then, rarely, the
 *     float mean and the scale by one ulp, which moves an output by <= 2 ulp.
 *     Measured: 0 on these inputs.
 */
extern "C" {
#include "backend.h"
#include "quant.h"
}

#include "rows.cu"

#include <math.h>

#include <algorithm>
#include <vector>

#include "emu_testutil.h"
#include "q8rows.h"
#include "q_random.h"

/* N values in [LO, HI), each EVERY-th (0: none) times SCALE: an input with
 * outliers. */
static std::vector<float> rand_vec(size_t n, float lo, float hi, size_t every = 0, float scale = 1.0f)
{
	std::vector<float> v(n);
	for (size_t i = 0; i < n; i++)
		v[i] = uniform(lo, hi) * (every && i % every == 0 ? scale : 1.0f);
	return v;
}

static struct backend *cpu;

/* Distance in ulps between two floats (both finite), as ordered integers. */
static int64_t ulps(float a, float b)
{
	int32_t ia, ib;
	memcpy(&ia, &a, 4);
	memcpy(&ib, &b, 4);
	int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
	return la > lb ? la - lb : lb - la;
}

/* Largest ulp distance of GOT from WANT (a NaN anywhere counts as huge). */
static int64_t max_ulps(const std::vector<float> &got, const std::vector<float> &want)
{
	CHECK(got.size() == want.size());
	int64_t m = 0;
	for (size_t i = 0; i < got.size() && i < want.size(); i++) {
		int64_t d = isnan(got[i]) || isnan(want[i]) ? INT32_MAX : ulps(got[i], want[i]);
		if (d > m)
			m = d;
	}
	return m;
}

/* swiglu's tolerance: 0 on the emulator (its expf is the host's); on a GPU
 * CUDA's expf (<= 2 ulp) against glibc's (<= 1) moves a / (1 + e^-a) by at
 * most 3 ulp relative, and the division and the product round once more
 * each: 8. */
#ifdef CUDA_EMU
#define LIBM_ULPS 0
#else
#define LIBM_ULPS 8
#endif

/* The largest distance each op measured, over every shape and order. */
static int64_t worst_embed, worst_rmsnorm, worst_rope, worst_swiglu, worst_add;

static void expect_close(const char *op, const char *what, const std::vector<float> &got,
	const std::vector<float> &want, int64_t tol, int64_t *worst)
{
	int64_t d = max_ulps(got, want);
	if (d > *worst)
		*worst = d;
	if (d > tol) {
		fprintf(stderr, "%s %s: %lld ulps from the CPU backend (tolerance %lld)\n", op, what,
			(long long)d, (long long)tol);
		test_failures++;
	}
}

/* ---- embed ---- */

/* N_OUT random valid rows of TYPE, N elements each. */
static std::vector<uint8_t> make_weight(uint32_t type, int64_t n, int64_t n_out, size_t *ret_row_bytes)
{
	const size_t rb = qtype_row_bytes(type, n);
	const struct qtype_info *qi = qtype_get(type);
	std::vector<uint8_t> w(rb * n_out);
	std::vector<float> f(n);
	*ret_row_bytes = rb;
	for (int64_t r = 0; r < n_out; r++) {
		uint8_t *row = w.data() + r * rb;
		for (float &v : f)
			v = uniform(-2, 2);
		switch (type) {
		case QT_F32: case QT_F16: case QT_BF16: case QT_Q8_0:
			/* the CPU's own converters and activation quantizer */
			quant_quantize_row(type, f.data(), row, n);
			break;
		default: {
			/* every code pattern: random bytes, with finite f16 scales */
			for (size_t i = 0; i < rb; i++)
				row[i] = (uint8_t)next_u32();
			for (int64_t b = 0; b < n / qi->blck; b++) {
				uint8_t *blk = row + b * qi->bytes;
				qt_f16 d = qt_f32_to_f16(uniform(-0.1f, 0.1f)), m = qt_f32_to_f16(uniform(0, 0.05f));
				if (type == QT_Q6_K) {
					memcpy(blk + offsetof(struct block_q6_k, d), &d, 2);
				} else {
					memcpy(blk, &d, 2);
					if (type != QT_Q4_0)
						memcpy(blk + 2, &m, 2); /* Q4_1's m, the K-quants' dmin */
				}
			}
		}
		}
	}
	return w;
}

static void test_embed()
{
	static const uint32_t types[] = { QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1,
					  QT_Q4_K, QT_Q5_K, QT_Q6_K };
	static const int32_t Ts[] = { 1, 3, 17 };
	const int64_t n_out = 37;

	for (uint32_t type : types) {
		const uint32_t blck = qtype_get(type)->blck;
		std::vector<int64_t> ns;
		if (blck == 1)
			ns = { 64, 100, 576 };
		else if (blck == QK)
			ns = { 64, 96, 576 };
		else
			ns = { 256, 768 };
		for (int64_t n : ns) {
			size_t rb;
			std::vector<uint8_t> w = make_weight(type, n, n_out, &rb);
			dbuf<uint8_t> dw(w.size());
			dw.put(w);
			for (int32_t T : Ts) {
				std::vector<int32_t> ids(T);
				for (int32_t &id : ids)
					id = (int32_t)(next_u32() % n_out);
				ids[0] = (int32_t)n_out - 1; /* the last row too */
				struct bk_weight hw = { type, n, n_out, w.data(), rb };
				std::vector<float> want((size_t)T * n);
				CHECK_INT_EQ(cpu->ops->embed(cpu, &hw, ids.data(), T, want.data()), 0);
				dbuf<int32_t> dids(T);
				dids.put(ids);
				dbuf<float> dout((size_t)T * n, 0xff);
				struct bk_weight dwt = { type, n, n_out, dw.d, rb };
				char what[96];
				snprintf(what, sizeof what, "%s n=%lld T=%d", qtype_get(type)->name, (long long)n, T);
				for_each_order([&](const char *) {
					CHECK_INT_EQ(cudaMemset(dout.d, 0xff, dout.n * 4), cudaSuccess);
					CHECK_INT_EQ(cuda_embed(&dwt, dids.d, T, dout.d, NULL), 0);
					expect_close("embed", what, dout.get(), want, 0, &worst_embed);
				});
			}
		}
	}

	/* Arguments, and an id out of range: a NaN row, the others intact. */
	size_t rb;
	std::vector<uint8_t> w = make_weight(QT_Q4_0, 64, 4, &rb);
	dbuf<uint8_t> dw(w.size());
	dw.put(w);
	dbuf<int32_t> dids(3);
	dids.put({ 1, 4, -1 });
	dbuf<float> dout(3 * 64);
	struct bk_weight dwt = { QT_Q4_0, 64, 4, dw.d, rb };
	CHECK_INT_EQ(cuda_embed(&dwt, dids.d, 3, dout.d, NULL), 0);
	std::vector<float> h = dout.get(), want(64);
	quant_dequantize_row(QT_Q4_0, w.data() + rb, want.data(), 64);
	CHECK(memcmp(h.data(), want.data(), 64 * 4) == 0);
	for (int i = 64; i < 3 * 64; i++)
		CHECK(isnan(h[i]));
	CHECK_INT_EQ(cuda_embed(&dwt, dids.d, 0, dout.d, NULL), 0);
	CHECK_INT_EQ(cuda_embed(&dwt, dids.d, -1, dout.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_embed(NULL, dids.d, 3, dout.d, NULL), -EINVAL);
	struct bk_weight bad = dwt;
	bad.n_in = 48; /* not a multiple of 32 */
	CHECK_INT_EQ(cuda_embed(&bad, dids.d, 3, dout.d, NULL), -EINVAL);
	bad = dwt;
	bad.row_bytes = 17; /* shorter than a row */
	CHECK_INT_EQ(cuda_embed(&bad, dids.d, 3, dout.d, NULL), -EINVAL);
	bad = dwt;
	bad.type = QT_Q8_1; /* an activation format, not a weight */
	CHECK_INT_EQ(cuda_embed(&bad, dids.d, 3, dout.d, NULL), -ENOTSUP);
}

/* ---- rmsnorm ---- */

static void test_rmsnorm()
{
	static const int32_t Ts[] = { 1, 3, 17 };
	static const int64_t ns[] = { 64, 100, 576, 2049 };

	for (int64_t n : ns) {
		for (int32_t T : Ts) {
			const float eps = T == 3 ? 1e-6f : 1e-5f;
			const std::vector<float> x = rand_vec((size_t)T * n, -3, 3, 7, 10), g = rand_vec(n, -1.5f, 1.5f);
			std::vector<float> want(x.size());
			CHECK_INT_EQ(cpu->ops->rmsnorm(cpu, x.data(), g.data(), T, n, eps, want.data(), NULL), 0);
			dbuf<float> dx(x.size()), dg(n), dout(x.size());
			dg.put(g);
			char what[64];
			snprintf(what, sizeof what, "n=%lld T=%d", (long long)n, T);
			for_each_order([&](const char *) {
				dx.put(x);
				CHECK_INT_EQ(cuda_rmsnorm(dx.d, dg.d, T, n, eps, dout.d, NULL), 0);
				expect_close("rmsnorm", what, dout.get(), want, 2, &worst_rmsnorm);
				/* in place */
				CHECK_INT_EQ(cuda_rmsnorm(dx.d, dg.d, T, n, eps, dx.d, NULL), 0);
				expect_close("rmsnorm in place", what, dx.get(), want, 2, &worst_rmsnorm);
			});
		}
	}
	dbuf<float> d(64);
	CHECK_INT_EQ(cuda_rmsnorm(d.d, d.d, 0, 64, 1e-5f, d.d, NULL), 0);
	CHECK_INT_EQ(cuda_rmsnorm(d.d, d.d, -1, 64, 1e-5f, d.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rmsnorm(d.d, d.d, 1, 0, 1e-5f, d.d, NULL), -EINVAL);
}

/* ---- add + rmsnorm fused ---- */

/* cuda_add_rmsnorm: x equals the CPU's add bit for bit, out is the CPU's
 * add-then-rmsnorm within rmsnorm's tolerance and cuda_add + cuda_rmsnorm's
 * bits exactly, written over y (as the engine does) or over x. */
static void test_add_rmsnorm()
{
	static const int32_t Ts[] = { 1, 5 };
	static const int64_t ns[] = { 64, 576, 2049 };
	int64_t unfused = 0; /* distance from the two launches it replaces */

	for (int64_t n : ns) {
		for (int32_t T : Ts) {
			const float eps = 1e-5f;
			const std::vector<float> x = rand_vec((size_t)T * n, -3, 3), y = rand_vec(x.size(), -2, 2, 5, 8),
						 g = rand_vec(n, -1.5f, 1.5f);
			std::vector<float> want_x = x, want(x.size());
			CHECK_INT_EQ(cpu->ops->add(cpu, want_x.data(), y.data(), (int64_t)T * n), 0);
			CHECK_INT_EQ(cpu->ops->rmsnorm(cpu, want_x.data(), g.data(), T, n, eps, want.data(), NULL), 0);
			dbuf<float> dx(x.size()), dy(x.size()), dg(n), dout(x.size());
			dg.put(g);
			char what[64];
			snprintf(what, sizeof what, "n=%lld T=%d", (long long)n, T);
			for_each_order([&](const char *) {
				/* the two launches it replaces */
				dx.put(x);
				dy.put(y);
				CHECK_INT_EQ(cuda_add(dx.d, dy.d, (int64_t)T * n, NULL), 0);
				CHECK_INT_EQ(cuda_rmsnorm(dx.d, dg.d, T, n, eps, dout.d, NULL), 0);
				std::vector<float> two = dout.get();
				expect_close("add", what, dx.get(), want_x, 0, &worst_add);

				dx.put(x);
				CHECK_INT_EQ(cuda_add_rmsnorm(dx.d, dy.d, dg.d, T, n, eps, dy.d, NULL), 0);
				expect_close("add_rmsnorm x", what, dx.get(), want_x, 0, &worst_add);
				expect_close("add_rmsnorm over y", what, dy.get(), want, 2, &worst_rmsnorm);
				expect_close("add_rmsnorm vs add + rmsnorm", what, dy.get(), two, 0, &unfused);

				dx.put(x);
				dy.put(y);
				CHECK_INT_EQ(cuda_add_rmsnorm(dx.d, dy.d, dg.d, T, n, eps, dx.d, NULL), 0);
				expect_close("add_rmsnorm over x vs add + rmsnorm", what, dx.get(), two, 0, &unfused);
			});
		}
	}
	dbuf<float> d(64);
	CHECK_INT_EQ(cuda_add_rmsnorm(d.d, d.d, d.d, 0, 64, 1e-5f, d.d, NULL), 0);
	CHECK_INT_EQ(cuda_add_rmsnorm(d.d, d.d, d.d, -1, 64, 1e-5f, d.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm(d.d, NULL, d.d, 1, 64, 1e-5f, d.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm(d.d, d.d, d.d, 1, 0, 1e-5f, d.d, NULL), -EINVAL);
}

/* cuda_add_rmsnorm_q8: x and out have cuda_add_rmsnorm's bits, and each
 * row of the scratch holds out's row quantized as the CPU quantizes it
 * (quant_quantize_row to Q8_0, Q8_1 or Q8_K), in the matmul's layout. */
static void test_add_rmsnorm_q8()
{
	static const int32_t Ts[] = { 1, 5 };
	/* 2080 and 4352: past the first pass's 16 loads a thread (4096) and
	 * the g the second pass loads first (8 blocks, 2 super-blocks a warp) */
	static const int64_t ns[] = { 64, 576, 2080 }, ns_k[] = { 256, 768, 4352 };

	for (uint32_t vec : q8_vecs) {
		const int blck = (int)qtype_get(vec)->blck;
		for (int64_t n : vec == QT_Q8_K ? ns_k : ns) {
			const size_t stride = q8_stride(vec, n);
			for (int32_t T : Ts) {
				const float eps = 1e-5f;
				std::vector<float> x = rand_vec((size_t)T * n, -3, 3),
						   y = rand_vec(x.size(), -2, 2, 7, 8);
				std::vector<float> g = rand_vec(n, -1.5f, 1.5f);
				std::fill_n(g.begin(), blck, 0.0f); /* a zero block: amax 0 */
				/* ties for the largest magnitude, signs opposite (the first
				 * sets the scale): in the last block, on two lanes (Q8_K:
				 * 40 elements apart, a lane holding 8), and where there are
				 * 3 blocks, in the middle one 3 apart (Q8_K: one lane's) */
				const int64_t nbk = n / blck, last = (nbk - 1) * blck;
				const int64_t tie[2][2] = { { last + 5, last + (blck == QK_K ? 45 : 13) },
							    { blck + 1, blck + 4 } };
				for (int k = 0; k < (nbk >= 3 ? 2 : 1); k++)
					for (int32_t t = 0; t < T; t++)
						for (int e = 0; e < 2; e++) {
							const int64_t i = tie[k][e];
							x[(size_t)t * n + i] = e ? -40.0f : 40.0f; /* y reaches 16 */
							y[(size_t)t * n + i] = 0.0f;
							g[i] = 1.25f;
						}
				dbuf<float> dx(x.size()), dy(x.size()), dg(n);
				dbuf<uint8_t> dq(stride * (size_t)T);
				dg.put(g);
				char what[64];
				snprintf(what, sizeof what, "n=%lld T=%d %s", (long long)n, T, qtype_get(vec)->name);
				for_each_order([&](const char *) {
					dx.put(x);
					dy.put(y);
					CHECK_INT_EQ(cuda_add_rmsnorm(dx.d, dy.d, dg.d, T, n, eps, dy.d, NULL), 0);
					std::vector<float> want_x = dx.get(), want = dy.get();
					dx.put(x);
					dy.put(y);
					CHECK_INT_EQ(cuda_add_rmsnorm_q8(dx.d, dy.d, dg.d, T, n, eps, dy.d, vec, dq.d, stride,
									 NULL), 0);
					int64_t d0 = 0;
					expect_close("add_rmsnorm_q8 x", what, dx.get(), want_x, 0, &d0);
					expect_close("add_rmsnorm_q8 out", what, dy.get(), want, 0, &d0);
					expect_q8_rows("add_rmsnorm_q8", what, dq.get(), want, T, n, stride, vec);
				});
			}
		}
	}
	dbuf<float> d(64);
	dbuf<uint8_t> q(256);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 0, 64, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), 0);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 48, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q8_K, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q8_1, q.d, 64, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q4_0, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q8_0, NULL, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q8_0, q.d + 1, 80, NULL), -EINVAL);
}

/* cuda_rmsnorm_q8: out has cuda_rmsnorm's bits (in place too), x is left
 * alone, and the scratch holds out quantized as the CPU quantizes it. */
static void test_rmsnorm_q8()
{
	static const int64_t ns[] = { 96, 576 }, ns_k[] = { 256, 1024 };
	const int32_t T = 3;

	for (uint32_t vec : q8_vecs) {
		for (int64_t n : vec == QT_Q8_K ? ns_k : ns) {
			const size_t stride = q8_stride(vec, n);
			const float eps = 1e-5f;
			const std::vector<float> x = rand_vec((size_t)T * n, -3, 3, 5, 6), g = rand_vec(n, -1.5f, 1.5f);
			dbuf<float> dx(x.size()), dg(n), dout(x.size());
			dbuf<uint8_t> dq(stride * (size_t)T);
			dg.put(g);
			dx.put(x);
			CHECK_INT_EQ(cuda_rmsnorm(dx.d, dg.d, T, n, eps, dout.d, NULL), 0);
			const std::vector<float> want = dout.get();
			char what[64];
			snprintf(what, sizeof what, "n=%lld %s", (long long)n, qtype_get(vec)->name);
			for_each_order([&](const char *) {
				int64_t d0 = 0;
				dx.put(x);
				CHECK_INT_EQ(cuda_rmsnorm_q8(dx.d, dg.d, T, n, eps, dout.d, vec, dq.d, stride, NULL), 0);
				expect_close("rmsnorm_q8 out", what, dout.get(), want, 0, &d0);
				CHECK(dx.get() == x);
				expect_q8_rows("rmsnorm_q8", what, dq.get(), want, T, n, stride, vec);
				CHECK_INT_EQ(cuda_rmsnorm_q8(dx.d, dg.d, T, n, eps, dx.d, vec, dq.d, stride, NULL), 0);
				expect_close("rmsnorm_q8 in place", what, dx.get(), want, 0, &d0);
				expect_q8_rows("rmsnorm_q8 in place", what, dq.get(), want, T, n, stride, vec);
			});
		}
	}
	dbuf<float> d(64);
	dbuf<uint8_t> q(256);
	CHECK_INT_EQ(cuda_rmsnorm_q8(d.d, d.d, 0, 64, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), 0);
	CHECK_INT_EQ(cuda_rmsnorm_q8(d.d, d.d, 1, 48, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rmsnorm_q8(d.d, d.d, 1, 64, 1e-5f, d.d, QT_Q8_1, q.d, 64, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rmsnorm_q8(NULL, d.d, 1, 64, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_rmsnorm_q8(d.d, NULL, d.d, 1, 64, 1e-5f, d.d, QT_Q8_0, q.d, 80, NULL), -EINVAL);
}

/* ---- rope ---- */

static void test_rope()
{
	static const struct { int32_t n_head, head_dim, n_rot; } shapes[] = {
		{ 3, 64, 64 }, { 2, 64, 32 }, { 5, 80, 80 }, { 1, 128, 128 }, { 9, 64, 64 },
	};
	static const int32_t Ts[] = { 1, 3, 17 };

	for (const auto &s : shapes) {
		for (int32_t T : Ts) {
			/* style 2, 3: normal and neox with every kind of scaling */
			for (int style = 0; style < 4; style++) {
				const float base = style % 2 ? 100000.0f : 10000.0f;
				struct bk_rope rp = bk_rope_plain(s.n_rot, style % 2 ? BK_ROPE_NEOX : BK_ROPE_NORMAL, base), drp;
				std::vector<float> ff((size_t)s.n_rot / 2);
				for (float &f : ff)
					f = 1.0f + (float)(next_u32() % 700) / 100.0f;
				dbuf<float> dff(ff.size());
				dff.put(ff);
				if (style >= 2) {
					rp.freq_factors = ff.data();
					rp.freq_scale = 0.25f;
					rp.ext_factor = 1.0f;
					rp.mscale = 1.3f;
					rp.corr_dims[0] = 3;
					rp.corr_dims[1] = 12;
				}
				drp = rp;
				if (style >= 2)
					drp.freq_factors = dff.d;
				const size_t n = (size_t)T * s.n_head * s.head_dim;
				const std::vector<float> x = rand_vec(n, -2, 2);
				std::vector<int32_t> pos(T);
				for (int32_t &p : pos)
					p = (int32_t)(next_u32() % 8192);
				pos[0] = 0;
				if (T > 1)
					pos[1] = 1;
				std::vector<float> want = x;
				CHECK_INT_EQ(cpu->ops->rope(cpu, want.data(), T, s.n_head, s.head_dim, pos.data(), &rp), 0);
				dbuf<float> dx(n);
				dbuf<int32_t> dpos(T);
				dpos.put(pos);
				char what[96];
				snprintf(what, sizeof what, "%s%s heads=%d hd=%d rot=%d T=%d",
					style % 2 ? "neox" : "normal", style >= 2 ? " scaled" : "", s.n_head, s.head_dim,
					s.n_rot, T);
				for_each_order([&](const char *) {
					dx.put(x);
					CHECK_INT_EQ(cuda_rope(dx.d, T, s.n_head, s.head_dim, dpos.d, &drp, NULL), 0);
					const std::vector<float> got = dx.get();
					double err;
					if (!rope_matches(got, want, 2.0f, &err)) {
						fprintf(stderr, "rope %s: %.3g from the CPU backend\n", what, err);
						test_failures++;
					}
					worst_rope = std::max(worst_rope, max_ulps(got, want));
				});
			}
		}
	}
	dbuf<float> d(64);
	dbuf<int32_t> p(1);
	struct bk_rope r65 = bk_rope_plain(65, BK_ROPE_NORMAL, 1e4f), r63 = bk_rope_plain(63, BK_ROPE_NORMAL, 1e4f);
	struct bk_rope r64 = bk_rope_plain(64, BK_ROPE_NORMAL, 1e4f), rbad = r64;
	rbad.style = 2;
	CHECK_INT_EQ(cuda_rope(d.d, 1, 1, 64, p.d, &r65, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rope(d.d, 1, 1, 64, p.d, &r63, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rope(d.d, 1, 1, 64, p.d, &rbad, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_rope(d.d, 0, 1, 64, p.d, &r64, NULL), 0);
	CHECK_INT_EQ(cuda_rope(d.d, 1, 1, 64, p.d, NULL, NULL), -EINVAL);
}

/* ---- swiglu, add ---- */

static void test_elementwise()
{
	static const int64_t ns[] = { 1, 100, 576, 17 * 576, 70001 };

	for (int64_t n : ns) {
		const std::vector<float> g = rand_vec(n, -12, 12), u = rand_vec(n, -3, 3);
		std::vector<float> want_sw(n), want_ge(n), want_add = g, want_sc = g, want_bias = g;
		CHECK_INT_EQ(cpu->ops->swiglu(cpu, g.data(), u.data(), n, want_sw.data(), NULL), 0);
		CHECK_INT_EQ(cpu->ops->geglu(cpu, g.data(), u.data(), n, want_ge.data(), NULL), 0);
		CHECK_INT_EQ(cpu->ops->add(cpu, want_add.data(), u.data(), n), 0);
		CHECK_INT_EQ(cpu->ops->scale(cpu, want_sc.data(), n, 25.298f), 0);
		/* as rows of 4 (n a multiple) or one row, a bias of u's first elements */
		const int64_t bn = n % 4 ? n : 4;
		CHECK_INT_EQ(cpu->ops->add_bias(cpu, want_bias.data(), u.data(), (int32_t)(n / bn), bn), 0);
		dbuf<float> dg(n), du(n), dout(n);
		du.put(u);
		char what[64];
		snprintf(what, sizeof what, "n=%lld", (long long)n);
		for_each_order([&](const char *) {
			dg.put(g);
			CHECK_INT_EQ(cuda_swiglu(dg.d, du.d, n, dout.d, NULL), 0);
			expect_close("swiglu", what, dout.get(), want_sw, LIBM_ULPS, &worst_swiglu);
			CHECK_INT_EQ(cuda_swiglu(dg.d, du.d, n, dg.d, NULL), 0); /* in place */
			expect_close("swiglu in place", what, dg.get(), want_sw, LIBM_ULPS, &worst_swiglu);
			dg.put(g);
			CHECK_INT_EQ(cuda_glu(BK_ACT_GELU, dg.d, du.d, n, dout.d, NULL), 0);
			expect_close("geglu", what, dout.get(), want_ge, LIBM_ULPS, &worst_swiglu);
			dg.put(g);
			CHECK_INT_EQ(cuda_add(dg.d, du.d, n, NULL), 0);
			expect_close("add", what, dg.get(), want_add, 0, &worst_add);
			dg.put(g);
			CHECK_INT_EQ(cuda_scale(dg.d, n, 25.298f, NULL), 0);
			expect_close("scale", what, dg.get(), want_sc, 0, &worst_add);
			dg.put(g);
			CHECK_INT_EQ(cuda_add_bias(dg.d, du.d, (int32_t)(n / bn), bn, NULL), 0);
			expect_close("add_bias", what, dg.get(), want_bias, 0, &worst_add);
		});
	}
	dbuf<float> d(4);
	CHECK_INT_EQ(cuda_swiglu(d.d, d.d, 0, d.d, NULL), 0);
	CHECK_INT_EQ(cuda_swiglu(d.d, d.d, -1, d.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add(d.d, d.d, 0, NULL), 0);
	CHECK_INT_EQ(cuda_add(d.d, NULL, 4, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_glu(7, d.d, d.d, 4, d.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_scale(NULL, 4, 2.0f, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_add_bias(d.d, NULL, 1, 4, NULL), -EINVAL);
}

/* ---- half-precision copies (the cuBLAS path's inputs) ---- */

/* Weight rows as the CPU dequantizes them, then its own f16 conversion;
 * activations through the CPU's F16 and BF16 row converters: bit for bit. */
static void test_half()
{
	static const uint32_t types[] = { QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1,
					  QT_Q4_K, QT_Q5_K, QT_Q6_K };
	const int64_t n_out = 37, row0 = 5, n_rows = 20;

	for (uint32_t type : types) {
		const int64_t n = qtype_get(type)->blck == QK_K ? 512 : 96;
		size_t rb;
		std::vector<uint8_t> w = make_weight(type, n, n_out, &rb);
		dbuf<uint8_t> dw(w.size());
		dw.put(w);
		struct bk_weight dwt = { type, n, n_out, dw.d, rb };
		dbuf<uint16_t> dout((size_t)n_rows * n, 0xff);
		std::vector<float> f(n);
		for_each_order([&](const char *) {
			CHECK_INT_EQ(cuda_dequant_f16(&dwt, row0, n_rows, dout.d, NULL), 0);
			std::vector<uint16_t> got = dout.get();
			int bad = 0;
			for (int64_t r = 0; r < n_rows; r++) {
				quant_dequantize_row(type, w.data() + (row0 + r) * rb, f.data(), n);
				for (int64_t e = 0; e < n; e++)
					bad += got[r * n + e] != qt_f32_to_f16(f[e]);
			}
			if (bad)
				fprintf(stderr, "dequant_f16 %s: %d of %lld halves differ\n",
					qtype_get(type)->name, bad, (long long)(n_rows * n));
			CHECK(bad == 0);
		});
	}

	/* ties, subnormals, overflow to infinity, infinities */
	std::vector<float> x(5000);
	for (float &v : x)
		v = uniform(-70000, 70000) * (next_u32() % 2 ? 1.0f : 1e-6f);
	const float special[] = { 0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-24f,
				  0x1p-25f, 65519.0f, 65520.0f, 1e30f, -1e30f, INFINITY, -INFINITY,
				  1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3e-39f };
	std::copy(special, special + sizeof special / sizeof special[0], x.begin());
	dbuf<float> dx(x.size());
	dx.put(x);
	dbuf<uint16_t> dh(x.size());
	for (int bf16 = 0; bf16 < 2; bf16++) {
		std::vector<uint16_t> want(x.size());
		quant_quantize_row(bf16 ? QT_BF16 : QT_F16, x.data(), want.data(), (int64_t)x.size());
		CHECK_INT_EQ(cuda_to_half(dx.d, (int64_t)x.size(), bf16, dh.d, NULL), 0);
		CHECK(dh.get() == want);
	}

	/* arguments */
	size_t rb;
	std::vector<uint8_t> w = make_weight(QT_Q4_0, 64, 4, &rb);
	dbuf<uint8_t> dw(w.size());
	struct bk_weight dwt = { QT_Q4_0, 64, 4, dw.d, rb };
	CHECK_INT_EQ(cuda_dequant_f16(&dwt, 0, 0, dh.d, NULL), 0);
	CHECK_INT_EQ(cuda_dequant_f16(&dwt, 2, 3, dh.d, NULL), -EINVAL); /* past the last row */
	CHECK_INT_EQ(cuda_dequant_f16(&dwt, -1, 1, dh.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_dequant_f16(&dwt, 0, 1, NULL, NULL), -EINVAL);
	dwt.type = QT_Q5_0;
	CHECK_INT_EQ(cuda_dequant_f16(&dwt, 0, 1, dh.d, NULL), -ENOTSUP);
	CHECK_INT_EQ(cuda_to_half(dx.d, -1, 0, dh.d, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_to_half(dx.d, 4, 0, (char *)dh.d + 1, NULL), -EINVAL);
}

/* cuda_swiglu_q8: out has cuda_swiglu's bits (in place too), and the
 * scratch holds out's rows quantized as the CPU quantizes them. */
static void test_swiglu_q8()
{
	static const int32_t Ts[] = { 1, 3 };
	static const int64_t ns[] = { 32, 1536 }, ns_k[] = { 256, 1536 };

	for (uint32_t vec : q8_vecs) {
		const int blck = (int)qtype_get(vec)->blck;
		for (int64_t n : vec == QT_Q8_K ? ns_k : ns) {
			const size_t stride = q8_stride(vec, n);
			for (int32_t T : Ts) {
				const size_t tn = (size_t)T * (size_t)n;
				std::vector<float> g = rand_vec(tn, -12, 12);
				const std::vector<float> u = rand_vec(tn, -3, 3);
				std::fill_n(g.begin(), blck, 0.0f); /* a zero block: amax 0 */
				dbuf<float> dg(tn), du(tn), dout(tn);
				dbuf<uint8_t> dq(stride * (size_t)T);
				du.put(u);
				char what[64];
				snprintf(what, sizeof what, "n=%lld T=%d %s", (long long)n, T, qtype_get(vec)->name);
				for_each_order([&](const char *) {
					dg.put(g);
					CHECK_INT_EQ(cuda_swiglu(dg.d, du.d, (int64_t)tn, dout.d, NULL), 0);
					std::vector<float> want = dout.get();
					int64_t d0 = 0;
					CHECK_INT_EQ(cuda_swiglu_q8(dg.d, du.d, T, n, dg.d, vec, dq.d, stride, NULL), 0);
					expect_close("swiglu_q8 in place", what, dg.get(), want, 0, &d0);
					expect_q8_rows("swiglu_q8", what, dq.get(), want, T, n, stride, vec);
					dg.put(g);
					CHECK_INT_EQ(cuda_glu(BK_ACT_GELU, dg.d, du.d, (int64_t)tn, dout.d, NULL), 0);
					want = dout.get();
					CHECK_INT_EQ(cuda_glu_q8(BK_ACT_GELU, dg.d, du.d, T, n, dg.d, vec, dq.d, stride, NULL), 0);
					expect_close("geglu_q8 in place", what, dg.get(), want, 0, &d0);
					expect_q8_rows("geglu_q8", what, dq.get(), want, T, n, stride, vec);
				});
			}
		}
	}
	dbuf<float> d(64);
	dbuf<uint8_t> q(256);
	CHECK_INT_EQ(cuda_swiglu_q8(d.d, d.d, 0, 64, d.d, QT_Q8_0, q.d, 80, NULL), 0);
	CHECK_INT_EQ(cuda_swiglu_q8(d.d, d.d, 1, 48, d.d, QT_Q8_0, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_swiglu_q8(d.d, d.d, 1, 64, d.d, QT_Q8_K, q.d, 80, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_swiglu_q8(d.d, d.d, 1, 64, d.d, QT_Q8_1, q.d, 64, NULL), -EINVAL);
	CHECK_INT_EQ(cuda_swiglu_q8(d.d, d.d, 1, 64, d.d, QT_Q8_0, NULL, 80, NULL), -EINVAL);
}

int main()
{
	CHECK_INT_EQ(cpu_backend_new(1, &cpu), 0);
	if (!cpu)
		return test_result();
	test_embed();
	test_rmsnorm();
	test_add_rmsnorm();
	test_add_rmsnorm_q8();
	test_rmsnorm_q8();
	test_rope();
	test_elementwise();
	test_swiglu_q8();
	test_half();
	backend_free(cpu);
	printf("largest distance from the CPU backend, in ulps: embed %lld, rmsnorm %lld, rope %lld, "
	       "swiglu %lld, add %lld\n", (long long)worst_embed, (long long)worst_rmsnorm,
	       (long long)worst_rope, (long long)worst_swiglu, (long long)worst_add);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
