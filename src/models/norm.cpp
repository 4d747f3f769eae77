#include "tp/models/norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace tp {

NormImpl::NormImpl(NormOptions options_) : options(std::move(options_)) { reset(); }

void NormImpl::reset() {
  TORCH_CHECK_VALUE(options.size() > 0, "Norm: size must be positive; got ", options.size());
  const auto opts = at::TensorOptions(options.dtype()).device(options.device());
  weight = register_parameter("weight", at::empty({options.size()}, opts));
  if (options.kind() == NormKind::kLayerNorm) bias = register_parameter("bias", at::empty({options.size()}, opts));
  if (options.init_weights()) reset_parameters();
}

void NormImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.fill_(options.kind() == NormKind::kRMSUnitOffset ? 0.0 : 1.0);
  if (bias.defined()) bias.zero_();
}

void NormImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::Norm(" << to_string(options.kind()) << ", size=" << options.size() << ", eps=" << options.eps() << ")";
}

at::Tensor NormImpl::forward(const at::Tensor& x) { return forward(x, weight, bias); }

at::Tensor NormImpl::forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1 && x.size(-1) == options.size(), "Norm: input of shape ",
                    x.defined() ? x.sizes() : c10::IntArrayRef{}, "; expected [..., ", options.size(), "]");
  switch (options.kind()) {
    case NormKind::kLayerNorm: return at::layer_norm(x, {options.size()}, w, b, options.eps());
    case NormKind::kRMSUnitOffset: {
      // Gemma's RMSNorm: everything in float32, the weight as an offset from 1, then cast.
      const at::Tensor h = x.to(options.compute_dtype());
      const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + options.eps());
      return (normed * (w.to(options.compute_dtype()) + 1.0)).to(x.scalar_type());
    }
    case NormKind::kRMSScaleFirst: {
      // GPT-OSS's RMSNorm: the weight times the normalised float32 value, cast once at the end.
      const at::Tensor h = x.to(options.compute_dtype());
      const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
      return (w * (h * at::rsqrt(variance + options.eps()))).to(x.scalar_type());
    }
    case NormKind::kRMS: break;
  }
  // The same operations, in the same order, as transformers' LlamaRMSNorm.forward.
  const at::Tensor h = x.to(options.compute_dtype());
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normed = (h * at::rsqrt(variance + options.eps())).to(x.scalar_type());
  return scale ? scale(w, normed) : w * normed;
}

}  // namespace tp
