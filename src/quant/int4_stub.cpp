// Placeholder until the int4 formats land: every entry point refuses clearly.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "quant/formats.h"

namespace tp::detail {

std::shared_ptr<QuantMethod> make_int4_method(const QuantConfig& config) {
  TORCH_CHECK_VALUE(false, "quant format ", to_string(config.format), " is not implemented yet");
}
QuantizedTensors quantize_int4(const at::Tensor&, const QuantConfig& config) {
  TORCH_CHECK_VALUE(false, "quant format ", to_string(config.format), " is not implemented yet");
}
at::Tensor dequantize_int4(const QuantizedTensors&, const QuantConfig& config) {
  TORCH_CHECK_VALUE(false, "quant format ", to_string(config.format), " is not implemented yet");
}

}  // namespace tp::detail
