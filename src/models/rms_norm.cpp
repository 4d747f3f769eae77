#include "tp/models/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace tp {

RMSNormImpl::RMSNormImpl(RMSNormOptions options_) : options(std::move(options_)) { reset(); }

void RMSNormImpl::reset() {
  TORCH_CHECK_VALUE(options.size() > 0, "RMSNorm: size must be positive; got ", options.size());
  weight = register_parameter("weight",
                              at::empty({options.size()}, at::TensorOptions(options.dtype()).device(options.device())));
  reset_parameters();
}

void RMSNormImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.fill_(1.0);
}

void RMSNormImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::RMSNorm(size=" << options.size() << ", eps=" << options.eps() << ")";
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) { return forward(x, weight); }

at::Tensor RMSNormImpl::forward(const at::Tensor& x, const at::Tensor& w) const {
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1 && x.size(-1) == options.size(), "RMSNorm: input of shape ",
                    x.defined() ? x.sizes() : c10::IntArrayRef{}, "; expected [..., ", options.size(), "]");
  // The same operations, in the same order, as transformers' LlamaRMSNorm.forward.
  const at::Tensor h = x.to(options.compute_dtype());
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return w * (h * at::rsqrt(variance + options.eps())).to(x.scalar_type());
}

}  // namespace tp
