#pragma once
// Status checks for the CUDA runtime and cuBLAS(Lt): every library call in
// src/ goes through one of these, so a failure names the call and the library's own
// status string instead of surfacing later as a wrong result. Private to src/; only
// CUDA builds include it. NCCL's check is in nccl_check.h.

#include <c10/util/Exception.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace tp::cuda {

inline const char* cublas_status_string(cublasStatus_t s) {
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
    default: return "unknown cublasStatus_t";
  }
}

}  // namespace tp::cuda

/// TP_CHECK_CUDA(cudaMemcpyAsync(...)): throws c10::Error naming the expression.
#define TP_CHECK_CUDA(expr)                                                                        \
  do {                                                                                             \
    const cudaError_t tp_status_ = (expr);                                                         \
    TORCH_CHECK(tp_status_ == cudaSuccess, #expr, " failed: ", cudaGetErrorName(tp_status_), " (", \
                cudaGetErrorString(tp_status_), ")");                                              \
  } while (false)

/// TP_CHECK_CUBLAS(expr, context...): the context (at least one item, streamed into
/// the message) names the GEMM and its shape, so a failure says which call it was.
#define TP_CHECK_CUBLAS(expr, ...)                                                                                     \
  do {                                                                                                                 \
    const cublasStatus_t tp_status_ = (expr);                                                                          \
    TORCH_CHECK(tp_status_ == CUBLAS_STATUS_SUCCESS, #expr, " failed: ", ::tp::cuda::cublas_status_string(tp_status_), \
                " in ", __VA_ARGS__);                                                                                  \
  } while (false)
