#include "tp/layers/numerics/numerics.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

#include "common/env.h"

namespace tp {

const char* to_string(Numerics n) {
  switch (n) {
    case Numerics::kAuto: return "auto";
    case Numerics::kDefault: return "default";
    case Numerics::kInvariant: return "invariant";
  }
  return "?";
}

Numerics parse_numerics(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const auto n : {Numerics::kAuto, Numerics::kDefault, Numerics::kInvariant})
    if (s == to_string(n)) return n;
  TORCH_CHECK_VALUE(false, "unknown numerics '", name, "'; expected auto, default or invariant");
}

Numerics resolve_numerics(Numerics n) {
  if (n != Numerics::kAuto) return n;
  const auto env = detail::env_value("TP_NUMERICS");
  if (!env) return Numerics::kDefault;
  const Numerics parsed = parse_numerics(*env);
  TORCH_CHECK_VALUE(parsed != Numerics::kAuto, "TP_NUMERICS=", *env, ": expected default or invariant");
  return parsed;
}

}  // namespace tp
