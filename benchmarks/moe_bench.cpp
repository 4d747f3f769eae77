#include "moe_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "bench_checkpoint.h"
#include "cpu/dense/gemm.h"
#include "cpu/kernel_counts.h"
#include "machine_limits.h"
#include "tp/comm/launch.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quantize.h"

namespace tp::bench {
namespace {

constexpr const char* kPrefix = "moe";

// The global weights: a router [E, H] and per expert gate, up [I, H] and down [H, I]
// (N(0, 1/K), float32), stored in `format` as a checkpoint of that format stores them.
Checkpoint make_checkpoint(const BlockShape& s, const QuantConfig& format, uint64_t seed) {
  Checkpoint ckpt;
  auto gen = at::detail::createCPUGenerator(seed);
  const auto linear = [&](int64_t out, int64_t in) {
    return at::randn({out, in}, gen, at::kFloat).div_(std::sqrt(static_cast<double>(in)));
  };
  ckpt.add(std::string(kPrefix) + ".gate.weight", linear(s.experts, s.hidden));
  const auto add = [&](const std::string& prefix, int64_t out, int64_t in) {
    add_to_checkpoint(ckpt, prefix, quantize_weight(linear(out, in), format));
  };
  for (int64_t e = 0; e < s.experts; ++e) {
    const std::string p = std::string(kPrefix) + ".experts." + std::to_string(e) + ".";
    add(p + "gate_proj", s.moe_intermediate, s.hidden);
    add(p + "up_proj", s.moe_intermediate, s.hidden);
    add(p + "down_proj", s.hidden, s.moe_intermediate);
  }
  if (s.shared_intermediate > 0) {
    const std::string p = std::string(kPrefix) + ".shared_expert.";
    add(p + "gate_proj", s.shared_intermediate, s.hidden);
    add(p + "up_proj", s.shared_intermediate, s.hidden);
    add(p + "down_proj", s.hidden, s.shared_intermediate);
  }
  return ckpt;
}

// One forward's phases on the slowest rank (each phase its own slowest rank), and what
// the ranks read together.
struct Phases {
  double route = 0, experts = 0, shared = 0, reduce = 0, total = 0;
  double bytes = 0;        // expert weight bytes read, all ranks
  double experts_run = 0;  // experts run, all ranks (a TP-split expert counts once per rank)
};

Phases median_of(const std::vector<Phases>& runs) {
  const auto med = [&](double Phases::*field) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r.*field);
    return median(v);
  };
  return {med(&Phases::route), med(&Phases::experts), med(&Phases::shared),     med(&Phases::reduce),
          med(&Phases::total), med(&Phases::bytes),   med(&Phases::experts_run)};
}

struct Split {
  std::string name;
  int64_t world = 1, ep = 1;  // expert_parallel_size
};

struct CaseResult {
  Phases prefill, decode;
  at::Tensor out;      // rank 0's prefill and decode outputs, float64, for the error
  std::string kernel;  // the GEMM kernels the forwards ran (cpu::kernel_counts)
};

CaseResult run_case(const MoeBenchConfig& c, const Checkpoint& ckpt, const QuantConfig& format, c10::ScalarType dtype,
                    const Split& split, const at::Tensor& prefill, const at::Tensor& decode) {
  const auto& s = c.shape;
  const int64_t world = split.world;
  std::mutex mutex;
  // per (phase, round) the ranks' timings, merged under the lock
  std::map<std::pair<int, int64_t>, Phases> merged;
  CaseResult result;
  const int total_threads = at::get_num_threads();
  const int per_rank = std::max<int>(1, total_threads / static_cast<int>(world));
  const auto kernels_before = cpu::kernel_counts();
  const auto dense_before = cpu::dense_backend_counts();
  run_ranks_in_threads(world, [&](Communicator& comm) {
    at::set_num_threads(per_rank);
    MoEParallelMLP moe(MoEParallelMLPOptions(s.hidden, s.moe_intermediate, s.experts, s.top_k)
                           .shared_expert_intermediate_size(s.shared_intermediate)
                           .expert_parallel_size(split.ep)
                           .quant(format)
                           .shared_expert_quant(format)
                           .dtype(dtype),
                       comm);
    moe->load_weights(ckpt, kPrefix);
    moe->record_timings = true;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> outs;
    const auto run = [&](int phase, int64_t round, const at::Tensor& x) {
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor y = moe->forward(x);
      const double total = seconds_since(t0);
      if (round >= 0) {
        const auto& t = moe->timings;
        std::lock_guard<std::mutex> lock(mutex);
        auto& m = merged[{phase, round}];
        m.route = std::max(m.route, t.route_s);
        m.experts = std::max(m.experts, t.experts_s);
        m.shared = std::max(m.shared, t.shared_s);
        m.reduce = std::max(m.reduce, t.reduce_s);
        m.total = std::max(m.total, total);
        m.bytes += static_cast<double>(t.weight_bytes);
        m.experts_run += static_cast<double>(t.experts_run);
      }
      return y;
    };
    const int rounds = std::max(1, c.timing.rounds);
    for (int64_t round = -std::max(0, c.timing.warmup); round < rounds; ++round) {
      at::Tensor y = run(0, round, prefill);
      if (round == rounds - 1) outs.push_back(y.to(at::kDouble));
    }
    for (int64_t step = 0; step < decode.size(0); ++step) {
      at::Tensor y = run(1, step, decode[step]);
      outs.push_back(y.to(at::kDouble));
    }
    if (comm.rank() == 0) result.out = at::cat(outs, 0);
  });
  at::set_num_threads(total_threads);
  // The formats' own kernels (gemv/avx2, w8a8/avx2, ...), and the dense backends that
  // name no kernel of their own (at_linear, onednn, ...).
  std::string kernel = cpu::kernels_between(kernels_before, cpu::kernel_counts());
  for (const auto& [backend, n] : cpu::dense_backend_counts()) {
    const auto it = dense_before.find(backend);
    const std::string name = cpu::to_string(backend);
    if (n > (it == dense_before.end() ? 0 : it->second) && kernel.find(name + "/") == std::string::npos)
      kernel = (kernel == "-" ? "" : kernel + "+") + name;
  }
  result.kernel = kernel;
  std::vector<Phases> pre, dec;
  for (const auto& [key, p] : merged) (key.first == 0 ? pre : dec).push_back(p);
  result.prefill = median_of(pre);
  result.decode = median_of(dec);
  return result;
}

// Whether `format` quantizes its input activations (W8A8, FP8), probed on random values.
bool quantizes_activations(const QuantConfig& format) {
  const auto w = quantize_weight(at::randn({32, 128}, at::kFloat), format);
  const auto x = at::randn({2, 128}, at::kFloat);
  return !at::equal(quantize_activation(x, w, format), x);
}

// What a correct split can differ from the single device by: the same GEMMs on slices,
// their partial sums added in another order; and where the split cuts an expert's
// intermediate dimension (tp, tp2xep2) and the format quantizes activations, each rank
// quantizes its own slice of the down projection's input with that slice's scale (as a
// RowParallelLinear does: the layers' specified behaviour), which moves an element by up
// to a quantization step (int8: 1/127 of the slice's amax; FP8: 2^-4 of the element):
// measured 1.2e-2 to 1.9e-2 for int8_w8a8 on Qwen3-30B-A3B's layer (RESULTS.md,
// 2026-12-06). A wrong scale, slice or expert is off by O(1).
double bound(c10::ScalarType dtype, const QuantConfig& format, bool cuts_experts) {
  if (cuts_experts && quantizes_activations(format)) return 0.1;
  if (dtype == c10::kDouble) return 1e-12;
  if (dtype == c10::kFloat) return 1e-4;
  return 3e-2;
}

}  // namespace

int run_moe_rows(const MoeBenchConfig& c) {
  const auto& s = c.shape;
  TORCH_CHECK_VALUE(s.experts > 0 && s.top_k > 0 && s.moe_intermediate > 0,
                    "tp-bench --rows moe: the shape has no experts; use a mixture-of-experts preset "
                    "(qwen3-30b-a3b, mixtral-8x7b) or --experts N --top-k N --moe-intermediate N");
  std::cout << "tp-bench --rows moe: one tp::MoEParallelMLP of shape '" << s.name << "': hidden " << s.hidden << ", "
            << s.experts << " experts of " << s.moe_intermediate << ", top " << s.top_k;
  if (s.shared_intermediate > 0) std::cout << ", a shared expert of " << s.shared_intermediate;
  std::cout
      << ", random weights\n"
      << "  machine: " << machine_description() << "; " << at::get_num_threads()
      << " intra-op threads (each of N ranks gets 1/N of them); ranks are threads of this process\n"
      << "  " << cpu_description() << "\n"
      << "  load average (1, 5, 15 min) at the start: " << load_average() << "\n"
      << "  splits: 1dev = the single-device layer (the reference); tp = every expert split over the ranks;\n"
      << "    ep = the experts distributed over the ranks; tp2xep2 = two groups of two, each splitting its experts\n"
      << "  prefill: one forward of " << c.prefill << " tokens, median of " << c.timing.rounds << " after "
      << c.timing.warmup << " warm-ups; decode: one token, median over " << c.decode_steps << " different tokens\n"
      << "  phases (MoETimings, each the slowest rank's): route = router, top-k and sorting the tokens; experts ="
      << " the routed\n    experts' GEMMs; shared = the shared expert; reduce = the all-reduce; total = the"
      << " forward (slowest rank)\n"
      << "  experts/tok = expert passes per token, all ranks (a split expert counts once per rank); MB/tok ="
      << " expert weight\n    bytes read per token, all ranks (each expert a token ran, once per forward);"
      << " read = MB/tok over the\n    experts' and shared expert's time as a fraction of the machine's read"
      << " bandwidth (decode: the limit)\n"
      << "  rel_err = max |y - y_1dev| / max |y_1dev| over the prefill and decode outputs; '!' above the"
      << " bound (wider where a\n    split cuts the experts and the format quantizes activations: each rank"
      << " quantizes its own slice); kernel = the GEMM kernels run\n"
      << std::flush;
  const auto limits = measure_machine_limits();
  std::cout << "  " << limits.describe() << "\n" << std::flush;
  std::vector<Split> splits{{"1dev", 1, 1}};
  for (const auto w : c.tp_sizes) {
    if (w == 1) continue;
    splits.push_back({"tp", w, 1});
    splits.push_back({"ep", w, w});
    if (w == 4) splits.push_back({"tp2xep2", 4, 2});
  }
  auto gen = at::detail::createCPUGenerator(c.seed + 1);
  const auto prefill64 = at::randn({c.prefill, s.hidden}, gen, at::kDouble);
  const auto decode64 = at::randn({c.decode_steps, 1, s.hidden}, gen, at::kDouble);
  bool suspicious = false;
  Table table({"format", "dtype", "split", "ranks", "phase", "tokens", "route ms", "experts ms", "shared ms",
               "reduce ms", "total ms", "tok/s", "x 1dev", "experts/tok", "MB/tok", "read", "rel_err", "kernel"});
  for (const auto& name : c.formats) {
    const QuantConfig quant = parse_quant_config(name);
    std::cerr << "  writing the " << name << " weights\n" << std::flush;
    const Checkpoint ckpt = make_checkpoint(s, quant, c.seed);
    for (const auto dtype : c.dtypes) {
      const auto prefill = prefill64.to(dtype), decode = decode64.to(dtype);
      std::vector<std::pair<Split, CaseResult>> results;
      for (const auto& split : splits) {
        std::cerr << "  " << name << " " << dtype_name(dtype) << " " << split.name << " " << split.world << "\n"
                  << std::flush;
        results.emplace_back(split, run_case(c, ckpt, quant, dtype, split, prefill, decode));
      }
      const auto& ref = results.front().second;
      for (const auto& [split, r] : results) {
        const double err = ((r.out - ref.out).abs().max() / ref.out.abs().max()).item<double>();
        const bool bad = !(err <= bound(dtype, quant, split.world / split.ep > 1));
        suspicious = suspicious || bad;
        for (int phase = 0; phase < 2; ++phase) {
          const Phases& p = phase == 0 ? r.prefill : r.decode;
          const Phases& p1 = phase == 0 ? ref.prefill : ref.decode;
          const int64_t tokens = phase == 0 ? c.prefill : 1;
          const double mb = p.bytes / tokens / 1e6;
          const double read = p.bytes / std::max(1e-12, p.experts + p.shared) / 1e9 / limits.read_gb_s;
          table.add({name, dtype_name(dtype), split.name, std::to_string(split.world),
                     phase == 0 ? "prefill" : "decode", std::to_string(tokens), format("%.3f", p.route * 1e3),
                     format("%.3f", p.experts * 1e3), format("%.3f", p.shared * 1e3), format("%.3f", p.reduce * 1e3),
                     format("%.3f", p.total * 1e3), format("%.1f", tokens / p.total),
                     format("%.2f", p1.total / p.total), format("%.2f", p.experts_run / tokens), format("%.2f", mb),
                     format("%.0f%%", 100 * read), format("%.2e%s", err, bad ? "!" : ""), r.kernel});
        }
      }
    }
  }
  std::cout << "\n" << table.str() << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  if (suspicious) std::cerr << "tp-bench --rows moe: an output error is above its bound\n";
  return suspicious ? 1 : 0;
}

}  // namespace tp::bench
