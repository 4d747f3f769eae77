#pragma once
// Rotary position embedding (the rotate-half form), with plain and Llama-3 frequencies.

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "tp/models/model_config.h"

namespace tp {

/// The cos / sin tables of one head size. The inverse frequencies and the angles are
/// computed in float32 with the operations of transformers' rope initialisers and
/// LlamaRotaryEmbedding.forward, then cast to the model dtype: so a float64 model
/// sees exactly the tables transformers' does.
class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(int64_t head_dim, const RopeParameters& rope);

  /// positions: int64 [batch, seq] -> (cos, sin), each [batch, seq, head_dim] in `dtype`.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, at::ScalarType dtype) const;
  /// The inverse frequencies, float32 [head_dim / 2].
  const at::Tensor& inv_freq() const { return inv_freq_; }

 private:
  at::Tensor inv_freq_;
};

/// x * cos + rotate_half(x) * sin. x: [batch, heads, seq, head_dim]; cos, sin: [batch, seq, head_dim].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tp
