#pragma once
// Per-layer benchmark: each TP layer of a Transformer block against at::linear on the
// full weights, for several TP sizes and token counts. Correctness first (error vs a
// float64 single-device reference), then the time ratio, measured side by side.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "bench_util.h"

namespace tp::bench {

/// The shapes of one Transformer block.
struct BlockShape {
  std::string name;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

/// The built-in default block (issue: hidden 2048, intermediate 5632, 16 heads, 4 KV heads, head_dim 128).
BlockShape default_block();

/// The layers a block has, by name: "column" (a plain ColumnParallelLinear
/// hidden -> intermediate), "qkv", "o", "gate_up", "down".
const std::vector<std::string>& all_layers();

struct LayerBenchConfig {
  BlockShape shape = default_block();
  std::vector<std::string> layers = all_layers();
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<int64_t> tokens{1, 256};
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;  // on CUDA, TP > 1 ranks share the one GPU
  TimingPolicy timing;
  uint64_t seed = 1234;
};

struct LayerResult {
  std::string layer;
  int64_t tp = 1, tokens = 1;
  int64_t out_features = 0, in_features = 0;  // global GEMM shape: [tokens, in] x [in, out]
  double max_abs_err = 0.0;                   // TP output vs float64 at::linear on full weights
  double reference_s = 0.0;                   // median at::linear, full weights, all threads
  double tp_s = 0.0;                          // median TP forward, slowest rank per iteration
  double ratio() const { return reference_s > 0 ? tp_s / reference_s : 0.0; }
};

/// Runs every (layer, tp, tokens) case; `progress` is called before each.
std::vector<LayerResult> run_layer_bench(const LayerBenchConfig& config,
                                         const std::function<void(const std::string&)>& progress);

/// The results as a table.
std::string layer_table(const std::vector<LayerResult>& results);

}  // namespace tp::bench
