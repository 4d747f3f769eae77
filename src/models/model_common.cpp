#include "models/model_common.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace tp::detail {

void load_mirrored(const Checkpoint& checkpoint, const std::string& name, at::Tensor& target) {
  const auto& source = checkpoint.get(name, "DecoderLayer");
  TORCH_CHECK_VALUE(c10::IntArrayRef(source.shape()) == target.sizes(), "tensor '", name, "' has shape ",
                    c10::IntArrayRef(source.shape()), "; expected ", target.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(source.dtype()) && !at::isFloat8Type(source.dtype()), "tensor '", name,
                   "' has dtype ", source.dtype(), "; a norm weight is stored in a floating dtype");
  at::NoGradGuard no_grad;
  target.copy_(source.read_all());
}

at::Tensor activation(Activation act, const at::Tensor& x) {
  switch (act) {
    case Activation::kGelu: return at::gelu(x);
    case Activation::kGeluTanh: return at::gelu(x, "tanh");
    // transformers' NewGELUActivation and FastGELUActivation, operation for operation.
    case Activation::kGeluNew:
      return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
    case Activation::kGeluFast: return 0.5 * x * (1.0 + at::tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)));
    case Activation::kSilu: break;
  }
  return at::silu(x);
}

}  // namespace tp::detail
