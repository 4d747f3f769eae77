#pragma once
// A shape as error messages print it: "[4096, 11008]".

#include <cstdint>
#include <string>
#include <vector>

namespace tp::detail {

inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace tp::detail
