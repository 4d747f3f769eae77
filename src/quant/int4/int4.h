#pragma once
// The INT4 group-wise family (int4_gptq, int4_awq, int4_pack_quantized): its row
// functions in the format table (quant/format_table.h), implemented in this folder's
// method.cpp and pack_quantized.cpp.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

std::shared_ptr<QuantMethod> make_int4_method(const QuantConfig& config);
QuantizedTensors quantize_int4(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_int4(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_int4(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config);
int64_t int4_alignment(const QuantConfig& config, ShardMode mode);
QuantizedTensors quantize_int4_pack_quantized(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_int4_pack_quantized(const QuantizedTensors& tensors, const QuantConfig& config);

}  // namespace tp::detail
