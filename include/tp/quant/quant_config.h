#pragma once
// QuantConfig: which weight format a layer uses, chosen in its Options.

#include <cstdint>
#include <string>

namespace tp {

/// Weight formats. kNone stores weights in the layer's dtype and runs at::linear;
/// the quantized formats join this enum as they land.
enum class QuantFormat {
  kNone,
};

const char* to_string(QuantFormat format);

/// Selects the QuantMethod of a layer.
/// Example: tp::ColumnParallelLinearOptions(4096, 11008).quant(tp::QuantConfig{})
struct QuantConfig {
  QuantFormat format = QuantFormat::kNone;
};

}  // namespace tp
