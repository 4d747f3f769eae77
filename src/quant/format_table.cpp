#include "quant/format_table.h"

#include <c10/util/Exception.h>

#include "quant/fp8/fp8.h"
#include "quant/int4/int4.h"
#include "quant/int8/int8.h"
#include "quant/unquantized/method.h"

namespace tp::detail {

const std::vector<FormatEntry>& format_table() {
  // clang-format off
  static const std::vector<FormatEntry> table = {
    // format                        name               group  method                    quantize              dequantize              activation                      alignment
    {QuantFormat::kNone,           "none",             false, make_unquantized_method, quantize_unquantized, dequantize_unquantized, quantize_activation_unquantized, unquantized_alignment},
    {QuantFormat::kFp8PerTensor,   "fp8_tensor",       false, make_fp8_method,         quantize_fp8,         dequantize_fp8,         quantize_activation_fp8,         fp8_alignment},
    {QuantFormat::kFp8PerChannel,  "fp8_channel",      false, make_fp8_method,         quantize_fp8,         dequantize_fp8,         quantize_activation_fp8,         fp8_alignment},
    {QuantFormat::kFp8Block,       "fp8_block",        false, make_fp8_method,         quantize_fp8,         dequantize_fp8,         quantize_activation_fp8,         fp8_alignment},
    {QuantFormat::kInt8W8A8,       "int8_w8a8",        false, make_int8_method,        quantize_int8,        dequantize_int8,        quantize_activation_int8,        int8_alignment},
    {QuantFormat::kInt8WeightOnly, "int8_weight_only", false, make_int8_method,        quantize_int8,        dequantize_int8,        quantize_activation_int8,        int8_alignment},
    {QuantFormat::kInt4Gptq,       "int4_gptq",        true,  make_int4_method,        quantize_int4,        dequantize_int4,        quantize_activation_int4,        int4_alignment},
    {QuantFormat::kInt4Awq,        "int4_awq",         true,  make_int4_method,        quantize_int4,        dequantize_int4,        quantize_activation_int4,        int4_alignment},
  };
  // clang-format on
  return table;
}

const FormatEntry& format_entry(QuantFormat format) {
  const auto& table = format_table();
  const auto i = static_cast<size_t>(format);
  TORCH_CHECK_VALUE(i < table.size(), "unknown quant format ", static_cast<int>(format));
  TORCH_INTERNAL_ASSERT(table[i].format == format, "format table out of QuantFormat order at ", table[i].name);
  return table[i];
}

}  // namespace tp::detail
