#include "quant/format_table.h"

#include <c10/util/Exception.h>

#include "quant/fp8/fp8.h"
#include "quant/int4/int4.h"
#include "quant/int8/int8.h"
#include "quant/mxfp4/mxfp4.h"
#include "quant/nvfp4/nvfp4.h"
#include "quant/unquantized/method.h"

namespace tp::detail {

const std::vector<FormatEntry>& format_table() {
  constexpr unsigned kInt4 = kGroupOption | kSymmetryOption;
  // The tensors each format registers (QuantMethod::create_weights), with the dimension
  // that carries the output features N and the input features K and how many features
  // one index covers: {name, N dim, per index, K dim, per index[, when]}.
  static const std::vector<StoredAxes> plain = {{"weight", 0, 1, 1, 1}};
  static const std::vector<StoredAxes> per_row_scale = {{"weight", 0, 1, 1, 1}, {"weight_scale", 0, 1, kNoDim, 1}};
  // FP8 per tensor: the scale is held per row ([N, 1]), the static input scale is 0-d.
  static const std::vector<StoredAxes> fp8_tensor = {
      {"weight", 0, 1, 1, 1}, {"weight_scale", 0, 1, kNoDim, 1}, {"input_scale", kNoDim, 1, kNoDim, 1}};
  // FP8 blocks: the scale is held per row, one column per 128 input features ([N, K/128]),
  // under the name the checkpoint gives it.
  static const std::vector<StoredAxes> fp8_block = {{"weight", 0, 1, 1, 1},
                                                    {"weight_scale_inv", 0, 1, 1, 128, StoredWhen::kScaleInvName},
                                                    {"weight_scale", 0, 1, 1, 128, StoredWhen::kScaleName}};
  // GPTQ: qweight [K/8, N], qzeros [K/g, N/8], scales [K/g, N]; AWQ packs N: qweight [K, N/8].
  static const std::vector<StoredAxes> gptq = {
      {"qweight", 1, 1, 0, 8}, {"qzeros", 1, 8, 0, kPerGroup}, {"scales", 1, 1, 0, kPerGroup}};
  static const std::vector<StoredAxes> awq = {
      {"qweight", 1, 8, 0, 1}, {"qzeros", 1, 8, 0, kPerGroup}, {"scales", 1, 1, 0, kPerGroup}};
  // compressed-tensors' pack-quantized: weight_packed [N, K/8], weight_scale [N, K/g],
  // weight_zero_point [N/8, K/g] (asymmetric only).
  static const std::vector<StoredAxes> pack_quantized = {
      {"weight_packed", 0, 1, 1, 8},
      {"weight_scale", 0, 1, 1, kPerGroup},
      {"weight_zero_point", 0, 8, 1, kPerGroup, StoredWhen::kAsymmetric}};
  // MXFP4: blocks [N, K/32, 16] (32 codes in 16 bytes), scales [N, K/32].
  static const std::vector<StoredAxes> mxfp4 = {{"blocks", 0, 1, 1, 32}, {"scales", 0, 1, 1, 32}};
  // NVFP4: codes [N, K/2] (two a byte), E4M3 scales [N, K/16], and the checkpoint's F32
  // global scale held per row ([N, 1]) so each part of a fused layer keeps its own.
  using W = StoredWhen;
  static const std::vector<StoredAxes> nvfp4 = {{"weight_packed", 0, 1, 1, 2, W::kCompressedTensors},
                                                {"weight", 0, 1, 1, 2, W::kModelOpt},
                                                {"weight_scale", 0, 1, 1, 16},
                                                {"weight_global_scale", 0, 1, kNoDim, 1, W::kCompressedTensors},
                                                {"weight_scale_2", 0, 1, kNoDim, 1, W::kModelOpt}};
  // clang-format off
  static const std::vector<FormatEntry> table = {
    // format                          name                   options                   method                    quantize                      dequantize                      activation                       alignment              rows_first stored         read_only
    {QuantFormat::kNone,               "none",                kNoOptions,               make_unquantized_method, quantize_unquantized,         dequantize_unquantized,         quantize_activation_unquantized, unquantized_alignment, true,  plain,          {}},
    {QuantFormat::kFp8PerTensor,       "fp8_tensor",          kNoOptions,               make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         false, fp8_tensor,     {}},
    {QuantFormat::kFp8PerChannel,      "fp8_channel",         kNoOptions,               make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         true,  per_row_scale,  {}},
    {QuantFormat::kFp8Block,           "fp8_block",           kBlockScaleNameOption,    make_fp8_method,         quantize_fp8,                 dequantize_fp8,                 quantize_activation_fp8,         fp8_alignment,         false, fp8_block,      {}},
    {QuantFormat::kInt8W8A8,           "int8_w8a8",           kNoOptions,               make_int8_method,        quantize_int8,                dequantize_int8,                quantize_activation_int8,        int8_alignment,        true,  per_row_scale,  {}},
    {QuantFormat::kInt8WeightOnly,     "int8_weight_only",    kNoOptions,               make_int8_method,        quantize_int8,                dequantize_int8,                quantize_activation_int8,        int8_alignment,        true,  per_row_scale,  {}},
    {QuantFormat::kInt4Gptq,           "int4_gptq",           kInt4 | kGptqFormatOption, make_int4_method,       quantize_int4,                dequantize_int4,                quantize_activation_int4,        int4_alignment,        false, gptq,           {"g_idx"}},
    {QuantFormat::kInt4Awq,            "int4_awq",            kInt4,                    make_int4_method,        quantize_int4,                dequantize_int4,                quantize_activation_int4,        int4_alignment,        false, awq,            {}},
    {QuantFormat::kInt4PackQuantized,  "int4_pack_quantized", kInt4,                    make_int4_method,        quantize_int4_pack_quantized, dequantize_int4_pack_quantized, quantize_activation_int4,        int4_alignment,        false, pack_quantized, {"weight_shape"}},
    {QuantFormat::kMxfp4,              "mxfp4",               kNoOptions,               make_mxfp4_method,       quantize_mxfp4,               dequantize_mxfp4,               quantize_activation_mxfp4,       mxfp4_alignment,       true,  mxfp4,          {}},
    {QuantFormat::kNvfp4,              "nvfp4",               kDialectOption,           make_nvfp4_method,       quantize_nvfp4,               dequantize_nvfp4,               quantize_activation_nvfp4,       nvfp4_alignment,       true,  nvfp4,          {}},
  };
  // clang-format on
  return table;
}

const std::vector<const char*>& foreign_quantized_tensor_names() {
  static const std::vector<const char*> names = {
      "output_scale", "input_zero_point", "weight_g_idx",       "k_scale",
      "v_scale",      "activation_scale", "input_global_scale",
  };
  return names;
}

const FormatEntry& format_entry(QuantFormat format) {
  const auto& table = format_table();
  const auto i = static_cast<size_t>(format);
  TORCH_CHECK_VALUE(i < table.size(), "unknown quant format ", static_cast<int>(format));
  TORCH_INTERNAL_ASSERT(table[i].format == format, "format table out of QuantFormat order at ", table[i].name);
  return table[i];
}

}  // namespace tp::detail
