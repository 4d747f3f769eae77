#pragma once
// The CUDA kernels of the quantized paths, as plain launchers over device pointers,
// sizes and a stream (docs/STYLE.md). Shapes and dtypes are validated by the callers
// (gemm.cpp, weight_only.cpp); each launcher checks its launch.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tp::cuda {

/// Element types the kernels read and write.
enum class Elem { kF32, kF16, kBF16 };

/// Quantized element types.
enum class QElem { kInt8, kFp8E4M3 };

// ---- quantize.cu --------------------------------------------------------------------

/// Dynamic symmetric quantization of rows in groups along the columns:
/// for each row r and group g (columns [g*group, (g+1)*group)),
///   scale[r, g] = amax / qmax (1 when the group is all zeros), q = round(x / scale).
/// x: [rows, cols] with row stride ld_x; q: [rows, cols] contiguous;
/// scales: [rows, cols / group] contiguous fp32. `group` divides `cols`.
/// qmax is 127 for int8 and 448 for E4M3 (saturating conversion).
void launch_quantize_groups(Elem in, const void* x /* device */, int64_t rows, int64_t cols, int64_t ld_x,
                            int64_t group, QElem out, void* q /* device */, float* scales /* device */,
                            cudaStream_t stream);

/// y[m, n] = acc[m, n] * x_scale[m] * w_scale[n] (+ bias[n]), written as `out`.
/// acc: [M, N] int32 contiguous; y: [M, N] contiguous; bias of type `out` or null.
void launch_scale_int32(const int32_t* acc /* device */, int64_t M, int64_t N, const float* x_scale /* device */,
                        const float* w_scale /* device */, const void* bias /* device */, Elem out,
                        void* y /* device */, cudaStream_t stream);

// ---- weight_only.cu -------------------------------------------------------------------
//
// The weight-only layout (what QuantMethod::finalize produces on CUDA):
//   bits 8: qweight [N, K] int8, w = (q - zero) * scale;
//   bits 4: qweight [N, K/2] uint8, element k in the low nibble of byte k/2 when k
//           is even and the high nibble when odd, q in 0..15, w = (q - zero) * scale;
//   scales, zeros: [N, K / group] fp32 contiguous; zeros null means 0 (int8) or 8 (int4).

/// y[M, N] = x[M, K] w[N, K]^T (+ bias[N]) for M <= 16: one warp per output
/// feature, 128-bit weight loads, dequantized in registers, fp32 accumulation.
/// Needs K % 32 == 0, group % 32 == 0, x rows 16-byte aligned (ld_x % 8 == 0
/// elements for 16-bit types); y: [M, N] contiguous, bias null or [N] of type `t`.
void launch_weight_only_gemv(Elem t, const void* x /* device */, int64_t M, int64_t K, int64_t ld_x,
                             const void* qweight /* device */, int bits, const float* scales /* device */,
                             const float* zeros /* device */, int64_t group, const void* bias /* device */,
                             void* y /* device */, int64_t N, cudaStream_t stream);

/// w[N, K] (type `t`, contiguous) = the dequantized weight, for the large-M path.
void launch_dequantize_weight(const void* qweight /* device */, int bits, const float* scales /* device */,
                              const float* zeros /* device */, int64_t N, int64_t K, int64_t group, Elem t,
                              void* w /* device */, cudaStream_t stream);

}  // namespace tp::cuda
