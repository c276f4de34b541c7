/* rope.cuh - RoPE's device steps, shared by rows.cu's rope kernel and
 * attention.cu's rope + kv_store kernel: the same operations in both, so the
 * same bits.  Threads of a block stride by blockDim.x. */
#ifndef LLMD_CUDA_ROPE_CUH
#define LLMD_CUDA_ROPE_CUH

#define ROPE_MAX_ROT 1024 /* as the CPU backend: bounds the table in shared memory */

/* CS[i] = cos/sin of P * theta_scale^i for i < N_PAIR, the power taken by
 * i float multiplications in order, exactly as the CPU's running product
 * (THETA_SCALE itself comes from the host's powf, the CPU's).  The caller
 * syncs the block before reading CS. */
static __device__ __forceinline__ void rope_table(float2 *cs, int32_t p, int n_pair, float theta_scale)
{
	for (int i = threadIdx.x; i < n_pair; i += blockDim.x) {
		float theta = (float)p;
		for (int k = 0; k < i; k++)
			theta = __fmul_rn(theta, theta_scale);
		cs[i] = make_float2(cosf(theta), sinf(theta));
	}
}

/* Rotates the first 2 * N_PAIR dims of each of ROW's N_HEAD heads in
 * place: adjacent pairs, or with NEOX the two halves.  A thread loads
 * ROPE_BATCH pairs before it stores any (each pair is one thread's: no
 * load waits for a store). */
#define ROPE_BATCH 4
static __device__ __forceinline__ void rope_rotate(float *row, const float2 *cs, int n_head, int head_dim,
	int n_pair, int neox)
{
	const int pairs = n_head * n_pair;
	for (int p0 = threadIdx.x; p0 < pairs; p0 += ROPE_BATCH * blockDim.x) {
		float *va[ROPE_BATCH], *vb[ROPE_BATCH];
		float x0[ROPE_BATCH], x1[ROPE_BATCH];
		int ci[ROPE_BATCH];
		for (int j = 0; j < ROPE_BATCH; j++) {
			const int p = p0 + j * (int)blockDim.x;
			if (p >= pairs)
				continue;
			const int h = p / n_pair, i = p % n_pair;
			float *v = row + (int64_t)h * head_dim;
			va[j] = v + (neox ? i : 2 * i);
			vb[j] = v + (neox ? i + n_pair : 2 * i + 1);
			ci[j] = i;
			x0[j] = *va[j];
			x1[j] = *vb[j];
		}
		for (int j = 0; j < ROPE_BATCH; j++) {
			if (p0 + j * (int)blockDim.x >= pairs)
				continue;
			const float c = cs[ci[j]].x, s = cs[ci[j]].y;
			*va[j] = __fmul_rn(x0[j], c) - __fmul_rn(x1[j], s);
			*vb[j] = __fmul_rn(x0[j], s) + __fmul_rn(x1[j], c);
		}
	}
}

#endif
