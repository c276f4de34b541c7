/* test_cuda_matmul.cc - kernels/cuda/matmul.cu, compiled here as C++ against
 * the CUDA emulator, against the CPU backend's matmul (the reference).
 *
 * Random valid weight blocks of every supported type (random codes, random
 * f16 scales), random activations (with an all-zero block and a tie for the
 * largest magnitude), several shapes (ragged 32-element tails, K-quant rows
 * longer than one warp's 32 super-blocks), T = 1, 2, 5, 9, 16, 33, on the
 * tensor-core kernels (the default at every T: 1 tile of activation rows a
 * pass up to T = 8, 2 at 9 and 16, the K-quants' 4 at 33; Q4_K/Q5_K also
 * from rows 2 bytes past a 16-byte boundary, read 16 bits at a time), and
 * T = 1, 2, 5 again on the dp4a kernels (the tuning's mma_min_t 8);
 * mma_s8_m16n8k32 is checked on its own against PTX's fragment layout, on
 * extreme bytes too.
 *
 * Tolerance: none.  The kernels reproduce quant.c's arithmetic (the device
 * quantizes activations exactly as the CPU, the integer sums are exact and
 * the float steps are the same fmas in the same order and the same tree
 * sum), so every output must equal the CPU backend's bit for bit, on its
 * default SIMD path and on the portable C one.  Also checked: each row's
 * output is the same bits computed alone (T = 1) or inside a T = 9 batch
 * (or, on dp4a, T = 5), the argument checks, and that nothing leaks;
 * and one row of Q4_K and Q6_K weights in one launch (test_mixed).
 *
 * Built again under ASan + UBSan (every shape) and under TSan
 * (MATMUL_SMALL: each kernel's code once), where the portable mma's shared
 * fragments would show a missing __syncwarp as a race.
 */
extern "C" {
#include "backend.h"
#include "quant.h"
}

#include "matmul.cu"
#include "matmul_dp4a.cu"
#include "matmul_mma.cu"
#include "matmul_wide.cu"

#include <math.h>
#include <string.h>
#include <time.h>

#include <deque>
#include <initializer_list>
#include <vector>

#include "emu_testutil.h"
#include "q_random.h"

static std::vector<float> random_x(int n_in, int T)
{
	std::vector<float> x((size_t)n_in * T);
	for (float &v : x)
		v = uniform(-2.0f, 2.0f);
	if (T > 1) /* an all-zero block (scale 0) */
		for (int i = 0; i < 32; i++)
			x[(size_t)n_in + i] = 0;
	if (T > 2) { /* the largest magnitude twice, signs opposite: Q8_K takes the first */
		x[2 * (size_t)n_in + 5] = 3.0f;
		x[2 * (size_t)n_in + 7] = -3.0f;
	}
	return x;
}

static struct backend *cpu_be;

/* The tuning every launch here takes (the settings the tests change as
 * they go; main starts from the defaults). */
static struct cuda_tuning tun;
static const struct cuda_launch tlc = { NULL, &tun, 0, 0 };

static std::vector<float> cpu_matmul(const bk_weight &w, const std::vector<float> &x, int T)
{
	std::vector<float> out((size_t)T * w.n_out, NAN);
	const bk_weight *wp = &w;
	float *op = out.data();
	CHECK_INT_EQ(cpu_be->ops->matmul(cpu_be, &wp, 1, x.data(), T, &op), 0);
	return out;
}

static bool same_bits(float a, float b)
{
	return memcmp(&a, &b, 4) == 0;
}

static int n_cases, n_mma, n_k45, n_split, n_wide;
static int split_seen; /* the split-K warp counts that ran, or'ed */

/* One shape of one type: the CUDA path equals the CPU (both ISAs) bit for
 * bit, row by row the same alone as in the batch. */
static void check_case(uint32_t type, int n_in, int n_out, int T, bool invariance)
{
	size_t rb;
	std::vector<uint8_t> hw = random_weights(type, n_in, n_out, &rb);
	std::vector<float> hx = random_x(n_in, T);

	dbuf<uint8_t> dw(hw.size());
	dbuf<float> dx(hx.size()), dout((size_t)T * n_out);
	dw.put(hw);
	dx.put(hx);
	bk_weight w = { type, n_in, n_out, hw.data(), rb };
	bk_weight dwt = { type, n_in, n_out, dw.d, rb };
	const size_t sb = cuda_matmul_scratch_bytes(&dwt, T);
	CHECK(sb > 0);
	dbuf<uint8_t> scratch(sb);

	n_mma += mm_use_mma(&tun, type, T) && !mm_use_wide(&tun, type, 1, T);
	{ /* the launch's split-K (matmul_q's choice) */
		int blck;
		mm_block_bytes(type, &blck);
		const int nt = T <= 8 ? 1 : T <= 16 || blck == QK ? 2 : 4;
		const int ks = mm_use_mma(&tun, type, T) ? mm_split(&tun, 0, blck, n_in / blck, nt, (n_out + 15) / 16) : 1;
		n_split += ks > 1;
		split_seen |= ks;
		n_wide += mm_use_wide(&tun, type, 1, T);
	}
	const bk_weight *dwp = &dwt;
	const bool k45 = mm_use_mma(&tun, type, T) && (type == QT_Q4_K || type == QT_Q5_K);
	CHECK(!k45 || mm_aligned16(&dwp, 1)); /* cudaMalloc'd */
	n_k45 += k45;
	std::vector<float> want = cpu_matmul(w, hx, T);
	enum quant_isa isa = quant_get_isa();
	quant_set_isa(QUANT_ISA_SCALAR);
	std::vector<float> want_c = cpu_matmul(w, hx, T);
	quant_set_isa(isa);

	CHECK_INT_EQ(cuda_matmul_q(&dwt, dx.d, T, dout.d, scratch.d, &tlc), 0);
	std::vector<float> got = dout.get();
	int bad = 0;
	double max_rel = 0;
	for (size_t i = 0; i < got.size(); i++) {
		if (!same_bits(got[i], want[i]) || !same_bits(got[i], want_c[i])) {
			if (bad < 3)
				fprintf(stderr, "%s n_in %d n_out %d T %d: out[%zu] = %.9g, cpu %.9g (c %.9g)\n",
					qtype_get(type)->name, n_in, n_out, T, i, got[i], want[i], want_c[i]);
			bad++;
		}
		double rel = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + 1e-30);
		if (rel > max_rel)
			max_rel = rel;
	}
	CHECK_INT_EQ(bad, 0);
	if (bad)
		fprintf(stderr, "  max relative difference %.3g\n", max_rel);

	if (k45) {
		/* the same rows 2 bytes past a 16-byte boundary: read 16 bits
		 * at a time, to the same bits */
		dbuf<uint8_t> dwu(hw.size() + 2);
		CHECK_INT_EQ(cudaMemcpy(dwu.d + 2, hw.data(), hw.size(), cudaMemcpyHostToDevice), cudaSuccess);
		bk_weight dwut = { type, n_in, n_out, dwu.d + 2, rb };
		const bk_weight *dwup = &dwut;
		CHECK(!mm_aligned16(&dwup, 1));
		CHECK_INT_EQ(cuda_matmul_q(&dwut, dx.d, T, dout.d, scratch.d, &tlc), 0);
		std::vector<float> gotu = dout.get();
		int badu = 0;
		for (size_t i = 0; i < gotu.size(); i++)
			badu += !same_bits(gotu[i], got[i]);
		CHECK_INT_EQ(badu, 0);
	}

	/* a second weight of the type against the rows left quantized in the
	 * scratch (a matmul group's shared quantization): its CPU product */
	{
		size_t rb2;
		std::vector<uint8_t> hw2 = random_weights(type, n_in, n_out / 2 + 1, &rb2);
		dbuf<uint8_t> dw2(hw2.size());
		dbuf<float> dout2((size_t)T * (n_out / 2 + 1));
		dw2.put(hw2);
		bk_weight w2 = { type, n_in, n_out / 2 + 1, hw2.data(), rb2 };
		bk_weight dw2t = { type, n_in, n_out / 2 + 1, dw2.d, rb2 };
		const bk_weight *w2p = &dw2t;
		float *o2 = dout2.d;
		CHECK_INT_EQ(cuda_matmul_q_group(&w2p, 1, NULL, T, &o2, scratch.d, &tlc), 0);
		std::vector<float> got2 = dout2.get(), want2 = cpu_matmul(w2, hx, T);
		int bad2 = 0;
		for (size_t i = 0; i < got2.size(); i++)
			bad2 += !same_bits(got2[i], want2[i]);
		CHECK_INT_EQ(bad2, 0);

		/* the three in one grouped launch (a layer's q, k, v), a third
		 * weight of 5 rows making the grid ragged: each output has its
		 * bits from the single launches */
		size_t rb3;
		std::vector<uint8_t> hw3 = random_weights(type, n_in, 5, &rb3);
		dbuf<uint8_t> dw3(hw3.size());
		dw3.put(hw3);
		bk_weight w3 = { type, n_in, 5, hw3.data(), rb3 };
		bk_weight dw3t = { type, n_in, 5, dw3.d, rb3 };
		dbuf<float> g0((size_t)T * n_out), g1((size_t)T * (n_out / 2 + 1)), g2((size_t)T * 5);
		const bk_weight *gw[3] = { &dwt, &dw2t, &dw3t };
		float *go[3] = { g0.d, g1.d, g2.d };
		CHECK_INT_EQ(cuda_matmul_q_group(gw, 3, dx.d, T, go, scratch.d, &tlc), 0);
		std::vector<float> h0 = g0.get(), h1 = g1.get(), h2 = g2.get(), want3 = cpu_matmul(w3, hx, T);
		int bad3 = 0;
		for (size_t i = 0; i < h0.size(); i++)
			bad3 += !same_bits(h0[i], got[i]);
		for (size_t i = 0; i < h1.size(); i++)
			bad3 += !same_bits(h1[i], want2[i]);
		for (size_t i = 0; i < h2.size(); i++)
			bad3 += !same_bits(h2[i], want3[i]);
		CHECK_INT_EQ(bad3, 0);
	}

	if (invariance) {
		/* Each row computed alone (T = 1) gives the bits it had in the batch. */
		dbuf<float> one(n_out);
		bk_weight w1 = dwt;
		dbuf<uint8_t> s1(cuda_matmul_scratch_bytes(&w1, 1));
		int diff = 0;
		for (int t = 0; t < T; t++) {
			CHECK_INT_EQ(cuda_matmul_q(&w1, dx.d + (size_t)t * n_in, 1, one.d, s1.d, &tlc), 0);
			std::vector<float> h = one.get();
			for (int i = 0; i < n_out; i++)
				diff += !same_bits(h[i], got[(size_t)t * n_out + i]);
		}
		CHECK_INT_EQ(diff, 0);
	}
	n_cases++;
}

static const uint32_t q32_types[] = { QT_Q8_0, QT_Q4_0, QT_Q4_1 };
static const uint32_t k_types[] = { QT_Q4_K, QT_Q5_K, QT_Q6_K };

/* Every type and shape at each T of TS (T >= 16 only on the shorter rows),
 * in forward order, each row's batch invariance at T = INV_T with 7
 * weight rows, and each K-quant's 33 super-blocks (more than a warp's 32)
 * at T = LONG_T. */
static void shape_cases(std::initializer_list<int> Ts, int inv_T, int long_T)
{
	const int q32_in[] = { 32, 96, 576, 1536, 1568 }; /* 1, 3, 16+2, 48, 48+1 blocks */
	const int k_in[] = { 256, 768 };
	const int n_outs[] = { 1, 7, 70 };
	for (uint32_t type : q32_types)
		for (int n_in : q32_in)
			for (int n_out : n_outs)
				for (int T : Ts)
					if (T < 16 || n_in <= 576)
						check_case(type, n_in, n_out, T, T == inv_T && n_out == 7);
	for (uint32_t type : k_types) {
		for (int n_in : k_in)
			for (int n_out : n_outs)
				for (int T : Ts)
					if (T < 16 || n_in == 256)
						check_case(type, n_in, n_out, T, T == inv_T && n_out == 7);
		check_case(type, 33 * QK_K, 3, long_T, false);
		check_case(type, 33 * QK_K, 3, 1, false); /* split-K's last chunk of 1 */
	}
}

/* The tuning's mm_mixed: one row of Q4_K and Q6_K weights (q, k, v) in
 * one launch, each output with the bits of its weight alone; refused
 * (-EINVAL) at more rows, with the wide kernels off, or with the knob
 * off. */
static void test_mixed()
{
	const int n_in = 2 * QK_K, T = 1;
	const uint32_t types[3] = { QT_Q4_K, QT_Q4_K, QT_Q6_K };
	const int n_out[3] = { 64, 32, 32 };
	std::vector<std::vector<uint8_t>> hw(3);
	std::deque<dbuf<uint8_t>> dw; /* (a deque: its elements stay where they are made) */
	std::deque<dbuf<float>> alone, mixed;
	bk_weight w[3];
	const bk_weight *ws[3];
	float *outs[3];
	std::vector<float> hx = random_x(n_in, 2);
	dbuf<float> x(hx.size());
	x.put(hx);
	for (int k = 0; k < 3; k++) {
		size_t rb;
		hw[k] = random_weights(types[k], n_in, n_out[k], &rb);
		dw.emplace_back(hw[k].size());
		dw[k].put(hw[k]);
		w[k] = { types[k], n_in, n_out[k], dw[k].d, rb };
		ws[k] = &w[k];
		alone.emplace_back(n_out[k]);
		mixed.emplace_back(2 * n_out[k], 0xff);
		outs[k] = mixed[k].d;
	}
	dbuf<uint8_t> scratch(cuda_matmul_scratch_bytes(&w[0], 2));
	tun.mm_wide = 2;
	tun.mm_mixed = 1;
	CHECK(cuda_matmul_mixes(QT_Q4_K, QT_Q6_K, 1, &tun) && !cuda_matmul_mixes(QT_Q4_K, QT_Q6_K, 2, &tun) &&
	      !cuda_matmul_mixes(QT_Q4_K, QT_Q4_0, 1, &tun));
	for (int k = 0; k < 3; k++)
		CHECK_INT_EQ(cuda_matmul_q(&w[k], x.d, T, alone[k].d, scratch.d, &tlc), 0);
	const long long n = launches_of([&] {
		CHECK_INT_EQ(cuda_matmul_q_group(ws, 3, x.d, T, outs, scratch.d, &tlc), 0);
	});
	CHECK(n < 0 || n == 2); /* the quantizer, then one launch for the three */
	for (int k = 0; k < 3; k++) {
		std::vector<float> a = alone[k].get(), m = mixed[k].get();
		CHECK(memcmp(a.data(), m.data(), a.size() * sizeof(float)) == 0);
	}
	CHECK_INT_EQ(cuda_matmul_q_group(ws, 3, x.d, 2, outs, scratch.d, &tlc), -EINVAL); /* two rows */
	tun.mm_wide = 0;
	CHECK_INT_EQ(cuda_matmul_q_group(ws, 3, x.d, T, outs, scratch.d, &tlc), -EINVAL);
	tun.mm_wide = 2;
	tun.mm_mixed = 0;
	CHECK_INT_EQ(cuda_matmul_q_group(ws, 3, x.d, T, outs, scratch.d, &tlc), -EINVAL);
	tun.mm_mixed = 1; /* the default again */
	tun.mm_wide = 0;
}

/* The shapes on the tensor-core kernels at every T (the default; 1, 2, 5:
 * one tile of 8 activation rows a pass; 9: two; 16 and 33: several passes,
 * a ragged last one, 33 the K-quants' four tiles), then the T < 8 ones
 * again on the dp4a kernels (T = 2: a second round of the warp's
 * broadcast over 33 super-blocks). */
static void test_shapes()
{
	shape_cases({ 1, 2, 5, 9, 16, 33 }, 9, 9);
	CHECK(n_mma == n_cases && n_k45 > 0);
	CHECK(split_seen == (2 | 4 | 8 | 16 | 1)); /* these small launches split as far as they may */
	/* split-K off, and at most 4 warps: the same bits */
	tun.mm_split = 1;
	const int before = n_split;
	shape_cases({ 1, 9 }, 9, 9);
	CHECK_INT_EQ(n_split, before);
	tun.mm_split = 16;
	/* a split-K target of one warp: every launch has it already */
	tun.mm_warps = 1;
	shape_cases({ 1 }, 1, 1);
	CHECK_INT_EQ(n_split, before);
	tun.mm_warps = 0; /* the default again */
	tun.mm_split = 4;
	shape_cases({ 2 }, 2, 2);
	CHECK(n_split > before);
	tun.mm_split = 16;
	/* Q4_K and Q6_K at T = 1 a weight row a warp (Q4_K's unaligned
	 * copies of check_case stay on the tensor cores): the same bits,
	 * with 1, 2, 4 and 8 rounds of loads in flight (the last round of a row
	 * ragged at 33 super-blocks, and at 3 and 1 for 3 * 256 and 256
	 * elements; Q6_K's super-blocks at every 2-byte alignment) */
	CHECK_INT_EQ(n_wide, 0);
	for (int rounds : { 1, 2, 4, 8 }) {
		tun.mm_wide = rounds;
		for (uint32_t type : { QT_Q4_K, QT_Q6_K }) {
			for (int n_in : { 256, 768, 33 * QK_K, 56 * QK_K })
				for (int n_out : { 1, 7, 70 })
					check_case(type, n_in, n_out, 1, false);
			check_case(type, 768, 7, 5, true); /* T > 1: the tensor cores, same bits alone */
		}
	}
	tun.mm_wide = 0;
	CHECK_INT_EQ(n_wide, 4 * 2 * 12);
	tun.mma_min_t = 8;
	shape_cases({ 1, 2, 5 }, 5, 2);
	tun.mma_min_t = 1;
	CHECK(n_mma > 0 && n_mma < n_cases);
}

/* mma_s8_m16n8k32 on fragments laid out as its comment (PTX's layout)
 * says: A (16 x 32) and B (32 x 8, stored by columns) loaded lane by lane,
 * D starting from C, written back by the same map. */
static __global__ void mma_layout_kernel(const int8_t *A, const int8_t *Bt, const int *C, int *D)
{
	const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
	int a[4], b[2], d[4];
	memcpy(&a[0], A + 32 * g + 4 * q, 4);
	memcpy(&a[1], A + 32 * (g + 8) + 4 * q, 4);
	memcpy(&a[2], A + 32 * g + 16 + 4 * q, 4);
	memcpy(&a[3], A + 32 * (g + 8) + 16 + 4 * q, 4);
	memcpy(&b[0], Bt + 32 * g + 4 * q, 4);
	memcpy(&b[1], Bt + 32 * g + 16 + 4 * q, 4);
	for (int i = 0; i < 4; i++)
		d[i] = C[8 * (g + 8 * (i / 2)) + 2 * q + i % 2];
	mma_s8_m16n8k32(d, a, b);
	for (int i = 0; i < 4; i++)
		D[8 * (g + 8 * (i / 2)) + 2 * q + i % 2] = d[i];
}

static void test_mma_layout()
{
	for_each_order([&](const char *order) {
		for (int round = 0; round < 3; round++) {
			std::vector<int8_t> A(16 * 32), Bt(8 * 32);
			std::vector<int> C(16 * 8);
			for (size_t i = 0; i < A.size(); i++) /* round 1: -128 and 127 only */
				A[i] = (int8_t)(round == 1 ? (next_u32() & 1 ? 127 : -128) : next_u32());
			for (size_t i = 0; i < Bt.size(); i++)
				Bt[i] = (int8_t)(round == 1 ? (next_u32() & 1 ? 127 : -128) : next_u32());
			for (int &c : C)
				c = round == 2 ? 0 : (int)(next_u32() % 2000001) - 1000000;
			dbuf<int8_t> dA(A.size()), dB(Bt.size());
			dbuf<int> dC(C.size()), dD(C.size());
			dA.put(A);
			dB.put(Bt);
			dC.put(C);
			LAUNCH(mma_layout_kernel, 1, 32, 0, 0, (const int8_t *)dA.d, (const int8_t *)dB.d,
			       (const int *)dC.d, dD.d);
			CHECK_INT_EQ(cudaDeviceSynchronize(), cudaSuccess);
			std::vector<int> D = dD.get();
			int bad = 0;
			for (int r = 0; r < 16; r++)
				for (int n = 0; n < 8; n++) {
					int want = C[8 * r + n];
					for (int k = 0; k < 32; k++)
						want += A[32 * r + k] * Bt[32 * n + k];
					if (D[8 * r + n] != want && bad++ < 3)
						fprintf(stderr, "mma %s round %d: D[%d][%d] = %d, want %d\n", order, round, r,
							n, D[8 * r + n], want);
				}
			CHECK_INT_EQ(bad, 0);
		}
	});
}

/* A smaller set in every thread order. */
static void test_orders()
{
	for_each_order([&](const char *) {
		tun.mma_min_t = 8; /* dp4a */
		for (uint32_t type : q32_types)
			check_case(type, 576, 9, 5, true);
		for (uint32_t type : k_types)
			check_case(type, 512, 5, 5, true);
		tun.mma_min_t = 1; /* the tensor cores: 1, 2 and 4 tiles */
		for (uint32_t type : q32_types) {
			check_case(type, 576, 9, 5, true);
			check_case(type, 576, 21, 9, true);
		}
		for (uint32_t type : k_types) {
			check_case(type, 512, 5, 5, true);
			check_case(type, 512, 21, 17, true);
		}
	});
}

static void test_args()
{
	dbuf<uint8_t> wbuf(34 * 4), scratch(4096);
	dbuf<float> x(64), out(16);
	bk_weight w = { QT_Q8_0, 64, 2, wbuf.d, 68 };
	CHECK_INT_EQ(cuda_matmul_q(&w, x.d, 1, out.d, scratch.d, &tlc), 0);
	CHECK_INT_EQ(cuda_matmul_q(NULL, x.d, 1, out.d, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_matmul_q(&w, NULL, 1, out.d, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_matmul_q(&w, x.d, 0, out.d, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_matmul_q(&w, x.d, 1, out.d, NULL, &tlc), -EINVAL);
	bk_weight bad = w;
	bad.n_in = 48; /* not whole blocks */
	CHECK_INT_EQ(cuda_matmul_q(&bad, x.d, 1, out.d, scratch.d, &tlc), -EINVAL);
	bad = w;
	bad.row_bytes = 34; /* shorter than a row */
	CHECK_INT_EQ(cuda_matmul_q(&bad, x.d, 1, out.d, scratch.d, &tlc), -EINVAL);
	bad = w;
	bad.type = QT_F32;
	CHECK_INT_EQ(cuda_matmul_q(&bad, x.d, 1, out.d, scratch.d, &tlc), -ENOTSUP);
	CHECK_INT_EQ(cuda_matmul_scratch_bytes(&bad, 1), 0);
	bad.type = QT_Q4_K; /* n_in 64 is not a super-block */
	CHECK_INT_EQ(cuda_matmul_q(&bad, x.d, 1, out.d, scratch.d, &tlc), -EINVAL);
	CHECK(cuda_matmul_scratch_bytes(&w, 3) == 3 * cuda_matmul_scratch_bytes(&w, 1));

	/* groups: 1 .. CUDA_MM_GROUP weights of one type and n_in */
	const bk_weight *g[CUDA_MM_GROUP + 1] = { &w, &w, &w, &w, &w };
	float *go[CUDA_MM_GROUP + 1] = { out.d, out.d + 2, out.d + 4, out.d + 6, out.d + 8 };
	CHECK_INT_EQ(cuda_matmul_q_group(g, CUDA_MM_GROUP, x.d, 1, go, scratch.d, &tlc), 0);
	CHECK_INT_EQ(cuda_matmul_q_group(g, CUDA_MM_GROUP, NULL, 1, go, scratch.d, &tlc), 0);
	CHECK_INT_EQ(cuda_matmul_q_group(g, 0, x.d, 1, go, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_matmul_q_group(g, CUDA_MM_GROUP + 1, x.d, 1, go, scratch.d, &tlc), -EINVAL);
	bk_weight other = w;
	other.type = QT_Q4_0; /* another type in the group */
	other.row_bytes = 36;
	g[1] = &other;
	CHECK_INT_EQ(cuda_matmul_q_group(g, 2, x.d, 1, go, scratch.d, &tlc), -EINVAL);
	other = w;
	other.n_in = 32; /* another n_in */
	CHECK_INT_EQ(cuda_matmul_q_group(g, 2, x.d, 1, go, scratch.d, &tlc), -EINVAL);
	g[1] = NULL;
	CHECK_INT_EQ(cuda_matmul_q_group(g, 2, x.d, 1, go, scratch.d, &tlc), -EINVAL);
	g[1] = &w;
	go[1] = NULL;
	CHECK_INT_EQ(cuda_matmul_q_group(g, 2, x.d, 1, go, scratch.d, &tlc), -EINVAL);
}

#ifdef MATMUL_SMALL
/* The TSan build's share: the shapes that reach every kernel's code once,
 * each type at T = 1, 9 and 17 on the tensor cores (1, 2 and 4 tiles) and
 * T = 2 on dp4a. */
static void test_small()
{
	for (uint32_t type : q32_types)
		for (int T : { 1, 9, 17 })
			check_case(type, 64, 7, T, T == 9);
	for (uint32_t type : k_types) {
		for (int T : { 1, 9, 17 })
			check_case(type, 256, 7, T, T == 9);
		check_case(type, 768, 7, 1, false); /* split-K: 2 warps, 3 super-blocks */
	}
	tun.mm_wide = 2; /* a warp per row: its steps through shared memory */
	check_case(QT_Q4_K, 33 * QK_K, 7, 1, false);
	check_case(QT_Q6_K, 9 * QK_K, 7, 1, false);
	tun.mm_wide = 0;
	CHECK_INT_EQ(n_wide, 2);
	tun.mma_min_t = 8;
	for (uint32_t type : q32_types)
		check_case(type, 64, 7, 2, true);
	for (uint32_t type : k_types)
		check_case(type, 256, 7, 2, true);
	tun.mma_min_t = 1;
}
#endif

/* The defaults (after the explicit settings the rest of the tests take):
 * one row of Q4_K (16-byte aligned) and Q6_K on the wide kernels, of the
 * 32-element types on dp4a, more rows on the tensor cores; split-K within
 * one wave of resident warps (the emulator's 132 SMs): an 8B's gate+up
 * (1792 runs of 16 rows) unsplit, its down (256) 8 warps a run. */
static void test_defaults()
{
	tun.mm_wide = -1;
	tun.mma_min_t = 0;
	tun.mm_warps = 0;
	CHECK(mm_use_wide(&tun, QT_Q4_K, 1, 1) && !mm_use_wide(&tun, QT_Q4_K, 0, 1) && mm_use_wide(&tun, QT_Q6_K, 0, 1));
	CHECK(!mm_use_wide(&tun, QT_Q4_K, 1, 2) && !mm_use_wide(&tun, QT_Q5_K, 1, 1) && !mm_use_wide(&tun, QT_Q4_1, 1, 1));
	CHECK(!mm_use_mma(&tun, QT_Q4_0, 1) && !mm_use_mma(&tun, QT_Q4_1, 1) && !mm_use_mma(&tun, QT_Q8_0, 1));
	CHECK(mm_use_mma(&tun, QT_Q4_1, 2) && mm_use_mma(&tun, QT_Q4_K, 1) && mm_use_mma(&tun, QT_Q6_K, 2));
	CHECK_INT_EQ(mm_split(&tun, 0, QK_K, 16, 1, 1792), 1);
	CHECK_INT_EQ(mm_split(&tun, 0, QK_K, 56, 1, 256), 8);
	CHECK_INT_EQ(mm_split(&tun, 0, QK_K, 16, 1, 384), 8);
	CHECK_INT_EQ(mm_split(&tun, 0, QK, 18, 1, 192), 8);
	CHECK_INT_EQ(mm_split(&tun, 0, QK, 48, 1, 36), 16);
	const int wide = n_wide;
	for (uint32_t type : { QT_Q4_0, QT_Q4_1, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K })
		for (int T : { 1, 2 })
			check_case(type, type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q8_0 ? 576 : 768, 7, T,
				   T == 2);
	CHECK_INT_EQ(n_wide, wide + 2);
}

#ifndef CPU_REF_THREADS
#define CPU_REF_THREADS 2
#endif

int main(void)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_INT_EQ(cpu_backend_new(CPU_REF_THREADS, &cpu_be), 0);
	if (!cpu_be)
		return test_result();
	cuda_tuning_defaults(&tun);
	/* the kernels by name: the tensor cores at every T, no wide kernels
	 * (test_defaults: what the backend picks unless told) */
	tun.mma_min_t = 1;
	tun.mm_wide = 0;
	test_args();
	test_mma_layout();
#ifdef MATMUL_SMALL
	test_small();
#else
	test_shapes();
	test_orders();
#endif
	test_defaults();
	test_mixed();
	backend_free(cpu_be);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("test_cuda_matmul: %d cases (%d on the tensor-core kernels, %d of them Q4_K/Q5_K, "
	       "each also from 2-byte aligned rows, %d split-K; %d Q4_K/Q6_K a row a warp; %d on dp4a; "
	       "cpu isa %s and scalar), all bit-identical: %s, %.1f s\n",
	       n_cases, n_mma, n_k45, n_split, n_wide, n_cases - n_mma - n_wide,
	       quant_isa_name(quant_get_isa()),
	       test_failures ? "no" : "yes",
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	return test_result();
}
