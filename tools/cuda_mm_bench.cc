/* cuda_mm_bench.cc - the decode matmuls alone on a GPU: each kernel
 * variant (matmul.cu's knobs) on an 8B Llama's Q4_K_M shapes (and
 * SmolLM2's Q4_1 ones), timed over back-to-back launches, against how
 * fast the device streams the same bytes at all, from HBM (copies of the
 * weights in turn, 4 times the L2 cache in all).
 *
 * Built with nvcc from the same source as the backend (matmul.cu included
 * here, as the kernel tests do);
 * .ci/gpu-bundle ships it, .ci/gpu-run runs it.  For each shape: random
 * weights of the type (sane scales), one activation row per T quantized
 * once into the scratch, then for each variant 3 launches to warm up and
 * REPS (default 200) timed with events; the microseconds per launch, the
 * weight bytes it streams per second, and whether its outputs have the
 * bits of the first variant's (they must: every variant reproduces the
 * CPU's arithmetic).  The last variant launches with programmatic
 * dependent launch (sm_90 and up), as a decode step does.  The
 * reference, "stream", is a kernel that only reads the weights (16 bytes a
 * load, a grid of the device's resident warps).
 *
 * Usage: cuda_mm_bench [REPS]
 * Exit status 77 when there is no device, 1 when a variant's bits differ.
 */
extern "C" {
#include "backend.h"
#include "quant.h"
}

#include "matmul.cu"
#include "matmul_dp4a.cu"
#include "matmul_mma.cu"
#include "matmul_wide.cu"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define BENCH_NAME "cuda_mm_bench"
#include "cuda_bench.h"
#include "q_random.h"

/* ---- the reference: read every byte once ---- */

static __global__ void stream_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink)
{
	unsigned v = 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		const uint4 q = __ldg(&p[i]);
		v ^= q.x ^ q.y ^ q.z ^ q.w;
	}
	if (v == 0x9e3779b9u) /* never, as far as the compiler knows */
		*sink = v;
}

/* One setting of matmul.cu's knobs (struct cuda_tuning, backend.h, says
 * what each value means). */
struct variant {
	const char *name;
	int split_max;   /* split-K's most warps on a run of 16 rows */
	int split_warps; /* its most warps in all (0: one wave) */
	int wide;        /* wide kernels' rounds (-1: the default, 0: off) */
	int mma_min_t;   /* tensor cores from this T (0: the default) */
	int pdl;         /* launches overlap their predecessor's tail (sm_90+) */
};

static const variant variants[] = {
	{ "default", 16, 0, -1, 0, 0 },
	{ "mma", 16, 0, 0, 1, 0 },
	{ "mma-no-split", 1, 0, 0, 1, 0 },
	{ "mma-w1024", 16, 1024, 0, 1, 0 },
	{ "mma-w2048", 16, 2048, 0, 1, 0 },
	{ "mma-w8192", 16, 8192, 0, 1, 0 },
	{ "wide1", 16, 0, 1, 1, 0 },
	{ "wide2", 16, 0, 2, 1, 0 },
	{ "wide4", 16, 0, 4, 1, 0 },
	{ "dp4a", 16, 0, 0, 8, 0 },
	/* the default as a decode step runs it, each launch overlapping the
	 * one before (programmatic dependent launch) */
	{ "default-pdl", 16, 0, -1, 0, 1 },
};

/* V as the tuning *T and the launch *LC on STREAM (PDL where SM90). */
static void set_variant(const variant &v, int sm90, cudaStream_t stream, struct cuda_tuning *t,
	struct cuda_launch *lc)
{
	cuda_tuning_defaults(t);
	t->mm_split = v.split_max;
	t->mm_warps = v.split_warps;
	t->mm_wide = v.wide;
	t->mma_min_t = v.mma_min_t;
	t->pdl = v.pdl;
	lc->stream = stream;
	lc->tuning = t;
	lc->pdl = v.pdl && sm90;
	lc->sms = 0;
}

/* A matmul group of a decode step: NW weights of TYPE sharing their input. */
struct shape {
	const char *name;
	uint32_t type;
	int n_in;
	int n_out[CUDA_MM_GROUP]; /* each weight's rows */
	int nw;    /* weights in the group */
	int max_t; /* timed at T = 1, 2, 4, 8 up to this */
};

static const shape shapes[] = {
	{ "8b gate+up", QT_Q4_K, 4096, { 14336, 14336 }, 2, 8 },
	{ "8b down q4k", QT_Q4_K, 14336, { 4096 }, 1, 1 },
	{ "8b down q6k", QT_Q6_K, 14336, { 4096 }, 1, 8 },
	{ "8b wo", QT_Q4_K, 4096, { 4096 }, 1, 1 },
	{ "8b qkv", QT_Q4_K, 4096, { 4096, 1024, 1024 }, 3, 1 },
	{ "8b qk", QT_Q4_K, 4096, { 4096, 1024 }, 2, 1 },
	{ "8b wv q6k", QT_Q6_K, 4096, { 1024 }, 1, 1 },
	{ "8b output", QT_Q6_K, 4096, { 49152 }, 1, 1 },
	{ "smol gate+up", QT_Q4_1, 576, { 1536, 1536 }, 2, 1 },
	{ "smol down", QT_Q4_1, 1536, { 576 }, 1, 1 },
};

int main(int argc, char **argv)
{
	const int reps = argc > 1 ? atoi(argv[1]) : 200;
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		fprintf(stderr, "cuda_mm_bench: no CUDA device\n");
		return 77;
	}
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("%s, %d SMs; %d launches a variant (T = 1 unless given)\n", prop.name, prop.multiProcessorCount,
	       reps);
	printf("%-14s %-4s %-12s %9s %8s %s\n", "shape", "T", "variant", "us", "GB/s", "bits");
	const int sm90 = prop.major >= 9;
	cudaStream_t pst; /* the PDL variants' stream */
	CK(cudaStreamCreateWithFlags(&pst, cudaStreamNonBlocking));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	unsigned *sink;
	CK(cudaMalloc(&sink, sizeof(unsigned)));
	int differ = 0;

	for (const shape &s : shapes) {
		for (int T : { 1, 2, 4, 8 }) {
			if (T > s.max_t)
				continue;
			/* COPIES of the group's weights, together 4 times the L2
			 * cache at least, taken in turn: every launch reads its
			 * weights from HBM, as a decode step's layers do */
			size_t bytes = 0, outs = 0;
			for (int k = 0; k < s.nw; k++) {
				bytes += qtype_row_bytes(s.type, s.n_in) * s.n_out[k];
				outs += (size_t)T * s.n_out[k];
			}
			const int copies = (int)((4 * (size_t)prop.l2CacheSize + bytes - 1) / bytes) + 1;
			std::vector<const bk_weight *> wp((size_t)copies * s.nw);
			std::vector<bk_weight> wt((size_t)copies * s.nw);
			std::vector<uint8_t *> dw((size_t)copies * s.nw);
			float *dout[CUDA_MM_GROUP];
			for (int k = 0; k < s.nw; k++) {
				size_t rb;
				std::vector<uint8_t> hw = random_weights(s.type, s.n_in, s.n_out[k], &rb);
				for (int c = 0; c < copies; c++) {
					const size_t i = (size_t)c * s.nw + k;
					CK(cudaMalloc(&dw[i], hw.size()));
					CK(cudaMemcpy(dw[i], hw.data(), hw.size(), cudaMemcpyHostToDevice));
					wt[i] = { s.type, s.n_in, s.n_out[k], dw[i], rb };
					wp[i] = &wt[i];
				}
				CK(cudaMalloc(&dout[k], sizeof(float) * T * s.n_out[k]));
			}
			std::vector<float> hx((size_t)T * s.n_in);
			for (float &v : hx)
				v = uniform(-2.0f, 2.0f);
			float *dx;
			uint8_t *scratch;
			CK(cudaMalloc(&dx, hx.size() * sizeof(float)));
			CK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
			CK(cudaMalloc(&scratch, cuda_matmul_scratch_bytes(wp[0], T)));
			/* the rows quantized once, with the defaults (variants[0]'s) */
			if (cuda_matmul_q_group(wp.data(), s.nw, dx, T, dout, scratch, NULL)) {
				fprintf(stderr, "cuda_mm_bench: %s: the matmul refused\n", s.name);
				return 1;
			}
			CK(cudaDeviceSynchronize());

			/* the reference: the group's weights only read, a launch
			 * per weight, copies in turn */
			{
				const int grid = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / 256);
				float ms = 0;
				for (int pass = 0; pass < 2; pass++) {
					CK(cudaEventRecord(e0));
					for (int i = 0; i < reps; i++)
						for (int k = 0; k < s.nw; k++) {
							const bk_weight &w = wt[(size_t)(i % copies) * s.nw + k];
							LAUNCH(stream_kernel, grid, 256, 0, 0, (const uint4 *)w.data,
							       w.row_bytes * w.n_out / 16, sink);
						}
					CK(cudaEventRecord(e1));
					CK(cudaEventSynchronize(e1));
					CK(cudaEventElapsedTime(&ms, e0, e1));
				}
				const double us = 1e3 * ms / reps;
				printf("%-14s %-4d %-12s %9.2f %8.0f\n", s.name, T, "stream", us, bytes / (us * 1e3));
			}

			std::vector<float> ref;
			for (const variant &v : variants) {
				if (v.wide > 0 && ((s.type != QT_Q4_K && s.type != QT_Q6_K) || T > 1))
					continue;
				cudaStream_t vs = v.pdl ? pst : (cudaStream_t)NULL;
				struct cuda_tuning tun;
				struct cuda_launch lc;
				set_variant(v, sm90, vs, &tun, &lc);
				for (int i = 0; i < 3; i++)
					if (cuda_matmul_q_group(&wp[(size_t)(i % copies) * s.nw], s.nw, NULL, T, dout, scratch,
								&lc)) {
						fprintf(stderr, "cuda_mm_bench: %s %s: the matmul refused\n", s.name, v.name);
						return 1;
					}
				CK(cudaDeviceSynchronize());
				float ms = 0;
				CK(cudaEventRecord(e0, vs));
				for (int i = 0; i < reps; i++)
					cuda_matmul_q_group(&wp[(size_t)(i % copies) * s.nw], s.nw, NULL, T, dout, scratch,
							    &lc);
				CK(cudaEventRecord(e1, vs));
				CK(cudaEventSynchronize(e1));
				CK(cudaEventElapsedTime(&ms, e0, e1));
				CK(cudaGetLastError());
				std::vector<float> got;
				for (int k = 0; k < s.nw; k++) {
					std::vector<float> o((size_t)T * s.n_out[k]);
					CK(cudaMemcpy(o.data(), dout[k], o.size() * sizeof(float), cudaMemcpyDeviceToHost));
					got.insert(got.end(), o.begin(), o.end());
				}
				const char *bits = "first";
				if (ref.empty()) {
					ref = got;
				} else {
					bits = memcmp(ref.data(), got.data(), outs * sizeof(float)) ? "DIFFER" : "same";
					differ += bits[0] == 'D';
				}
				const double us = 1e3 * ms / reps;
				printf("%-14s %-4d %-12s %9.2f %8.0f %s\n", s.name, T, v.name, us, bytes / (us * 1e3), bits);
			}
			fflush(stdout);
			for (uint8_t *p : dw)
				CK(cudaFree(p));
			for (int k = 0; k < s.nw; k++)
				CK(cudaFree(dout[k]));
			CK(cudaFree(dx));
			CK(cudaFree(scratch));
		}
	}
	CK(cudaStreamDestroy(pst));
	CK(cudaFree(sink));
	if (differ)
		printf("cuda_mm_bench: %d variants' bits differ from the default's\n", differ);
	return differ ? 1 : 0;
}
