#pragma once
// A thin private wrapper over cublasLtMatmul: RAII descriptors, a thread-safe cache
// of heuristic results, a 32 MiB workspace per stream from torch's caching allocator,
// and the current torch CUDA stream. Every GEMM of the CUDA path goes through
// `matmul`; the typed entry points (gemm.h) build its MatmulSpec.
//
// Convention: cuBLAS is column-major. A row-major y[M, N] = x[M, K] w[N, K]^T is
// computed as the column-major D[m=N, n=M] = op(A)[N, K] op(B)[K, M] with A = w
// (transposed, ld = K) and B = x (not transposed, ld = K): the "TN" layout that
// FP8 and IMMA kernels require, and a bias epilogue is then per output feature.

#include <cstdint>
#include <string>

#include <cublasLt.h>
#include <library_types.h>

namespace tp::cuda {

/// Everything that selects a cuBLASLt algorithm (the cache key) besides the device.
struct MatmulSpec {
  int64_t m = 0, n = 0, k = 0;  // column-major D[m, n] = op(A)[m, k] op(B)[k, n]
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool trans_a = true, trans_b = false;
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;  // the type of alpha and beta
  /// cublasLtMatmulMatrixScale_t of A and B, or -1 for no scale pointer (unscaled).
  int32_t a_scale_mode = -1, b_scale_mode = -1;
  bool bias = false;  // CUBLASLT_EPILOGUE_BIAS, a vector of m
  cudaDataType_t bias_type = CUDA_R_16BF;
  /// Smallest alignment (bytes, up to 256) of the A, B, D and bias pointers: the
  /// heuristic may pick a kernel that needs more, so it is part of the key.
  int32_t align_a = 256, align_b = 256, align_d = 256, align_bias = 256;

  bool operator==(const MatmulSpec& o) const;
  /// "m=4096 n=16 k=8192 A=fp8e4m3 B=fp8e4m3 D=bf16 scales=(blk128x128, vec128) bias"
  std::string describe() const;
};

/// Device pointers of one call; scales only when the spec has scale modes.
struct MatmulArgs {
  const void* a = nullptr;       /* device */
  const void* b = nullptr;       /* device */
  void* d = nullptr;             /* device */
  const void* bias = nullptr;    /* device */
  const void* a_scale = nullptr; /* device */
  const void* b_scale = nullptr; /* device */
  /// alpha as the spec's scale_type (float for 32F, int32 for 32I); beta is 0.
  float alpha_f = 1.0f;
  int32_t alpha_i = 1;
};

/// Runs the matmul on the current torch CUDA stream of the current device. Returns
/// false, without launching anything, when cuBLASLt has no algorithm for the spec
/// on this GPU (the caller then takes its fallback); the answer is cached, so an
/// unsupported spec costs one heuristic query per process. Any other failure throws
/// naming `what` and the spec.
bool matmul(const MatmulSpec& spec, const MatmulArgs& args, const char* what);

/// Smallest power-of-two alignment of `p`, capped at 256 bytes.
int32_t pointer_alignment(const void* p);

/// "bf16", "fp8e4m3", ... for messages.
const char* data_type_name(cudaDataType_t t);

}  // namespace tp::cuda
