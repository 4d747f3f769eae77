#pragma once
// tp-bench's `model` row (tp-bench --rows model): a whole tp::CausalLM of a preset's
// shape with a few decoder layers, built from a Hugging Face folder this writes once
// (config.json + model.safetensors, random weights, cached), at each TP size against
// the TP=1 run of the same folder:
//   prefill: one forward of `prefill` tokens (batch 1, into a fresh KV cache);
//   decode:  one forward of 1 token after them (M = 1 with the KV cache);
// tokens per second of each, their ratio to TP=1's, and the error of the logits (the
// prefill's last position, gathered) and whether the greedy tokens of the decode steps
// equal TP=1's. Ranks are threads of this process.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "bench_util.h"
#include "layer_bench.h"

namespace tp::bench {

struct ModelBenchConfig {
  BlockShape shape;
  int64_t layers = 2;
  int64_t vocab = 32000;
  int64_t prefill = 256;
  int64_t decode_steps = 16;  // decode timings: the median over these steps (each after the previous)
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<c10::ScalarType> dtypes{c10::kFloat};
  TimingPolicy timing;
  std::string ckpt_dir;  // empty: ~/.cache/tp/bench
  uint64_t seed = 1234;
};

/// Runs the rows and prints the table; returns 1 if an error is above its dtype's
/// bound (the TP model is wrong), else 0.
int run_model_rows(const ModelBenchConfig& config);

}  // namespace tp::bench
