#pragma once
// The normalisation layers of the decoder families, computed operation for operation as
// transformers does: RMSNorm (Llama, Qwen, Mistral, Phi-3), Gemma's (1 + w) RMSNorm and
// LayerNorm with a bias (GPT-NeoX). The weights are mirrored on every rank.

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/models/model_config.h"

namespace tp {

/// Options for Norm.
/// Example: tp::Norm norm(tp::NormOptions(4096).eps(1e-5));
struct NormOptions {
  explicit NormOptions(int64_t size) : size_(size) {}
  TORCH_ARG(int64_t, size);
  TORCH_ARG(NormKind, kind) = NormKind::kRMS;
  TORCH_ARG(double, eps) = 1e-6;
  /// The RMS kinds: where mean(x^2) and the scaling are computed. float32 is what
  /// transformers' RMSNorms do for every dtype (float64 included), and what makes a
  /// float64 model equal theirs; kDouble keeps a float64 model exact. (LayerNorm runs in
  /// the input's dtype, as torch.nn.LayerNorm does.)
  TORCH_ARG(at::ScalarType, compute_dtype) = at::kFloat;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// false: the parameters are allocated uninitialized (at::empty) and left unfilled, as
  /// torch.nn.utils.skip_init does, for a load_weights to fill (CausalLM::from_pretrained
  /// builds its layers so; LoadSession::expect_filled names any tensor a load left unfilled).
  /// true: reset_parameters() fills them at construction.
  TORCH_ARG(bool, init_weights) = true;
};

/// kRMS:           y = weight * (h / sqrt(mean(h^2) + eps)).to(x.dtype), h = x in compute_dtype
/// kRMSUnitOffset: y = ((h / sqrt(mean(h^2) + eps)) * (1 + weight in compute_dtype)).to(x.dtype)
/// kRMSScaleFirst: y = (weight * (h / sqrt(mean(h^2) + eps))).to(x.dtype)
/// kLayerNorm:     y = layer_norm(x, weight, bias, eps)
class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  explicit NormImpl(NormOptions options);
  void reset() override;
  /// The identity: weight 1 (0 for kRMSUnitOffset, whose scale is 1 + weight), bias 0.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., size] -> [..., size].
  at::Tensor forward(const at::Tensor& x);
  /// The same with `weight` (and `bias`, kLayerNorm) in place of the parameters (e.g. a
  /// weight routed through a collective for its gradient).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;

  NormOptions options;
  at::Tensor weight;  // [size]
  at::Tensor bias;    // [size], kLayerNorm only
  /// RMSNorm's last step, weight times the normalised x; empty: `weight * x`. Invariant
  /// numerics sets it (DecoderLayer, CausalLM) so the weight's gradient, a sum over tokens
  /// (and heads), is canonical.
  std::function<at::Tensor(const at::Tensor& weight, const at::Tensor& normed)> scale;
};

/// A ModuleHolder for NormImpl.
TORCH_MODULE(Norm);

}  // namespace tp
