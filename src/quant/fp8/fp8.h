#pragma once
// The FP8 E4M3 family (fp8_tensor, fp8_channel, fp8_block): its row functions in the
// format table (quant/format_table.h), implemented in this folder's method.cpp.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

std::shared_ptr<QuantMethod> make_fp8_method(const QuantConfig& config);
QuantizedTensors quantize_fp8(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_fp8(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_fp8(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);
int64_t fp8_alignment(const QuantConfig& config, ShardMode mode);

}  // namespace tp::detail
