#include "tp/quant/quantize.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "quant/format_table.h"
#include "quant/random_weight.h"

namespace tp {

QuantizedTensors quantize_weight(const at::Tensor& weight, const QuantConfig& config) {
  TORCH_CHECK_VALUE(weight.defined() && weight.dim() == 2 && at::isFloatingType(weight.scalar_type()),
                    "quantize_weight(", to_string(config),
                    "): expected a floating-point [out_features, in_features] "
                    "weight; got ",
                    weight.defined() ? weight.sizes() : at::IntArrayRef{}, " ",
                    weight.defined() ? c10::toString(weight.scalar_type()) : "undefined");
  return detail::format_entry(config.format).quantize(weight.cpu(), config);
}

at::Tensor dequantize_weight(const QuantizedTensors& tensors, const QuantConfig& config) {
  return detail::format_entry(config.format).dequantize(tensors, config);
}

at::Tensor quantize_activation(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config) {
  return detail::format_entry(config.format).quantize_activation(x, tensors, config);
}

namespace detail {

at::Tensor random_linear_weight(int64_t out, int64_t in, int64_t global_in_features) {
  const double bound = global_in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(global_in_features)) : 0.0;
  return at::empty({out, in}, at::kFloat).uniform_(-bound, bound);
}

void for_each_row_chunk(int64_t n, int64_t k, int64_t row_multiple, const std::function<void(int64_t, int64_t)>& fill) {
  const int64_t fit = std::max<int64_t>(1, kRandomInitChunkElements / std::max<int64_t>(k, 1) / row_multiple);
  const int64_t chunk = fit * row_multiple;
  for (int64_t first = 0; first < n; first += chunk) fill(first, std::min(chunk, n - first));
}

}  // namespace detail

void add_to_checkpoint(Checkpoint& checkpoint, const std::string& prefix, const QuantizedTensors& tensors) {
  for (const auto& [suffix, tensor] : tensors) checkpoint.add(prefix + "." + suffix, tensor);
}

}  // namespace tp
