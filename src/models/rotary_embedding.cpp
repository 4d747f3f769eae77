#include "tp/models/rotary_embedding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace tp {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, const RopeParameters& rope) {
  TORCH_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0, "RotaryEmbedding: head_dim must be positive and even; got ",
                    head_dim);
  at::NoGradGuard no_grad;
  // 1 / theta^(2i / d), as transformers' _compute_default_rope_parameters (float32).
  const at::Tensor exponent = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / head_dim;
  at::Tensor inv_freq = at::pow(rope.theta, exponent).reciprocal() * 1.0;
  if (rope.type == RopeType::kLlama3) {
    // transformers' _compute_llama3_parameters, operation for operation.
    const double factor = rope.factor, low = rope.low_freq_factor, high = rope.high_freq_factor;
    const double old_context = static_cast<double>(rope.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
    const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    const at::Tensor smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
    const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / factor + smooth * scaled;
    const at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
    inv_freq = at::where(medium, smoothed, scaled);
  }
  inv_freq_ = inv_freq;
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& positions, at::ScalarType dtype) const {
  TORCH_CHECK_VALUE(inv_freq_.defined(), "RotaryEmbedding: not initialised");
  TORCH_CHECK_VALUE(positions.dim() == 2, "RotaryEmbedding: positions must be [batch, seq]; got ", positions.sizes());
  at::NoGradGuard no_grad;
  const at::Tensor freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq_.to(positions.device());
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // [batch, seq, head_dim]
  return {(emb.cos() * 1.0).to(dtype), (emb.sin() * 1.0).to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

}  // namespace tp
