#pragma once
// tp-bench --rows lora: the block's four TP layers (qkv, o, gate_up, down, each on its own
// input as the block row runs them) with LoRA adapters of rank 16 on every layer, side by
// side with the same layers without: 0 adapters, 1 (every token takes it) and 4 (the
// tokens take them in turn; one at M = 1) per token count and TP size. The limit printed
// beside each: the adapters' bytes over the base's, what a memory-bound forward pays.

#include <cstdint>
#include <vector>

#include <c10/core/ScalarType.h>

#include "layer_bench.h"

namespace tp::bench {

struct LoraBenchConfig {
  BlockShape shape;
  std::vector<int64_t> tokens{1, 16, 256};
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<c10::ScalarType> dtypes{c10::kBFloat16};
  int64_t rank = 16;
  int64_t iterations = 7;  // timed rounds of the three sides, alternating, after 2 warm-up rounds
  uint64_t seed = 1234;
};

int run_lora_rows(const LoraBenchConfig& config);

}  // namespace tp::bench
