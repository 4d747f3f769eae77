#pragma once
// The random initialisation every quantized method's reset_parameters quantizes.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tp::detail {

/// A float32 [out, in] weight drawn as torch::nn::Linear draws one, U(-1/sqrt(fan_in),
/// 1/sqrt(fan_in)) with the GLOBAL fan-in, for a method's reset_parameters to quantize.
at::Tensor random_linear_weight(int64_t out, int64_t in, int64_t global_in_features);

}  // namespace tp::detail
