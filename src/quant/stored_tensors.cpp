#include "tp/quant/stored_tensors.h"

#include <algorithm>
#include <set>

#include "quant/format_table.h"

namespace tp {

namespace {

bool is_stored(detail::StoredWhen when, const QuantConfig& config) {
  switch (when) {
    case detail::StoredWhen::kAlways: return true;
    case detail::StoredWhen::kAsymmetric: return !config.symmetric;
    case detail::StoredWhen::kScaleInvName: return config.block_scale_name == BlockScaleName::kWeightScaleInv;
    case detail::StoredWhen::kScaleName: return config.block_scale_name == BlockScaleName::kWeightScale;
    case detail::StoredWhen::kCompressedTensors: return config.nvfp4_dialect == Nvfp4Dialect::kCompressedTensors;
    case detail::StoredWhen::kModelOpt: return config.nvfp4_dialect == Nvfp4Dialect::kModelOpt;
  }
  return false;
}

int64_t per_index(int64_t declared, const QuantConfig& config) {
  return declared == detail::kPerGroup ? config.group_size : declared;
}

}  // namespace

std::vector<StoredTensor> stored_tensors(const QuantConfig& config) {
  std::vector<StoredTensor> out;
  for (const auto& axes : detail::format_entry(config.format).stored) {
    if (!is_stored(axes.when, config)) continue;
    out.push_back({axes.name, axes.out_dim, per_index(axes.out_per_index, config), axes.in_dim,
                   per_index(axes.in_per_index, config)});
  }
  return out;
}

const std::vector<std::string>& quantized_tensor_names() {
  static const std::vector<std::string> names = [] {
    std::set<std::string> quantized, unquantized;
    for (const auto& entry : detail::format_table()) {
      auto& into = entry.format == QuantFormat::kNone ? unquantized : quantized;
      for (const auto& axes : entry.stored) into.insert(axes.name);  // every variant's
      for (const char* name : entry.read_only) into.insert(name);
    }
    for (const char* name : detail::foreign_quantized_tensor_names()) quantized.insert(name);
    std::vector<std::string> out;
    std::set_difference(quantized.begin(), quantized.end(), unquantized.begin(), unquantized.end(),
                        std::back_inserter(out));
    return out;
  }();
  return names;
}

}  // namespace tp
