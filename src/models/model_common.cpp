#include "models/model_common.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

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

}  // namespace tp::detail
