// LoRA adapters on the four linear layers at TP 1-4 (ranks as threads over Gloo), in
// float64, against a single-device reference from the same global weights:
// y = x W^T + b + scaling (x A_s^T) B_s^T per output segment s. Forward, and the gradients
// of the input, every A and every B within 1e-10; shapes that split unevenly, weighted
// splits with one rank at zero (a B cut by `out / world` instead of the base's plan would
// give other rows), one KV head replicated on every rank, adapters on some segments only,
// and a batch whose rows take different adapters.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <sstream>
#include <vector>

#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;

namespace {

constexpr double kTol = 1e-10;

enum class Kind { kColumn, kRow, kQKV, kGateUp };

const char* name_of(Kind k) {
  switch (k) {
    case Kind::kColumn: return "column";
    case Kind::kRow: return "row";
    case Kind::kQKV: return "qkv";
    case Kind::kGateUp: return "gate_up";
  }
  return "";
}

// One layer and its global tensors: the base weight's segments (rows of W) and, per
// adapter, each segment's A and B (undefined where the adapter leaves the segment alone).
struct Case {
  Kind kind = Kind::kColumn;
  int64_t world = 1, in = 0, tokens = 0;
  std::vector<std::string> segments, prefixes;
  std::vector<int64_t> sizes;   // output rows of each segment
  std::vector<double> weights;  // split weights (empty: even)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  at::Tensor w, b;
  struct Adapter {
    std::string name;
    LoRAConfig config;
    std::vector<at::Tensor> A, B;
  };
  std::vector<Adapter> adapters;
  int64_t out() const {
    int64_t n = 0;
    for (auto s : sizes) n += s;
    return n;
  }
};

Case make_case(Kind kind, int64_t world, uint64_t seed) {
  Case c;
  c.kind = kind;
  c.world = world;
  c.tokens = test::randint(1, 5, seed);
  c.in = kind == Kind::kRow ? test::randint(world, 23, seed + 1) : test::randint(3, 19, seed + 1);
  if (world > 1 && seed % 2 == 0) {
    c.weights.assign(world, 1.0);
    c.weights[0] = 3.0;
    c.weights[world - 1] = world > 2 ? 0.0 : 1.0;  // a rank with nothing, where the world allows
  }
  switch (kind) {
    case Kind::kColumn:
      c.segments = {"linear"};
      c.prefixes = {"fc"};
      c.sizes = {test::randint(world, 17, seed + 2)};
      break;
    case Kind::kRow:
      c.segments = {"linear"};
      c.prefixes = {"o"};
      c.sizes = {test::randint(1, 13, seed + 2)};
      break;
    case Kind::kQKV:
      // One KV head: every rank of a world > 1 holds a replica of k and v.
      c.head_dim = 2;
      c.heads = 5;
      c.kv_heads = 1;
      c.weights.clear();
      c.segments = {"q", "k", "v"};
      c.prefixes = {"attn.q_proj", "attn.k_proj", "attn.v_proj"};
      c.sizes = {c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim};
      break;
    case Kind::kGateUp: {
      const int64_t inter = test::randint(world, 15, seed + 2);
      c.segments = {"gate", "up"};
      c.prefixes = {"mlp.gate_proj", "mlp.up_proj"};
      c.sizes = {inter, inter};
      break;
    }
  }
  c.w = randn({c.out(), c.in}, seed + 3);
  c.b = randn({c.out()}, seed + 4);
  // Adapter "a" on every segment; "b" (rsLoRA, another rank) on the first and last only.
  for (int i = 0; i < 2; ++i) {
    Case::Adapter a;
    a.name = i == 0 ? "a" : "b";
    a.config = i == 0 ? LoRAConfig().rank(3).alpha(6.0) : LoRAConfig().rank(4).alpha(3.0).use_rslora(true);
    for (size_t s = 0; s < c.sizes.size(); ++s) {
      const bool on = i == 0 || s == 0 || s + 1 == c.sizes.size();
      const int64_t r = a.config.rank();
      a.A.push_back(on ? randn({r, c.in}, seed + 10 + 7 * s + 50 * i) : at::Tensor());
      a.B.push_back(on ? randn({c.sizes[s], r}, seed + 11 + 7 * s + 50 * i) : at::Tensor());
    }
    c.adapters.push_back(a);
  }
  return c;
}

Checkpoint checkpoint_of(const Case& c) {
  Checkpoint ckpt;
  int64_t row = 0;
  for (size_t s = 0; s < c.sizes.size(); ++s) {
    ckpt.add(c.prefixes[s] + ".weight", c.w.narrow(0, row, c.sizes[s]));
    ckpt.add(c.prefixes[s] + ".bias", c.b.narrow(0, row, c.sizes[s]));
    row += c.sizes[s];
    for (const auto& a : c.adapters) {
      if (!a.A[s].defined()) continue;
      ckpt.add(a.name + "." + c.prefixes[s] + ".lora_A.weight", a.A[s]);
      ckpt.add(a.name + "." + c.prefixes[s] + ".lora_B.weight", a.B[s]);
    }
  }
  return ckpt;
}

// The reference: per row of x's first dimension, the base plus that row's adapter.
at::Tensor reference(const Case& c, const at::Tensor& x, const std::vector<std::string>& rows) {
  at::Tensor y = at::linear(x, c.w, c.b);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < x.size(0); ++i) {
    at::Tensor yi = y.select(0, i);
    const at::Tensor xi = x.select(0, i);
    for (const auto& a : c.adapters) {
      if (a.name != rows[i]) continue;
      std::vector<at::Tensor> parts;
      for (size_t s = 0; s < c.sizes.size(); ++s) {
        parts.push_back(a.A[s].defined() ? at::matmul(at::matmul(xi, a.A[s].t()), a.B[s].t()) * a.config.scaling()
                                         : at::zeros({xi.size(0), c.sizes[s]}, xi.options()));
      }
      yi = yi + at::cat(parts, -1);
    }
    out.push_back(yi);
  }
  return at::stack(out, 0);
}

// What one rank computed: its output, input gradient and every adapter factor's gradient.
struct RankOut {
  at::Tensor y, gx;
  std::vector<std::vector<at::Tensor>> gA, gB;  // [adapter][segment]
  std::vector<SegmentPiece> pieces;             // this rank's output rows per segment (column)
  Range in_range;                               // row: this rank's input columns
};

template <class Layer>
void load_adapters(Layer& layer, const Case& c, const Checkpoint& ckpt) {
  for (const auto& a : c.adapters) {
    std::vector<std::string> prefixes;
    for (size_t s = 0; s < c.sizes.size(); ++s)
      prefixes.push_back(a.A[s].defined() ? a.name + "." + c.prefixes[s] : "");
    layer->lora().load(ckpt, a.name, a.config, prefixes);
  }
}

std::vector<SegmentPiece> single_piece(const std::string& name, int64_t size, Range range) {
  return {SegmentPiece{name, size, 0, range, 0}};
}

// Runs the case with `rows` naming each batch row's adapter; checks every rank.
void run_case(const Case& c, const std::vector<std::string>& rows, uint64_t seed) {
  std::ostringstream what;
  what << name_of(c.kind) << " world=" << c.world << " in=" << c.in << " out=" << c.out()
       << " weights=" << c.weights.size() << " rows=" << c10::Join(",", rows);
  INFO(what.str());
  const int64_t batch = static_cast<int64_t>(rows.size());
  const auto x = randn({batch, c.tokens, c.in}, seed + 100), G = randn({batch, c.tokens, c.out()}, seed + 101);
  const Checkpoint ckpt = checkpoint_of(c);
  SplitPolicy policy;
  if (!c.weights.empty()) policy = policy.with_weights(c.weights);
  std::vector<RankOut> outs(c.world);
  run_ranks_in_threads(
      c.world,
      [&](Communicator& comm) {
        RankOut out;
        auto run = [&](auto& layer, const at::Tensor& xin, const at::Tensor& g) {
          layer->load_weights(ckpt, c.kind == Kind::kQKV ? "attn" : c.kind == Kind::kGateUp ? "mlp" : c.prefixes[0]);
          load_adapters(layer, c, ckpt);
          layer->lora().selection().select_rows(rows);
          auto xr = xin.clone().requires_grad_(true);
          out.y = layer->forward(xr);
          (out.y * g).sum().backward();
          out.y = out.y.detach();
          out.gx = xr.grad();
          for (const auto& a : c.adapters) {
            out.gA.emplace_back();
            out.gB.emplace_back();
            for (size_t s = 0; s < c.segments.size(); ++s) {
              const auto A = layer->lora().lora_A(a.name, c.segments[s]);
              out.gA.back().push_back(A.defined() ? A.grad() : at::Tensor());
              out.gB.back().push_back(A.defined() ? layer->lora().lora_B(a.name, c.segments[s]).grad() : at::Tensor());
            }
          }
        };
        const auto cols = [&](const at::Tensor& t, const std::vector<SegmentPiece>& pieces) {
          std::vector<at::Tensor> parts;
          for (const auto& p : pieces) parts.push_back(t.narrow(-1, p.fused_source().begin, p.size()));
          return at::cat(parts, -1);
        };
        switch (c.kind) {
          case Kind::kColumn: {
            ColumnParallelLinear l(
                ColumnParallelLinearOptions(c.in, c.out()).bias(true).split(policy).dtype(at::kDouble), comm);
            out.pieces = single_piece("linear", c.out(), l->local_range());
            run(l, x, cols(G, out.pieces));
            break;
          }
          case Kind::kRow: {
            RowParallelLinear l(RowParallelLinearOptions(c.in, c.out()).bias(true).split(policy).dtype(at::kDouble),
                                comm);
            out.in_range = l->local_range();
            run(l, x.narrow(-1, out.in_range.begin, out.in_range.size()), G);
            break;
          }
          case Kind::kQKV: {
            QKVParallelLinear l(
                QKVParallelLinearOptions(c.in, c.head_dim, c.heads, c.kv_heads).bias(true).dtype(at::kDouble), comm);
            out.pieces = l->head_plan().qkv_plan().pieces;
            run(l, x, cols(G, out.pieces));
            break;
          }
          case Kind::kGateUp: {
            GateUpParallelLinear l(
                GateUpParallelLinearOptions(c.in, c.sizes[0]).bias(true).split(policy).dtype(at::kDouble), comm);
            const Range r = l->local_range();
            out.pieces = {SegmentPiece{"gate", c.sizes[0], 0, r, 0},
                          SegmentPiece{"up", c.sizes[1], c.sizes[0], r, r.size()}};
            run(l, x, cols(G, out.pieces));
            break;
          }
        }
        outs[comm.rank()] = std::move(out);
      },
      test::test_comm_options());

  // The reference's output and gradients.
  auto xr = x.clone().requires_grad_(true);
  Case ref = c;
  for (auto& a : ref.adapters)
    for (size_t s = 0; s < a.A.size(); ++s)
      if (a.A[s].defined()) {
        a.A[s] = a.A[s].clone().requires_grad_(true);
        a.B[s] = a.B[s].clone().requires_grad_(true);
      }
  const at::Tensor y = reference(ref, xr, rows);
  // The loss the ranks computed: <Y, G> once for a row layer's mirrored output, else every
  // rank's rows, a replicated KV head once per copy.
  at::Tensor loss = c.kind == Kind::kRow ? (y * G).sum() : at::zeros({}, at::kDouble);
  for (int64_t r = 0; r < c.world && c.kind != Kind::kRow; ++r)
    for (const auto& p : outs[r].pieces)
      loss = loss +
             (y.narrow(-1, p.fused_source().begin, p.size()) * G.narrow(-1, p.fused_source().begin, p.size())).sum();
  loss.backward();
  const auto err = [](const at::Tensor& a, const at::Tensor& b) { return test::relative_error(a, b); };
  for (int64_t r = 0; r < c.world; ++r) {
    INFO("rank " << r);
    const auto& o = outs[r];
    const bool row = c.kind == Kind::kRow;
    std::vector<at::Tensor> want_y;
    for (const auto& p : o.pieces) want_y.push_back(y.detach().narrow(-1, p.fused_source().begin, p.size()));
    CHECK(err(o.y, row ? y.detach() : at::cat(want_y, -1)) <= kTol);
    CHECK(err(o.gx, row ? xr.grad().narrow(-1, o.in_range.begin, o.in_range.size()) : xr.grad()) <= kTol);
    for (size_t i = 0; i < ref.adapters.size(); ++i) {
      const auto& a = ref.adapters[i];
      for (size_t s = 0; s < a.A.size(); ++s) {
        INFO("adapter " << a.name << " segment " << c.segments[s]);
        const bool used = std::find(rows.begin(), rows.end(), a.name) != rows.end();
        // No row took an unused adapter: its factors took part in nothing.
        REQUIRE(o.gA[i][s].defined() == (used && a.A[s].defined()));
        if (!o.gA[i][s].defined()) continue;
        if (row) {
          CHECK(err(o.gA[i][s], a.A[s].grad().narrow(1, o.in_range.begin, o.in_range.size())) <= kTol);
          CHECK(err(o.gB[i][s], a.B[s].grad()) <= kTol);
        } else {
          const auto& p = o.pieces[s];
          CHECK(err(o.gA[i][s], a.A[s].grad()) <= kTol);
          CHECK(err(o.gB[i][s], a.B[s].grad().narrow(0, p.source.begin, p.size())) <= kTol);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("LoRA on the four layers equals the single-device reference, forward and backward, at TP 1-4",
          "[layers][lora]") {
  uint64_t seed = 9100;
  for (Kind kind : {Kind::kColumn, Kind::kRow, Kind::kQKV, Kind::kGateUp}) {
    for (int64_t world = 1; world <= 4; ++world) {
      seed += 1000;
      const Case c = make_case(kind, world, seed);
      run_case(c, {"a", "a"}, seed);               // one adapter for the batch
      run_case(c, {"b", "", "a", "b"}, seed + 7);  // a mixed batch: each row its own, one none
    }
  }
}

TEST_CASE("LoRA gathers its factors whole and refuses what it cannot take", "[layers][lora]") {
  const Case c = make_case(Kind::kQKV, 3, 4242);
  const Checkpoint ckpt = checkpoint_of(c);
  std::vector<std::map<std::string, at::Tensor>> gathered(3);
  std::vector<std::string> errors(3), shape_errors(3);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        QKVParallelLinear l(
            QKVParallelLinearOptions(c.in, c.head_dim, c.heads, c.kv_heads).bias(true).dtype(at::kDouble), comm);
        load_adapters(l, c, ckpt);
        gathered[comm.rank()] = l->lora().gather("b", {"q", "", "v"});
        try {
          l->lora().add("a", LoRAConfig());
        } catch (const c10::Error& e) {
          errors[comm.rank()] = e.what_without_backtrace();
        }
        // A B of the wrong shape, given to rank 2 alone: every rank fails, naming the tensor.
        Checkpoint bad = ckpt;
        if (comm.rank() == 2)
          bad.add("bad.q.lora_B.weight", at::zeros({c.sizes[0] + 1, 4}, at::kDouble));
        else
          bad.add("bad.q.lora_B.weight", c.adapters[1].B[0]);
        bad.add("bad.q.lora_A.weight", c.adapters[1].A[0]);
        try {
          l->lora().load(bad, "c", c.adapters[1].config, {"bad.q", "", ""});
        } catch (const c10::Error& e) {
          shape_errors[comm.rank()] = e.what_without_backtrace();
        }
      },
      test::test_comm_options());
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(at::equal(gathered[r].at("q.lora_A.weight"), c.adapters[1].A[0]));
    CHECK(at::equal(gathered[r].at("q.lora_B.weight"), c.adapters[1].B[0]));
    CHECK(at::equal(gathered[r].at("v.lora_B.weight"), c.adapters[1].B[2]));  // the replicated KV head once
    CHECK(gathered[r].size() == 4);
    CHECK_THAT(errors[r], Catch::Contains("has an adapter 'a' already"));
    CHECK_THAT(shape_errors[r], Catch::Contains("failed on rank 2"));
    CHECK_THAT(shape_errors[r], Catch::Contains("bad.q.lora_B.weight"));
  }
  // Invariant numerics: refused by name.
  std::vector<std::string> invariant(2);
  run_ranks_in_threads(2, [&](Communicator& comm) {
    ColumnParallelLinear l(ColumnParallelLinearOptions(64, 64).numerics(Numerics::kInvariant), comm);
    try {
      l->lora().add("x", LoRAConfig());
    } catch (const c10::Error& e) {
      invariant[comm.rank()] = e.what_without_backtrace();
    }
  });
  for (const auto& e : invariant) CHECK_THAT(e, Catch::Contains("invariant numerics"));
}

TEST_CASE("LoRA over quantized bases: the base frozen, the adapter trained, at TP 1-3", "[layers][lora]") {
  // A weight-only format (INT4 GPTQ) and one that quantizes activations too (FP8 per
  // channel): the adapter adds to the format's own output, its gradients as on an
  // unquantized base, the base weight without one.
  const int64_t in = 256, out = 384, r = 8, tokens = 3;
  const LoRAConfig config = LoRAConfig().rank(r).alpha(16.0);
  for (const std::string format : {"int4_gptq:g128", "fp8_channel"}) {
    const QuantConfig quant = parse_quant_config(format);
    for (const bool row : {false, true}) {
      for (int64_t world = 1; world <= 3; ++world) {
        INFO(format << (row ? " row" : " column") << " world=" << world);
        const uint64_t seed = 777 + world * 10 + (row ? 5 : 0);
        const auto stored = quantize_weight(randn({out, in}, seed).to(at::kFloat), quant);
        Checkpoint ckpt;
        for (const auto& [suffix, t] : stored) ckpt.add("p." + suffix, t);
        const at::Tensor A = randn({r, in}, seed + 1).to(at::kFloat), B = randn({out, r}, seed + 2).to(at::kFloat);
        ckpt.add("ad.p.lora_A.weight", A);
        ckpt.add("ad.p.lora_B.weight", B);
        const auto x = randn({tokens, in}, seed + 3).to(at::kFloat), G = randn({tokens, out}, seed + 4).to(at::kFloat);
        std::vector<at::Tensor> ys(world), gA(world), gB(world), base(world);
        std::vector<Range> ranges(world);
        std::vector<int> base_grad(world, 1);  // not vector<bool>: its ranks share bytes
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              const int64_t rank = comm.rank();
              const auto run = [&](auto& layer, const at::Tensor& xin, const at::Tensor& g) {
                layer->load_weights(ckpt, "p");
                layer->lora().load(ckpt, "ad", config, {"ad.p"});
                layer->lora().selection().select("ad");
                const at::Tensor y = layer->forward(xin);
                (y * g).sum().backward();
                ys[rank] = y.detach();
                gA[rank] = layer->lora().lora_A("ad", "linear").grad();
                gB[rank] = layer->lora().lora_B("ad", "linear").grad();
                base_grad[rank] = layer->weight.grad().defined();
                layer->lora().selection().clear();
                at::NoGradGuard no_grad;
                base[rank] = layer->forward(xin);  // the format's own output, without the adapter
              };
              if (row) {
                RowParallelLinear l(RowParallelLinearOptions(in, out).bias(false).quant(quant), comm);
                ranges[rank] = l->local_range();
                run(l, x.narrow(1, ranges[rank].begin, ranges[rank].size()), G);
              } else {
                ColumnParallelLinear l(ColumnParallelLinearOptions(in, out).bias(false).quant(quant), comm);
                ranges[rank] = l->local_range();
                run(l, x, G.narrow(1, ranges[rank].begin, ranges[rank].size()));
              }
            },
            test::test_comm_options());
        // The reference adapter in float64 on top of each rank's own base output.
        auto Ad = A.to(at::kDouble).requires_grad_(true), Bd = B.to(at::kDouble).requires_grad_(true);
        const at::Tensor d = at::matmul(at::matmul(x.to(at::kDouble), Ad.t()), Bd.t()) * config.scaling();
        (d * G.to(at::kDouble)).sum().backward();
        for (int64_t rank = 0; rank < world; ++rank) {
          INFO("rank " << rank);
          const Range rg = ranges[rank];
          const at::Tensor want = row ? d.detach() : d.detach().narrow(1, rg.begin, rg.size());
          CHECK(test::relative_error((ys[rank] - base[rank]).to(at::kDouble), want) <= 1e-5);
          CHECK(test::relative_error(gA[rank].to(at::kDouble),
                                     row ? Ad.grad().narrow(1, rg.begin, rg.size()) : Ad.grad()) <= 1e-5);
          CHECK(test::relative_error(gB[rank].to(at::kDouble),
                                     row ? Bd.grad() : Bd.grad().narrow(0, rg.begin, rg.size())) <= 1e-5);
          CHECK_FALSE(base_grad[rank]);
        }
      }
    }
  }
}

TEST_CASE("LoRA under sequence parallelism: tokens split, the adapters' gradients summed over every rank's tokens",
          "[layers][lora]") {
  // Column: this rank's tokens enter, the adapter's x A^T is gathered over tokens (A's
  // gradient summed over the ranks' tokens). Row: the partial sum is reduce-scattered over
  // tokens with the base's (B's gradient summed over the ranks' columns).
  const int64_t in = 10, out = 9, tokens = 7, r = 3;
  const LoRAConfig config = LoRAConfig().rank(r).alpha(5.0);
  for (const bool row : {false, true}) {
    for (int64_t world = 1; world <= 4; ++world) {
      INFO((row ? "row" : "column") << " world=" << world);
      const uint64_t seed = 5150 + world + (row ? 50 : 0);
      const auto x = randn({tokens, in}, seed), w = randn({out, in}, seed + 1), bias = randn({out}, seed + 2);
      const auto A = randn({r, in}, seed + 3), B = randn({out, r}, seed + 4), G = randn({tokens, out}, seed + 5);
      Checkpoint ckpt;
      ckpt.add("p.weight", w);
      ckpt.add("p.bias", bias);
      ckpt.add("ad.lora_A.weight", A);
      ckpt.add("ad.lora_B.weight", B);
      std::vector<at::Tensor> ys(world), gx(world), gA(world), gB(world);
      std::vector<Range> ranges(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            const int64_t rank = comm.rank();
            const Range tok = sequence_ranges(tokens, world).at(rank);
            const auto run = [&](auto& layer, const at::Tensor& xin, const at::Tensor& g) {
              layer->load_weights(ckpt, "p");
              layer->lora().load(ckpt, "ad", config, {"ad"});
              layer->lora().selection().select("ad");
              auto xr = xin.clone().requires_grad_(true);
              const at::Tensor y = layer->forward(xr);
              (y * g).sum().backward();
              ys[rank] = y.detach();
              gx[rank] = xr.grad();
              gA[rank] = layer->lora().lora_A("ad", "linear").grad();
              gB[rank] = layer->lora().lora_B("ad", "linear").grad();
            };
            if (row) {
              RowParallelLinear l(
                  RowParallelLinearOptions(in, out).input_is_parallel(false).sequence_parallel(true).dtype(at::kDouble),
                  comm);
              ranges[rank] = l->local_range();
              run(l, x, G.narrow(0, tok.begin, tok.size()));
            } else {
              ColumnParallelLinear l(ColumnParallelLinearOptions(in, out).sequence_parallel(true).dtype(at::kDouble),
                                     comm);
              ranges[rank] = l->local_range();
              run(l, x.narrow(0, tok.begin, tok.size()), G.narrow(1, ranges[rank].begin, ranges[rank].size()));
            }
          },
          test::test_comm_options());
      auto xr = x.clone().requires_grad_(true), Ar = A.clone().requires_grad_(true),
           Br = B.clone().requires_grad_(true);
      const at::Tensor y = at::linear(xr, w, bias) + at::matmul(at::matmul(xr, Ar.t()), Br.t()) * config.scaling();
      (y * G).sum().backward();
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("rank " << rank);
        const Range tok = sequence_ranges(tokens, world).at(rank), rg = ranges[rank];
        const auto err = [](const at::Tensor& a, const at::Tensor& b) { return test::relative_error(a, b); };
        if (row) {
          CHECK(err(ys[rank], y.detach().narrow(0, tok.begin, tok.size())) <= kTol);
          CHECK(err(gx[rank], xr.grad()) <= kTol);
          CHECK(err(gA[rank], Ar.grad().narrow(1, rg.begin, rg.size())) <= kTol);
          CHECK(err(gB[rank], Br.grad()) <= kTol);
        } else {
          CHECK(err(ys[rank], y.detach().narrow(1, rg.begin, rg.size())) <= kTol);
          CHECK(err(gx[rank], xr.grad().narrow(0, tok.begin, tok.size())) <= kTol);
          CHECK(err(gA[rank], Ar.grad()) <= kTol);
          CHECK(err(gB[rank], Br.grad().narrow(0, rg.begin, rg.size())) <= kTol);
        }
      }
    }
  }
}
