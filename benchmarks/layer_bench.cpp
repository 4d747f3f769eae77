#include "layer_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tp/tp.h"

namespace tp::bench {

BlockShape default_block() { return {"default", 2048, 5632, 16, 4, 128}; }

const std::vector<std::string>& all_layers() {
  static const std::vector<std::string> layers{"column", "qkv", "o", "gate_up", "down"};
  return layers;
}

namespace {

// The global weights of one layer, as a checkpoint and as the single-device weight.
struct LayerWeights {
  Checkpoint checkpoint;
  at::Tensor full_weight;  // [out, in], the dtype under test: what at::linear multiplies
  int64_t in = 0, out = 0;
};

at::Tensor random_weight(int64_t out, int64_t in, uint64_t seed, c10::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed);
  return (at::randn({out, in}, gen, at::kFloat) / std::sqrt(static_cast<double>(in))).to(dtype);
}

LayerWeights make_weights(const std::string& layer, const BlockShape& s, c10::ScalarType dtype, uint64_t seed) {
  LayerWeights w;
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  auto add = [&](const std::string& name, int64_t out, int64_t in) {
    auto t = random_weight(out, in, seed++, dtype);
    w.checkpoint.add(name + ".weight", t);
    return t;
  };
  if (layer == "column") {
    w.full_weight = add("up_proj", s.intermediate, s.hidden);
  } else if (layer == "qkv") {
    w.full_weight = at::cat({add("attn.q_proj", q, s.hidden), add("attn.k_proj", kv, s.hidden),
                             add("attn.v_proj", kv, s.hidden)});
  } else if (layer == "o") {
    w.full_weight = add("o_proj", s.hidden, q);
  } else if (layer == "gate_up") {
    w.full_weight = at::cat({add("mlp.gate_proj", s.intermediate, s.hidden), add("mlp.up_proj", s.intermediate, s.hidden)});
  } else if (layer == "down") {
    w.full_weight = add("down_proj", s.hidden, s.intermediate);
  } else {
    TORCH_CHECK_VALUE(false, "tp-bench: unknown layer '", layer, "' (layers: column, qkv, o, gate_up, down)");
  }
  w.out = w.full_weight.size(0);
  w.in = w.full_weight.size(1);
  return w;
}

// One rank's layer as a forward function plus which columns of the reference its
// output corresponds to (column layers: a slice per segment; row layers: all of it).
struct RankLayer {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<at::Tensor(const at::Tensor&)> input_of;           // global x -> this rank's input
  std::function<at::Tensor(const at::Tensor&)> expected_of;        // global y -> this rank's expected y
};

RankLayer build(const std::string& layer, const BlockShape& s, c10::ScalarType dtype, at::Device device,
                const Checkpoint& ckpt, Communicator& comm) {
  RankLayer r;
  auto identity = [](const at::Tensor& t) { return t; };
  r.input_of = identity;
  if (layer == "column") {
    ColumnParallelLinear m(ColumnParallelLinearOptions(s.hidden, s.intermediate).bias(false).dtype(dtype).device(device), comm);
    m->load_weights(ckpt, "up_proj");
    const Range range = m->local_range();
    r.forward = [m](const at::Tensor& x) mutable { return m->forward(x); };
    r.expected_of = [range](const at::Tensor& y) { return y.narrow(-1, range.begin, range.size()); };
  } else if (layer == "qkv") {
    QKVParallelLinear m(QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads).dtype(dtype).device(device),
                        comm);
    m->load_weights(ckpt, "attn");
    const auto plan = m->head_plan().qkv_plan();
    r.forward = [m](const at::Tensor& x) mutable { return m->forward(x); };
    r.expected_of = [plan](const at::Tensor& y) {
      std::vector<at::Tensor> parts;
      for (const auto& p : plan.pieces) parts.push_back(y.narrow(-1, p.fused_source().begin, p.size()));
      return at::cat(parts, -1);
    };
  } else if (layer == "gate_up") {
    GateUpParallelLinear m(GateUpParallelLinearOptions(s.hidden, s.intermediate).dtype(dtype).device(device), comm);
    m->load_weights(ckpt, "mlp");
    const Range range = m->local_range();
    const int64_t inter = s.intermediate;
    r.forward = [m](const at::Tensor& x) mutable { return m->forward(x); };
    r.expected_of = [range, inter](const at::Tensor& y) {
      return at::cat({y.narrow(-1, range.begin, range.size()), y.narrow(-1, inter + range.begin, range.size())}, -1);
    };
  } else {  // "o" and "down": row-parallel, input already split (the usual case in a block)
    const bool o = layer == "o";
    const int64_t in = o ? s.heads * s.head_dim : s.intermediate;
    RowParallelLinear m(RowParallelLinearOptions(in, s.hidden).bias(false).dtype(dtype).device(device), comm);
    m->load_weights(ckpt, o ? "o_proj" : "down_proj");
    const Range range = m->local_range();
    r.forward = [m](const at::Tensor& x) mutable { return m->forward(x); };
    r.input_of = [range](const at::Tensor& x) { return x.narrow(-1, range.begin, range.size()).contiguous(); };
    r.expected_of = identity;
  }
  return r;
}

LayerResult run_case(const std::string& layer, const LayerWeights& w, int64_t tp, int64_t tokens,
                     const LayerBenchConfig& config) {
  LayerResult result;
  result.layer = layer;
  result.tp = tp;
  result.tokens = tokens;
  result.in_features = w.in;
  result.out_features = w.out;
  auto gen = at::detail::createCPUGenerator(config.seed + 977 * tokens);
  const auto x_cpu = at::randn({tokens, w.in}, gen, at::kFloat).to(config.dtype);
  const auto y64 = at::linear(x_cpu.to(at::kDouble), w.full_weight.to(at::kDouble));
  const auto x = x_cpu.to(config.device);
  const auto full_weight = w.full_weight.to(config.device);
  // GPU work is asynchronous: a timed region ends when the device is done.
  const bool cuda = config.device.is_cuda();
  auto sync = [cuda] {
    if (cuda) torch::cuda::synchronize();
  };

  // Reference and TP layer are measured side by side: rounds alternate between them,
  // so drift in the machine's speed (other load, frequency) hits both alike.
  const auto ref_probe = std::chrono::steady_clock::now();
  (void)at::linear(x, full_weight);
  sync();
  const double probe_s = std::max(seconds_since(ref_probe), 1e-6);
  const int rounds = std::max(1, config.timing.rounds);
  const int per_round = std::clamp(static_cast<int>(config.timing.max_seconds / probe_s / rounds), 1,
                                   std::max(1, config.timing.max_iters / rounds));
  const int iters = rounds * per_round;

  const int total_threads = at::get_num_threads();
  const int threads_per_rank = std::max(1, total_threads / static_cast<int>(tp));
  std::vector<std::vector<double>> samples(tp, std::vector<double>(iters));
  std::vector<double> reference_samples;
  std::vector<double> errors(tp, 0.0);
  auto rank_body = [&](Communicator& comm) {
    c10::InferenceMode inference;  // no autograd bookkeeping, for the layer and at::linear alike
    // The ranks share this machine's cores: each gets its share, as separate
    // processes pinned to their own cores would.
    at::set_num_threads(threads_per_rank);
    auto layer_fn = build(layer, config.shape, config.dtype, config.device, w.checkpoint, comm);
    const auto input = layer_fn.input_of(x);
    at::Tensor y;
    for (int i = 0; i < config.timing.warmup; ++i) y = layer_fn.forward(input);
    sync();
    if (comm.rank() == 0) {
      at::set_num_threads(total_threads);
      for (int i = 0; i < config.timing.warmup; ++i) (void)at::linear(x, full_weight);
      sync();
      at::set_num_threads(threads_per_rank);
    }
    for (int round = 0; round < rounds; ++round) {
      comm.barrier();
      if (comm.rank() == 0) {  // the others wait in the barrier below
        at::set_num_threads(total_threads);
        for (int i = 0; i < per_round; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          (void)at::linear(x, full_weight);
          sync();
          reference_samples.push_back(seconds_since(t0));
        }
        at::set_num_threads(threads_per_rank);
      }
      for (int i = 0; i < per_round; ++i) {
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        y = layer_fn.forward(input);
        sync();
        samples[comm.rank()][round * per_round + i] = seconds_since(t0);
      }
    }
    const auto expected = layer_fn.expected_of(y64);
    errors[comm.rank()] = (y.cpu().to(at::kDouble) - expected).abs().max().item<double>();
  };
  if (tp == 1) {
    Communicator single;  // TP=1 is the user's path: the same layer, a no-op communicator
    rank_body(single);
  } else {
    run_ranks_in_threads(tp, rank_body);
  }
  at::set_num_threads(total_threads);
  result.reference_s = median(reference_samples);

  std::vector<double> slowest(iters, 0.0);
  for (int i = 0; i < iters; ++i)
    for (int64_t r = 0; r < tp; ++r) slowest[i] = std::max(slowest[i], samples[r][i]);
  result.tp_s = median(slowest);
  result.max_abs_err = *std::max_element(errors.begin(), errors.end());
  return result;
}

}  // namespace

std::vector<LayerResult> run_layer_bench(const LayerBenchConfig& config,
                                         const std::function<void(const std::string&)>& progress) {
  std::vector<LayerResult> results;
  uint64_t seed = config.seed;
  for (const auto& layer : config.layers) {
    const auto weights = make_weights(layer, config.shape, config.dtype, seed += 10);
    for (int64_t tp : config.tp_sizes) {
      for (int64_t tokens : config.tokens) {
        if (progress) progress(format("%s TP=%lld M=%lld", layer.c_str(), (long long)tp, (long long)tokens));
        results.push_back(run_case(layer, weights, tp, tokens, config));
      }
    }
  }
  return results;
}

std::string layer_table(const std::vector<LayerResult>& results) {
  Table table({"layer", "TP", "M", "GEMM [M,K]x[K,N]", "max_abs_err", "at::linear ms", "TP ms", "TP/linear"});
  for (const auto& r : results) {
    table.add({r.layer, std::to_string(r.tp), std::to_string(r.tokens),
               format("[%lld,%lld]x[%lld,%lld]", (long long)r.tokens, (long long)r.in_features,
                      (long long)r.in_features, (long long)r.out_features),
               format("%.2e", r.max_abs_err), format("%.3f", r.reference_s * 1e3), format("%.3f", r.tp_s * 1e3),
               format("%.3f", r.ratio())});
  }
  return table.str();
}

}  // namespace tp::bench
