#pragma once
// QuantConfig: which weight format a layer uses, chosen in its Options.

#include <cstdint>
#include <string>
#include <vector>

namespace tp {

/// Weight formats. Tensor names are those of common Hugging Face checkpoints; the
/// stored tensors of each are listed in tp/quant/quantize.h, and each family's
/// folder (src/quant/<family>/) describes its alignment and kernels.
enum class QuantFormat {
  kNone,            ///< weights in the layer's dtype, GEMM by at::linear
  kFp8PerTensor,    ///< FP8 E4M3 weight, per-tensor weight_scale, static per-tensor input_scale
  kFp8PerChannel,   ///< FP8 E4M3 weight, per-output-channel weight_scale, dynamic per-token activations
  kFp8Block,        ///< FP8 E4M3 weight, 128x128 weight_scale_inv blocks, dynamic 1x128 activation groups
  kInt8W8A8,        ///< INT8 weight, per-channel weight_scale, dynamic per-token symmetric INT8 activations
  kInt8WeightOnly,  ///< INT8 weight, per-channel weight_scale; activations stay in the layer's dtype
  kInt4Gptq,        ///< INT4 group-wise, GPTQ packing (qweight packed along in_features)
  kInt4Awq,         ///< INT4 group-wise, AWQ packing (qweight packed along out_features, AWQ nibble order)
};

/// The format's short name ("none", "fp8_tensor", "fp8_channel", "fp8_block",
/// "int8_w8a8", "int8_weight_only", "int4_gptq", "int4_awq").
const char* to_string(QuantFormat format);

/// Every format, in enum order (the names parse_quant_config accepts).
std::vector<QuantFormat> all_quant_formats();

/// Selects the QuantMethod of a layer.
/// Example: tp::ColumnParallelLinearOptions(4096, 11008).quant(tp::QuantConfig{tp::QuantFormat::kInt4Gptq, 64})
struct QuantConfig {
  QuantFormat format = QuantFormat::kNone;
  /// INT4 formats: in_features per scale group (32, 64 or 128).
  int64_t group_size = 128;
  /// INT4 formats: symmetric (zero point 8) or asymmetric (a zero point per group and column).
  bool symmetric = true;
};

/// "int4_gptq:g64:asym", "fp8_block", "none": the format name, then optional
/// ":g<group>" and ":sym"/":asym" for the INT4 formats. Unknown text is an error
/// listing what is accepted.
QuantConfig parse_quant_config(const std::string& text);
/// The inverse of parse_quant_config (group and symmetry only for INT4 formats).
std::string to_string(const QuantConfig& config);

}  // namespace tp
