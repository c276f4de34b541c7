/* emu_test_cublas.cc - the emulator's cublasGemmEx against a naive loop in
 * double, for every transpose and supported type combination, plus the
 * argument checks and status codes cuBLAS documents, and capture.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <vector>

#include "emu_testutil.h"

static uint64_t rng = 0x1234567;
static float frand()
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((rng >> 40) & 0xffff) / 32768.0f - 1.0f;
}

/* A column-major ROWS x COLS matrix with leading dimension LD, in TYPE, as
 * host bytes and as the exact values they hold. */
struct mat {
	int rows, cols, ld;
	cudaDataType type;
	std::vector<unsigned char> bytes;
	std::vector<double> val;
	mat(int r, int c, int ld_, cudaDataType t) : rows(r), cols(c), ld(ld_), type(t)
	{
		size_t es = t == CUDA_R_32F ? 4 : 2;
		bytes.assign((size_t)ld * c * es, 0xff);
		val.assign((size_t)ld * c, 0.0);
		for (int j = 0; j < c; j++)
			for (int i = 0; i < r; i++)
				set(i, j, frand());
	}
	void set(int i, int j, float f)
	{
		size_t k = (size_t)j * ld + i;
		if (type == CUDA_R_32F) {
			memcpy(&bytes[k * 4], &f, 4);
			val[k] = f;
		} else {
			uint16_t b = type == CUDA_R_16F ? cuda_emu_f32_to_f16(f) : cuda_emu_f32_to_bf16(f);
			memcpy(&bytes[k * 2], &b, 2);
			val[k] = type == CUDA_R_16F ? cuda_emu_f16_to_f32(b) : cuda_emu_bf16_to_f32(b);
		}
	}
	double get_bytes(const std::vector<unsigned char> &b, int i, int j) const
	{
		size_t k = (size_t)j * ld + i;
		if (type == CUDA_R_32F) {
			float f;
			memcpy(&f, &b[k * 4], 4);
			return f;
		}
		uint16_t h;
		memcpy(&h, &b[k * 2], 2);
		return type == CUDA_R_16F ? cuda_emu_f16_to_f32(h) : cuda_emu_bf16_to_f32(h);
	}
};

static void *upload(const mat &m)
{
	void *d = NULL;
	CHECK_INT_EQ(cudaMalloc(&d, m.bytes.size()), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(d, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
	return d;
}

/* One GEMM of the given shape and types, checked element by element. */
static void check_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
	int k, cudaDataType ab, cudaDataType ct, float alpha, float beta)
{
	int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	mat A(ar, ac, ar + 3, ab), B(br, bc, br + 1, ab), C(m, n, m + 2, ct);
	if (beta == 0.0f) /* C must not be read: NaN there must not show */
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++)
				C.set(i, j, NAN);
	void *dA = upload(A), *dB = upload(B), *dC = upload(C);
	CHECK_INT_EQ(cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, ab, A.ld, dB, ab, B.ld, &beta, dC,
		ct, C.ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
	std::vector<unsigned char> out(C.bytes.size());
	CHECK_INT_EQ(cudaMemcpy(out.data(), dC, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
	double tol = ct == CUDA_R_32F ? 1e-5 : ct == CUDA_R_16F ? 2e-3 : 1.6e-2;
	int bad = 0;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			double acc = 0;
			for (int l = 0; l < k; l++) {
				double a = ta == CUBLAS_OP_N ? A.val[(size_t)l * A.ld + i] : A.val[(size_t)i * A.ld + l];
				double b = tb == CUBLAS_OP_N ? B.val[(size_t)j * B.ld + l] : B.val[(size_t)l * B.ld + j];
				acc += a * b;
			}
			double want = alpha * acc + (beta != 0.0f ? beta * C.val[(size_t)j * C.ld + i] : 0.0);
			double got = C.get_bytes(out, i, j);
			if (!(fabs(got - want) <= tol * (1.0 + fabs(want))) && bad++ < 3)
				fprintf(stderr, "gemm op %d%d %dx%dx%d types %d->%d: C[%d,%d] = %g, want %g\n",
					ta, tb, m, n, k, ab, ct, i, j, got, want);
		}
	/* The padding rows between columns of C are untouched. */
	for (int j = 0; j < n && !bad; j++)
		for (int i = m; i < C.ld; i++)
			if (memcmp(&out[((size_t)j * C.ld + i) * (ct == CUDA_R_32F ? 4 : 2)],
				&C.bytes[((size_t)j * C.ld + i) * (ct == CUDA_R_32F ? 4 : 2)],
				ct == CUDA_R_32F ? 4 : 2) != 0)
				bad++;
	CHECK_INT_EQ(bad, 0);
	cudaFree(dA);
	cudaFree(dB);
	cudaFree(dC);
}

static void test_gemm_values(cublasHandle_t h)
{
	const cublasOperation_t ops[] = { CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C };
	const cudaDataType combos[][2] = {
		{ CUDA_R_16F, CUDA_R_32F }, { CUDA_R_32F, CUDA_R_32F }, { CUDA_R_16F, CUDA_R_16F },
		{ CUDA_R_16BF, CUDA_R_32F }, { CUDA_R_16BF, CUDA_R_16BF },
	};
	for (const auto &c : combos)
		for (cublasOperation_t ta : ops)
			for (cublasOperation_t tb : ops) {
				check_gemm(h, ta, tb, 5, 7, 9, c[0], c[1], 1.5f, 0.0f);
				check_gemm(h, ta, tb, 3, 4, 17, c[0], c[1], -0.5f, 0.25f);
			}
	check_gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 1, CUDA_R_16F, CUDA_R_32F, 1.0f, 1.0f);
	check_gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 33, 2, 64, CUDA_R_16F, CUDA_R_32F, 1.0f, 0.0f);
	/* k == 0: C = beta * C */
	check_gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 0, CUDA_R_32F, CUDA_R_32F, 1.0f, 2.0f);

	float a = 1.0f, b = 0.0f, x[4] = { 1, 2, 3, 4 }, y[4] = { 0 };
	float *dx = NULL, *dy = NULL;
	CHECK_INT_EQ(cudaMalloc(&dx, sizeof x), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&dy, sizeof y), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice), cudaSuccess);
	/* (2x2)^T * (2x2) with Sgemm: column-major [1 3; 2 4]^T [1 3; 2 4] */
	CHECK_INT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 2, &a, dx, 2, dx, 2, &b, dy, 2),
		CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(y[0] == 5 && y[1] == 11 && y[2] == 11 && y[3] == 25);
	cudaFree(dx);
	cudaFree(dy);
}

static cublasStatus_t gemm_args(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
	int m, int n, int k, int lda, int ldb, int ldc, cudaDataType at, cudaDataType bt,
	cudaDataType ct, cublasComputeType_t comp, const float *alpha, void *buf)
{
	static const float beta = 0.0f;
	return cublasGemmEx(h, ta, tb, m, n, k, alpha, buf, at, lda, buf, bt, ldb, &beta, buf, ct, ldc,
		comp, CUBLAS_GEMM_DEFAULT);
}

static void test_gemm_checks(cublasHandle_t h)
{
	const float one = 1.0f;
	void *buf = NULL;
	CHECK_INT_EQ(cudaMalloc(&buf, 1 << 16), cudaSuccess);
	const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
	const cudaDataType F16 = CUDA_R_16F, F32 = CUDA_R_32F;
	const cublasComputeType_t C32 = CUBLAS_COMPUTE_32F;
#define EXPECT(status, ...) CHECK_INT_EQ(gemm_args(h, __VA_ARGS__, buf), status)
	EXPECT(CUBLAS_STATUS_SUCCESS, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, -1, 8, 8, 8, 8, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, -1, 8, 8, 8, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 8, -1, 8, 8, 8, F16, F16, F32, C32, &one);
	/* lda >= rows of A as stored: m for N, k for T */
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 4, 2, 7, 8, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_SUCCESS, T, N, 8, 4, 2, 2, 2, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, T, N, 8, 4, 3, 2, 3, 8, F16, F16, F32, C32, &one);
	/* ldb >= k for N, n for T */
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 4, 6, 8, 5, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_SUCCESS, N, T, 8, 4, 6, 8, 4, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, T, 8, 5, 6, 8, 4, 8, F16, F16, F32, C32, &one);
	/* ldc >= m, and every ld >= 1 even for empty matrices */
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 8, 8, 8, 8, 7, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 0, 8, 8, 0, 8, 0, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_SUCCESS, N, N, 0, 8, 8, 1, 8, 1, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, (cublasOperation_t)5, N, 8, 8, 8, 8, 8, 8, F16, F16, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32, C32, NULL);
	EXPECT(CUBLAS_STATUS_INVALID_VALUE, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32,
		(cublasComputeType_t)1234, &one);
	/* Known types the emulator (and llmd) do not use: not supported. */
	EXPECT(CUBLAS_STATUS_NOT_SUPPORTED, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32,
		CUBLAS_COMPUTE_16F, &one);
	EXPECT(CUBLAS_STATUS_NOT_SUPPORTED, N, N, 8, 8, 8, 8, 8, 8, F16, F32, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_NOT_SUPPORTED, N, N, 8, 8, 8, 8, 8, 8, F32, F32, F16, C32, &one);
	EXPECT(CUBLAS_STATUS_NOT_SUPPORTED, N, N, 8, 8, 8, 8, 8, 8, CUDA_R_8I, CUDA_R_8I, F32, C32, &one);
	EXPECT(CUBLAS_STATUS_NOT_SUPPORTED, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32,
		CUBLAS_COMPUTE_64F, &one);
#undef EXPECT
	CHECK_INT_EQ(cublasGemmEx(h, N, N, 8, 8, 8, &one, buf, F16, 8, buf, F16, 8, &one, buf, F32, 8,
		C32, (cublasGemmAlgo_t)50), CUBLAS_STATUS_NOT_SUPPORTED);
	/* a workspace: aligned, inside one allocation; or none */
	CHECK_INT_EQ(cublasSetWorkspace(h, buf, 1 << 16), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cublasSetWorkspace(h, (char *)buf + 256, (1 << 16) - 256), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cublasSetWorkspace(h, (char *)buf + 8, 256), CUBLAS_STATUS_INVALID_VALUE);
	CHECK_INT_EQ(cublasSetWorkspace(h, buf, (1 << 16) + 1), CUBLAS_STATUS_INVALID_VALUE);
	CHECK_INT_EQ(cublasSetWorkspace(h, NULL, 64), CUBLAS_STATUS_INVALID_VALUE);
	CHECK_INT_EQ(cublasSetWorkspace(h, NULL, 0), CUBLAS_STATUS_SUCCESS);
	cudaFree(buf);

	cublasHandle_t dead;
	CHECK_INT_EQ(cublasCreate(&dead), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cublasDestroy(dead), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cublasDestroy(dead), CUBLAS_STATUS_NOT_INITIALIZED);
	CHECK_INT_EQ(cublasSetStream(dead, 0), CUBLAS_STATUS_NOT_INITIALIZED);
	CHECK_INT_EQ(cublasSetWorkspace(dead, NULL, 0), CUBLAS_STATUS_NOT_INITIALIZED);
	CHECK_INT_EQ(gemm_args(dead, N, N, 8, 8, 8, 8, 8, 8, F16, F16, F32, C32, &one, NULL),
		CUBLAS_STATUS_NOT_INITIALIZED);
	CHECK_STR_EQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

/* A matrix outside device memory faults like the device would. */
static void test_gemm_host_pointer(cublasHandle_t h)
{
	const float one = 1.0f, zero = 0.0f;
	float host[64] = { 0 };
	float *d = NULL;
	CHECK_INT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
	CHECK_INT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, host, CUDA_R_32F, 8, d,
		CUDA_R_32F, 8, &zero, d, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
		CUBLAS_STATUS_EXECUTION_FAILED);
	CHECK(strstr(cuda_emu_last_diagnostic(), "matrix A") != NULL);
	CHECK_INT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
	CHECK_INT_EQ(cudaDeviceReset(), cudaSuccess);
}

/* A GEMM on a capturing stream is recorded and runs at each replay. */
static void test_gemm_capture(cublasHandle_t h)
{
	cudaStream_t s;
	CHECK_INT_EQ(cudaStreamCreate(&s), cudaSuccess);
	CHECK_INT_EQ(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
	float one = 1.0f, zero = 0.0f, x[4] = { 1, 2, 3, 4 }, y[4] = { 0 };
	float *dx = NULL, *dy = NULL;
	CHECK_INT_EQ(cudaMalloc(&dx, sizeof x), cudaSuccess);
	CHECK_INT_EQ(cudaMalloc(&dy, sizeof y), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice), cudaSuccess);
	CHECK_INT_EQ(cudaMemset(dy, 0, sizeof y), cudaSuccess);
	cudaGraph_t g;
	cudaGraphExec_t ex;
	CHECK_INT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	CHECK_INT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dx, 2, dx, 2, &zero, dy, 2),
		CUBLAS_STATUS_SUCCESS);
	one = 3.0f; /* alpha was read at the call */
	CHECK_INT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(y[0] == 0.0f);
	CHECK_INT_EQ(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
	CHECK_INT_EQ(cudaGraphLaunch(ex, s), cudaSuccess);
	CHECK_INT_EQ(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK(y[0] == 7 && y[1] == 10 && y[2] == 15 && y[3] == 22);
	CHECK_INT_EQ(cudaGraphExecDestroy(ex), cudaSuccess);
	CHECK_INT_EQ(cudaGraphDestroy(g), cudaSuccess);
	CHECK_INT_EQ(cublasSetStream(h, 0), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cudaStreamDestroy(s), cudaSuccess);
	cudaFree(dx);
	cudaFree(dy);
}

int main(void)
{
	cublasHandle_t h;
	CHECK_INT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
	test_gemm_values(h);
	test_gemm_checks(h);
	test_gemm_capture(h);
	test_gemm_host_pointer(h);
	CHECK_INT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
