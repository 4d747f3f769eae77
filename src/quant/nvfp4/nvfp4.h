#pragma once
// The NVFP4 family (nvfp4: NVIDIA's 4-bit float, written by llm-compressor /
// compressed-tensors and by ModelOpt): its row functions in the format table
// (quant/format_table.h), implemented in this folder's method.cpp, and the CPU decoder its
// kernel runs (cpu_kernels.cpp).
//
// Stored, for a weight [N, K] (K a multiple of 16), under the dialect's names
// (QuantConfig::nvfp4_dialect):
//   weight_packed / weight   uint8 [N, K / 2]          two E2M1 codes a byte (quant/mxfp4/e2m1.h)
//   weight_scale             float8_e4m3fn [N, K / 16] one scale per 16 elements of a row
//   weight_global_scale /    float32 [N, 1]            the checkpoint tensor's one F32 global
//   weight_scale_2                                     scale, held per row (each part of a
//                                                      fused layer keeps its own)
// and computed, in float32 exactly as the producers dequantize (one rounding each):
//   compressed-tensors  group scale = weight_scale / weight_global_scale
//   ModelOpt            group scale = weight_scale * weight_scale_2
//   W[n, k] = E2M1(code[n, k]) * group scale[n, k / 16]
// compressed-tensors' own decompression rounds that float32 weight to bfloat16 last.
// Weight-only (W4A16): checkpoints whose activations are quantized too (input_global_scale,
// ModelOpt's input_scale) are refused, not read as W4A16.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

/// Elements per E4M3 scale (a K-split must fall on whole groups).
inline constexpr int64_t kNvfp4Group = 16;

std::shared_ptr<QuantMethod> make_nvfp4_method(const QuantConfig& config);
QuantizedTensors quantize_nvfp4(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_nvfp4(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_nvfp4(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);
int64_t nvfp4_alignment(const QuantConfig& config, ShardMode mode);

/// The stored names of `config`'s dialect: the codes' and the global scale's.
const char* nvfp4_codes_name(const QuantConfig& config);
const char* nvfp4_global_name(const QuantConfig& config);

/// The weight the CPU decoder reads: codes [n, k / 2], E4M3 scale bytes [n, k / 16] and the
/// global scale per row [n], all contiguous on the CPU (the registered tensors themselves).
struct Nvfp4CpuWeight {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const float* global = nullptr;
  int64_t n = 0, k = 0;
  bool divide = true;  ///< compressed-tensors: scale / global; ModelOpt: scale * global
};

/// y = x W^T for x [M, K] (float32, bfloat16 or float16, CPU) over the weights decoded
/// exactly as the header's formula (float32 products and sums, y rounded once to x's
/// dtype): M <= kNvfp4RowsMaxM on AVX2 / AVX-512 the rows kernel ("nvfp4 rows/avx2"), else
/// the panel GEMM ("nvfp4 panel/<isa>").
at::Tensor nvfp4_cpu_linear(const at::Tensor& x, const Nvfp4CpuWeight& w);

/// Rows of x up to which the rows kernel runs (decode), each weight byte read once.
inline constexpr int64_t kNvfp4RowsMaxM = 4;

/// y[m, n] = x[m, :] . W[n, :] for n in [n0, n1) and m < M <= 4; x float32 [M, K] (row
/// stride ld_x), y [M, ld_y]. AVX2 + FMA (rows_avx2.cpp); serves AVX-512 machines too.
void nvfp4_rows_f32_avx2(const float* x, int64_t m, int64_t ld_x, const Nvfp4CpuWeight& w, float* y, int64_t ld_y,
                         int64_t n0, int64_t n1);

/// E4M3 (fn) bytes as float32, exact: the decoders' table [256].
const float* nvfp4_e4m3_table();

/// The float32 weight [N, K] as the CPU decoder writes it (tests: bit for bit
/// dequantize_nvfp4).
at::Tensor nvfp4_cpu_decode_all(const Nvfp4CpuWeight& w);

}  // namespace tp::detail
