#include "tp/quant/quant_method.h"

#include <c10/util/Exception.h>

#include "tp/quant/unquantized.h"

namespace tp {

const char* to_string(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone:
      return "none";
  }
  return "unknown";
}

std::shared_ptr<QuantMethod> make_quant_method(const QuantConfig& config) {
  switch (config.format) {
    case QuantFormat::kNone:
      return std::make_shared<UnquantizedMethod>();
  }
  TORCH_CHECK_VALUE(false, "unknown quant format ", static_cast<int>(config.format));
}

}  // namespace tp
