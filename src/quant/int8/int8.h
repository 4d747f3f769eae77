#pragma once
// The INT8 family (int8_w8a8, int8_weight_only): its row functions in the
// format table (quant/format_table.h), implemented in this folder's method.cpp.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

std::shared_ptr<QuantMethod> make_int8_method(const QuantConfig& config);
QuantizedTensors quantize_int8(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_int8(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_int8(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);
int64_t int8_alignment(const QuantConfig& config, ShardMode mode);

}  // namespace tp::detail
