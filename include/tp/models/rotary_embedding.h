#pragma once
// Rotary position embedding (the rotate-half form, over the leading rotary_dim features
// of a head), with plain, Llama-3, linear, LongRoPE and YaRN frequencies.

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "tp/models/model_config.h"

namespace tp {

/// The cos / sin tables of one rotary dimension. The inverse frequencies and the angles
/// are computed in float32 with the operations of transformers' rope initialisers and
/// its rotary embeddings' forward, then cast to the model dtype: so a float64 model
/// sees exactly the tables transformers' does.
class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  /// rotary_dim: the features of a head that rotate (head_dim, or less for partial rotary).
  RotaryEmbedding(int64_t rotary_dim, const RopeParameters& rope);

  /// positions: int64 [batch, seq] -> (cos, sin), each [batch, seq, rotary_dim] in
  /// `dtype`. LongRoPE takes its long factors when the largest position + 1 exceeds
  /// original_max_position_embeddings (per call, as transformers does), and scales
  /// both tables by its attention_factor; so does YaRN.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, at::ScalarType dtype) const;
  /// The inverse frequencies, float32 [rotary_dim / 2] (LongRoPE: the short ones).
  const at::Tensor& inv_freq() const { return inv_freq_; }

 private:
  bool uses_long_factors(const at::Tensor& positions) const;

  RopeParameters rope_;
  at::Tensor inv_freq_, long_inv_freq_;
};

/// x * cos + rotate_half(x) * sin on the leading cos.size(-1) features of each head (the
/// rest unchanged). x: [batch, heads, seq, head_dim]; cos, sin: [batch, seq, rotary_dim].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tp
