#include "tp/quant/quantize.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "quant/formats.h"

namespace tp {

QuantizedTensors quantize_weight(const at::Tensor& weight, const QuantConfig& config) {
  TORCH_CHECK_VALUE(weight.defined() && weight.dim() == 2 && at::isFloatingType(weight.scalar_type()),
                    "quantize_weight(", to_string(config), "): expected a floating-point [out_features, in_features] "
                    "weight; got ", weight.defined() ? weight.sizes() : at::IntArrayRef{}, " ",
                    weight.defined() ? c10::toString(weight.scalar_type()) : "undefined");
  const at::Tensor w = weight.cpu();
  switch (detail::family_of(config.format)) {
    case detail::FormatFamily::kNone: return {{"weight", w}};
    case detail::FormatFamily::kFp8: return detail::quantize_fp8(w, config);
    case detail::FormatFamily::kInt8: return detail::quantize_int8(w, config);
    case detail::FormatFamily::kInt4: return detail::quantize_int4(w, config);
  }
  TORCH_CHECK_VALUE(false, "quantize_weight: unknown format");
}

at::Tensor dequantize_weight(const QuantizedTensors& tensors, const QuantConfig& config) {
  switch (detail::family_of(config.format)) {
    case detail::FormatFamily::kNone: {
      const auto it = tensors.find("weight");
      TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(none): no 'weight' tensor");
      return it->second.to(at::kFloat);
    }
    case detail::FormatFamily::kFp8: return detail::dequantize_fp8(tensors, config);
    case detail::FormatFamily::kInt8: return detail::dequantize_int8(tensors, config);
    case detail::FormatFamily::kInt4: return detail::dequantize_int4(tensors, config);
  }
  TORCH_CHECK_VALUE(false, "dequantize_weight: unknown format");
}

at::Tensor quantize_activation(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config) {
  switch (detail::family_of(config.format)) {
    case detail::FormatFamily::kNone:
    case detail::FormatFamily::kInt4: return x.to(at::kFloat);
    case detail::FormatFamily::kFp8: return detail::quantize_activation_fp8(x, tensors, config);
    case detail::FormatFamily::kInt8: return detail::quantize_activation_int8(x, tensors, config);
  }
  TORCH_CHECK_VALUE(false, "quantize_activation: unknown format");
}

namespace detail {

at::Tensor random_linear_weight(int64_t out, int64_t in, int64_t global_in_features) {
  const double bound = global_in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(global_in_features)) : 0.0;
  return at::empty({out, in}, at::kFloat).uniform_(-bound, bound);
}

}  // namespace detail

void add_to_checkpoint(Checkpoint& checkpoint, const std::string& prefix, const QuantizedTensors& tensors) {
  for (const auto& [suffix, tensor] : tensors) checkpoint.add(prefix + "." + suffix, tensor);
}

}  // namespace tp
