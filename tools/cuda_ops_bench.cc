/* cuda_ops_bench.cc - a decode step's other launches alone on a GPU: the
 * fused norms, RoPE with the KV store, attention (at several context
 * lengths, with either pair of kernels, attn_split_kernel and its
 * reduction or the lanes versions, each kernel also alone) and SwiGLU, each
 * on an 8B Llama's shapes and SmolLM2's, against an empty kernel: what a
 * launch costs where it moves almost nothing.
 *
 * A decode step replays a CUDA graph, so each op is timed that way: REPS
 * (default 200) launches of it captured into one graph on a stream (with
 * programmatic dependent launch where cuda_backend_new turns it on,
 * compute capability 9.0 and up), the graph replayed 3 times, the
 * microseconds per launch from events.  Built with nvcc from the same
 * source as the backend (rows.cu and attention.cu included here, as the
 * kernel tests do); .ci/gpu-bundle ships it, .ci/gpu-run runs it.
 *
 * Usage: cuda_ops_bench [REPS]
 * Exit status 77 when there is no device, 1 on a failed launch or call.
 */
extern "C" {
#include "backend.h"
#include "quant.h"
}

#include "attention.cu"
#include "rows.cu"

#include <stdio.h>
#include <stdlib.h>

#include <functional>
#include <vector>

#define BENCH_NAME "cuda_ops_bench"
#include "cuda_bench.h"
#include "q_random.h" /* uniform() */

static __global__ void empty_kernel(int *never)
{
	grid_dep_wait();
	if (never && threadIdx.x == 1024) /* no block has that thread */
		*never = 1;
}

template <typename T> static T *dev(size_t n)
{
	T *p;
	CK(cudaMalloc(&p, n * sizeof(T)));
	CK(cudaMemset(p, 0, n * sizeof(T)));
	return p;
}

static float *dev_random(size_t n, float lo, float hi)
{
	std::vector<float> h(n);
	for (float &v : h)
		v = uniform(lo, hi);
	float *p = dev<float>(n);
	CK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
	return p;
}

/* Microseconds per launch of LAUNCH (0 when it launched), REPS of them in
 * one graph replayed 3 times after a warm-up replay. */
static double time_graph(cudaStream_t st, int reps, const std::function<int()> &launch)
{
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
	for (int i = 0; i < reps; i++)
		if (launch()) {
			fprintf(stderr, "cuda_ops_bench: a launch refused its arguments\n");
			exit(1);
		}
	CK(cudaStreamEndCapture(st, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	CK(cudaGraphLaunch(ge, st));
	CK(cudaEventRecord(e0, st));
	for (int i = 0; i < 3; i++)
		CK(cudaGraphLaunch(ge, st));
	CK(cudaEventRecord(e1, st));
	CK(cudaEventSynchronize(e1));
	float ms = 0;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	CK(cudaGraphExecDestroy(ge));
	CK(cudaGraphDestroy(g));
	return 1e3 * ms / (3.0 * reps);
}

struct model {
	const char *name;
	int n_embd, n_head, n_head_kv, head_dim, n_ff;
	uint32_t vec; /* what its matmuls read: Q8_K for the K-quants, Q8_1 for Q4_1 */
	float rope_base;
};

static const model models[] = {
	{ "8b", 4096, 32, 8, 128, 14336, QT_Q8_K, 500000.0f },
	{ "smol", 576, 9, 3, 64, 1536, QT_Q8_1, 100000.0f },
};

#define BT 16          /* the engine's KV block */
#define MAX_CTX 4096

int main(int argc, char **argv)
{
	const int reps = argc > 1 ? atoi(argv[1]) : 200;
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		fprintf(stderr, "cuda_ops_bench: no CUDA device\n");
		return 77;
	}
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	printf("%s, %d SMs; %d launches of each op in a graph%s; T = 1\n", prop.name,
	       prop.multiProcessorCount, reps, prop.major >= 9 ? ", programmatic dependent launch" : "");
	printf("%-6s %-28s %9s\n", "model", "op", "us");
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	/* the backend's launches: the default tuning, PDL where the device has it */
	struct cuda_tuning tun;
	cuda_tuning_defaults(&tun);
	const struct cuda_launch lc = { st, &tun, prop.major >= 9, prop.multiProcessorCount };

	printf("%-6s %-28s %9.2f\n", "-", "empty kernel", time_graph(st, reps, [&] {
		LAUNCH_PDL(lc.pdl, empty_kernel, 1, 32, 0, st, (int *)NULL);
		return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
	}));

	for (const model &m : models) {
		const int n = m.n_embd, kv_dim = m.n_head_kv * m.head_dim, qn = m.n_head * m.head_dim;
		const size_t xq_stride = (q8_row_bytes(m.vec, m.n_ff > n ? m.n_ff : n) + 15) / 16 * 16;
		uint8_t *xq = dev<uint8_t>(xq_stride);
		const float eps = 1e-5f;

		/* the residual add and the norm before a matmul */
		float *x = dev_random(n, -1, 1), *y = dev_random(n, -1e-3f, 1e-3f), *g = dev_random(n, 0.5f, 1.5f);
		float *out = dev<float>(n);
		printf("%-6s %-28s %9.2f\n", m.name, "add_rmsnorm_q8", time_graph(st, reps, [&] {
			return cuda_add_rmsnorm_q8(x, y, g, 1, n, eps, out, m.vec, xq, xq_stride, &lc);
		}));

		/* one layer's pool (F16, the default), blocks in order */
		struct bk_kv kv;
		kv.type = QT_F16;
		kv.n_blocks = MAX_CTX / BT;
		kv.block_tokens = BT;
		kv.n_layer = 1;
		kv.kv_dim = kv_dim;
		kv.row_bytes = qtype_row_bytes(QT_F16, kv_dim);
		kv.block_bytes = 2 * BT * kv.row_bytes;
		{
			std::vector<uint16_t> h(kv.n_blocks * kv.block_bytes / 2);
			for (uint16_t &v : h)
				v = __half_as_ushort(__float2half_rn(uniform(-1, 1)));
			uint16_t *p = dev<uint16_t>(h.size());
			CK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
			kv.base = p;
		}
		const int32_t table_stride = MAX_CTX / BT;
		std::vector<int32_t> ht(table_stride);
		for (int32_t i = 0; i < table_stride; i++)
			ht[i] = i;
		int32_t *tables = dev<int32_t>(table_stride), *pos = dev<int32_t>(1);
		CK(cudaMemcpy(tables, ht.data(), ht.size() * 4, cudaMemcpyHostToDevice));
		const struct bk_attn a = { m.n_head, m.n_head_kv, m.head_dim, 1.0f / sqrtf((float)m.head_dim), 0 };
		float *q = dev_random(qn, -1, 1), *k = dev_random(kv_dim, -1, 1), *v = dev_random(kv_dim, -1, 1);
		float *att = dev<float>(qn);
		const size_t sb = cuda_attention_scratch_bytes(&kv, &a, 1, table_stride, &tun);
		uint8_t *scratch = dev<uint8_t>(sb);

		for (int ctx : { 64, 512, 4096 }) {
			const int32_t p = ctx - 1;
			CK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
			char what[64];
			snprintf(what, sizeof what, "rope_kv_store pos %d", p);
			printf("%-6s %-28s %9.2f\n", m.name, what, time_graph(st, reps, [&] {
				const struct bk_rope rp = bk_rope_plain(m.head_dim, BK_ROPE_NORMAL, m.rope_base);
				return cuda_rope_kv_store(&kv, 0, 1, pos, tables, table_stride, &a, &rp, q, k, v, &lc);
			}));
			/* attention, then each of its two kernels alone, as attn_run
			 * launches them */
			attn_shape sh;
			if (attn_plan(&kv, &a, table_stride, tun.attn_split, &sh)) {
				fprintf(stderr, "cuda_ops_bench: attention refused the shapes\n");
				return 1;
			}
			const kv_view view = kv_view_of(&kv, 0);
			const size_t smem = attn_smem_floats(1, sh.group, sh.head_dim, sh.tile) * sizeof(float);
			const dim3 grid((unsigned)sh.n_splits, (unsigned)sh.n_head_kv, 1u);
			const dim3 red_grid((unsigned)((qn + Q8K_THREADS - 1) / Q8K_THREADS), 1u);
			float *partial = (float *)scratch;
			snprintf(what, sizeof what, "attention_q8 lanes ctx %d", ctx);
			printf("%-6s %-28s %9.2f\n", m.name, what, time_graph(st, reps, [&] {
				return cuda_attention_q8(&kv, 0, 1, pos, tables, table_stride, &a, q, att, NULL,
							 scratch, m.vec, xq, xq_stride, &lc);
			}));
			printf("%-6s %-28s %9.2f\n", m.name, "  its split kernel", time_graph(st, reps, [&] {
				LAUNCH_PDL(lc.pdl, attn_split_lanes_kernel, grid, ATTN_LANES_THREADS, smem, st, view, pos,
				       tables, table_stride, sh, 0, (const int32_t *)NULL, 0, q, partial);
				return launched();
			}));
			printf("%-6s %-28s %9.2f\n", m.name, "  its reduction", time_graph(st, reps, [&] {
				LAUNCH_PDL(lc.pdl, attn_reduce_lanes_kernel, red_grid, Q8K_THREADS, attn_reduce_smem(sh), st,
				       pos, sh, 0, (const float *)partial, att, m.vec, xq, xq_stride);
				return launched();
			}));
		}

		float *gg = dev_random(m.n_ff, -4, 4), *u = dev_random(m.n_ff, -1, 1), *h = dev<float>(m.n_ff);
		printf("%-6s %-28s %9.2f\n", m.name, "swiglu_q8", time_graph(st, reps, [&] {
			return cuda_swiglu_q8(gg, u, 1, m.n_ff, h, m.vec, xq, xq_stride, &lc);
		}));
	}
	CK(cudaStreamSynchronize(st));
	return 0;
}
