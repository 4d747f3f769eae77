#include "quant/format_table.h"

#include <c10/util/Exception.h>

#include "quant/fp8/fp8.h"
#include "quant/int4/int4.h"
#include "quant/int8/int8.h"
#include "quant/mxfp4/mxfp4.h"
#include "quant/unquantized/method.h"

namespace tp::detail {

const std::vector<FormatEntry>& format_table() {
  constexpr unsigned kInt4 = kGroupOption | kSymmetryOption;
  // clang-format off
  static const std::vector<FormatEntry> table = {
    // format                          name                   options                   method                    quantize                      dequantize                      activation                       alignment              rows_first
    {QuantFormat::kNone,               "none",                kNoOptions,               make_unquantized_method, quantize_unquantized,         dequantize_unquantized,         quantize_activation_unquantized, unquantized_alignment, true},
    {QuantFormat::kFp8PerTensor,       "fp8_tensor",          kNoOptions,               make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         false},
    {QuantFormat::kFp8PerChannel,      "fp8_channel",         kNoOptions,               make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         true},
    {QuantFormat::kFp8Block,           "fp8_block",           kBlockScaleNameOption,    make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         false},
    {QuantFormat::kInt8W8A8,           "int8_w8a8",           kNoOptions,               make_int8_method,        quantize_int8,                dequantize_int8,                quantize_activation_int8,        int8_alignment,        true},
    {QuantFormat::kInt8WeightOnly,     "int8_weight_only",    kNoOptions,               make_int8_method,        quantize_int8,                dequantize_int8,                quantize_activation_int8,        int8_alignment,        true},
    {QuantFormat::kInt4Gptq,           "int4_gptq",           kInt4 | kGptqFormatOption, make_int4_method,       quantize_int4,                dequantize_int4,                quantize_activation_int4,        int4_alignment,        false},
    {QuantFormat::kInt4Awq,            "int4_awq",            kInt4,                    make_int4_method,        quantize_int4,                dequantize_int4,                quantize_activation_int4,        int4_alignment,        false},
    {QuantFormat::kInt4PackQuantized,  "int4_pack_quantized", kInt4,                    make_int4_method,        quantize_int4_pack_quantized, dequantize_int4_pack_quantized, quantize_activation_int4,        int4_alignment,        false},
    {QuantFormat::kMxfp4,              "mxfp4",               kNoOptions,               make_mxfp4_method,       quantize_mxfp4,               dequantize_mxfp4,               quantize_activation_mxfp4,       mxfp4_alignment,       true},
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
