#pragma once
// The format table: one row per QuantFormat, the only place that maps a format to
// its name, its TP alignment, its stored tensors and their split axes, and the
// functions of its family's folder (src/quant/<family>/). Every switch over formats
// reads this table; adding a format is a QuantFormat value, its folder, and one row in
// format_table.cpp.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

/// The QuantConfig fields a format takes (FormatEntry::options, a bitwise or): the
/// text form accepts exactly these, and QuantConfig equality compares only these.
enum FormatOption : unsigned {
  kNoOptions = 0,
  kGroupOption = 1u << 0,           ///< group_size, ":g<group>"
  kSymmetryOption = 1u << 1,        ///< symmetric, ":sym" / ":asym"
  kGptqFormatOption = 1u << 2,      ///< gptq_format, ":v1" / ":v2"
  kBlockScaleNameOption = 1u << 3,  ///< block_scale_name, ":weight_scale_inv" / ":weight_scale"
  kDialectOption = 1u << 4,         ///< nvfp4_dialect, ":compressed_tensors" / ":modelopt"
};

/// When a format registers a stored tensor (StoredAxes::when).
enum class StoredWhen {
  kAlways,
  kAsymmetric,         ///< only without QuantConfig::symmetric (a zero point)
  kScaleInvName,       ///< only with block_scale_name kWeightScaleInv (fp8_block's scale, HF's name)
  kScaleName,          ///< only with block_scale_name kWeightScale (fp8_block's scale, compressed-tensors' name)
  kCompressedTensors,  ///< only with nvfp4_dialect kCompressedTensors (its tensor names)
  kModelOpt,           ///< only with nvfp4_dialect kModelOpt
};

/// StoredAxes' per-index counts: an index covers the config's group_size features.
inline constexpr int64_t kPerGroup = 0;
/// StoredAxes' dimensions: the tensor has no such dimension.
inline constexpr int64_t kNoDim = -1;

/// One tensor a format stores, declared once in its row (tp::StoredTensor, resolved for a
/// config by tp::stored_tensors): its name, the dimension carrying the output features N
/// (split by column layers) and the one carrying the input features K (split by row
/// layers), each with the features one index covers (kPerGroup: the group size).
struct StoredAxes {
  const char* name;
  int64_t out_dim, out_per_index;
  int64_t in_dim, in_per_index;
  StoredWhen when = StoredWhen::kAlways;
};

struct FormatEntry {
  QuantFormat format;
  /// The name to_string / parse_quant_config use ("fp8_block").
  const char* name;
  /// The QuantConfig fields this format takes (FormatOption bits).
  unsigned options;
  /// The layer's QuantMethod.
  std::shared_ptr<QuantMethod> (*make_method)(const QuantConfig&);
  /// tp::quantize_weight: a float [N, K] weight (float32, CPU) -> the stored tensors.
  QuantizedTensors (*quantize)(const at::Tensor& weight, const QuantConfig&);
  /// tp::dequantize_weight: the stored tensors -> float32 [N, K].
  at::Tensor (*dequantize)(const QuantizedTensors&, const QuantConfig&);
  /// tp::quantize_activation: what the kernel does to x before the GEMM, as float32.
  at::Tensor (*quantize_activation)(const at::Tensor& x, const QuantizedTensors&, const QuantConfig&);
  /// Every shard boundary of the split dimension is a multiple of this (QuantMethod::tp_alignment).
  int64_t (*alignment)(const QuantConfig&, ShardMode);
  /// Every stored tensor is [out_features, ...] (tp::splits_by_rows).
  bool rows_first;
  /// The tensors the method registers, in registration order, with their split axes.
  std::vector<StoredAxes> stored;
  /// Checkpoint tensors the load reads (when present) that are not stored: checked, then dropped.
  std::vector<const char*> read_only;
};

/// Every format, in QuantFormat order.
const std::vector<FormatEntry>& format_table();

/// Checkpoint tensor names of the quantized formats tp does not read (KV-cache and output
/// scales, NVFP4 W4A4 input global scales, activation zero points, act-order permutations): strict
/// loading names them as another format's, not as stray tensors.
const std::vector<const char*>& foreign_quantized_tensor_names();

/// The row of `format`; an error for a value outside the enum.
const FormatEntry& format_entry(QuantFormat format);

}  // namespace tp::detail
