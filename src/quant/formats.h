#pragma once
// Private: the entry points of each format family, implemented next to its methods
// (fp8*.cpp, int8*.cpp, int4*.cpp) and dispatched from quant_method.cpp and
// quantize.cpp, so neither dispatcher includes a format's details.

#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

namespace tp::detail {

// kFp8PerTensor, kFp8PerChannel, kFp8Block.
std::shared_ptr<QuantMethod> make_fp8_method(const QuantConfig& config);
QuantizedTensors quantize_fp8(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_fp8(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_fp8(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);

// kInt8W8A8, kInt8WeightOnly.
std::shared_ptr<QuantMethod> make_int8_method(const QuantConfig& config);
QuantizedTensors quantize_int8(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_int8(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_int8(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);

// kInt4Gptq, kInt4Awq.
std::shared_ptr<QuantMethod> make_int4_method(const QuantConfig& config);
QuantizedTensors quantize_int4(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_int4(const QuantizedTensors& tensors, const QuantConfig& config);

/// A float32 [out, in] weight drawn as torch::nn::Linear draws one, U(-1/sqrt(fan_in),
/// 1/sqrt(fan_in)) with the GLOBAL fan-in, for a method's reset_parameters to quantize.
at::Tensor random_linear_weight(int64_t out, int64_t in, int64_t global_in_features);

/// The format family of `format`.
enum class FormatFamily { kNone, kFp8, kInt8, kInt4 };
FormatFamily family_of(QuantFormat format);

}  // namespace tp::detail
