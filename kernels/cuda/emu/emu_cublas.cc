/* emu_cublas.cc - the CUDA emulator's reference cuBLAS: the GEMMs llmd
 * calls, as plain loops, behind cuBLAS's argument checks.
 *
 * Not fast and not cuBLAS's rounding: float accumulation in k order.  Tests
 * compare with tolerances, as they must against the real library too.
 */
#include "emu_impl.h"

#include <stdint.h>
#include <string.h>

#include <set>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

struct cublasContext {
	cudaStream_t stream;          /* where calls run (or are captured) */
	cublasPointerMode_t pointer_mode;
	cublasMath_t math_mode;
	void *workspace;              /* cublasSetWorkspace's (unused by the reference) */
	size_t workspace_bytes;
};

namespace cuda_emu {
namespace {

static std::set<cublasContext *> &handles()
{
	static std::set<cublasContext *> *h = new std::set<cublasContext *>();
	return *h;
}

static size_t type_size(cudaDataType t)
{
	switch (t) {
	case CUDA_R_32F: return 4;
	case CUDA_R_64F: return 8;
	case CUDA_R_16F: return 2;
	case CUDA_R_16BF: return 2;
	case CUDA_R_8I: return 1;
	case CUDA_R_32I: return 4;
	}
	return 0;
}

static float load(const void *p, cudaDataType t, size_t i)
{
	switch (t) {
	case CUDA_R_16F: return cuda_emu_f16_to_f32(((const uint16_t *)p)[i]);
	case CUDA_R_16BF: return cuda_emu_bf16_to_f32(((const uint16_t *)p)[i]);
	default: return ((const float *)p)[i];
	}
}

static void store(void *p, cudaDataType t, size_t i, float v)
{
	switch (t) {
	case CUDA_R_16F: ((uint16_t *)p)[i] = cuda_emu_f32_to_f16(v); break;
	case CUDA_R_16BF: ((uint16_t *)p)[i] = cuda_emu_f32_to_bf16(v); break;
	default: ((float *)p)[i] = v; break;
	}
}

/* Bytes an ld-strided ROWS x COLS column-major matrix spans. */
static size_t span(int rows, int cols, int ld, cudaDataType t)
{
	if (rows <= 0 || cols <= 0)
		return 0;
	return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * type_size(t);
}

struct gemm {
	cublasOperation_t ta, tb;
	int m, n, k;
	float alpha, beta;            /* host pointer mode: read at the call */
	const float *dalpha, *dbeta;  /* device pointer mode: read when it runs */
	const void *A, *B;
	void *C;
	cudaDataType at, bt, ct;
	int lda, ldb, ldc;
};

static cublasStatus_t check_matrix(const char *name, const void *p, int rows, int cols, int ld,
	cudaDataType t)
{
	std::string why;
	size_t bytes = span(rows, cols, ld, t);
	if (!bytes || device_range(p, bytes, &why))
		return CUBLAS_STATUS_SUCCESS;
	diag("cublasGemmEx: matrix %s (%d x %d, ld %d): %s; a device fault", name, rows, cols, ld,
		why.c_str());
	return CUBLAS_STATUS_EXECUTION_FAILED;
}

static cudaError_t run_gemm(const gemm &g)
{
	int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
	int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
	float alpha = g.alpha, beta = g.beta;
	if (check_matrix("A", g.A, ar, ac, g.lda, g.at) || check_matrix("B", g.B, br, bc, g.ldb, g.bt) ||
		check_matrix("C", g.C, g.m, g.n, g.ldc, g.ct) ||
		(g.dalpha && (check_matrix("alpha", g.dalpha, 1, 1, 1, CUDA_R_32F) ||
		check_matrix("beta", g.dbeta, 1, 1, 1, CUDA_R_32F)))) {
		set_sticky(cudaErrorIllegalAddress);
		return cudaErrorIllegalAddress;
	}
	if (g.dalpha) {
		alpha = *g.dalpha;
		beta = *g.dbeta;
	}
	for (int j = 0; j < g.n; j++)
		for (int i = 0; i < g.m; i++) {
			float acc = 0.0f;
			for (int l = 0; l < g.k; l++) {
				size_t ai = g.ta == CUBLAS_OP_N ? (size_t)l * g.lda + i : (size_t)i * g.lda + l;
				size_t bi = g.tb == CUBLAS_OP_N ? (size_t)j * g.ldb + l : (size_t)l * g.ldb + j;
				acc += load(g.A, g.at, ai) * load(g.B, g.bt, bi);
			}
			size_t ci = (size_t)j * g.ldc + i;
			float v = alpha * acc;
			if (beta != 0.0f) /* beta == 0: C is not read, NaNs there vanish */
				v += beta * load(g.C, g.ct, ci);
			store(g.C, g.ct, ci, v);
		}
	return cudaSuccess;
}

static bool known_type(int t)
{
	return t == CUDA_R_32F || t == CUDA_R_64F || t == CUDA_R_16F || t == CUDA_R_8I ||
		t == CUDA_R_32I || t == CUDA_R_16BF;
}

static bool compute_32f(int c)
{
	return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
		c == CUBLAS_COMPUTE_32F_FAST_16F || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
		c == CUBLAS_COMPUTE_32F_FAST_TF32;
}

static bool known_compute(int c)
{
	return compute_32f(c) || c == CUBLAS_COMPUTE_16F || c == CUBLAS_COMPUTE_16F_PEDANTIC ||
		c == CUBLAS_COMPUTE_64F || c == CUBLAS_COMPUTE_64F_PEDANTIC ||
		c == CUBLAS_COMPUTE_32I || c == CUBLAS_COMPUTE_32I_PEDANTIC;
}

static int max1(int a) { return a > 1 ? a : 1; }

} // namespace
} // namespace cuda_emu

using namespace cuda_emu;

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
	if (!handle)
		return CUBLAS_STATUS_INVALID_VALUE;
	std::lock_guard<std::mutex> g(api_lock());
	if (sticky_error())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	cublasContext *c = new cublasContext();
	c->stream = NULL;
	c->pointer_mode = CUBLAS_POINTER_MODE_HOST;
	c->math_mode = CUBLAS_DEFAULT_MATH;
	handles().insert(c);
	*handle = c;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().erase(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	delete handle;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->stream = stream;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!stream)
		return CUBLAS_STATUS_INVALID_VALUE;
	*stream = handle->stream;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if ((int)(mode & 0xf) > CUBLAS_TF32_TENSOR_OP_MATH)
		return CUBLAS_STATUS_INVALID_VALUE;
	handle->math_mode = mode;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t size)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	std::string why;
	if (!workspace && size)
		why = "a NULL workspace of nonzero size";
	else if ((uintptr_t)workspace % 256)
		why = "not 256-byte aligned";
	else if (size)
		device_range(workspace, size, &why);
	if (!why.empty()) {
		diag("cublasSetWorkspace: %p (%zu bytes): %s", workspace, size, why.c_str());
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	handle->workspace = workspace;
	handle->workspace_bytes = size;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode)
{
	std::lock_guard<std::mutex> g(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
		return CUBLAS_STATUS_INVALID_VALUE;
	handle->pointer_mode = mode;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasGetStatusName(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
	case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
	default: return cublasGetStatusName(s);
	}
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
	cublasOperation_t transb, int m, int n, int k, const void *alpha,
	const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
	const void *beta, void *C, cudaDataType Ctype, int ldc,
	cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
	if (in_kernel())
		abort();
	std::lock_guard<std::mutex> guard(api_lock());
	if (!handles().count(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (sticky_error())
		return CUBLAS_STATUS_EXECUTION_FAILED;
	/* The checks cuBLAS documents for cublasGemmEx, in its order. */
	bool op_ok = (transa == CUBLAS_OP_N || transa == CUBLAS_OP_T || transa == CUBLAS_OP_C) &&
		(transb == CUBLAS_OP_N || transb == CUBLAS_OP_T || transb == CUBLAS_OP_C);
	if (m < 0 || n < 0 || k < 0 || !op_ok ||
		lda < max1(transa == CUBLAS_OP_N ? m : k) ||
		ldb < max1(transb == CUBLAS_OP_N ? k : n) ||
		ldc < max1(m) || !alpha || !beta ||
		!known_type(Atype) || !known_type(Btype) || !known_type(Ctype) ||
		!known_compute(computeType)) {
		diag("cublasGemmEx: invalid value (m %d n %d k %d, ops %d %d, lda %d ldb %d ldc %d, "
			"alpha %p beta %p, types %d %d %d, compute %d)", m, n, k, transa, transb, lda, ldb,
			ldc, alpha, beta, Atype, Btype, Ctype, computeType);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	bool in16 = Atype == CUDA_R_16F || Atype == CUDA_R_16BF;
	bool types_ok = compute_32f(computeType) && Atype == Btype &&
		((in16 && (Ctype == Atype || Ctype == CUDA_R_32F)) ||
		(Atype == CUDA_R_32F && Ctype == CUDA_R_32F));
	bool algo_ok = (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
		(algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
	if (!types_ok || !algo_ok) {
		diag("cublasGemmEx: not supported (types A %d B %d C %d, compute %d, algo %d); the "
			"emulator has 16F/16BF inputs with a same-type or 32F output, and all-32F, with a "
			"COMPUTE_32F type", Atype, Btype, Ctype, computeType, algo);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	gemm g;
	g.ta = transa == CUBLAS_OP_C ? CUBLAS_OP_T : transa;
	g.tb = transb == CUBLAS_OP_C ? CUBLAS_OP_T : transb;
	g.m = m;
	g.n = n;
	g.k = k;
	g.alpha = g.beta = 0.0f;
	g.dalpha = g.dbeta = NULL;
	if (handle->pointer_mode == CUBLAS_POINTER_MODE_HOST) {
		memcpy(&g.alpha, alpha, sizeof g.alpha);
		memcpy(&g.beta, beta, sizeof g.beta);
	} else {
		g.dalpha = (const float *)alpha;
		g.dbeta = (const float *)beta;
	}
	g.A = A;
	g.B = B;
	g.C = C;
	g.at = Atype;
	g.bt = Btype;
	g.ct = Ctype;
	g.lda = lda;
	g.ldb = ldb;
	g.ldc = ldc;
	work w;
	w.kind = work::HOST_FN;
	w.fn = [g] { return run_gemm(g); };
	w.what = "cublasGemmEx";
	cudaError_t e = enqueue(handle->stream, std::move(w));
	if (e == cudaSuccess)
		return CUBLAS_STATUS_SUCCESS;
	return e == cudaErrorIllegalAddress ? CUBLAS_STATUS_EXECUTION_FAILED :
		e == cudaErrorInvalidResourceHandle ? CUBLAS_STATUS_INVALID_VALUE :
		CUBLAS_STATUS_EXECUTION_FAILED;
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
	cublasOperation_t transb, int m, int n, int k, const float *alpha,
	const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc)
{
	return cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B,
		CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
