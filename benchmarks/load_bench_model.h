#pragma once
// tp-load-bench --model: the loading table of CausalLM::from_pretrained (load_bench_model.cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace tp::bench {

/// The generated folder's shape, the TP sizes and formats measured, and where it goes.
struct ModelLoadConfig {
  int64_t hidden = 2048, intermediate = 5632, layers = 8, vocab = 32000, heads = 16, kv_heads = 4;
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<bool> formats{false, true};  // false: bfloat16; true: fp8_block
  std::string dir;
  int port = 29750;
  bool check = false;     // exit 1 when a rank's peak anonymous memory exceeds its bound
  bool draw_rows = true;  // also each bfloat16 row with the model drawn first (the load before issue 46)
  int threads = 0;        // intra-op threads per rank; 0: the hardware threads over the TP size
};

/// The table (and, with check, the verdict): 0 when every rank kept within its bound.
int run_model_load(const ModelLoadConfig& config);
/// One rank, as a child process: prints "load_s held_bytes largest_tensor_bytes
/// peak_rss_kib peak_anon_kib first_forward_anon_kib kept_anon_kib". `draw`: the load as it was before
/// issue 46, for comparison: the model drawn at random (init_weights(true)), then loaded. `threads`: as
/// ModelLoadConfig::threads.
int run_model_load_child(const std::string& folder, int64_t world, int64_t rank, int port, bool draw, int threads);

}  // namespace tp::bench
