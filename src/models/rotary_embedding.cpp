#include "tp/models/rotary_embedding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace tp {

RotaryEmbedding::RotaryEmbedding(int64_t rotary_dim, const RopeParameters& rope) : rope_(rope) {
  TORCH_CHECK_VALUE(rotary_dim > 0 && rotary_dim % 2 == 0,
                    "RotaryEmbedding: the rotary dimension must be positive and even; got ", rotary_dim);
  at::NoGradGuard no_grad;
  // theta^(2i / d), as transformers' rope initialisers compute it (float32).
  const at::Tensor exponent = at::arange(0, rotary_dim, 2, at::kLong).to(at::kFloat) / rotary_dim;
  const at::Tensor base = at::pow(rope.theta, exponent);
  at::Tensor inv_freq = base.reciprocal() * 1.0;
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
  } else if (rope.type == RopeType::kLinear) {
    inv_freq = inv_freq / rope.factor;  // _compute_linear_scaling_rope_parameters
  } else if (rope.type == RopeType::kLongRope) {
    // _compute_longrope_parameters: 1 / (ext_factors * theta^(2i / d)).
    const auto factors = [&](const std::vector<double>& f) {
      TORCH_CHECK_VALUE(static_cast<int64_t>(f.size()) == rotary_dim / 2, "RotaryEmbedding: longrope has ", f.size(),
                        " factors for rotary dimension ", rotary_dim);
      return (at::tensor(f, at::kDouble).to(at::kFloat) * base).reciprocal() * 1.0;
    };
    inv_freq = factors(rope.short_factor);
    long_inv_freq_ = factors(rope.long_factor);
  } else if (rope.type == RopeType::kYarn) {
    // transformers' _compute_yarn_parameters, operation for operation: the ramp's bounds in
    // double, the frequencies in float32.
    const double dim = static_cast<double>(rotary_dim), theta = rope.theta;
    const double context = static_cast<double>(rope.original_max_position_embeddings);
    const auto correction_dim = [&](double rotations) {
      return (dim * std::log(context / (rotations * 2 * M_PI))) / (2 * std::log(theta));
    };
    double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
    if (rope.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // a zero-width ramp
    const at::Tensor extrapolation = base.reciprocal() * 1.0;
    const at::Tensor interpolation = (base * rope.factor).reciprocal() * 1.0;
    const at::Tensor ramp = ((at::arange(rotary_dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
    const at::Tensor keep = at::rsub(ramp, 1);  // the share of the original frequency
    inv_freq = interpolation * at::rsub(keep, 1) + extrapolation * keep;
  }
  inv_freq_ = inv_freq;
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& positions, at::ScalarType dtype) const {
  TORCH_CHECK_VALUE(inv_freq_.defined(), "RotaryEmbedding: not initialised");
  TORCH_CHECK_VALUE(positions.dim() == 2, "RotaryEmbedding: positions must be [batch, seq]; got ", positions.sizes());
  at::NoGradGuard no_grad;
  const at::Tensor& inv_freq = uses_long_factors(positions) ? long_inv_freq_ : inv_freq_;
  const at::Tensor freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq.to(positions.device());
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // [batch, seq, rotary_dim]
  const bool scaled = rope_.type == RopeType::kLongRope || rope_.type == RopeType::kYarn;
  const double scaling = scaled ? rope_.attention_factor : 1.0;
  return {(emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)};
}

bool RotaryEmbedding::uses_long_factors(const at::Tensor& positions) const {
  // transformers' dynamic LongRoPE: the long factors once the sequence (its largest
  // position + 1) is longer than the pretrained context; keys cached before keep theirs.
  return long_inv_freq_.defined() && positions.numel() > 0 &&
         positions.max().item<int64_t>() + 1 > rope_.original_max_position_embeddings;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t dim = cos.size(-1);
  if (dim < x.size(-1)) {
    // Partial rotary: the leading `dim` features rotate, the rest pass through.
    return at::cat({apply_rotary(x.narrow(-1, 0, dim), cos, sin), x.narrow(-1, dim, x.size(-1) - dim)}, -1);
  }
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

}  // namespace tp
