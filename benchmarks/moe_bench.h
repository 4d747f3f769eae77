#pragma once
// tp-bench's `moe` row (tp-bench --rows moe): one mixture-of-experts layer
// (tp::MoEParallelMLP) of a preset's shape (Qwen3-30B-A3B: 128 experts of 768, top 8;
// Mixtral-8x7B: 8 of 14336, top 2), random weights in the requested formats, at each TP
// size split two ways, expert tensor parallelism (every rank a slice of every expert) and
// expert parallelism (the experts distributed), against the single-device layer:
//   prefill: one forward of `prefill` tokens;
//   decode:  one forward of 1 token (median over `decode_steps` different tokens);
// each forward's time split into routing, the expert GEMMs, the shared expert and the
// all-reduce (MoETimings), the experts a token ran, the expert weight bytes a decode token
// read (all ranks) and that as a fraction of the machine's measured read bandwidth, and
// the output's error vs the single-device layer of the same dtype and format. Ranks are
// threads of this process.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "bench_util.h"
#include "layer_bench.h"

namespace tp::bench {

struct MoeBenchConfig {
  BlockShape shape;  // experts, top_k, moe_intermediate (and shared_intermediate) set
  int64_t prefill = 256;
  int64_t decode_steps = 16;
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<c10::ScalarType> dtypes{c10::kFloat};
  std::vector<std::string> formats{"none"};
  TimingPolicy timing;
  uint64_t seed = 1234;
};

/// Runs the rows and prints the table; returns 1 if an output error is above its bound
/// (the split layer disagrees with the single-device one), else 0.
int run_moe_rows(const MoeBenchConfig& config);

}  // namespace tp::bench
