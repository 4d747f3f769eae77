#pragma once
// tp-bench's engine: one Transformer block's linear layers (QKV, O, gate_up, down)
// and the block they make, at several TP sizes, token counts, weight formats,
// AllReduce strategies and dtypes, each against a single-device reference built
// from the same global weights. Correctness first (error vs the reference), then
// time: the reference, the TP forward, and the TP forward split into its GEMM part
// and its communication part, all measured side by side.
//
// Weights come from a safetensors checkpoint written once (cached), which every
// rank opens and loads its shard of; loading time and memory are reported too.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "bench_util.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"

namespace tp::bench {

/// The shapes of one Transformer block (one layer of a model).
struct BlockShape {
  std::string name;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  /// The model_type of the `model` row's folder: llama, mistral, phi3 or gemma2.
  std::string family = "llama";
  /// A mixture of experts (the `moe` row): experts, chosen per token, one expert's
  /// intermediate size, the shared expert's (0: none). 0 experts: a dense model.
  int64_t experts = 0, top_k = 0, moe_intermediate = 0, shared_intermediate = 0;
};

/// The built-in presets: "default" (hidden 2048, intermediate 5632, 16 heads, 4 KV
/// heads, head_dim 128: small enough for a quick run), and one layer of
/// "llama3-8b", "llama3-70b", "qwen3-32b", "mistral-7b", "phi3-mini" and "gemma2-9b"
/// (their Hugging Face config.json; the model row builds that family), and the
/// mixtures of experts "qwen3-30b-a3b" and "mixtral-8x7b" (the moe row).
const std::vector<BlockShape>& presets();
/// The preset named `name`; an error listing the presets otherwise.
BlockShape preset(const std::string& name);

/// Rows of the table: "qkv", "o", "gate_up", "down" (each layer on its own) and
/// "block" (the four chained, with two AllReduces; see block_description()).
const std::vector<std::string>& all_rows();
/// What the "block" row computes, for the header.
const char* block_description();

struct BenchConfig {
  BlockShape shape = presets().front();
  std::vector<std::string> rows = all_rows();
  std::vector<int64_t> tp_sizes{1, 2};
  std::vector<int64_t> tokens{1, 64};
  std::vector<std::string> formats{"none"};  // quant formats by name
  std::vector<AllReduceStrategy> allreduce{AllReduceStrategy::kAuto};
  std::vector<c10::ScalarType> dtypes{c10::kFloat};
  c10::Device device = c10::kCPU;  // on CUDA, TP > 1 ranks share the one GPU
  TimingPolicy timing;
  std::string ckpt_dir;              // where checkpoints are cached; empty: ~/.cache/tp/bench
  bool verify_calls = false;         // the communicator's per-collective shape check (costs a small allgather)
  bool ranks_are_processes = false;  // set by a RankLauncher that runs each rank in its own process
  uint64_t seed = 1234;
};

/// One row of the table: a layer (or the block) at one setting.
struct RowResult {
  std::string row, format, dtype, allreduce;  // allreduce: as requested
  std::string allreduce_taken;                // what the reductions used ("-" when there are none)
  int64_t tp = 1, tokens = 1;
  int64_t in_features = 0, out_features = 0;  // the global GEMM [tokens, in] x [in, out] ("block": its first)
  double flops = 0.0;                         // of the global problem, 2 * M * K * N summed over GEMMs
  double bytes = 0.0;                         // weights as stored + activations in and out, summed over GEMMs
  double max_abs_err = 0.0;                   // worst rank: max |TP - reference| over its part of the output
  double rel_err = 0.0;                       // worst rank: ||TP - reference|| / ||reference|| over its part
  double reference_s = 0.0;                   // median, single device, all threads
  double tp_s = 0.0;                          // median TP forward, slowest rank per iteration
  double gemm_s = 0.0;                        // median TP forward without its AllReduces, slowest rank
  double comm_s = 0.0;                        // median of the AllReduces alone, slowest rank (0: none)
  bool suspicious = false;                    // rel_err above the dtype's bound
  std::string kernel = "-";                   // the GEMM kernels the TP forward ran (rank 0's process), '+'-joined
  double limit_fraction = 0.0;                // of the binding machine limit (set by tp-bench's main; CPU only)
  std::string limit;                          // "mem", "fp32", "bf16"; empty: not measured
  double ratio() const { return reference_s > 0 ? tp_s / reference_s : 0.0; }
  double gflops() const { return tp_s > 0 ? flops / tp_s * 1e-9 : 0.0; }
  double gbytes_per_s() const { return tp_s > 0 ? bytes / tp_s * 1e-9 : 0.0; }
};

/// Loading one TP size's shards of one checkpoint.
struct LoadResult {
  std::string format, dtype, checkpoint;
  bool written = false;  // this run wrote the checkpoint (else it was cached)
  double write_s = 0.0;
  int64_t tp = 1;
  std::string ranks = "threads";  // or "processes"
  double load_s = 0.0;            // slowest rank: open_checkpoint + constructing and loading the 4 layers
  int64_t shard_bytes = 0;        // largest rank's parameters and buffers after loading
  int64_t peak_rss_delta = -1;    // VmHWM during the loads minus VmRSS before, of the largest process (ranks as
                                  // threads: one process for all ranks); -1 where the peak could not be reset
};

struct BenchResults {
  std::vector<RowResult> rows;
  std::vector<LoadResult> loads;
};

/// Runs `body(comm)` on every rank of a TP group of `world` ranks and returns when
/// all are done. The default runs ranks as threads of this process (world 1: on
/// this thread, with a no-op communicator).
using RankLauncher = std::function<void(int64_t world, const std::function<void(Communicator&)>& body)>;

/// Runs every case of `config`, with a progress line on stderr. With a launcher that
/// runs this process as one rank of several, only rank 0 returns results.
BenchResults run_bench(const BenchConfig& config, const RankLauncher& launcher = {});

/// Writes every checkpoint `config` needs (if not cached), so processes started
/// afterwards only read them.
void prepare_checkpoints(const BenchConfig& config);

}  // namespace tp::bench
