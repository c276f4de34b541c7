/* cublas_v2.h - the emulator's stand-in for the cuBLAS calls llmd uses.
 *
 * A reference implementation: plain loops in column-major order, float
 * accumulation, with cuBLAS's documented argument checks and status codes
 * (values as in the toolkit's cublas_api.h).  Calls run at once on the
 * handle's stream, or are recorded when that stream is capturing.  Beyond
 * the checks cuBLAS makes, every matrix must lie inside cudaMalloc memory:
 * a matrix that does not fails like a device fault would (sticky
 * cudaErrorIllegalAddress, CUBLAS_STATUS_EXECUTION_FAILED).  C and C++.
 */
#ifndef LLMD_CUDA_EMU_CUBLAS_V2_H
#define LLMD_CUDA_EMU_CUBLAS_V2_H

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaDataType_t {
	CUDA_R_32F = 0,
	CUDA_R_64F = 1,
	CUDA_R_16F = 2,
	CUDA_R_8I = 3,
	CUDA_R_32I = 10,
	CUDA_R_16BF = 14,
} cudaDataType;

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_MAPPING_ERROR = 11,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR = 14,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
	CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

typedef enum {
	CUBLAS_DEFAULT_MATH = 0,
	CUBLAS_TENSOR_OP_MATH = 1,
	CUBLAS_PEDANTIC_MATH = 2,
	CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;

typedef enum {
	CUBLAS_COMPUTE_16F = 64,
	CUBLAS_COMPUTE_16F_PEDANTIC = 65,
	CUBLAS_COMPUTE_32F = 68,
	CUBLAS_COMPUTE_32F_PEDANTIC = 69,
	CUBLAS_COMPUTE_64F = 70,
	CUBLAS_COMPUTE_64F_PEDANTIC = 71,
	CUBLAS_COMPUTE_32I = 72,
	CUBLAS_COMPUTE_32I_PEDANTIC = 73,
	CUBLAS_COMPUTE_32F_FAST_16F = 74,
	CUBLAS_COMPUTE_32F_FAST_16BF = 75,
	CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

/* Algorithms are accepted and ignored: -1..23 and 99..115, as cuBLAS's. */
typedef enum {
	CUBLAS_GEMM_DEFAULT = -1,
	CUBLAS_GEMM_ALGO0 = 0,
	CUBLAS_GEMM_ALGO23 = 23,
	CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
	CUBLAS_GEMM_ALGO0_TENSOR_OP = 100,
	CUBLAS_GEMM_ALGO15_TENSOR_OP = 115,
} cublasGemmAlgo_t;

typedef struct cublasContext *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
/* The device memory the handle's calls may use as scratch (so that none is
 * allocated while a stream is captured): WORKSPACE 256-byte aligned inside
 * one cudaMalloc'd allocation of at least SIZE bytes, or NULL with SIZE 0. */
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t size);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);

/* C = alpha * op(A) op(B) + beta * C, column-major; op(A) is m x k, op(B)
 * k x n, C m x n.  Supported (A/B, C, compute): 16F/16F, 16F/32F, 16BF/16BF,
 * 16BF/32F and 32F/32F with a CUBLAS_COMPUTE_32F* compute type and float
 * alpha/beta; others give CUBLAS_STATUS_NOT_SUPPORTED.  With beta == 0, C is
 * not read. */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
	cublasOperation_t transb, int m, int n, int k, const void *alpha,
	const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
	const void *beta, void *C, cudaDataType Ctype, int ldc,
	cublasComputeType_t computeType, cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
	cublasOperation_t transb, int m, int n, int k, const float *alpha,
	const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc);

#ifdef __cplusplus
}
#endif

#endif
