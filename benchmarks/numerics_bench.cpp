#include "numerics_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>

#include "bench_block.h"
#include "bench_checkpoint.h"
#include "bench_util.h"
#include "machine_limits.h"
#include "tp/comm/launch.h"

namespace tp::bench {
namespace {

const std::vector<std::string> kRows{"qkv", "o", "gate_up", "down", "block"};

// One side's median over `iters` calls per round, collected over the rounds.
struct Times {
  std::vector<double> default_s, invariant_s;
};

}  // namespace

int run_numerics_rows(const BenchConfig& config) {
  TORCH_CHECK_VALUE(config.device.is_cpu() && config.formats == std::vector<std::string>{"none"},
                    "tp-bench --rows numerics: format none on the CPU (invariant numerics covers those)");
  const auto& s = config.shape;
  std::cout << "tp-bench --rows numerics: the block's layers with numerics=default and numerics=invariant, side by "
               "side\n"
            << "  machine: " << machine_description() << "; " << at::get_num_threads()
            << " intra-op threads (each of N ranks gets 1/N); ranks are threads of this process\n"
            << "  " << cpu_description() << "\n"
            << "  load average (1, 5, 15 min) at the start: " << load_average() << "\n"
            << "  shape: hidden " << s.hidden << ", intermediate " << s.intermediate << ", heads " << s.heads
            << ", kv_heads " << s.kv_heads << ", head_dim " << s.head_dim << "\n"
            << "  times: medians of " << config.timing.rounds << " alternating rounds (default, invariant) after "
            << config.timing.warmup << " warm-ups, the slowest rank; inv/def = the mode's cost\n"
            << "  bits: the invariant block's output at this TP equals TP 1's bit for bit\n\n";
  bool all_equal = true;
  std::cout << format("%-8s  %-7s  %2s  %4s  %10s  %12s  %7s  %5s\n", "dtype", "row", "TP", "M", "default ms",
                      "invariant ms", "inv/def", "bits")
            << std::string(68, '-') << "\n";
  for (const auto dtype : config.dtypes) {
    const auto file = ensure_checkpoint(config, "none", dtype);
    const Checkpoint ckpt = open_checkpoint(file.path);
    std::map<int64_t, at::Tensor> tp1_block;  // M -> the invariant block's output at TP 1
    for (const int64_t tp : config.tp_sizes) {
      for (const int64_t m : config.tokens) {
        const Inputs inputs = make_inputs(s, m, dtype, config.seed);
        std::vector<std::map<std::string, Times>> per_rank(tp);
        at::Tensor block_out;
        const int total_threads = at::get_num_threads();
        run_ranks_in_threads(tp, [&](Communicator& comm) {
          c10::InferenceMode inference;
          at::set_num_threads(std::max(1, total_threads / static_cast<int>(tp)));
          Layers def(s, {}, dtype, config.device, comm, ckpt, Numerics::kDefault);
          Layers inv(s, {}, dtype, config.device, comm, ckpt, Numerics::kInvariant);
          const RankInputs in_def = rank_inputs(inputs, def, config.device);
          const RankInputs in_inv = rank_inputs(inputs, inv, config.device);
          auto& times = per_rank[comm.rank()];
          for (const auto& row : kRows) {
            auto run = [&](Layers& l, const RankInputs& in) { return forward(row, l, in); };
            for (int w = 0; w < config.timing.warmup; ++w) {
              run(def, in_def);
              run(inv, in_inv);
            }
            // Iterations per round: about max_seconds / rounds per side, at least 1.
            const auto t0 = std::chrono::steady_clock::now();
            run(inv, in_inv);
            // Every rank must run the same number of calls (they hold collectives): the
            // slowest rank's time decides.
            const at::Tensor mine = at::full({1}, std::max(1e-6, seconds_since(t0)), at::kDouble);
            const double once = comm.all_gather(mine, 0, std::vector<int64_t>(tp, 1)).max().item<double>();
            const int iters = static_cast<int>(
                std::clamp(config.timing.max_seconds / config.timing.rounds / once, 1.0,
                           static_cast<double>(std::max(1, config.timing.max_iters / config.timing.rounds))));
            for (int r = 0; r < config.timing.rounds; ++r) {
              for (const bool invariant : {false, true}) {
                comm.barrier();
                const auto t = std::chrono::steady_clock::now();
                for (int i = 0; i < iters; ++i) invariant ? run(inv, in_inv) : run(def, in_def);
                (invariant ? times[row].invariant_s : times[row].default_s).push_back(seconds_since(t) / iters);
              }
            }
          }
          const at::Tensor out = forward("block", inv, in_inv);
          if (comm.rank() == 0) block_out = out.clone();
        });
        if (tp == config.tp_sizes.front() && tp == 1) tp1_block[m] = block_out;
        const auto it = tp1_block.find(m);
        const bool known = it != tp1_block.end();
        const bool equal = known && at::equal(it->second, block_out);
        all_equal = all_equal && (!known || equal);
        for (const auto& row : kRows) {
          double d = 0, v = 0;
          for (const auto& rank : per_rank) {
            d = std::max(d, median(rank.at(row).default_s));
            v = std::max(v, median(rank.at(row).invariant_s));
          }
          const std::string bits = row != "block" ? "" : !known ? "-" : equal ? "equal" : "DIFFER";
          std::cout << format("%-8s  %-7s  %2lld  %4lld  %10.3f  %12.3f  %7.2f  %5s\n", dtype_name(dtype).c_str(),
                              row.c_str(), static_cast<long long>(tp), static_cast<long long>(m), d * 1e3, v * 1e3,
                              v / d, bits.c_str());
        }
      }
    }
  }
  std::cout << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  return all_equal ? 0 : 1;
}

}  // namespace tp::bench
