#pragma once
// RMSNorm as the Llama family computes it: the statistics in float32 whatever the
// dtype, the weight applied in the input's dtype.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

namespace tp {

/// Options for RMSNorm.
/// Example: tp::RMSNorm norm(tp::RMSNormOptions(4096).eps(1e-5));
struct RMSNormOptions {
  explicit RMSNormOptions(int64_t size) : size_(size) {}
  TORCH_ARG(int64_t, size);
  TORCH_ARG(double, eps) = 1e-6;
  /// Where mean(x^2) and the scaling are computed. float32 is what transformers'
  /// LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm do for every dtype (float64 included),
  /// and what makes a float64 model equal theirs; kDouble keeps a float64 model exact.
  TORCH_ARG(at::ScalarType, compute_dtype) = at::kFloat;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
};

/// y = weight * (x / sqrt(mean(x^2, -1) + eps)), the normalisation in compute_dtype and
/// cast back to x's dtype before the weight. The weight is mirrored on every rank.
class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl> {
 public:
  explicit RMSNormImpl(RMSNormOptions options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., size] -> [..., size].
  at::Tensor forward(const at::Tensor& x);
  /// The same with `weight` in place of the parameter (e.g. a weight routed through a
  /// collective for its gradient).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight) const;

  RMSNormOptions options;
  at::Tensor weight;  // [size]
};

/// A ModuleHolder for RMSNormImpl.
TORCH_MODULE(RMSNorm);

}  // namespace tp
