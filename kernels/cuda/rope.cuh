/* rope.cuh - RoPE's device steps, shared by rows.cu's rope kernel and
 * attention.cu's rope + kv_store kernel: the same operations in both, so the
 * same bits.  Threads of a block stride by blockDim.x. */
#ifndef LLMD_CUDA_ROPE_CUH
#define LLMD_CUDA_ROPE_CUH

#define ROPE_MAX_ROT 1024 /* as the CPU backend: bounds the table in shared memory */

/* A struct bk_rope as the kernels take it (by value): THETA_SCALE from the
 * host's powf, as the CPU computes it; FF a device pointer. */
struct rope_angles {
	float theta_scale;  /* freq_base^(-2 / n_rot) */
	float freq_scale, ext, mscale, c0, c1;
	const float *ff;    /* (n_rot / 2) device copy of freq_factors, or NULL */
	int scaled;         /* bk_rope_scaled() */
};

/* RP's angles for the kernels, FF its factors' device copy (or NULL). */
static inline rope_angles rope_angles_of(const struct bk_rope *rp, const float *ff)
{
	rope_angles ra;
	ra.theta_scale = rp->n_rot ? powf(rp->freq_base, -2.0f / (float)rp->n_rot) : 1.0f;
	ra.freq_scale = rp->freq_scale;
	ra.ext = rp->ext_factor;
	ra.mscale = rp->mscale;
	ra.c0 = rp->corr_dims[0];
	ra.c1 = rp->corr_dims[1];
	ra.ff = ff;
	ra.scaled = bk_rope_scaled(rp);
	return ra;
}

/* CS[i] = cos/sin of pair i's angle at position P for i < N_PAIR
 * (struct bk_rope): P * theta_scale^i by i float multiplications in order,
 * exactly as the CPU's running product, then its factor and scaling with
 * each of the CPU's roundings.  The caller syncs the block before reading
 * CS. */
static __device__ __forceinline__ void rope_table(float2 *cs, int32_t p, int n_pair, const rope_angles &ra)
{
	for (int i = threadIdx.x; i < n_pair; i += blockDim.x) {
		float theta = (float)p;
		for (int k = 0; k < i; k++)
			theta = __fmul_rn(theta, ra.theta_scale);
		if (!ra.scaled) {
			cs[i] = make_float2(cosf(theta), sinf(theta));
			continue;
		}
		const float te = ra.ff ? __fdiv_rn(theta, ra.ff[i]) : theta;
		float t = __fmul_rn(ra.freq_scale, te);
		if (ra.ext != 0.0f) {
			const float w = __fsub_rn(ra.c1, ra.c0);
			const float y = __fdiv_rn(__fsub_rn((float)i, ra.c0), w > 0.001f ? w : 0.001f);
			const float mix = __fmul_rn(__fsub_rn(1.0f, y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y), ra.ext);
			t = __fadd_rn(__fmul_rn(t, __fsub_rn(1.0f, mix)), __fmul_rn(te, mix));
		}
		cs[i] = make_float2(__fmul_rn(cosf(t), ra.mscale), __fmul_rn(sinf(t), ra.mscale));
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
