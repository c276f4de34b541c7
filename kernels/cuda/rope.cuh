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
 * place: adjacent pairs, or with NEOX the two halves. */
static __device__ __forceinline__ void rope_rotate(float *row, const float2 *cs, int n_head, int head_dim,
	int n_pair, int neox)
{
	const int pairs = n_head * n_pair;
	for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
		const int h = p / n_pair, i = p % n_pair;
		float *v = row + (int64_t)h * head_dim;
		const int a = neox ? i : 2 * i, b = neox ? i + n_pair : 2 * i + 1;
		const float x0 = v[a], x1 = v[b], c = cs[i].x, s = cs[i].y;
		v[a] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
		v[b] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
	}
}

#endif
