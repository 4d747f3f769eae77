#include "cpu/crossovers.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>

#include "cpu/dense/table.h"
#include "cpu/features.h"

namespace tp::cpu {
namespace {

constexpr int64_t kNoOverride = 0;  // a min_m is at least 1

std::array<std::atomic<int64_t>, kCrossoverCount>& overrides() {
  static std::array<std::atomic<int64_t>, kCrossoverCount> values{};  // kNoOverride
  return values;
}

int64_t checked(int64_t min_m) {
  TORCH_CHECK_VALUE(min_m >= 1, "ScopedCrossover: min_m must be at least 1, got ", min_m);
  return min_m;
}

// The active table's value for this machine, else the built-in table's (a table file
// written before the crossovers were rows has none).
int64_t table_min_m(Crossover c) {
  const bool amd = features().amd;
  const Isa level = isa();
  const int64_t active = DenseTable::active().crossover_min_m(c, amd, level);
  if (active > 0) return active;
  const int64_t builtin = DenseTable::builtin().crossover_min_m(c, amd, level);
  TORCH_INTERNAL_ASSERT(builtin > 0, "the built-in CPU GEMM table has no crossover ", to_string(c));
  return builtin;
}

}  // namespace

const char* to_string(Crossover c) {
  switch (c) {
    case Crossover::kBf16Dot: return "bf16_dot";
    case Crossover::kW8a8Panels: return "w8a8_panels";
  }
  return "?";
}

Crossover parse_crossover(const std::string& name) {
  for (const auto c : {Crossover::kBf16Dot, Crossover::kW8a8Panels})
    if (name == to_string(c)) return c;
  TORCH_CHECK_VALUE(false, "unknown crossover \"", name, "\"; expected bf16_dot or w8a8_panels");
}

int64_t crossover_min_m(Crossover c) {
  const int64_t forced = overrides()[static_cast<size_t>(c)].load(std::memory_order_relaxed);
  if (forced != kNoOverride) return forced;
  static const std::array<int64_t, kCrossoverCount> from_table = [] {
    std::array<int64_t, kCrossoverCount> out{};
    for (const auto c : {Crossover::kBf16Dot, Crossover::kW8a8Panels}) out[static_cast<size_t>(c)] = table_min_m(c);
    return out;
  }();
  return from_table[static_cast<size_t>(c)];
}

ScopedCrossover::ScopedCrossover(Crossover c, int64_t min_m)
    : c_(c), previous_(overrides()[static_cast<size_t>(c)].exchange(checked(min_m))) {}

ScopedCrossover::~ScopedCrossover() { overrides()[static_cast<size_t>(c_)].store(previous_); }

}  // namespace tp::cpu
