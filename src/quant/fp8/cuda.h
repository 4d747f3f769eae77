#pragma once
// The FP8 formats on CUDA: the method's stored tensors -> cuBLASLt FP8 scale modes.
// `prepare` once in finalize() (layout changes, checks that need the host), `apply`
// per forward, over the format-free GEMM entry points of src/gpu/gemm.h. Compiled
// only in CUDA builds; the method includes it under TP_WITH_CUDA.

#include <optional>

#include <ATen/core/Tensor.h>

#include "gpu/gemm.h"
#include "tp/quant/quant_config.h"

namespace tp::cuda {

/// An FP8 weight ready for fp8_linear.
struct Fp8Prepared {
  at::Tensor weight;   // [N, K] float8_e4m3fn
  at::Tensor w_scale;  // per tensor: [1]; per channel: [N]; block: [ceil(N/128), ceil(K/128)]
  Fp8Scaling scaling = Fp8Scaling::kPerTensor;
  std::optional<at::Tensor> input_scale;  // the static activation scale of fp8_tensor
  at::Tensor dequantized;                 // set instead when the scales fit no cuBLASLt mode (see prepare_fp8)
};

/// `scale_rows`: the method's per-row weight scale [N, G] (G = 1, or ceil(K/128) for
/// fp8_block: a row's scale for each 128-column block, as a TP shard starting inside a
/// 128-row block stores it). Block scales become 128x128 blocks when every aligned
/// 128-row group shares its scales (checked once, here); otherwise the weight is kept
/// dequantized in `dtype` and runs as a plain GEMM (correct; warned once).
Fp8Prepared prepare_fp8(QuantFormat format, const at::Tensor& weight, const at::Tensor& scale_rows,
                        const std::optional<at::Tensor>& input_scale, at::ScalarType dtype);
at::Tensor apply(const Fp8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

}  // namespace tp::cuda
