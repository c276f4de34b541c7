/* test_cuda_attention.cc - kernels/cuda/attention.cu, compiled here as C++
 * against the CUDA emulator, against the CPU backend (the reference):
 * kv_store writes the very bytes the CPU writes (F32, F16, Q8_0), and
 * attention over a paged pool (shuffled block ids, tables with holes, GQA,
 * ragged batches mixing decode rows and prefill chunks) matches the CPU's
 * within the tolerances below, in every thread order.
 *
 * Splits are made small here (48 positions: 3 blocks of 16, at most 4 of
 * them, so 96 from position 192) so that rows of up to 200 positions cross
 * up to 4 splits, the reduction is exercised and a prefill chunk spans the
 * change of split size; the kernels are the same at the defaults (16, 32).
 */
extern "C" { /* C headers, before cuda_ops.h includes backend.h as C++ */
#include "backend.h"
#include "quant.h"
}

#define ATTN_SPLIT_TOKENS 48
#define ATTN_MAX_SPLITS 4 /* so 48 positions a split up to 191, then 96 */
#include "attention.cu"

#include <math.h>

#include <algorithm>
#include <vector>

#include "emu_testutil.h"
#include "q8rows.h"

/* The tuning attention runs with here: attn_split 0 is ATTN_SPLIT_TOKENS
 * above (48); test_args and main set others. */
static struct cuda_tuning tun = { 0, 16, 0, 2, 1, 0, 0 };
static const struct cuda_launch tlc = { NULL, &tun, 0, 0 };

static uint64_t rng = 7;
static uint32_t next_u32()
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 32);
}
static float next_f(float lo, float hi)
{
	return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.0f;
}

#define N_BLOCKS 64
#define BT 16
#define N_LAYER 2
#define TABLE_STRIDE 16 /* capacity 256 positions */
#define N_SEQ 4

/* Outputs are convex combinations of V values in [-1, 1].  The GPU sums the
 * dot products, the softmax denominators and the weighted V rows in another
 * order than the CPU's SIMD loops (fmaf chains, per-split partials
 * rescaled by exp(m_s - M) in the reduction), and its expf may differ from
 * libm's by an ulp or two: each output is off by a few float ulps of the
 * terms summed: measured <= 2e-7 absolute at these lengths (<= 200
 * positions, |score| < 6).  F16 and Q8_0 dequantize to the very floats the
 * CPU uses (same products), so the same bound holds.  We allow
 * 4e-6 + 4e-6 * |ref|: 20x the measured error, far below a wrong weight or
 * a dropped position (>= 1e-3 here). */
static const float ATOL = 4e-6f, RTOL = 4e-6f;

struct cfg {
	uint32_t type;
	int32_t head_dim, n_head, n_head_kv;
	bool big_batch; /* also a 70-row prefill chunk (more than one row chunk) */
	bool small_lanes; /* the TSan build's shapes for attn_split_lanes_kernel */
};

static const cfg cfgs[] = {
	{ QT_F32, 8, 4, 2, true, false },
	{ QT_F32, 64, 6, 1, false, true },
	{ QT_F16, 16, 9, 3, false, false },
	{ QT_F16, 64, 8, 2, false, false },
	{ QT_F16, 6, 4, 2, false, true },    /* heads of no whole float4s: one element at a time */
#ifndef ATTN_SMALL /* the TSan build: its barriers are the others' */
	{ QT_F16, 128, 12, 4, false, false }, /* rope_kv_store's q heads over two blocks (8 + 4) */
#endif
	{ QT_Q8_0, 64, 4, 2, false, false },
	{ QT_Q8_0, 16, 6, 2, false, true },  /* heads inside a Q8_0 block */
	{ QT_Q8_0, 8, 8, 4, false, false },
};

static size_t row_bytes_of(uint32_t type, int32_t kv_dim)
{
	return type == QT_F32 ? (size_t)kv_dim * 4 : type == QT_F16 ? (size_t)kv_dim * 2
		: (size_t)kv_dim / 32 * 34;
}

/* A step: rows (pos, seq). */
struct step {
	std::vector<int32_t> pos, seq;
	void add(int32_t s, int32_t p0, int32_t n)
	{
		for (int32_t i = 0; i < n; i++) {
			pos.push_back(p0 + i);
			seq.push_back(s);
		}
	}
	int32_t T() const { return (int32_t)pos.size(); }
};

static struct backend *cpu;
static double worst_err, worst_rope;
static int32_t test_window; /* the attention's sliding window in run_cfg; 0: none */

/* cuda_rope_kv_store equals the CPU's rope of q, rope of k and kv_store:
 * rotated q and k bit for bit on the emulator (on a GPU within
 * rope_matches: CUDA's sinf/cosf), every pool byte, for both RoPE styles and
 * a partial rotation, over the ragged steps FILLS (padding rows: run_cfg). */
template <class Tables, class Rows>
static void rope_kv_store_vs_cpu(const cfg &c, const struct bk_kv &shape, const std::vector<step> &fills,
	Tables tables_of, Rows rows_of)
{
	const int32_t kv_dim = shape.kv_dim, q_dim = c.n_head * c.head_dim;
	const size_t pool_bytes = (size_t)shape.n_blocks * shape.block_bytes;
	const struct bk_attn a = { c.n_head, c.n_head_kv, c.head_dim, 1.0f, 0 };

	for (int style = 0; style < 2; style++) {
		const enum bk_rope_style st = style ? BK_ROPE_NEOX : BK_ROPE_NORMAL;
		const int32_t n_rot = style ? c.head_dim : (c.head_dim / 2 + 1) / 2 * 2; /* NORMAL: partial */
		std::vector<uint8_t> cpu_pool(pool_bytes, 0);
		dbuf<uint8_t> dpool(pool_bytes);
		dpool.put(cpu_pool);
		struct bk_kv hkv = shape, dkv = shape;
		hkv.base = cpu_pool.data();
		dkv.base = dpool.d;
		for (int layer = 0; layer < N_LAYER; layer++) {
			for (const step &s : fills) {
				const int32_t T = s.T();
				std::vector<float> q((size_t)T * q_dim), k((size_t)T * kv_dim), v(k.size());
				for (float &x : q)
					x = next_f(-2, 2);
				for (float &x : k)
					x = next_f(-2, 2);
				for (float &x : v)
					x = next_f(-1, 1);
				std::vector<const int32_t *> ptrs;
				struct bk_rows rows = rows_of(s, ptrs);
				dbuf<int32_t> dpos(T), dtab((size_t)T * TABLE_STRIDE);
				dbuf<float> dq(q.size()), dk(k.size()), dv(v.size());
				dpos.put(s.pos);
				dtab.put(tables_of(s));
				dq.put(q);
				dk.put(k);
				dv.put(v);
				const struct bk_rope rp = bk_rope_plain(n_rot, st, 10000.0f);
				CHECK_INT_EQ(cuda_rope_kv_store(&dkv, layer, T, dpos.d, dtab.d, TABLE_STRIDE, &a, &rp,
								dq.d, dk.d, dv.d, 0), 0);
				CHECK_INT_EQ(cpu->ops->rope(cpu, q.data(), T, c.n_head, c.head_dim, rows.pos, &rp), 0);
				CHECK_INT_EQ(cpu->ops->rope(cpu, k.data(), T, c.n_head_kv, c.head_dim, rows.pos, &rp), 0);
				double eq, ek;
				CHECK(rope_matches(dq.get(), q, 2.0f, &eq));
				CHECK(rope_matches(dk.get(), k, 2.0f, &ek));
				worst_rope = std::max(worst_rope, std::max(eq, ek));
				/* the CPU stores the device's k (the same bits on the
				 * emulator): then every pool byte must be the CPU's */
				k = dk.get();
				CHECK_INT_EQ(cpu->ops->kv_store(cpu, &hkv, layer, &rows, k.data(), v.data()), 0);
			}
		}
		CHECK(dpool.get() == cpu_pool);
		/* bad shapes */
		struct bk_attn bad = a;
		bad.n_head_kv = c.n_head_kv + 1;
		dbuf<int32_t> dpos(1), dtab(TABLE_STRIDE);
		dbuf<float> dx(q_dim);
		const struct bk_rope rp = bk_rope_plain(n_rot, st, 10000.0f), r3 = bk_rope_plain(3, st, 10000.0f);
		CHECK_INT_EQ(cuda_rope_kv_store(&dkv, 0, 1, dpos.d, dtab.d, TABLE_STRIDE, &bad, &rp,
						dx.d, dx.d, dx.d, 0), -EINVAL);
		CHECK_INT_EQ(cuda_rope_kv_store(&dkv, 0, 1, dpos.d, dtab.d, TABLE_STRIDE, &a, &r3,
						dx.d, dx.d, dx.d, 0), -EINVAL);
	}
}

/* kv_store and attention on C's shapes; WITH_ROPE: rope_kv_store too. */
static void run_cfg(const cfg &c, bool with_rope)
{
	const int32_t kv_dim = c.head_dim * c.n_head_kv, hd = c.head_dim;
	const size_t rb = row_bytes_of(c.type, kv_dim);
	const size_t block_bytes = 2 * (size_t)N_LAYER * BT * rb;
	const size_t pool_bytes = (size_t)N_BLOCKS * block_bytes;

	/* sequences: lengths, tables of shuffled block ids; unused entries are
	 * -1 holes (never read), unused blocks stay zero */
	const int32_t len[N_SEQ] = { 200, 150, 37, 5 };
	std::vector<int32_t> perm(N_BLOCKS);
	for (int i = 0; i < N_BLOCKS; i++)
		perm[i] = i;
	for (int i = N_BLOCKS - 1; i > 0; i--)
		std::swap(perm[i], perm[next_u32() % (i + 1)]);
	std::vector<int32_t> seq_table((size_t)N_SEQ * TABLE_STRIDE, -1);
	int used = 3; /* blocks perm[0..2] belong to nobody */
	for (int s = 0; s < N_SEQ; s++)
		for (int b = 0; b < (len[s] + BT - 1) / BT; b++)
			seq_table[(size_t)s * TABLE_STRIDE + b] = perm[used++];

	std::vector<uint8_t> cpu_pool(pool_bytes, 0);
	dbuf<uint8_t> dpool(pool_bytes);
	struct bk_kv hkv = { cpu_pool.data(), c.type, N_BLOCKS, BT, N_LAYER, kv_dim, rb, block_bytes };
	struct bk_kv dkv = hkv;
	dkv.base = dpool.d;

	/* per-step device copies of pos and the rows' tables */
	auto tables_of = [&](const step &st) {
		std::vector<int32_t> tb((size_t)st.T() * TABLE_STRIDE);
		for (int32_t t = 0; t < st.T(); t++)
			std::copy(seq_table.begin() + (size_t)st.seq[t] * TABLE_STRIDE,
				seq_table.begin() + (size_t)(st.seq[t] + 1) * TABLE_STRIDE,
				tb.begin() + (size_t)t * TABLE_STRIDE);
		return tb;
	};
	auto rows_of = [&](const step &st, std::vector<const int32_t *> &ptrs) {
		ptrs.resize(st.T());
		for (int32_t t = 0; t < st.T(); t++)
			ptrs[t] = seq_table.data() + (size_t)st.seq[t] * TABLE_STRIDE;
		struct bk_rows r = { st.T(), st.pos.data(), ptrs.data() };
		return r;
	};

	/* ---- kv_store: fill every sequence in ragged steps, both layers ---- */
	std::vector<step> fills(3);
	for (int s = 0; s < N_SEQ; s++) { /* each sequence's positions over 3 steps */
		int32_t a = len[s] / 3, b = 2 * len[s] / 3;
		fills[0].add(s, 0, a);
		fills[1].add(s, a, b - a);
		fills[2].add(s, b, len[s] - b);
	}
	for (int layer = 0; layer < N_LAYER; layer++) {
		for (const step &st : fills) {
			const int32_t T = st.T();
			std::vector<float> k((size_t)T * kv_dim), v((size_t)T * kv_dim);
			for (float &x : k)
				x = next_f(-1, 1);
			for (float &x : v)
				x = next_f(-1, 1);
			if (T > 2) { /* a zero row (Q8_0 amax == 0) and a tie-rounding one */
				std::fill(k.begin(), k.begin() + kv_dim, 0.0f);
				for (int32_t i = 0; i < kv_dim; i++)
					v[i] = i % 32 == 0 ? 1.0f : (float)((int)(next_u32() % 255) - 127) / 254.0f;
			}
			std::vector<const int32_t *> ptrs;
			struct bk_rows rows = rows_of(st, ptrs);
			CHECK_INT_EQ(cpu->ops->kv_store(cpu, &hkv, layer, &rows, k.data(), v.data()), 0);
			dbuf<int32_t> dpos(T), dtab((size_t)T * TABLE_STRIDE);
			dbuf<float> dk(k.size()), dv(v.size());
			dpos.put(st.pos);
			dtab.put(tables_of(st));
			dk.put(k);
			dv.put(v);
			CHECK_INT_EQ(cuda_kv_store(&dkv, layer, T, dpos.d, dtab.d, TABLE_STRIDE, dk.d, dv.d, 0), 0);
		}
	}
	std::vector<uint8_t> got = dpool.get();
	size_t diff = 0;
	for (size_t i = 0; i < pool_bytes; i++)
		diff += got[i] != cpu_pool[i];
	if (diff)
		fprintf(stderr, "type %u hd %d: kv_store: %zu of %zu pool bytes differ\n", c.type, hd, diff,
			pool_bytes);
	CHECK(diff == 0);
	if (with_rope)
		rope_kv_store_vs_cpu(c, hkv, fills, tables_of, rows_of);
	dpool.put(cpu_pool); /* attention below reads the CPU's bytes either way */
	{ /* padding rows (negative positions, tables of holes) store nothing,
	   * and rope_kv_store rotates nothing of theirs either */
		const struct bk_attn a = { c.n_head, c.n_head_kv, hd, 1.0f, 0 };
		std::vector<int32_t> ppos = { -1, -1, -7 }, ptab(3 * TABLE_STRIDE, -1);
		std::vector<float> x3((size_t)3 * c.n_head * hd, 0.5f); /* q-sized: k, v fit too */
		dbuf<int32_t> dpos(3), dtab(ptab.size());
		dbuf<float> dx(x3.size());
		dpos.put(ppos);
		dtab.put(ptab);
		dx.put(x3);
		CHECK_INT_EQ(cuda_kv_store(&dkv, 0, 3, dpos.d, dtab.d, TABLE_STRIDE, dx.d, dx.d, 0), 0);
		CHECK(dpool.get() == cpu_pool);
		const struct bk_rope rp = bk_rope_plain(hd, BK_ROPE_NORMAL, 10000.0f);
		CHECK_INT_EQ(cuda_rope_kv_store(&dkv, 0, 3, dpos.d, dtab.d, TABLE_STRIDE, &a, &rp,
						dx.d, dx.d, dx.d, 0), 0);
		CHECK(dpool.get() == cpu_pool);
		CHECK(dx.get() == x3);
	}

	/* ---- attention: a ragged batch ---- */
	std::vector<step> steps(1);
	steps[0].add(0, 199, 1);    /* decode, 3 splits of 96 */
	steps[0].add(0, 186, 10);   /* a chunk across 191 | 192: splits of 48, then 96 */
	steps[0].add(1, 140, 10);   /* a prefill chunk */
	steps[0].add(2, 36, 1);     /* decode */
	steps[0].add(3, 0, 5);      /* a fresh sequence's prompt */
	steps[0].add(0, 47, 2);     /* split edge: 48 and 49 positions */
	if (c.big_batch) {
		steps.emplace_back();
		steps[1].add(1, 60, 70); /* more rows than ATTN_ROW_CHUNK */
		steps[1].add(2, 15, 2);  /* KV block edge: 16, 17 positions */
	}
	attn_shape unused;
	struct bk_attn a = { c.n_head, c.n_head_kv, hd, 1.0f / sqrtf((float)hd), test_window };
	CHECK_INT_EQ(attn_plan(&dkv, &a, TABLE_STRIDE, ATTN_SPLIT_TOKENS, &unused), 0);
	/* the tiled runs below share blocks (fewer rows fit beside big heads) */
	CHECK(cuda_attention_qrows(&dkv, &a) >= (hd <= 64 ? 8 : 2));
	for (const step &st : steps) {
		const int32_t T = st.T();
		const size_t qn = (size_t)T * c.n_head * hd;
		std::vector<float> q(qn), want(qn);
		for (float &x : q)
			x = next_f(-2, 2);
		std::vector<const int32_t *> ptrs;
		struct bk_rows rows = rows_of(st, ptrs);
		const int layer = 1;
		CHECK_INT_EQ(cpu->ops->attention(cpu, &hkv, layer, &rows, &a, q.data(), want.data(), NULL), 0);
		dbuf<int32_t> dpos(T), dtab((size_t)T * TABLE_STRIDE);
		dbuf<float> dq(qn), dout(qn, 0xff);
		const size_t sb = cuda_attention_scratch_bytes(&dkv, &a, T, TABLE_STRIDE, &tun);
		CHECK(sb > 0);
		dbuf<uint8_t> scratch(sb, 0xff);
		dpos.put(st.pos);
		dtab.put(tables_of(st));
		dq.put(q);
		std::vector<float> first;
		/* one row per block, then a prefill chunk's rows sharing blocks */
		for (int tiled = 0; tiled < 2; tiled++)
		for_each_order([&](const char *order) {
			CHECK_INT_EQ(cuda_attention(&dkv, layer, T, dpos.d, dtab.d, TABLE_STRIDE, &a, dq.d,
					     dout.d, tiled ? &rows : NULL, scratch.d, &tlc), 0);
			std::vector<float> out = dout.get();
			int bad = 0;
			for (size_t i = 0; i < qn; i++) {
				double e = fabs((double)out[i] - want[i]);
				if (e > worst_err)
					worst_err = e;
				if (!(e <= ATOL + RTOL * fabs(want[i])) && bad++ < 5)
					fprintf(stderr, "type %u hd %d T %d [%zu] (row %zu head %zu): %.8g, cpu %.8g\n",
						c.type, hd, T, i, i / (c.n_head * hd), i / hd % c.n_head,
						out[i], want[i]);
			}
			CHECK(bad == 0);
			/* neither the thread order nor the tiling changes anything:
			 * each output has one writer and a fixed summation order */
			if (first.empty())
				first = out;
			else
				CHECK(memcmp(first.data(), out.data(), qn * sizeof(float)) == 0);
		});
		/* the pool at an offset of its allocation that leaves its rows
		 * no whole-word loads (F32 4 bytes, F16 2: attn_plan's
		 * vec_load): the one-element loads give the same floats, so
		 * the same bits (Q8_0 needs only 2-byte alignment either way) */
		if (c.type != QT_Q8_0) {
			const size_t off = c.type == QT_F32 ? 4 : 2;
			std::vector<uint8_t> shifted(pool_bytes + off, 0);
			std::copy(cpu_pool.begin(), cpu_pool.end(), shifted.begin() + off);
			dbuf<uint8_t> dshift(shifted.size());
			dshift.put(shifted);
			struct bk_kv skv = dkv;
			skv.base = dshift.d + off;
			attn_shape vs, ss;
			CHECK_INT_EQ(attn_plan(&dkv, &a, TABLE_STRIDE, ATTN_SPLIT_TOKENS, &vs), 0);
			CHECK_INT_EQ(attn_plan(&skv, &a, TABLE_STRIDE, ATTN_SPLIT_TOKENS, &ss), 0);
			CHECK(vs.vec_load == (hd % 4 == 0) && !ss.vec_load);
			CHECK_INT_EQ(cuda_attention(&skv, layer, T, dpos.d, dtab.d, TABLE_STRIDE, &a, dq.d, dout.d,
						    &rows, scratch.d, &tlc), 0);
			CHECK(memcmp(dout.get().data(), first.data(), qn * sizeof(float)) == 0);
		}
		/* quantizing for the o projection in the reduction changes none
		 * of out's bits, and the rows are the CPU quantizer's */
		const int64_t row_n = (int64_t)c.n_head * hd;
		for (uint32_t vec : q8_vecs) {
			if (!q8_row_bytes(vec, row_n))
				continue;
			const size_t qs = q8_stride(vec, row_n);
			dbuf<uint8_t> dxq(qs * (size_t)T, 0xff);
			char what[80];
			snprintf(what, sizeof what, "type %u hd %d T %d %s", c.type, hd, T, qtype_get(vec)->name);
			for_each_order([&](const char *) {
				dout.put(std::vector<float>(qn, -1.0f));
				CHECK_INT_EQ(cuda_attention_q8(&dkv, layer, T, dpos.d, dtab.d, TABLE_STRIDE, &a, dq.d,
							       dout.d, &rows, scratch.d, vec, dxq.d, qs, &tlc), 0);
				CHECK(memcmp(dout.get().data(), first.data(), qn * sizeof(float)) == 0);
				expect_q8_rows("attention_q8", what, dxq.get(), first, T, row_n, qs, vec);
			});
		}
		/* padding rows around the step's own: zeros for them, the same
		 * bits for the others */
		{
			step pad = st;
			pad.pos.insert(pad.pos.begin(), -1);
			pad.seq.insert(pad.seq.begin(), 0);
			pad.pos.push_back(-1);
			pad.seq.push_back(1);
			const int32_t TP = pad.T();
			std::vector<int32_t> ptab = tables_of(pad);
			std::fill(ptab.begin(), ptab.begin() + TABLE_STRIDE, -1); /* never read */
			const size_t hn = (size_t)c.n_head * hd;
			std::vector<float> pq((size_t)TP * hn, 1.0f);
			std::copy(q.begin(), q.end(), pq.begin() + hn);
			dbuf<int32_t> ppos(TP), pt(ptab.size());
			dbuf<float> pdq(pq.size()), pout(pq.size(), 0xff);
			dbuf<uint8_t> ps(cuda_attention_scratch_bytes(&dkv, &a, TP, TABLE_STRIDE, &tun), 0xff);
			ppos.put(pad.pos);
			pt.put(ptab);
			pdq.put(pq);
			CHECK_INT_EQ(cuda_attention(&dkv, layer, TP, ppos.d, pt.d, TABLE_STRIDE, &a, pdq.d,
					     pout.d, NULL, ps.d, &tlc), 0);
			std::vector<float> po = pout.get();
			CHECK(memcmp(po.data() + hn, first.data(), qn * sizeof(float)) == 0);
			for (size_t i = 0; i < hn; i++)
				CHECK(po[i] == 0.0f && po[(size_t)(TP - 1) * hn + i] == 0.0f);
		}
		/* batch invariance: each row alone gives the same bits */
		for (int32_t t = 0; t < T; t += 7) {
			CHECK_INT_EQ(cuda_attention(&dkv, layer, 1, dpos.d + t, dtab.d + (size_t)t * TABLE_STRIDE,
					     TABLE_STRIDE, &a, dq.d + (size_t)t * c.n_head * hd, dout.d,
					     NULL, scratch.d, &tlc), 0);
			std::vector<float> one = dout.get();
			CHECK(memcmp(one.data(), first.data() + (size_t)t * c.n_head * hd,
				     (size_t)c.n_head * hd * sizeof(float)) == 0);
		}
	}
}

static void test_args()
{
	dbuf<uint8_t> pool(2 * 2 * 4 * 16 * 4 * 4);
	dbuf<int32_t> pos(1), tab(4);
	dbuf<float> x(64), out(64);
	dbuf<uint8_t> scratch(1 << 16);
	struct bk_kv kv = { pool.d, QT_F32, 4, 4, 2, 16, 64, 2 * 2 * 4 * 64 };
	struct bk_attn a = { 4, 2, 8, 0.35f, 0 };
	CHECK(cuda_attention_scratch_bytes(&kv, &a, 1, 4, &tun) > 0);
	CHECK(cuda_attention_scratch_bytes(&kv, &a, 1, 4, &tun) <= (1 << 16));
	/* the split size: one KV block a split, four splits of partials */
	const size_t one = cuda_attention_scratch_bytes(&kv, &a, 1, 4, &tun);
	tun.attn_split = 4;
	CHECK(cuda_attention_scratch_bytes(&kv, &a, 1, 4, &tun) > one);
	tun.attn_split = 0; /* the default again */
	CHECK_INT_EQ(cuda_attention_scratch_bytes(&kv, &a, 1, 4, &tun), one);
	CHECK_INT_EQ(cuda_attention(&kv, 0, 0, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, &tlc), 0);
	CHECK_INT_EQ(cuda_kv_store(&kv, 0, 0, pos.d, tab.d, 4, x.d, x.d, 0), 0);
	CHECK_INT_EQ(cuda_attention(&kv, 2, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_kv_store(&kv, -1, 1, pos.d, tab.d, 4, x.d, x.d, 0), -EINVAL);
	CHECK_INT_EQ(cuda_attention(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, NULL, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention(&kv, 0, 1, pos.d, tab.d, 0, &a, x.d, out.d, NULL, scratch.d, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention(&kv, 0, -1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, &tlc), -EINVAL);
	struct bk_attn bad = { 5, 2, 8, 0.35f, 0 }; /* n_head % n_head_kv */
	CHECK_INT_EQ(cuda_attention(&kv, 0, 1, pos.d, tab.d, 4, &bad, x.d, out.d, NULL, scratch.d, &tlc), -EINVAL);
	CHECK(cuda_attention_scratch_bytes(&kv, &bad, 1, 4, &tun) == 0);
	bad = { 4, 2, 16, 0.25f, 0 }; /* head_dim * n_head_kv != kv_dim */
	CHECK_INT_EQ(cuda_attention(&kv, 0, 1, pos.d, tab.d, 4, &bad, x.d, out.d, NULL, scratch.d, &tlc), -EINVAL);
	struct bk_kv k2 = kv;
	k2.type = QT_BF16;
	CHECK_INT_EQ(cuda_kv_store(&k2, 0, 1, pos.d, tab.d, 4, x.d, x.d, 0), -ENOTSUP);
	CHECK_INT_EQ(cuda_attention(&k2, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, &tlc), -ENOTSUP);
	k2 = kv;
	k2.row_bytes = 32; /* not F32's row of kv_dim */
	CHECK_INT_EQ(cuda_kv_store(&k2, 0, 1, pos.d, tab.d, 4, x.d, x.d, 0), -EINVAL);
	k2 = kv;
	k2.type = QT_Q8_0; /* kv_dim 16 is not whole Q8_0 blocks */
	k2.row_bytes = 34;
	CHECK_INT_EQ(cuda_kv_store(&k2, 0, 1, pos.d, tab.d, 4, x.d, x.d, 0), -EINVAL);
	/* the quantized rows: 32 elements (4 heads of 8) are one Q8_0 block,
	 * but no Q8_K super-block; the stride must hold a row, 16-aligned */
	dbuf<uint8_t> xq(256);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 0, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_0,
				       xq.d, 48, &tlc), 0);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_K,
				       xq.d, 256, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_1,
				       xq.d, 32, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_0,
				       xq.d, 40, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q4_0,
				       xq.d, 48, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_0,
				       NULL, 48, &tlc), -EINVAL);
	CHECK_INT_EQ(cuda_attention_q8(&kv, 0, 1, pos.d, tab.d, 4, &a, x.d, out.d, NULL, scratch.d, QT_Q8_0,
				       xq.d + 1, 48, &tlc), -EINVAL);
}

/* The CPU reference's threads: one in the TSan build, whose reference
 * (libkernels.a) is not instrumented, so its pool's handoffs are not seen. */
#ifndef CPU_REF_THREADS
#define CPU_REF_THREADS 2
#endif

int main()
{
	CHECK_INT_EQ(cpu_backend_new(CPU_REF_THREADS, &cpu), 0);
	if (!cpu)
		return test_result();
	test_args();
	/* attn_split_lanes_kernel on every shape (the TSan build, much the
	 * slowest, on the small_lanes shapes only: its barriers are the same
	 * on all); then a split of one KV block (cuda_attention_set_split):
	 * more splits, the same tolerances. */
	worst_err = 0;
	for (const cfg &c : cfgs) {
#ifdef ATTN_SMALL
		if (!c.small_lanes)
			continue;
#endif
		run_cfg(c, true);
	}
	tun.attn_split = 16;
	run_cfg(cfgs[0], false);
	tun.attn_split = 0;
	/* sliding windows (Gemma 3): splits and tiles wholly before a row's
	 * window, one cut inside a tile, a window of one position */
	static const int32_t windows[] = { 37, 100, 1 };
	for (int32_t w : windows) {
		test_window = w;
		run_cfg(cfgs[w == 37 ? 3 : 0], false);
	}
	test_window = 0;
	fprintf(stderr, "attn_split_lanes_kernel: worst |gpu - cpu| = %.3g\n", worst_err);
	backend_free(cpu);
	fprintf(stderr, "RoPE'd q and k: worst |gpu - cpu| = %.3g\n", worst_rope);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
