#include "backward_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

#include "bench_checkpoint.h"
#include "tp/tp.h"

namespace tp::bench {
namespace {

// ---- the block's weights: the cached checkpoint's, plus a random bias per layer --------------

// The reference's parameters, fused the way the TP layers fuse them.
struct FullWeights {
  at::Tensor qkv, qkv_b, o, o_b, gate_up, gate_up_b, down, down_b;
  std::vector<at::Tensor> all() const { return {qkv, qkv_b, o, o_b, gate_up, gate_up_b, down, down_b}; }
};

struct Globals {
  Checkpoint ckpt;      // what the layers load: weights and biases in the dtype under test
  FullWeights weights;  // the same, fused, on the CPU
};

Globals make_globals(const BenchConfig& config, c10::ScalarType dtype) {
  const auto file = ensure_checkpoint(config, "none", dtype);
  const auto stored = open_checkpoint(file.path);
  auto gen = at::detail::createCPUGenerator(config.seed + 4242);
  Globals g;
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> wb;
  for (const auto& name : {kQ, kK, kV, kO, kGate, kUp, kDown}) {
    const auto w = stored.get(name + ".weight").read_all();
    const auto b = (at::randn({w.size(0)}, gen, at::kFloat) * 0.1).to(dtype);
    g.ckpt.add(name + ".weight", w);
    g.ckpt.add(name + ".bias", b);
    wb[name] = {w, b};
  }
  auto& f = g.weights;
  f.qkv = at::cat({wb[kQ].first, wb[kK].first, wb[kV].first});
  f.qkv_b = at::cat({wb[kQ].second, wb[kK].second, wb[kV].second});
  f.o = wb[kO].first, f.o_b = wb[kO].second;
  f.gate_up = at::cat({wb[kGate].first, wb[kUp].first});
  f.gate_up_b = at::cat({wb[kGate].second, wb[kUp].second});
  f.down = wb[kDown].first, f.down_b = wb[kDown].second;
  return g;
}

// Inputs and output gradients of one token count M (global, CPU, dtype under test).
struct Inputs {
  at::Tensor hidden, attn, inter;         // the inputs of qkv / gate_up / block, o, down
  at::Tensor g_qkv, g_hidden, g_gate_up;  // output gradients: qkv; o, down and block; gate_up
};

Inputs make_inputs(const BlockShape& s, int64_t m, c10::ScalarType dtype, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed + 31 * static_cast<uint64_t>(m));
  auto r = [&](int64_t cols) { return at::randn({m, cols}, gen, at::kFloat).to(dtype); };
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  return {r(s.hidden), r(q), r(s.intermediate), r(q + 2 * kv), r(s.hidden), r(2 * s.intermediate)};
}

// ---- the reference: at::linear with autograd on the full weights ------------------------------

// Output of `row` from the full weights w (leaf tensors that require grad).
at::Tensor reference_forward(const std::string& row, const Inputs& in, const FullWeights& w, int64_t q_size) {
  if (row == "qkv") return at::linear(in.hidden, w.qkv, w.qkv_b);
  if (row == "o") return at::linear(in.attn, w.o, w.o_b);
  if (row == "gate_up") return at::linear(in.hidden, w.gate_up, w.gate_up_b);
  if (row == "down") return at::linear(in.inter, w.down, w.down_b);
  const auto q = at::linear(in.hidden, w.qkv, w.qkv_b).narrow(-1, 0, q_size);
  const auto gu = at::linear(at::linear(q, w.o, w.o_b), w.gate_up, w.gate_up_b);
  const int64_t inter = gu.size(-1) / 2;
  return at::linear(at::silu(gu.narrow(-1, 0, inter)) * gu.narrow(-1, inter, inter), w.down, w.down_b);
}

// The row's input (a leaf that requires grad) and its output gradient.
std::pair<at::Tensor, at::Tensor> row_input(const std::string& row, const Inputs& in) {
  if (row == "o") return {in.attn, in.g_hidden};
  if (row == "down") return {in.inter, in.g_hidden};
  if (row == "qkv") return {in.hidden, in.g_qkv};
  if (row == "gate_up") return {in.hidden, in.g_gate_up};
  return {in.hidden, in.g_hidden};
}

FullWeights leaves(const FullWeights& w, const std::function<at::Tensor(const at::Tensor&)>& to) {
  auto l = [&](const at::Tensor& t) { return to(t).detach().requires_grad_(true); };
  return {l(w.qkv), l(w.qkv_b), l(w.o), l(w.o_b), l(w.gate_up), l(w.gate_up_b), l(w.down), l(w.down_b)};
}

Inputs map_inputs(const Inputs& in, const std::function<at::Tensor(const at::Tensor&)>& to) {
  return {to(in.hidden), to(in.attn), to(in.inter), to(in.g_qkv), to(in.g_hidden), to(in.g_gate_up)};
}

// What the float64 reference gives: output and gradients (undefined where the row does not use them).
struct Expected {
  at::Tensor y, dx;
  FullWeights grads;
};

Expected expected_of(const std::string& row, const Inputs& in, const FullWeights& weights, int64_t q_size) {
  auto f64 = [](const at::Tensor& t) { return t.cpu().to(at::kDouble); };
  const auto w = leaves(weights, f64);
  const auto in64 = map_inputs(in, f64);
  auto [x0, g] = row_input(row, in64);
  auto x = x0.detach().requires_grad_(true);
  Inputs with_x = in64;
  (row == "o" ? with_x.attn : row == "down" ? with_x.inter : with_x.hidden) = x;
  const auto y = reference_forward(row, with_x, w, q_size);
  y.backward(g);
  auto grad = [](const at::Tensor& t) { return t.grad(); };
  return {y.detach(),
          x.grad(),
          {grad(w.qkv), grad(w.qkv_b), grad(w.o), grad(w.o_b), grad(w.gate_up), grad(w.gate_up_b), grad(w.down),
           grad(w.down_b)}};
}

// ---- the TP layers on one rank -------------------------------------------------------------------

struct Layers {
  QKVParallelLinear qkv{nullptr};
  RowParallelLinear o{nullptr};
  GateUpParallelLinear gate_up{nullptr};
  RowParallelLinear down{nullptr};

  Layers(const BlockShape& s, c10::ScalarType dtype, c10::Device device, const Communicator& comm,
         const Checkpoint& ckpt) {
    qkv = QKVParallelLinear(
        QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads).bias(true).dtype(dtype).device(device),
        comm);
    o = RowParallelLinear(RowParallelLinearOptions(s.heads * s.head_dim, s.hidden)
                              .split(qkv->attention_output_split())
                              .dtype(dtype)
                              .device(device),
                          comm);
    const auto split = SplitPolicy{}.with_granularity(s.intermediate % 128 == 0 ? 128 : 1);
    gate_up = GateUpParallelLinear(
        GateUpParallelLinearOptions(s.hidden, s.intermediate).bias(true).split(split).dtype(dtype).device(device),
        comm);
    down = RowParallelLinear(
        RowParallelLinearOptions(s.intermediate, s.hidden).split(split).dtype(dtype).device(device), comm);
    qkv->load_weights(ckpt, kAttn);
    o->load_weights(ckpt, kO);
    gate_up->load_weights(ckpt, kMlp);
    down->load_weights(ckpt, kDown);
  }

  std::vector<at::Tensor> params() const {
    return {qkv->weight, qkv->bias, o->weight, o->bias, gate_up->weight, gate_up->bias, down->weight, down->bias};
  }
  void zero_grad() {
    for (auto& p : params()) p.mutable_grad().reset();
  }

  at::Tensor forward(const std::string& row, const at::Tensor& x) {
    if (row == "qkv") return qkv->forward(x);
    if (row == "o") return o->forward(x);
    if (row == "gate_up") return gate_up->forward(x);
    if (row == "down") return down->forward(x);
    const auto q = std::get<0>(qkv->split(qkv->forward(x)));
    const auto [gate, up] = gate_up->split(gate_up->forward(o->forward(q)));
    return down->forward(at::silu(gate) * up);
  }
};

// This rank's part of a global tensor of the fused qkv or gate_up output dim (dim `d`).
at::Tensor qkv_part(const Layers& l, const at::Tensor& t, int64_t d) {
  std::vector<at::Tensor> parts;
  for (const auto& p : l.qkv->head_plan().qkv_plan().pieces)
    parts.push_back(t.narrow(d, p.fused_source().begin, p.size()));
  return at::cat(parts, d);
}
at::Tensor gate_up_part(const Layers& l, const at::Tensor& t, int64_t d, int64_t inter) {
  const Range r = l.gate_up->local_range();
  return at::cat({t.narrow(d, r.begin, r.size()), t.narrow(d, inter + r.begin, r.size())}, d);
}
at::Tensor cols(const at::Tensor& t, const Range& r) { return t.narrow(-1, r.begin, r.size()); }

// This rank's input and output gradient of `row` (the device, the dtype under test).
std::pair<at::Tensor, at::Tensor> rank_input(const std::string& row, const Layers& l, const Inputs& in, int64_t inter,
                                             c10::Device device) {
  auto [x, g] = row_input(row, in);
  if (row == "o") x = cols(x, l.o->local_range());
  if (row == "down") x = cols(x, l.down->local_range());
  if (row == "qkv") g = qkv_part(l, g, -1);
  if (row == "gate_up") g = gate_up_part(l, g, -1, inter);
  return {x.contiguous().to(device), g.contiguous().to(device)};
}

double rel(const at::Tensor& got, const at::Tensor& want) {
  const auto a = got.cpu().to(at::kDouble);
  const double d = (a - want).norm().item<double>(), n = want.norm().item<double>();
  return n > 0 ? d / n : d;
}

double error_bound(c10::ScalarType dtype) {
  if (dtype == c10::kDouble) return 1e-10;
  if (dtype == c10::kFloat) return 1e-4;
  return 3e-2;
}

std::vector<std::vector<double>> gather_doubles(const Communicator& comm, const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size()), world = comm.world_size();
  if (world == 1) return {values};
  const auto all = comm.all_gather(at::tensor(values, at::kDouble), 0, std::vector<int64_t>(world, n)).contiguous();
  std::vector<std::vector<double>> out(world);
  for (int64_t r = 0; r < world; ++r)
    out[r].assign(all.data_ptr<double>() + r * n, all.data_ptr<double>() + (r + 1) * n);
  return out;
}

struct Run {
  const BenchConfig& config;
  c10::ScalarType dtype;
  const Globals& globals;
  const std::map<int64_t, Inputs>& inputs;                              // one M per run
  const std::map<std::pair<int64_t, std::string>, Expected>& expected;  // by (M, row), float64 CPU
  int64_t tp;
  Progress& progress;
  std::vector<BackwardResult>& out;

  void rank_body(Communicator& comm) const {
    const bool rank0 = comm.rank() == 0;
    const auto& s = config.shape;
    const int64_t q_size = s.heads * s.head_dim;
    const int total_threads = at::get_num_threads();
    const int threads_per_rank = std::max(1, total_threads / static_cast<int>(tp));
    at::set_num_threads(threads_per_rank);
    const bool cuda = config.device.is_cuda();
    auto sync = [cuda] {
      if (cuda) torch::cuda::synchronize();
    };
    Layers layers(s, dtype, config.device, comm, globals.ckpt);
    const auto dev = [&](const at::Tensor& t) { return t.to(config.device); };
    // The reference runs on rank 0 only (the others wait): only it holds the full weights.
    const auto ref_w = rank0 ? leaves(globals.weights, dev) : FullWeights{};
    const auto& timing = config.timing;
    for (const auto& [m, in_global] : inputs) {
      const Inputs ref_in = map_inputs(in_global, dev);
      for (const auto& row : config.rows) {
        if (rank0)
          progress.step(format("backward %s TP=%lld M=%lld %s", dtype_name(dtype).c_str(), (long long)tp, (long long)m,
                               row.c_str()));
        const auto [x_base, g] = rank_input(row, layers, in_global, s.intermediate, config.device);
        at::Tensor x_last;
        double fwd_s = 0.0;
        auto run_tp = [&] {
          layers.zero_grad();
          x_last = x_base.detach().requires_grad_(true);
          const auto t0 = std::chrono::steady_clock::now();
          const auto y = layers.forward(row, x_last);
          sync();
          fwd_s = seconds_since(t0);
          y.backward(g);
          sync();
        };
        auto [rx, rg] = row_input(row, ref_in);
        auto run_ref = [&] {
          for (const auto& w : ref_w.all()) w.mutable_grad().reset();
          const auto x = rx.detach().requires_grad_(true);
          Inputs with_x = ref_in;
          (row == "o" ? with_x.attn : row == "down" ? with_x.inter : with_x.hidden) = x;
          reference_forward(row, with_x, ref_w, q_size).backward(rg);
          sync();
        };
        double probe = 0.0;
        for (int i = 0; i < timing.warmup; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          run_tp();
          probe = std::max(probe, seconds_since(t0));
        }
        if (rank0) {
          at::set_num_threads(total_threads);
          for (int i = 0; i < timing.warmup; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            run_ref();
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
        std::vector<double> t_ref, t_tp, t_fwd;
        for (int round = 0; round < rounds; ++round) {
          comm.barrier();
          if (rank0) {
            at::set_num_threads(total_threads);
            for (int i = 0; i < per_round; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              run_ref();
              t_ref.push_back(seconds_since(t0));
            }
            at::set_num_threads(threads_per_rank);
          }
          for (int i = 0; i < per_round; ++i) {
            comm.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            run_tp();
            t_tp.push_back(seconds_since(t0));
            t_fwd.push_back(fwd_s);
          }
        }

        // Correctness: the last iteration's output and gradients vs this rank's part of
        // the float64 reference.
        layers.zero_grad();
        x_last = x_base.detach().requires_grad_(true);
        const auto y = layers.forward(row, x_last);
        y.backward(g);
        const auto& e = expected.at({m, row});
        const int64_t inter = s.intermediate;
        double y_err, dx_err = 0, dw_err = 0, db_err = 0;
        if (row == "qkv") {
          y_err = rel(y, qkv_part(layers, e.y, -1));
        } else if (row == "gate_up") {
          y_err = rel(y, gate_up_part(layers, e.y, -1, inter));
        } else {
          y_err = rel(y, e.y);
        }
        const auto want_dx = row == "o"      ? cols(e.dx, layers.o->local_range())
                             : row == "down" ? cols(e.dx, layers.down->local_range())
                                             : e.dx;
        dx_err = rel(x_last.grad(), want_dx);
        const bool block = row == "block";
        auto check = [&](const at::Tensor& got_w, const at::Tensor& want_w, const at::Tensor& got_b,
                         const at::Tensor& want_b) {
          dw_err = std::max(dw_err, rel(got_w, want_w));
          db_err = std::max(db_err, rel(got_b, want_b));
        };
        if (block || row == "qkv")
          check(layers.qkv->weight.grad(), qkv_part(layers, e.grads.qkv, 0), layers.qkv->bias.grad(),
                qkv_part(layers, e.grads.qkv_b, 0));
        if (block || row == "o")
          check(layers.o->weight.grad(), cols(e.grads.o, layers.o->local_range()), layers.o->bias.grad(), e.grads.o_b);
        if (block || row == "gate_up")
          check(layers.gate_up->weight.grad(), gate_up_part(layers, e.grads.gate_up, 0, inter),
                layers.gate_up->bias.grad(), gate_up_part(layers, e.grads.gate_up_b, 0, inter));
        if (block || row == "down")
          check(layers.down->weight.grad(), cols(e.grads.down, layers.down->local_range()), layers.down->bias.grad(),
                e.grads.down_b);

        std::vector<double> mine{y_err, dx_err, dw_err, db_err};
        mine.insert(mine.end(), t_tp.begin(), t_tp.end());
        mine.insert(mine.end(), t_fwd.begin(), t_fwd.end());
        const auto all = gather_doubles(comm, mine);
        if (!rank0) continue;
        BackwardResult r;
        r.row = row;
        r.dtype = dtype_name(dtype);
        r.tp = tp;
        r.tokens = m;
        for (const auto& rank : all) {
          r.y_err = std::max(r.y_err, rank[0]);
          r.dx_err = std::max(r.dx_err, rank[1]);
          r.dw_err = std::max(r.dw_err, rank[2]);
          r.db_err = std::max(r.db_err, rank[3]);
        }
        auto slowest = [&](size_t offset) {
          std::vector<double> worst(iters, 0.0);
          for (const auto& rank : all)
            for (int i = 0; i < iters; ++i) worst[i] = std::max(worst[i], rank[offset + i]);
          return median(worst);
        };
        r.reference_s = median(t_ref);
        r.tp_s = slowest(4);
        r.tp_forward_s = slowest(4 + iters);
        const double bound = error_bound(dtype);
        r.suspicious = !(r.y_err <= bound && r.dx_err <= bound && r.dw_err <= bound && r.db_err <= bound);
        out.push_back(r);
      }
    }
    at::set_num_threads(total_threads);
  }
};

}  // namespace

std::vector<BackwardResult> run_backward_bench(const BenchConfig& config, const RankLauncher& launcher) {
  for (const auto& f : config.formats) {
    TORCH_CHECK_VALUE(parse_quant_config(f).format == QuantFormat::kNone, "tp-bench --backward: format ", f,
                      " has frozen weights; --backward measures unquantized layers (--quant none)");
  }
  for (const auto& row : config.rows) {
    TORCH_CHECK_VALUE(std::find(all_rows().begin(), all_rows().end(), row) != all_rows().end(),
                      "tp-bench: unknown row '", row, "' (rows: qkv, o, gate_up, down, block)");
  }
  std::vector<BackwardResult> results;
  Progress progress(
      static_cast<int64_t>(config.dtypes.size() * config.tp_sizes.size() * config.tokens.size() * config.rows.size()));
  CommunicatorOptions comm_options;
  comm_options.verify_calls = config.verify_calls;
  const int64_t q_size = config.shape.heads * config.shape.head_dim;
  for (const auto dtype : config.dtypes) {
    const auto globals = make_globals(config, dtype);
    // One M at a time: the float64 expected gradients of the block are the size of the
    // whole block in float64.
    for (const auto m : config.tokens) {
      std::map<int64_t, Inputs> inputs{{m, make_inputs(config.shape, m, dtype, config.seed)}};
      std::map<std::pair<int64_t, std::string>, Expected> expected;
      for (const auto& row : config.rows) expected[{m, row}] = expected_of(row, inputs[m], globals.weights, q_size);
      for (const auto tp : config.tp_sizes) {
        std::vector<BackwardResult> rows;
        Run run{config, dtype, globals, inputs, expected, tp, progress, rows};
        auto body = [&](Communicator& comm) { run.rank_body(comm); };
        if (launcher) {
          launcher(tp, body);
        } else if (tp == 1) {
          Communicator single;
          body(single);
        } else {
          run_ranks_in_threads(tp, body, comm_options);
        }
        results.insert(results.end(), rows.begin(), rows.end());
      }
    }
  }
  progress.finish();
  return results;
}

std::string backward_table(const std::vector<BackwardResult>& rows) {
  auto sorted = rows;
  auto order = [](const std::string& row) {
    return std::find(all_rows().begin(), all_rows().end(), row) - all_rows().begin();
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const BackwardResult& a, const BackwardResult& b) {
    return std::make_tuple(order(a.row), a.tp, a.tokens) < std::make_tuple(order(b.row), b.tp, b.tokens);
  });
  Table table({"row", "TP", "M", "y rel_err", "dx rel_err", "dW rel_err", "db rel_err", "ref fwd+bwd ms",
               "TP fwd+bwd ms", "TP fwd ms", "TP/ref"});
  for (const auto& r : sorted) {
    const char* mark = r.suspicious ? " !" : "";
    table.add({r.row, std::to_string(r.tp), std::to_string(r.tokens), format("%.2e", r.y_err), format("%.2e", r.dx_err),
               format("%.2e", r.dw_err), format("%.2e%s", r.db_err, mark), format("%.3f", r.reference_s * 1e3),
               format("%.3f", r.tp_s * 1e3), format("%.3f", r.tp_forward_s * 1e3), format("%.3f", r.ratio())});
  }
  return table.str();
}

std::string serialize_backward(const std::vector<BackwardResult>& rows) {
  std::ostringstream os;
  os.precision(17);
  for (const auto& r : rows) {
    os << "backward\t" << r.row << "\t" << r.dtype << "\t" << r.tp << "\t" << r.tokens << "\t" << r.reference_s << "\t"
       << r.tp_s << "\t" << r.tp_forward_s << "\t" << r.y_err << "\t" << r.dx_err << "\t" << r.dw_err << "\t"
       << r.db_err << "\t" << r.suspicious << "\n";
  }
  return os.str();
}

std::vector<BackwardResult> deserialize_backward(const std::string& text) {
  std::vector<BackwardResult> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    std::string field;
    while (std::getline(fields, field, '\t')) f.push_back(field);
    TORCH_CHECK(f.size() == 13 && f[0] == "backward", "tp-bench: malformed --backward line from a worker: '", line,
                "'");
    BackwardResult r;
    r.row = f[1], r.dtype = f[2], r.tp = std::stoll(f[3]), r.tokens = std::stoll(f[4]);
    r.reference_s = std::stod(f[5]), r.tp_s = std::stod(f[6]), r.tp_forward_s = std::stod(f[7]);
    r.y_err = std::stod(f[8]), r.dx_err = std::stod(f[9]), r.dw_err = std::stod(f[10]), r.db_err = std::stod(f[11]);
    r.suspicious = f[12] == "1";
    rows.push_back(r);
  }
  return rows;
}

}  // namespace tp::bench
