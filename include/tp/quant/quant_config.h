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
  kNone,               ///< weights in the layer's dtype, GEMM by at::linear
  kFp8PerTensor,       ///< FP8 E4M3 weight, per-tensor weight_scale, static per-tensor input_scale
  kFp8PerChannel,      ///< FP8 E4M3 weight, per-output-channel weight_scale, dynamic per-token activations
  kFp8Block,           ///< FP8 E4M3 weight, 128x128 scale blocks (QuantConfig::block_scale_name), dynamic 1x128
                       ///< activation groups
  kInt8W8A8,           ///< INT8 weight, per-channel weight_scale, dynamic per-token symmetric INT8 activations
  kInt8WeightOnly,     ///< INT8 weight, per-channel weight_scale; activations stay in the layer's dtype
  kInt4Gptq,           ///< INT4 group-wise, GPTQ packing (qweight packed along in_features; QuantConfig::gptq_format)
  kInt4Awq,            ///< INT4 group-wise, AWQ packing (qweight packed along out_features, AWQ nibble order)
  kInt4PackQuantized,  ///< INT4 group-wise, compressed-tensors pack-quantized (weight_packed [N, K/8], offset binary)
  kMxfp4,              ///< OCP MXFP4: E2M1 codes (blocks [N, K/32, 16]) with an E8M0 scale per 32 (GPT-OSS's experts)
  kNvfp4,              ///< NVFP4: E2M1 codes two a byte ([N, K/2]), an E4M3 scale per 16, an F32 global scale
                       ///< per checkpoint tensor (QuantConfig::nvfp4_dialect); activations stay in the layer's dtype
};

/// The format's short name ("none", "fp8_tensor", "fp8_channel", "fp8_block",
/// "int8_w8a8", "int8_weight_only", "int4_gptq", "int4_awq", "int4_pack_quantized", "mxfp4", "nvfp4").
const char* to_string(QuantFormat format);

/// Every format, in enum order (the names parse_quant_config accepts).
std::vector<QuantFormat> all_quant_formats();

/// How a GPTQ checkpoint stores its zero points (config.json's
/// quantization_config.checkpoint_format). The two differ in nothing else, and a
/// checkpoint read with the wrong one has every zero point off by one.
enum class GptqFormat {
  kV1,  ///< "gptq" (AutoGPTQ; and GPTQModel's default export): the file stores zero - 1
  kV2,  ///< "gptq_v2" (GPTQModel): the file stores the zero point itself
};
/// "v1" or "v2" (the text form's option).
const char* to_string(GptqFormat format);

/// The name of an FP8 block checkpoint's scale tensor. Both multiply:
/// w = float(weight) * scale[n / 128, k / 128].
enum class BlockScaleName {
  kWeightScaleInv,  ///< "weight_scale_inv": HF fine-grained FP8 (DeepSeek-V3, Qwen3-FP8)
  kWeightScale,     ///< "weight_scale": compressed-tensors FP8_BLOCK (llm-compressor)
};
/// The tensor suffix: "weight_scale_inv" or "weight_scale".
const char* to_string(BlockScaleName name);

/// Which producer wrote an NVFP4 checkpoint. The two store the same codes and E4M3 group
/// scales; their F32 global scales are inverses of each other (docs/checkpoint_formats.md):
///   w = E2M1(code) * float32(weight_scale / weight_global_scale)   compressed-tensors
///   w = E2M1(code) * float32(weight_scale * weight_scale_2)        ModelOpt
enum class Nvfp4Dialect {
  kCompressedTensors,  ///< "nvfp4-pack-quantized": weight_packed, weight_scale, weight_global_scale (a divisor)
  kModelOpt,           ///< NVIDIA ModelOpt: weight, weight_scale, weight_scale_2 (a multiplier)
};
/// "compressed_tensors" or "modelopt" (the text form's option).
const char* to_string(Nvfp4Dialect dialect);

/// Selects the QuantMethod of a layer. Every field but `format` is an option some
/// formats take (the format table says which; parse_quant_config refuses the others).
/// Example: tp::ColumnParallelLinearOptions(4096, 11008).quant(tp::QuantConfig{tp::QuantFormat::kInt4Gptq, 64})
///          tp::parse_quant_config("int4_gptq:g128:asym:v2")
struct QuantConfig {
  QuantFormat format = QuantFormat::kNone;
  /// INT4 formats: in_features per scale group (32, 64 or 128).
  int64_t group_size = 128;
  /// INT4 formats: symmetric (zero point 8) or asymmetric (a zero point per group and column).
  bool symmetric = true;
  /// int4_gptq: how the checkpoint stores zero points.
  GptqFormat gptq_format = GptqFormat::kV1;
  /// fp8_block: the scale tensor's name in the checkpoint (and on the layer).
  BlockScaleName block_scale_name = BlockScaleName::kWeightScaleInv;
  /// nvfp4: the checkpoint's tensor names and global-scale convention.
  Nvfp4Dialect nvfp4_dialect = Nvfp4Dialect::kCompressedTensors;

  bool operator==(const QuantConfig& other) const;
  bool operator!=(const QuantConfig& other) const { return !(*this == other); }
};

/// "int4_gptq:g64:asym:v2", "fp8_block:weight_scale", "none": the format name, then
/// the options its format takes, in any order: ":g<group>" and ":sym"/":asym" (INT4
/// formats), ":v1"/":v2" (int4_gptq), ":weight_scale_inv"/":weight_scale" (fp8_block),
/// ":compressed_tensors"/":modelopt" (nvfp4).
/// Unknown text, or an option the format does not take, is an error listing what is accepted.
QuantConfig parse_quant_config(const std::string& text);
/// The inverse of parse_quant_config: the format's group and symmetry always, the
/// other options only where they differ from the default ("int4_gptq:g128:sym",
/// "int4_gptq:g128:sym:v2", "fp8_block", "fp8_block:weight_scale").
std::string to_string(const QuantConfig& config);

}  // namespace tp
