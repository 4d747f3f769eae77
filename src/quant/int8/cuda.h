#pragma once
// The INT8 formats on CUDA: IMMA (W8A8) and the weight-only GEMV.
// `prepare` once in finalize() (layout changes, checks that need the host), `apply`
// per forward, over the format-free GEMM entry points of src/gpu/gemm.h. Compiled
// only in CUDA builds; the method includes it under TP_WITH_CUDA.

#include <optional>

#include <ATen/core/Tensor.h>

#include "gpu/gemm.h"

namespace tp::cuda {

/// An INT8 weight (int8 [N, K], weight_scale [N, 1]) for W8A8 or weight-only.
struct Int8Prepared {
  bool w8a8 = true;
  at::Tensor weight;  // [N, K] int8
  at::Tensor scale;   // W8A8: [N] fp32; weight-only: [N, 1] fp32 (one group of K)
};
Int8Prepared prepare_int8(bool w8a8, const at::Tensor& weight, const at::Tensor& weight_scale);
at::Tensor apply(const Int8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

}  // namespace tp::cuda
