#pragma once
// The MXFP4 family (mxfp4: OCP Microscaling FP4, as GPT-OSS stores its experts): its row
// functions in the format table (quant/format_table.h), implemented in this folder's
// method.cpp, and the CPU decoder its kernel runs (cpu_kernels.cpp).
//
// Stored, for a weight [N, K] (K a multiple of 32):
//   blocks  uint8 [N, K / 32, 16]  two E2M1 codes per byte, element 2i in the low nibble
//   scales  uint8 [N, K / 32]      E8M0: the block of 32 is multiplied by 2^(scales - 127)
//   W[n, k] = E2M1(code) * 2^(scales[n, k / 32] - 127), E2M1 codes 0..15 being
//   0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (the sign in bit 3).
// A scale byte of 255 is E8M0's NaN: refused when loaded.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

/// Elements per shared scale (a K-split must fall on whole blocks).
inline constexpr int64_t kMxfp4Block = 32;

std::shared_ptr<QuantMethod> make_mxfp4_method(const QuantConfig& config);
QuantizedTensors quantize_mxfp4(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_mxfp4(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_mxfp4(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);
int64_t mxfp4_alignment(const QuantConfig& config, ShardMode mode);

/// The packed weight the CPU decoder reads: blocks [n, k / 32, 16] and scales [n, k / 32],
/// both contiguous uint8 on the CPU (the registered tensors themselves).
struct Mxfp4CpuWeight {
  const uint8_t* blocks = nullptr;
  const uint8_t* scales = nullptr;
  int64_t n = 0, k = 0;
};

/// y = x W^T for x [M, K] (float32, bfloat16 or float16, CPU) through the panel GEMM
/// over weights decoded exactly to float32 (cpu/panel_gemm.h): float32 products and
/// sums, y rounded once to x's dtype. The kernel column names it "mxfp4 panel/<isa>".
/// M <= kMxfp4RowsMaxM on AVX2 / AVX-512 takes the rows kernels (rows.h: "mxfp4 rows/<isa>").
/// bf16 x where cpu/bf16_dot.h says so and the scales allow: the row-decoded GEMM's
/// AVX-512 bf16 loop over the exact dequantized weight ("mxfp4 gemm/avx512_bf16").
at::Tensor mxfp4_cpu_linear(const at::Tensor& x, const Mxfp4CpuWeight& w);

/// Scale bytes for which every E2M1 value times the scale is a normal bf16 value (exact in the
/// bf16 dot products, which flush subnormal inputs): a layer whose scales all lie in
/// [kMxfp4Bf16ScaleMin, kMxfp4Bf16ScaleMax] may take them.
inline constexpr int kMxfp4Bf16ScaleMin = 2;
inline constexpr int kMxfp4Bf16ScaleMax = 252;

/// cpu::RowDecodeFn over an Mxfp4CpuWeight: row `row`'s dequantized weight (E2M1 value
/// times its block's scale) as bf16 bits, exact for scales in the range above; k0 and kc
/// multiples of 32 (row_decode_avx512.cpp; uses AVX-512 BW).
void mxfp4_decode_row_bf16(const void* weight, int64_t row, int64_t k0, int64_t kc, uint16_t* out);

/// The float32 weight [N, K] as the CPU decoder writes it (tests: bit for bit
/// dequantize_mxfp4).
at::Tensor mxfp4_cpu_decode_all(const Mxfp4CpuWeight& w);

}  // namespace tp::detail
