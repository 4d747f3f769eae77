#pragma once
// The quantized formats a test of stored tensors runs over: every format the build
// knows (tp::all_quant_formats(), the format table) at its default options, then the
// option variants that change what is stored (group size, symmetry, GPTQ's zero-point
// convention). A format added to the table is in this list with no test edited.

#include <string>
#include <vector>

#include "tp/quant/quant_config.h"

namespace tp::test {

inline std::vector<std::string> quantized_format_variants() {
  std::vector<std::string> out;
  for (const QuantFormat f : all_quant_formats()) {
    if (f != QuantFormat::kNone) out.push_back(to_string(QuantConfig{f}));
  }
  for (const char* variant :
       {"int4_gptq:g64", "int4_gptq:g64:v2", "int4_gptq:g32:asym", "int4_awq:g64:asym", "int4_pack_quantized:g32:asym"})
    out.push_back(variant);
  return out;
}

}  // namespace tp::test
