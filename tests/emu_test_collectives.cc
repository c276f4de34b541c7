/* emu_test_collectives.cc - the emulator's barriers and warp collectives
 * against CUDA's documented semantics, in every thread order: shuffles
 * (all four, with widths and out-of-range lanes), votes with partial masks,
 * __syncwarp, __syncthreads with exited threads and its count/and/or forms,
 * match and reduce, atomics, built-in variables, and the orders themselves.
 */
#include "cuda_compat.h"

#include <limits.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "emu_testutil.h"

/* ---- shuffles ---- */
enum { K_IDX, K_UP, K_DOWN, K_XOR };
static const int widths[] = { 32, 16, 8, 4, 2, 1 };
#define N_WIDTHS 6
#define N_ARGS 8
/* The lane operands tried per kind; -1 stands for "lane * 7" (per-lane source). */
static const int idx_args[N_ARGS] = { 0, 1, 5, 16, 31, 33, -5, -1 };
static const int up_down_args[N_ARGS] = { 0, 1, 2, 3, 7, 16, 31, 4 };
static const int xor_args[N_ARGS] = { 0, 1, 2, 5, 8, 16, 31, 12 };

struct shfl_args {
	int a[N_ARGS];
};

/* out[(w * N_ARGS + a) * 64 + tid] = the shuffle of tid*10+1 for width w, operand a. */
static __global__ void shfl_kernel(int kind, shfl_args args, int *out)
{
	const int tid = threadIdx.x, lane = tid % 32, v = tid * 10 + 1;
	const int ws[N_WIDTHS] = { 32, 16, 8, 4, 2, 1 };
	for (int w = 0; w < N_WIDTHS; w++)
		for (int a = 0; a < N_ARGS; a++) {
			int arg = args.a[a] == -1 ? lane * 7 : args.a[a], r;
			switch (kind) {
			case K_IDX: r = __shfl_sync(0xffffffffu, v, arg, ws[w]); break;
			case K_UP: r = __shfl_up_sync(0xffffffffu, v, (unsigned)arg, ws[w]); break;
			case K_DOWN: r = __shfl_down_sync(0xffffffffu, v, (unsigned)arg, ws[w]); break;
			default: r = __shfl_xor_sync(0xffffffffu, v, arg, ws[w]); break;
			}
			out[(w * N_ARGS + a) * 64 + tid] = r;
		}
}

/* CUDA's rules, from the programming guide: a segment of WIDTH lanes; idx
 * wraps modulo width; up/down leave the value unchanged past the segment's
 * edge; xor may read earlier segments but not later ones. */
static int shfl_ref(int kind, int tid, int arg, int width)
{
	int lane = tid % 32, start = lane & ~(width - 1), end = start + width - 1, j;
	switch (kind) {
	case K_IDX: j = start + (arg & (width - 1)); break;
	case K_UP: j = lane - arg; j = j < start ? lane : j; break;
	case K_DOWN: j = lane + arg; j = j > end ? lane : j; break;
	default: j = lane ^ arg; j = j > end ? lane : j; break;
	}
	return (tid - lane + j) * 10 + 1;
}

static void test_shuffles()
{
	const int *argsets[4] = { idx_args, up_down_args, up_down_args, xor_args };
	static const char *const names[4] = { "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
		"__shfl_xor_sync" };
	for_each_order([&](const char *) {
		for (int kind = 0; kind < 4; kind++) {
			shfl_args a;
			memcpy(a.a, argsets[kind], sizeof a.a);
			dbuf<int> out(N_WIDTHS * N_ARGS * 64);
			LAUNCH(shfl_kernel, 1, 64, 0, 0, kind, a, out.d);
			CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
			std::vector<int> h = out.get();
			int bad = 0;
			for (int w = 0; w < N_WIDTHS; w++)
				for (int k = 0; k < N_ARGS; k++)
					for (int tid = 0; tid < 64; tid++) {
						int arg = a.a[k] == -1 ? (tid % 32) * 7 : a.a[k];
						int want = shfl_ref(kind, tid, arg, widths[w]);
						int got = h[(w * N_ARGS + k) * 64 + tid];
						if (got != want && bad++ < 5)
							fprintf(stderr, "%s width %d operand %d thread %d: %d, want %d\n",
								names[kind], widths[w], arg, tid, got, want);
					}
			CHECK_INT_EQ(bad, 0);
		}
	});
}

/* 8-byte and half-precision values travel whole. */
static __global__ void shfl_types_kernel(double *od, long long *ol, __half2 *oh)
{
	const int tid = threadIdx.x;
	od[tid] = __shfl_xor_sync(0xffffffffu, tid + 0.25, 3);
	ol[tid] = __shfl_down_sync(0xffffffffu, ((long long)tid << 40) - 7, 1);
	oh[tid] = __shfl_sync(0xffffffffu, __floats2half2_rn((float)tid, -0.5f * tid), 31 - tid);
}

static void test_shuffle_types()
{
	for_each_order([&](const char *) {
		dbuf<double> od(32);
		dbuf<long long> ol(32);
		dbuf<__half2> oh(32);
		LAUNCH(shfl_types_kernel, 1, 32, 0, 0, od.d, ol.d, oh.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<double> d = od.get();
		std::vector<long long> l = ol.get();
		std::vector<__half2> h = oh.get();
		for (int t = 0; t < 32; t++) {
			CHECK(d[t] == (t ^ 3) + 0.25);
			int src = t + 1 < 32 ? t + 1 : t;
			CHECK(l[t] == ((long long)src << 40) - 7);
			CHECK(__low2float(h[t]) == (float)(31 - t));
			CHECK(__high2float(h[t]) == -0.5f * (31 - t));
		}
	});
}

/* ---- votes ---- */
#define VOTES 9
static __global__ void vote_kernel(unsigned *out)
{
	const int tid = threadIdx.x, lane = tid % 32;
	unsigned *o = out + tid * VOTES;
	const int pred = tid % 3 == 0;
	o[0] = __ballot_sync(0xffffffffu, pred);
	o[1] = __any_sync(0xffffffffu, pred);
	o[2] = __all_sync(0xffffffffu, pred);
	o[3] = __all_sync(0xffffffffu, tid < 1000);
	o[4] = __any_sync(0xffffffffu, 0);
	if (lane < 16) { /* only the low half takes part */
		o[5] = __ballot_sync(0x0000ffffu, lane % 2);
		o[6] = __all_sync(0x0000ffffu, lane < 16);
	}
	if (lane % 2 == 0) { /* only even lanes */
		o[7] = __ballot_sync(0x55555555u, lane % 4 == 0);
		o[8] = __any_sync(0x55555555u, lane == 30);
	}
}

static void test_votes()
{
	for_each_order([&](const char *) {
		dbuf<unsigned> out(64 * VOTES, 0xee);
		LAUNCH(vote_kernel, 1, 64, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<unsigned> h = out.get();
		for (int tid = 0; tid < 64; tid++) {
			const unsigned *o = &h[tid * VOTES];
			int lane = tid % 32, base = tid - lane;
			unsigned ballot = 0;
			for (int i = 0; i < 32; i++)
				ballot |= (unsigned)((base + i) % 3 == 0) << i;
			CHECK_INT_EQ(o[0], ballot);
			CHECK_INT_EQ(o[1], 1);
			CHECK_INT_EQ(o[2], 0);
			CHECK_INT_EQ(o[3], 1);
			CHECK_INT_EQ(o[4], 0);
			CHECK_INT_EQ(o[5], lane < 16 ? 0x0000aaaau : 0xeeeeeeeeu);
			CHECK_INT_EQ(o[6], lane < 16 ? 1u : 0xeeeeeeeeu);
			CHECK_INT_EQ(o[7], lane % 2 == 0 ? 0x11111111u : 0xeeeeeeeeu);
			CHECK_INT_EQ(o[8], lane % 2 == 0 ? 1u : 0xeeeeeeeeu);
		}
	});
}

/* ---- __syncwarp with disjoint partial masks ---- */
static __global__ void syncwarp_kernel(int *out)
{
	__shared__ int s[64];
	const int tid = threadIdx.x, lane = tid % 32;
	const unsigned mine = lane < 16 ? 0x0000ffffu : 0xffff0000u;
	s[tid] = tid * 3;
	__syncwarp(mine);
	const int got = s[(tid & ~15) + ((tid + 1) & 15)];
	__syncwarp(mine);
	s[tid] = got;
	__syncwarp();
	out[tid] = s[tid ^ 31];
}

static void test_syncwarp()
{
	for_each_order([&](const char *) {
		dbuf<int> out(64);
		LAUNCH(syncwarp_kernel, 1, 64, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<int> h = out.get();
		for (int tid = 0; tid < 64; tid++) {
			int src = tid ^ 31;
			CHECK_INT_EQ(h[tid], ((src & ~15) + ((src + 1) & 15)) * 3);
		}
	});
}

/* ---- __syncthreads with threads that exited before it ---- */
static __global__ void early_exit_kernel(int n_live, int *out)
{
	__shared__ int s[128];
	const int tid = threadIdx.x;
	if (tid >= n_live)
		return;
	s[tid] = tid + 100;
	__syncthreads();
	const int v = s[(tid + 1) % n_live];
	__syncthreads();
	s[tid] = v * 2;
	__syncthreads();
	out[tid] = s[(tid + n_live - 1) % n_live];
}

/* Threads exit one by one between barriers: each barrier counts the live. */
static __global__ void staggered_exit_kernel(int *out)
{
	__shared__ int s[96];
	const int tid = threadIdx.x;
	int acc = 0;
	for (int round = 0; round < 96; round++) {
		if (tid < round)
			return;
		s[tid] = round;
		__syncthreads();
		acc += s[95 - (tid - round) % (96 - round)];
		__syncthreads();
		out[tid] = acc;
	}
}

static void test_syncthreads_exited()
{
	for_each_order([&](const char *) {
		const int lives[] = { 128, 100, 33, 1 };
		for (int n_live : lives) {
			dbuf<int> out(128, 0xff);
			LAUNCH(early_exit_kernel, 2, 128, 0, 0, n_live, out.d);
			CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
			std::vector<int> h = out.get();
			for (int t = 0; t < 128; t++)
				CHECK_INT_EQ(h[t], t < n_live ? ((t % n_live) + 100) * 2 : -1);
		}
		dbuf<int> out(96, 0xff);
		LAUNCH(staggered_exit_kernel, 1, 96, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<int> h = out.get();
		for (int t = 0; t < 96; t++) {
			int acc = 0;
			for (int round = 0; round <= t; round++)
				acc += round;
			CHECK_INT_EQ(h[t], acc);
		}
	});
}

static __global__ void syncthreads_pred_kernel(int *out)
{
	const int tid = threadIdx.x;
	const int c = __syncthreads_count(tid % 5 == 0);
	const int a = __syncthreads_and(tid < 1000);
	const int a2 = __syncthreads_and(tid != 3);
	const int o = __syncthreads_or(tid == 77);
	const int o2 = __syncthreads_or(0);
	out[tid * 5 + 0] = c;
	out[tid * 5 + 1] = a;
	out[tid * 5 + 2] = a2;
	out[tid * 5 + 3] = o;
	out[tid * 5 + 4] = o2;
}

static void test_syncthreads_pred()
{
	for_each_order([&](const char *) {
		dbuf<int> out(100 * 5);
		LAUNCH(syncthreads_pred_kernel, 1, 100, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<int> h = out.get();
		for (int t = 0; t < 100; t++) {
			CHECK_INT_EQ(h[t * 5 + 0], 20);
			CHECK(h[t * 5 + 1] != 0);
			CHECK_INT_EQ(h[t * 5 + 2], 0);
			CHECK(h[t * 5 + 3] != 0);
			CHECK_INT_EQ(h[t * 5 + 4], 0);
		}
	});
}

/* ---- match, reduce, out-of-mask sources, partial warps ---- */
#define MR 10
static __global__ void match_reduce_kernel(int *out)
{
	const int lane = threadIdx.x % 32;
	int *o = out + threadIdx.x * MR;
	int pred = -1;
	o[0] = (int)__match_any_sync(0xffffffffu, lane / 4);
	o[1] = (int)__match_all_sync(0xffffffffu, 7.5f, &pred);
	o[2] = pred;
	o[3] = (int)__match_all_sync(0xffffffffu, lane, &pred);
	o[4] = pred;
	o[5] = (int)__reduce_add_sync(0xffffffffu, (unsigned)lane);
	o[6] = __reduce_min_sync(0xffffffffu, lane - 10);
	o[7] = (int)__reduce_max_sync(0xffffffffu, (unsigned)lane * 3);
	o[8] = (int)__reduce_or_sync(0xffffffffu, 1u << lane);
	/* Lanes 8-15 read lanes 16-23, which are outside the mask: undefined,
	 * which the emulator makes all-ones bits (-1) so that it shows. */
	o[9] = lane < 16 ? __shfl_down_sync(0x0000ffffu, lane, 8) : 0;
}

static void test_match_reduce()
{
	for_each_order([&](const char *) {
		dbuf<int> out(32 * MR);
		LAUNCH(match_reduce_kernel, 1, 32, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<int> h = out.get();
		for (int l = 0; l < 32; l++) {
			const int *o = &h[l * MR];
			CHECK_INT_EQ((unsigned)o[0], 0xfu << (4 * (l / 4)));
			CHECK_INT_EQ((unsigned)o[1], 0xffffffffu);
			CHECK_INT_EQ(o[2], 1);
			CHECK_INT_EQ(o[3], 0);
			CHECK_INT_EQ(o[4], 0);
			CHECK_INT_EQ(o[5], 496);
			CHECK_INT_EQ(o[6], -10);
			CHECK_INT_EQ(o[7], 93);
			CHECK_INT_EQ((unsigned)o[8], 0xffffffffu);
			CHECK_INT_EQ(o[9], l < 8 ? l + 8 : l < 16 ? -1 : 0);
		}
	});
}

/* A block of 48: warp 1 has 16 lanes; __activemask names exactly those.
 * Votes and __syncwarp with a full mask wait for the lanes that exist and
 * have not exited, as CUDA says ("all non-exited threads named in mask"). */
static __global__ void partial_warp_kernel(unsigned *out)
{
	const int tid = threadIdx.x, lane = tid % 32;
	unsigned *o = out + tid * 5;
	const unsigned m = __activemask();
	o[0] = m;
	o[1] = (unsigned)__shfl_xor_sync(m, tid, 1);
	__syncwarp();
	o[2] = __ballot_sync(0xffffffffu, 1);
	if (lane >= 8 && lane < 12) /* four lanes of each warp leave */
		return;
	o[3] = __ballot_sync(0xffffffffu, lane % 2);
	__syncwarp();
	o[4] = (unsigned)__all_sync(0xffffffffu, lane != 8);
}

static void test_partial_warp()
{
	for_each_order([&](const char *) {
		dbuf<unsigned> out(48 * 5, 0xee);
		LAUNCH(partial_warp_kernel, 1, 48, 0, 0, out.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<unsigned> h = out.get();
		for (int t = 0; t < 48; t++) {
			const unsigned *o = &h[t * 5];
			unsigned all = t < 32 ? 0xffffffffu : 0x0000ffffu;
			bool left = t % 32 >= 8 && t % 32 < 12;
			CHECK_INT_EQ(o[0], all);
			CHECK_INT_EQ(o[1], (unsigned)(t ^ 1));
			CHECK_INT_EQ(o[2], all);
			CHECK_INT_EQ(o[3], left ? 0xeeeeeeeeu : all & 0xaaaaaaaau & ~0x00000f00u);
			CHECK_INT_EQ(o[4], left ? 0xeeeeeeeeu : 1u);
		}
	});
}

/* ---- atomics ---- */
static __global__ void atomics_kernel(int *gi, unsigned *gu, float *gf, unsigned long long *gull,
	int *won)
{
	__shared__ int smax;
	const int tid = threadIdx.x;
	if (tid == 0)
		smax = INT_MIN;
	__syncthreads();
	atomicAdd(&gi[0], 1);
	atomicSub(&gi[1], 2);
	atomicMax(&gi[2], tid * 7 % 50);
	atomicMin(&gi[3], 100 - tid);
	atomicAnd(&gu[0], ~(1u << (tid % 32)));
	atomicOr(&gu[1], 1u << (tid % 32));
	atomicXor(&gu[2], (unsigned)tid);
	atomicInc(&gu[3], 9);
	atomicAdd(gf, 0.5f);
	atomicAdd(gull, 1ull << 40);
	atomicMax(&smax, tid);
	won[tid] = atomicCAS(&gi[4], 0, tid + 1) == 0;
	__syncthreads();
	if (tid == 0)
		gi[5] = smax;
}

static void test_atomics()
{
	for_each_order([&](const char *order) {
		dbuf<int> gi(6);
		dbuf<unsigned> gu(4);
		dbuf<float> gf(1);
		dbuf<unsigned long long> gull(1);
		dbuf<int> won(128);
		std::vector<int> i0 = { 0, 0, INT_MIN, INT_MAX, 0, 0 };
		gi.put(i0);
		gu.put({ 0xffffffffu, 0, 0, 0 });
		LAUNCH(atomics_kernel, 1, 128, 0, 0, gi.d, gu.d, gf.d, gull.d, won.d);
		CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
		std::vector<int> i = gi.get();
		std::vector<unsigned> u = gu.get();
		CHECK_INT_EQ(i[0], 128);
		CHECK_INT_EQ(i[1], -256);
		CHECK_INT_EQ(i[2], 49);
		CHECK_INT_EQ(i[3], -27);
		CHECK_INT_EQ(i[5], 127);
		CHECK_INT_EQ(u[0], 0);
		CHECK_INT_EQ(u[1], 0xffffffffu);
		CHECK_INT_EQ(u[2], 0);
		CHECK_INT_EQ(u[3], 128 % 10);
		CHECK(gf.get()[0] == 64.0f);
		CHECK(gull.get()[0] == 128ull << 40);
		std::vector<int> w = won.get();
		int winners = 0, winner = -1;
		for (int t = 0; t < 128; t++)
			if (w[t]) {
				winners++;
				winner = t;
			}
		CHECK_INT_EQ(winners, 1);
		CHECK_INT_EQ(i[4], winner + 1);
		/* Threads start in order: the first to run wins. */
		if (!strcmp(order, "forward"))
			CHECK_INT_EQ(winner, 0);
		if (!strcmp(order, "reverse"))
			CHECK_INT_EQ(winner, 127);
	});
}

/* ---- built-in variables and the orders ---- */
static __global__ void builtins_kernel(int *out)
{
	const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
	const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
	const int nt = blockDim.x * blockDim.y * blockDim.z;
	int *o = out + (b * nt + t) * 5;
	o[0] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
	o[1] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
	o[2] = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
	o[3] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
	o[4] = warpSize;
}

static void test_builtins()
{
	const int gx = 3, gy = 2, gz = 2, bx = 4, by = 3, bz = 2, nt = bx * by * bz;
	dbuf<int> out(gx * gy * gz * nt * 5);
	LAUNCH(builtins_kernel, dim3(gx, gy, gz), dim3(bx, by, bz), 0, 0, out.d);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	std::vector<int> h = out.get();
	for (int z = 0; z < gz; z++)
		for (int y = 0; y < gy; y++)
			for (int x = 0; x < gx; x++)
				for (int t = 0; t < nt; t++) {
					const int *o = &h[((x + gx * (y + gy * z)) * nt + t) * 5];
					CHECK_INT_EQ(o[0], t % bx | (t / bx % by) << 8 | (t / (bx * by)) << 16);
					CHECK_INT_EQ(o[1], x | y << 8 | z << 16);
					CHECK_INT_EQ(o[2], bx | by << 8 | bz << 16);
					CHECK_INT_EQ(o[3], gx | gy << 8 | gz << 16);
					CHECK_INT_EQ(o[4], 32);
				}
}

/* The order threads reach a barrier, and leave it. */
static __global__ void order_kernel(int *pos, int *counter)
{
	pos[threadIdx.x] = atomicAdd(counter, 1);
	__syncthreads();
	pos[blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

static std::vector<int> run_order(enum cuda_emu_order o, unsigned long long seed, int n)
{
	cuda_emu_set_order(o, seed);
	dbuf<int> pos(2 * n), counter(1);
	LAUNCH(order_kernel, 1, n, 0, 0, pos.d, counter.d);
	CHECK_INT_EQ(cudaGetLastError(), cudaSuccess);
	cuda_emu_set_order(CUDA_EMU_ORDER_FORWARD, 0);
	return pos.get();
}

static void test_orders()
{
	const int n = 200;
	std::vector<int> f = run_order(CUDA_EMU_ORDER_FORWARD, 0, n);
	std::vector<int> r = run_order(CUDA_EMU_ORDER_REVERSE, 0, n);
	for (int t = 0; t < n; t++) {
		CHECK_INT_EQ(f[t], t);
		CHECK_INT_EQ(f[n + t], n + t);
		CHECK_INT_EQ(r[t], n - 1 - t);
		CHECK_INT_EQ(r[n + t], 2 * n - 1 - t);
	}
	std::vector<int> a = run_order(CUDA_EMU_ORDER_RANDOM, 5, n);
	std::vector<int> b = run_order(CUDA_EMU_ORDER_RANDOM, 5, n);
	std::vector<int> c = run_order(CUDA_EMU_ORDER_RANDOM, 6, n);
	CHECK(a == b); /* a seed replays */
	CHECK(a != c);
	std::vector<int> first(a.begin(), a.begin() + n), second(a.begin() + n, a.end());
	std::sort(first.begin(), first.end());
	std::sort(second.begin(), second.end());
	for (int t = 0; t < n; t++) {
		CHECK_INT_EQ(first[t], t); /* a permutation; every arrival before every departure */
		CHECK_INT_EQ(second[t], n + t);
	}
	CHECK(!std::equal(a.begin(), a.begin() + n, f.begin()));
	unsigned long long seed = 0;
	cuda_emu_set_order(CUDA_EMU_ORDER_RANDOM, 99);
	CHECK_INT_EQ(cuda_emu_get_order(&seed), CUDA_EMU_ORDER_RANDOM);
	CHECK_INT_EQ(seed, 99);
	cuda_emu_set_order(CUDA_EMU_ORDER_FORWARD, 0);
}

/* ---- intrinsics without a launch ---- */
static void test_intrinsics()
{
	CHECK_INT_EQ(__dp4a(0x01020304, 0x05060708, 10), 10 + 1 * 5 + 2 * 6 + 3 * 7 + 4 * 8);
	CHECK_INT_EQ(__dp4a((int)0xff80017f, (int)0x02ff7f80, 0), -1 * 2 + -128 * -1 + 1 * 127 + 127 * -128);
	CHECK_INT_EQ(__dp4a(0xff80017fu, 0x02ff7f80u, 1u), 1u + 255 * 2 + 128 * 255 + 1 * 127 + 127 * 128);
	CHECK_INT_EQ(__popc(0xf0f0u), 8);
	CHECK_INT_EQ(__clz(1), 31);
	CHECK_INT_EQ(__clz(0), 32);
	CHECK_INT_EQ(__ffs(0x10), 5);
	CHECK_INT_EQ(__brev(1u), 0x80000000u);
	CHECK_INT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0x5140u), 0x55114400u);
	CHECK_INT_EQ(__umulhi(0x80000000u, 4u), 2);
	CHECK_INT_EQ(__funnelshift_l(0x80000000u, 1u, 1), 3);
	CHECK_INT_EQ(__float_as_int(1.0f), 0x3f800000);
	CHECK(__int_as_float(0x40000000) == 2.0f);
	CHECK(rsqrtf(4.0f) == 0.5f);
	CHECK(__fdividef(1.0f, 4.0f) == 0.25f);
	CHECK(fabsf(__expf(1.0f) - 2.7182817f) < 1e-6f);
	CHECK_INT_EQ(max(3, 7), 7);
	CHECK_INT_EQ(min(3u, 7u), 3);
	CHECK(max(1.5f, -2.0f) == 1.5f);
	CHECK_INT_EQ(__mul24(-3, 5), -15);
}

int main(void)
{
	test_intrinsics();
	test_shuffles();
	test_shuffle_types();
	test_votes();
	test_syncwarp();
	test_syncthreads_exited();
	test_syncthreads_pred();
	test_match_reduce();
	test_partial_warp();
	test_atomics();
	test_builtins();
	test_orders();
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
