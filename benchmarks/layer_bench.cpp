#include "layer_bench.h"

#include "bench_block.h"
#include "bench_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <malloc.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "cpu/kernel_counts.h"
#include "tp/tp.h"

namespace tp::bench {

// ---- presets and rows ------------------------------------------------------------------

const std::vector<BlockShape>& presets() {
  // From each model's Hugging Face config.json: hidden_size, intermediate_size,
  // num_attention_heads, num_key_value_heads, head_dim.
  static const std::vector<BlockShape> all{
      {"default", 2048, 5632, 16, 4, 128},
      {"llama3-8b", 4096, 14336, 32, 8, 128},
      {"llama3-70b", 8192, 28672, 64, 8, 128},
      {"qwen3-32b", 5120, 25600, 64, 8, 128},
      {"mistral-7b", 4096, 14336, 32, 8, 128, "mistral"},
      {"phi3-mini", 3072, 8192, 32, 32, 96, "phi3"},
      {"gemma2-9b", 3584, 14336, 16, 8, 256, "gemma2"},
      // Mixtures of experts (their config.json's num_experts / num_local_experts,
      // num_experts_per_tok, moe_intermediate_size): the moe row's layer.
      {"qwen3-30b-a3b", 2048, 6144, 32, 4, 128, "qwen3_moe", 128, 8, 768},
      {"mixtral-8x7b", 4096, 14336, 32, 8, 128, "mixtral", 8, 2, 14336},
  };
  return all;
}

BlockShape preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  TORCH_CHECK_VALUE(false, "tp-bench: unknown preset '", name, "' (presets: ", names, ")");
}

const std::vector<std::string>& all_rows() {
  static const std::vector<std::string> rows{"qkv", "o", "gate_up", "down", "block"};
  return rows;
}

const char* block_description() {
  return "qkv -> Q (standing in for the attention output: no attention math, norms or residuals) -> o -> "
         "AllReduce -> gate_up -> SiLU(gate)*up -> down -> AllReduce";
}

namespace {

// ---- one TP size: load, then measure every case ------------------------------------------------

// Per-rank doubles gathered on every rank: result[r] is rank r's vector.
std::vector<std::vector<double>> gather(const Communicator& comm, const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size()), world = comm.world_size();
  if (world == 1) return {values};
  const auto t = at::tensor(values, at::kDouble);
  const auto all = comm.all_gather(t, 0, std::vector<int64_t>(world, n)).contiguous();
  std::vector<std::vector<double>> out(world);
  for (int64_t r = 0; r < world; ++r)
    out[r].assign(all.data_ptr<double>() + r * n, all.data_ptr<double>() + (r + 1) * n);
  return out;
}

struct Shapes {
  int64_t in, out;
  double flops, bytes;
};

// The global GEMMs of a row (the block: all four), for FLOP and byte counts.
Shapes row_shapes(const std::string& row, const BlockShape& s, int64_t m, int64_t act_bytes, const Checkpoint& ckpt) {
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  struct G {
    int64_t in, out, weight;
  };
  const G qkv{s.hidden, q + 2 * kv, stored_bytes(ckpt, kQ) + stored_bytes(ckpt, kK) + stored_bytes(ckpt, kV)};
  const G o{q, s.hidden, stored_bytes(ckpt, kO)};
  const G gate_up{s.hidden, 2 * s.intermediate, stored_bytes(ckpt, kGate) + stored_bytes(ckpt, kUp)};
  const G down{s.intermediate, s.hidden, stored_bytes(ckpt, kDown)};
  const bool block = row == "block";
  std::vector<G> gemms;
  if (block || row == "qkv") gemms.push_back(qkv);
  if (block || row == "o") gemms.push_back(o);
  if (block || row == "gate_up") gemms.push_back(gate_up);
  if (block || row == "down") gemms.push_back(down);
  Shapes sh{gemms[0].in, gemms[0].out, 0.0, 0.0};
  for (const auto& g : gemms) {
    sh.flops += 2.0 * m * g.in * g.out;
    sh.bytes += static_cast<double>(g.weight) + static_cast<double>(m) * (g.in + g.out) * act_bytes;
  }
  return sh;
}

double error_bound(c10::ScalarType dtype, const std::string& format) {
  // Quantized: vs the float64 model of the same kernel, which quantizes each layer's
  // input as the layers do (per rank slice on row layers); what remains is the GEMM's
  // rounding and the few activations whose quantization rounds the other way after it.
  // Measured worst over every format at TP 1-3: 4.2e-3 float32, 8.8e-3 bf16; the bounds
  // are ~3.5x that (benchmarks/RESULTS.md, 2026-12-03 (evening), "tp-bench's bound").
  if (parse_quant_config(format).format != QuantFormat::kNone)
    return dtype == c10::kFloat || dtype == c10::kDouble ? 1.5e-2 : 3e-2;
  if (dtype == c10::kDouble) return 1e-10;
  if (dtype == c10::kFloat) return 1e-4;
  return 3e-2;
}

std::string taken_between(const std::map<AllReduceStrategy, int64_t>& before,
                          const std::map<AllReduceStrategy, int64_t>& after) {
  std::string taken;
  for (const auto& [strategy, count] : after) {
    const auto it = before.find(strategy);
    if (count > (it == before.end() ? 0 : it->second))
      taken += (taken.empty() ? "" : "+") + std::string(to_string(strategy));
  }
  return taken.empty() ? "-" : taken;
}

struct TpRun {
  const BenchConfig& config;
  const std::string& quant_format;
  c10::ScalarType dtype;
  const std::string& ckpt_path;
  const Reference& ref;
  const std::map<int64_t, Inputs>& inputs;                                // by M
  const std::map<std::pair<int64_t, std::string>, at::Tensor>& expected;  // by (M, row), float64 CPU
  // Quantized formats at TP > 1: the row layers' rows again, with this run's splits
  // (written after the load: by rank 0 for ranks that are threads, else by each process).
  std::map<std::pair<int64_t, std::string>, at::Tensor>& expected_split;
  const Checkpoint& ckpt_meta;  // the same file, for byte counts
  int64_t tp;
  Progress& progress;
  std::vector<RowResult>& rows_out;
  LoadResult& load_out;

  void rank_body(Communicator& comm) const;
};

void TpRun::rank_body(Communicator& comm) const {
  c10::InferenceMode inference;  // no autograd bookkeeping, for the layers and the reference alike
  const bool rank0 = comm.rank() == 0;
  const int total_threads = at::get_num_threads();
  // The ranks share this machine's cores: each gets its share, as separate processes
  // pinned to their own cores would. The reference (rank 0, others waiting) gets all.
  const int threads_per_rank = std::max(1, total_threads / static_cast<int>(tp));
  at::set_num_threads(threads_per_rank);
  const bool cuda = config.device.is_cuda();
  auto sync = [cuda] {
    if (cuda) torch::cuda::synchronize();
  };

  // ---- loading. Peak RSS: a process's VmHWM during the loads minus its VmRSS before.
  // Ranks as threads share one process (rank 0 measures it: all ranks together);
  // ranks as processes each measure their own.
  const bool measures_memory = rank0 || config.ranks_are_processes;
  int64_t rss_before = 0;
  bool peak_reset = false;
  if (measures_memory) {
    malloc_trim(0);  // so freed heap from an earlier TP size does not hide this load's growth
    peak_reset = reset_peak_rss();
    rss_before = proc_status_kib("VmRSS");
  }
  comm.barrier();
  const auto t_load = std::chrono::steady_clock::now();
  const auto ckpt = open_checkpoint(ckpt_path);
  Layers layers(config.shape, parse_quant_config(quant_format), dtype, config.device, comm, ckpt);
  sync();
  const double load_s = seconds_since(t_load);
  comm.barrier();
  const double peak = measures_memory && peak_reset ? (proc_status_kib("VmHWM") - rss_before) * 1024.0 : -1.0;
  const auto load_stats = gather(comm, {load_s, static_cast<double>(layers.bytes()), peak});
  if (rank0) {
    load_out.tp = tp;
    load_out.ranks = config.ranks_are_processes ? "processes" : "threads";
    for (const auto& r : load_stats) {
      load_out.load_s = std::max(load_out.load_s, r[0]);
      load_out.shard_bytes = std::max(load_out.shard_bytes, static_cast<int64_t>(r[1]));
      load_out.peak_rss_delta = std::max(load_out.peak_rss_delta, static_cast<int64_t>(r[2]));
    }
  }

  if (ref.quantized && tp > 1) {
    if (rank0 || config.ranks_are_processes) {
      at::set_num_threads(total_threads);
      const RowSplits splits{layers.o->ranges(), layers.down->ranges()};
      for (const auto& row : config.rows) {
        if (row != "o" && row != "down" && row != "block") continue;
        for (auto& [m, y] : ref.expected(row, inputs, splits)) expected_split[{m, row}] = std::move(y);
      }
      at::set_num_threads(threads_per_rank);
    }
    comm.barrier();
  }

  const auto& timing = config.timing;
  for (const auto strategy : config.allreduce) {
    for (const auto& [m, in_global] : inputs) {
      const auto in = rank_inputs(in_global, layers, config.device);
      Inputs ref_in{in_global.hidden.to(config.device), in_global.attn.to(config.device),
                    in_global.inter.to(config.device)};
      const auto comm_buffer = at::randn({m, config.shape.hidden}, at::TensorOptions(dtype).device(config.device));
      for (const auto& row : config.rows) {
        if (rank0)
          progress.step(format("%s %s AR=%s TP=%lld M=%lld %s", quant_format.c_str(), dtype_name(dtype).c_str(),
                               to_string(strategy), (long long)tp, (long long)m, row.c_str()));
        const bool has_comm = row == "o" || row == "down" || row == "block";
        const int reductions = row == "block" ? 2 : 1;
        layers.set_reduce(true, strategy);

        // The sides of the case. TP sides run on every rank; the reference on rank 0
        // with all threads while the others wait.
        auto run_tp = [&] { (void)forward(row, layers, in); };
        auto run_gemm = [&] {
          layers.set_reduce(false, strategy);
          (void)forward(row, layers, in);
          layers.set_reduce(true, strategy);
        };
        std::vector<at::Tensor> buffers(reductions);
        auto run_comm = [&] {
          for (auto& b : buffers) comm.all_reduce(b, strategy);
        };
        auto refill = [&] {
          for (auto& b : buffers) b = comm_buffer.clone();
        };
        auto run_ref = [&] { (void)ref.forward(row, ref_in); };

        // Warm-up, and a probe that sets how many iterations fit the time budget.
        double probe = 0.0;
        for (int i = 0; i < timing.warmup; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          run_tp();
          sync();
          probe = std::max(probe, seconds_since(t0));
          if (has_comm) {
            run_gemm();
            refill();
            run_comm();
            sync();
          }
        }
        if (rank0) {
          at::set_num_threads(total_threads);
          for (int i = 0; i < timing.warmup; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            run_ref();
            sync();
            probe = std::max(probe, seconds_since(t0));
          }
          at::set_num_threads(threads_per_rank);
        }
        auto probe_t = at::full({1}, probe, at::kDouble);
        comm.broadcast(probe_t, 0);
        probe = std::max(probe_t.item<double>(), 1e-6);
        const int rounds = std::max(1, timing.rounds);
        const int per_round = std::clamp(static_cast<int>(timing.max_seconds / probe / rounds), 1,
                                         std::max(1, timing.max_iters / rounds));
        const int iters = rounds * per_round;

        std::vector<double> t_ref, t_tp, t_gemm, t_comm;
        auto timed = [&](const std::function<void()>& fn, std::vector<double>& out,
                         const std::function<void()>& before = nullptr) {
          for (int i = 0; i < per_round; ++i) {
            if (before) before();
            comm.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            fn();
            sync();
            out.push_back(seconds_since(t0));
          }
        };
        std::map<AllReduceStrategy, int64_t> counts_before, counts_after;
        std::map<std::string, int64_t> kernels_before, kernels_after;
        for (int round = 0; round < rounds; ++round) {
          comm.barrier();
          if (rank0) {
            at::set_num_threads(total_threads);
            for (int i = 0; i < per_round; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              run_ref();
              sync();
              t_ref.push_back(seconds_since(t0));
            }
            at::set_num_threads(threads_per_rank);
          }
          if (round == 0) counts_before = comm.all_reduce_counts(), kernels_before = tp::cpu::kernel_counts();
          timed(run_tp, t_tp);
          if (round == 0) counts_after = comm.all_reduce_counts(), kernels_after = tp::cpu::kernel_counts();
          if (has_comm) {
            timed(run_gemm, t_gemm);
            timed(run_comm, t_comm, refill);
          }
        }

        // Correctness: this rank's output vs its part of the reference.
        const auto y = forward(row, layers, in).cpu().to(at::kDouble);
        const auto split = expected_split.find({m, row});
        const auto want =
            rank_part(row, layers, config.shape, split != expected_split.end() ? split->second : expected.at({m, row}));
        const double max_abs = y.numel() ? (y - want).abs().max().item<double>() : 0.0;
        const double err_norm = (y - want).norm().item<double>(), want_norm = want.norm().item<double>();

        // Every rank's samples and errors, to rank 0.
        std::vector<double> mine{max_abs, err_norm, want_norm};
        mine.insert(mine.end(), t_tp.begin(), t_tp.end());
        mine.insert(mine.end(), t_gemm.begin(), t_gemm.end());
        mine.insert(mine.end(), t_comm.begin(), t_comm.end());
        const auto all = gather(comm, mine);
        if (!rank0) continue;
        RowResult r;
        r.row = row;
        r.format = quant_format;
        r.dtype = dtype_name(dtype);
        r.allreduce = to_string(strategy);
        r.allreduce_taken = has_comm && tp > 1 ? taken_between(counts_before, counts_after) : "-";
        // Process-wide counts: with ranks as threads, every rank's calls (all run the same kernels).
        r.kernel = tp::cpu::kernels_between(kernels_before, kernels_after);
        r.tp = tp;
        r.tokens = m;
        const auto sh = row_shapes(row, config.shape, m, static_cast<int64_t>(c10::elementSize(dtype)), ckpt_meta);
        r.in_features = sh.in;
        r.out_features = sh.out;
        r.flops = sh.flops;
        r.bytes = sh.bytes;
        auto slowest = [&](size_t offset) {
          std::vector<double> worst(iters, 0.0);
          for (const auto& rank : all)
            for (int i = 0; i < iters; ++i) worst[i] = std::max(worst[i], rank[offset + i]);
          return median(worst);
        };
        for (const auto& rank : all) {
          r.max_abs_err = std::max(r.max_abs_err, rank[0]);
          r.rel_err = std::max(r.rel_err, rank[2] > 0 ? rank[1] / rank[2] : rank[1]);
        }
        r.reference_s = median(t_ref);
        r.tp_s = slowest(3);
        r.gemm_s = has_comm ? slowest(3 + iters) : r.tp_s;
        r.comm_s = has_comm ? slowest(3 + 2 * iters) : 0.0;
        r.suspicious = !(r.rel_err <= error_bound(dtype, quant_format));
        rows_out.push_back(r);
      }
    }
  }
  at::set_num_threads(total_threads);
}

}  // namespace

BenchResults run_bench(const BenchConfig& config, const RankLauncher& launcher) {
  BenchResults results;
  const int64_t total = static_cast<int64_t>(config.dtypes.size() * config.formats.size() * config.tp_sizes.size() *
                                             config.allreduce.size() * config.tokens.size() * config.rows.size());
  for (const auto& row : config.rows) {
    TORCH_CHECK_VALUE(std::find(all_rows().begin(), all_rows().end(), row) != all_rows().end(),
                      "tp-bench: unknown row '", row, "' (rows: qkv, o, gate_up, down, block)");
  }
  for (const auto& f : config.formats) (void)parse_quant_config(f);  // refuse unknown formats before any work
  Progress progress(total);
  CommunicatorOptions comm_options;
  comm_options.verify_calls = config.verify_calls;
  for (const auto dtype : config.dtypes) {
    for (const auto& format : config.formats) {
      const auto file = ensure_checkpoint(config, format, dtype);
      const auto ckpt = open_checkpoint(file.path);
      const auto ref = make_reference(config, format, dtype, ckpt);
      std::map<int64_t, Inputs> inputs;
      std::map<std::pair<int64_t, std::string>, at::Tensor> expected;
      {
        c10::InferenceMode inference;
        for (const auto m : config.tokens) inputs[m] = make_inputs(config.shape, m, dtype, config.seed);
        for (const auto& row : config.rows)
          for (auto& [m, y] : ref.expected(row, inputs)) expected[{m, row}] = std::move(y);
      }
      for (const auto tp : config.tp_sizes) {
        LoadResult load;
        load.format = format;
        load.dtype = dtype_name(dtype);
        load.checkpoint = file.path;
        load.written = file.written && tp == config.tp_sizes.front();
        load.write_s = load.written ? file.write_s : 0.0;
        std::vector<RowResult> rows;
        std::map<std::pair<int64_t, std::string>, at::Tensor> expected_split;
        TpRun run{config,         format, dtype, file.path, ref,  inputs, expected,
                  expected_split, ckpt,   tp,    progress,  rows, load};
        auto body = [&](Communicator& comm) { run.rank_body(comm); };
        if (launcher) {
          launcher(tp, body);
        } else if (tp == 1) {
          Communicator single;  // TP=1 is the user's path: the same layers, a no-op communicator
          body(single);
        } else {
          run_ranks_in_threads(tp, body, comm_options);
        }
        if (rows.empty()) continue;  // not rank 0 of a process launch: rank 0 reports
        results.rows.insert(results.rows.end(), rows.begin(), rows.end());
        results.loads.push_back(load);
      }
    }
  }
  progress.finish();
  return results;
}

void prepare_checkpoints(const BenchConfig& config) {
  for (const auto dtype : config.dtypes)
    for (const auto& format : config.formats) (void)ensure_checkpoint(config, format, dtype);
}

}  // namespace tp::bench
