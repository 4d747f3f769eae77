#include "tp/comm/all_reduce_strategy.h"

#include <algorithm>
#include <cctype>
#include <ostream>

#include <c10/util/Exception.h>

namespace tp {
namespace {

// Every strategy, in enum order; parse reads this table.
constexpr AllReduceStrategy kAllStrategies[] = {
    AllReduceStrategy::kAuto,
    AllReduceStrategy::kProcessGroup,
    AllReduceStrategy::kSharedMemoryOneShot,
    AllReduceStrategy::kSharedMemoryTwoShot,
    AllReduceStrategy::kNccl,
    AllReduceStrategy::kNcclBf16Wire,
    AllReduceStrategy::kRecursiveDoubling,
};

constexpr WirePrecision kAllWires[] = {WirePrecision::kDefault, WirePrecision::kNative, WirePrecision::kBFloat16};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

const char* to_string(AllReduceStrategy s) {
  switch (s) {
    case AllReduceStrategy::kAuto: return "auto";
    case AllReduceStrategy::kProcessGroup: return "process_group";
    case AllReduceStrategy::kSharedMemoryOneShot: return "shm_one_shot";
    case AllReduceStrategy::kSharedMemoryTwoShot: return "shm_two_shot";
    case AllReduceStrategy::kNccl: return "nccl";
    case AllReduceStrategy::kNcclBf16Wire: return "nccl_bf16_wire";
    case AllReduceStrategy::kRecursiveDoubling: return "recursive_doubling";
  }
  TORCH_INTERNAL_ASSERT(false, "tp::to_string: unknown AllReduceStrategy value ", static_cast<int>(s));
}

std::ostream& operator<<(std::ostream& out, AllReduceStrategy s) { return out << to_string(s); }

AllReduceStrategy parse_all_reduce_strategy(const std::string& name) {
  const std::string wanted = lower(name);
  std::string valid;
  for (AllReduceStrategy s : kAllStrategies) {
    if (wanted == to_string(s)) return s;
    valid += valid.empty() ? "" : ", ";
    valid += to_string(s);
  }
  TORCH_CHECK_VALUE(false, "tp::parse_all_reduce_strategy: unknown all-reduce strategy '", name,
                    "'; valid names (case-insensitive): ", valid);
}

const char* to_string(WirePrecision w) {
  switch (w) {
    case WirePrecision::kDefault: return "default";
    case WirePrecision::kNative: return "native";
    case WirePrecision::kBFloat16: return "bf16";
  }
  TORCH_INTERNAL_ASSERT(false, "tp::to_string: unknown WirePrecision value ", static_cast<int>(w));
}

std::ostream& operator<<(std::ostream& out, WirePrecision w) { return out << to_string(w); }

WirePrecision parse_wire_precision(const std::string& name) {
  const std::string wanted = lower(name);
  if (wanted == "bfloat16") return WirePrecision::kBFloat16;
  std::string valid;
  for (WirePrecision w : kAllWires) {
    if (wanted == to_string(w)) return w;
    valid += valid.empty() ? "" : ", ";
    valid += to_string(w);
  }
  TORCH_CHECK_VALUE(false, "tp::parse_wire_precision: unknown wire precision '", name,
                    "'; valid names (case-insensitive): ", valid, " (bfloat16 = bf16)");
}

}  // namespace tp
