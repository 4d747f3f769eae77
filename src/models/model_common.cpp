#include "models/model_common.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace tp::detail {

QuantConfig same_quant(const DecoderConfig& config, const std::vector<std::string>& modules) {
  const QuantConfig first = config.quant_for(modules.at(0));
  for (const auto& m : modules) {
    const QuantConfig q = config.quant_for(m);
    TORCH_CHECK_VALUE(q.format == first.format && q.group_size == first.group_size && q.symmetric == first.symmetric,
                      "DecoderConfig: ", modules.at(0), " is ", to_string(first), " but ", m, " is ", to_string(q),
                      "; the parts of one fused layer share a format");
  }
  return first;
}

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
