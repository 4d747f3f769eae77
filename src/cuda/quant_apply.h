#pragma once
// Adapters between the quant methods' stored tensors (src/quant/fp8*.cpp, int8*.cpp,
// int4*.cpp) and the CUDA GEMM entry points (gemm.h): `prepare` once in finalize()
// (layout changes, checks that need the host), `apply` per forward. A method wires
// its CUDA path with two lines:
//   finalize():  if (weight_.is_cuda()) cuda_ = cuda::prepare_fp8(...);
//   apply():     if (x.is_cuda() && cuda_) return cuda::apply(*cuda_, x, bias);

#include <optional>

#include <ATen/core/Tensor.h>

#include "cuda/gemm.h"
#include "tp/quant/quant_config.h"

namespace tp::cuda {

/// An FP8 weight ready for fp8_linear.
struct Fp8Prepared {
  at::Tensor weight;       // [N, K] float8_e4m3fn
  at::Tensor w_scale;      // per tensor: [1]; per channel: [N]; block: [ceil(N/128), ceil(K/128)]
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
  std::optional<at::Tensor> input_scale;  // the static activation scale of fp8_tensor
  at::Tensor dequantized;  // set instead when the scales fit no cuBLASLt mode (see prepare_fp8)
};

/// `scale_rows`: the method's per-row weight scale [N, G] (G = 1, or ceil(K/128) for
/// fp8_block: a row's scale for each 128-column block, as a TP shard starting inside a
/// 128-row block stores it). Block scales become 128x128 blocks when every aligned
/// 128-row group shares its scales (checked once, here); otherwise the weight is kept
/// dequantized in `dtype` and runs as a plain GEMM (correct; warned once).
Fp8Prepared prepare_fp8(QuantFormat format, const at::Tensor& weight, const at::Tensor& scale_rows,
                        const std::optional<at::Tensor>& input_scale, at::ScalarType dtype);
at::Tensor apply(const Fp8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

/// An INT8 weight (int8 [N, K], weight_scale [N, 1]) for W8A8 or weight-only.
struct Int8Prepared {
  bool w8a8 = true;
  at::Tensor weight;   // [N, K] int8
  at::Tensor scale;    // W8A8: [N] fp32; weight-only: [N, 1] fp32 (one group of K)
};
Int8Prepared prepare_int8(bool w8a8, const at::Tensor& weight, const at::Tensor& weight_scale);
at::Tensor apply(const Int8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

/// An INT4 group-wise weight in the GEMV kernel's layout (kernels.h).
struct Int4Prepared {
  at::Tensor packed;   // [N, K/2] uint8
  at::Tensor scales;   // [N, K/g] fp32
  at::Tensor zeros;    // [N, K/g] fp32, in code units
  int64_t group = 128;
};
/// From unpacked codes [N, K] (0..15), and scale / zero as [K/g, N] (GPTQ/AWQ order,
/// as src/quant/int4_packing.h unpacks them), moved to `device`.
Int4Prepared prepare_int4(const at::Tensor& codes, const at::Tensor& scale_kn, const at::Tensor& zero_kn,
                          int64_t group, const at::Device& device);
at::Tensor apply(const Int4Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

}  // namespace tp::cuda
