// Invariant numerics (tp/layers/numerics/numerics.h): the canonical GEMM and the layers at TP 1-4,
// ranks as threads. "Bitwise" below is at::equal: every output and gradient of TP 2, 3
// and 4 equals TP 1's to the last bit, in float32 and bfloat16, with uneven shards
// (world 3), chunk tails and zero-size shards; a row alone equals the same row inside a
// batch; and the canonical GEMM stays within float32 accumulation bounds of float64.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/invariant_gemm.h"
#include "layers/numerics/canonical_sum.h"
#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using Catch::Contains;
using tp::test::randn;

namespace {

at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, int64_t chunk) {
  // The whole reduction on one rank: its pieces make the whole tree.
  const at::Tensor pieces = cpu::invariant_gemm_pieces(a.contiguous(), cpu::invariant_pack(b), b.size(0), 0, chunk);
  return tp::detail::evaluate_whole((a.size(1) + chunk - 1) / chunk, pieces);
}

// What one rank saw, gathered after the ranks joined (Catch's assertions are not thread-safe).
struct Seen {
  at::Tensor y, gx, gw, gb;
};

}  // namespace

TEST_CASE("invariant: dyadic pieces are the canonical tree's whole subtrees", "[invariant]") {
  using S = cpu::ChunkSpan;
  CHECK((cpu::dyadic_pieces(0, 8) == std::vector<S>{{0, 8}}));
  CHECK((cpu::dyadic_pieces(3, 11) == std::vector<S>{{3, 1}, {4, 4}, {8, 2}, {10, 1}}));
  CHECK(cpu::dyadic_pieces(5, 5).empty());
  CHECK((cpu::dyadic_pieces(0, 11) == std::vector<S>{{0, 8}, {8, 2}, {10, 1}}));
}

TEST_CASE("invariant: the canonical GEMM gives a row the same bits alone and in any batch, near float64",
          "[invariant]") {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t k : {1, 63, 64, 200, 1000}) {
      INFO("dtype=" << dtype << " K=" << k);
      const at::Tensor a = randn({37, k}, 11 + k).to(at::kFloat);
      const at::Tensor b = randn({45, k}, 12 + k).to(dtype);
      const at::Tensor y = gemm(a, b, 64);
      for (const int64_t m : {1, 2, 5, 17}) CHECK(at::equal(gemm(a.narrow(0, 3, m), b, 64), y.narrow(0, 3, m)));
      const at::Tensor exact = at::matmul(a.to(at::kDouble), b.to(at::kDouble).t());
      const double bound =
          2.0 * k * 6e-8 * (at::matmul(a.abs().to(at::kDouble), b.abs().to(at::kDouble).t())).max().item<double>();
      CHECK((y.to(at::kDouble) - exact).abs().max().item<double>() <= bound + 1e-30);
    }
  }
}

TEST_CASE("invariant: pieces of a reduction split over ranks rebuild one device's sum bit for bit", "[invariant]") {
  const int64_t chunk = 16, chunks = 11, k = chunks * chunk - 5;  // a short last chunk
  // 5 rows (a full and a partial block of 4 on AVX-512) and 2.
  for (const int64_t m : {5, 2}) {
    INFO("M=" << m);
    const at::Tensor a = randn({m, k}, 1).to(at::kFloat), b = randn({9, k}, 2).to(at::kFloat);
    const at::Tensor whole = gemm(a, b, chunk);
    for (const auto& split :
         std::vector<std::vector<int64_t>>{{0, 11}, {0, 3, 7, 11}, {0, 1, 2, 11}, {0, 5, 5, 10, 11}}) {
      std::vector<cpu::ChunkSpan> spans;
      std::vector<at::Tensor> values;
      for (size_t r = 0; r + 1 < split.size(); ++r) {
        const int64_t c0 = split[r], c1 = split[r + 1];
        const int64_t k0 = c0 * chunk, k1 = std::min(k, c1 * chunk);
        const at::Tensor pieces = cpu::invariant_gemm_pieces(
            a.narrow(1, k0, k1 - k0).contiguous(), cpu::invariant_pack(b.narrow(1, k0, k1 - k0)), 9, c0, chunk);
        const auto mine = cpu::dyadic_pieces(c0, c1);
        REQUIRE(pieces.size(0) == static_cast<int64_t>(mine.size()));
        for (size_t i = 0; i < mine.size(); ++i) {
          spans.push_back(mine[i]);
          values.push_back(pieces[static_cast<int64_t>(i)]);
        }
      }
      CHECK(at::equal(tp::detail::evaluate_tree(chunks, spans, values), whole));
    }
  }
}

namespace {

// Runs `body(comm, rank_seen)` at TP 1-4 and checks every world's outputs and
// gradients equal TP 1's bit for bit (`slice` maps TP 1's weight gradient to a rank's).
using Body = std::function<Seen(Communicator&)>;
using Slice = std::function<at::Tensor(const at::Tensor& whole, int64_t world, int64_t rank)>;

void check_tp_invariant(const Body& body, const Slice& weight_slice, const Slice& bias_slice) {
  Seen one;
  run_ranks_in_threads(1, [&](Communicator& comm) { one = body(comm); });
  for (int64_t world = 2; world <= 4; ++world) {
    std::vector<Seen> seen(world);
    run_ranks_in_threads(world, [&](Communicator& comm) { seen[comm.rank()] = body(comm); });
    for (int64_t r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      CHECK(at::equal(seen[r].y, one.y));
      CHECK(at::equal(seen[r].gx, one.gx));
      CHECK(at::equal(seen[r].gw, weight_slice(one.gw, world, r)));
      if (one.gb.defined()) CHECK(at::equal(seen[r].gb, bias_slice(one.gb, world, r)));
    }
  }
}

Seen record(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return {y.detach().clone(), x.grad().clone(), w.grad().clone(), b.defined() ? b.grad().clone() : at::Tensor()};
}

}  // namespace

TEST_CASE("invariant: a Column then Row pair gives TP 1's bits at TP 2-4, forward and backward",
          "[invariant][layers]") {
  // in 96 (a short second chunk of 32), intermediate 320 (granularity 1, raised to 64:
  // 5 chunks, 2 + 2 + 1 at TP 3, a rank with none at TP 4 ... 2 + 1 + 1 + 1), out 37.
  const int64_t in = 96, mid = 320, out = 37, tokens = 7;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    const auto x = randn({tokens, in}, 1).to(dtype), G = randn({tokens, out}, 2).to(dtype);
    Checkpoint ckpt;
    ckpt.add("up.weight", randn({mid, in}, 3).to(dtype));
    ckpt.add("up.bias", randn({mid}, 4).to(dtype));
    ckpt.add("down.weight", randn({out, mid}, 5).to(dtype));
    ckpt.add("down.bias", randn({out}, 6).to(dtype));
    std::vector<std::vector<Range>> up_ranges(5);
    std::mutex mutex;
    // Record the column layer's gradients (its weight's rows are this rank's range).
    const Body body = [&](Communicator& comm) {
      ColumnParallelLinear up(ColumnParallelLinearOptions(in, mid).numerics(Numerics::kInvariant).dtype(dtype), comm);
      RowParallelLinear down(RowParallelLinearOptions(mid, out).numerics(Numerics::kInvariant).dtype(dtype), comm);
      up->load_weights(ckpt, "up");
      down->load_weights(ckpt, "down");
      {
        std::lock_guard<std::mutex> lock(mutex);
        up_ranges[comm.world_size()].resize(comm.world_size());
        up_ranges[comm.world_size()][comm.rank()] = up->local_range();
      }
      const at::Tensor xr = x.clone().requires_grad_(true);
      const at::Tensor y = down->forward(at::gelu(up->forward(xr)));
      (y * G).sum().backward();
      return record(y, xr, up->weight, up->bias);
    };
    check_tp_invariant(
        body,
        [&](const at::Tensor& w, int64_t world, int64_t r) {
          const Range rr = up_ranges[world][r];
          return w.narrow(0, rr.begin, rr.size());
        },
        [&](const at::Tensor& b, int64_t world, int64_t r) {
          const Range rr = up_ranges[world][r];
          return b.narrow(0, rr.begin, rr.size());
        });
    // The row layer's own weight gradient, by columns.
    std::vector<std::vector<Range>> down_ranges(5);
    const Body row_body = [&](Communicator& comm) {
      RowParallelLinear down(
          RowParallelLinearOptions(mid, out).input_is_parallel(false).numerics(Numerics::kInvariant).dtype(dtype),
          comm);
      down->load_weights(ckpt, "down");
      {
        std::lock_guard<std::mutex> lock(mutex);
        down_ranges[comm.world_size()].resize(comm.world_size());
        down_ranges[comm.world_size()][comm.rank()] = down->local_range();
      }
      const at::Tensor h = at::gelu(randn({tokens, mid}, 7)).to(dtype).requires_grad_(true);
      const at::Tensor y = down->forward(h);
      (y * G).sum().backward();
      return record(y, h, down->weight, down->bias);
    };
    check_tp_invariant(
        row_body,
        [&](const at::Tensor& w, int64_t world, int64_t r) {
          const Range rr = down_ranges[world][r];
          return w.narrow(1, rr.begin, rr.size());
        },
        [](const at::Tensor& b, int64_t, int64_t) { return b; });
  }
}

TEST_CASE("invariant: a row gives the same bits alone and inside a batch, at TP 1-3", "[invariant][layers]") {
  const int64_t in = 256, out = 48;
  Checkpoint ckpt;
  ckpt.add("down.weight", randn({out, in}, 5).to(at::kFloat));
  const at::Tensor x = randn({7, in}, 8).to(at::kFloat);
  for (int64_t world = 1; world <= 3; ++world) {
    std::vector<at::Tensor> batch(world), alone(world);
    run_ranks_in_threads(world, [&](Communicator& comm) {
      RowParallelLinear down(
          RowParallelLinearOptions(in, out).bias(false).input_is_parallel(false).numerics(Numerics::kInvariant), comm);
      down->load_weights(ckpt, "down");
      batch[comm.rank()] = down->forward(x);
      alone[comm.rank()] = down->forward(x.narrow(0, 4, 1));
    });
    for (int64_t r = 0; r < world; ++r) CHECK(at::equal(alone[r], batch[r].narrow(0, 4, 1)));
  }
}

TEST_CASE("invariant: QKV and GateUp give TP 1's outputs and input gradients at TP 2-4", "[invariant][layers]") {
  const int64_t hidden = 80, head_dim = 16, heads = 4, kv = 4, inter = 128, tokens = 5;
  Checkpoint ckpt;
  for (const char* n : {"q", "k", "v"})
    ckpt.add(std::string("attn.") + n + "_proj.weight", randn({heads * head_dim, hidden}, n[0]).to(at::kFloat));
  ckpt.add("mlp.gate_proj.weight", randn({inter, hidden}, 21).to(at::kFloat));
  ckpt.add("mlp.up_proj.weight", randn({inter, hidden}, 22).to(at::kFloat));
  const at::Tensor x = randn({tokens, hidden}, 9).to(at::kFloat);
  const at::Tensor Gq = randn({tokens, (heads + 2 * kv) * head_dim}, 10).to(at::kFloat);
  const at::Tensor Gm = randn({tokens, 2 * inter}, 11).to(at::kFloat);
  std::vector<at::Tensor> one(4);
  for (int64_t world = 1; world <= 4; ++world) {
    std::vector<std::vector<at::Tensor>> seen(world);
    run_ranks_in_threads(world, [&](Communicator& comm) {
      QKVParallelLinear qkv(QKVParallelLinearOptions(hidden, head_dim, heads, kv)
                                .bias(false)
                                .gather_output(true)
                                .numerics(Numerics::kInvariant),
                            comm);
      qkv->load_weights(ckpt, "attn");
      GateUpParallelLinear mlp(
          GateUpParallelLinearOptions(hidden, inter).bias(false).gather_output(true).numerics(Numerics::kInvariant),
          comm);
      mlp->load_weights(ckpt, "mlp");
      const at::Tensor xq = x.clone().requires_grad_(true), xm = x.clone().requires_grad_(true);
      const at::Tensor yq = qkv->forward(xq), ym = mlp->forward(xm);
      (yq * Gq).sum().backward();
      (ym * Gm).sum().backward();
      seen[comm.rank()] = {yq.detach(), xq.grad(), ym.detach(), xm.grad()};
    });
    for (int64_t r = 0; r < world; ++r) {
      if (world == 1) {
        one = seen[0];
        continue;
      }
      INFO("world " << world << " rank " << r);
      for (size_t i = 0; i < one.size(); ++i) CHECK(at::equal(seen[r][i], one[i]));
    }
  }
}

TEST_CASE(
    "invariant: replicated KV heads give TP 1's outputs and gradients when every replica gets the whole "
    "gradient, and fail by name when they do not",
    "[invariant][layers]") {
  // 6 query heads in 2 groups of 3: at TP 4 each KV head has 2 replicas, whose ranks hold
  // 2 and 1 of its group's query heads.
  const int64_t hidden = 32, head_dim = 8, heads = 6, kv = 2, tokens = 3;
  Checkpoint ckpt;
  ckpt.add("attn.q_proj.weight", randn({heads * head_dim, hidden}, 3).to(at::kFloat));
  ckpt.add("attn.k_proj.weight", randn({kv * head_dim, hidden}, 4).to(at::kFloat));
  ckpt.add("attn.v_proj.weight", randn({kv * head_dim, hidden}, 5).to(at::kFloat));
  const at::Tensor x = randn({tokens, hidden}, 6).to(at::kFloat);
  // The output gradient of the whole [q | k | v]: each rank takes its rows' part, so a
  // replica's k and v rows get the whole gradient of their head.
  const at::Tensor G = randn({tokens, (heads + 2 * kv) * head_dim}, 7).to(at::kFloat);
  struct Out {
    at::Tensor y, gx, gw;
    std::vector<Range> rows;  // this rank's rows of [q | k | v], in local order
    std::string error;
  };
  std::map<int64_t, std::vector<Out>> seen;
  for (const int64_t world : {1, 2, 4}) {
    seen[world].resize(world);
    run_ranks_in_threads(world, [&](Communicator& comm) {
      QKVParallelLinear qkv(
          QKVParallelLinearOptions(hidden, head_dim, heads, kv).bias(false).numerics(Numerics::kInvariant), comm);
      qkv->load_weights(ckpt, "attn");
      Out& o = seen[world][comm.rank()];
      const auto& plan = qkv->head_plan();
      const int64_t q_size = heads * head_dim, kv_size = kv * head_dim;
      o.rows = {{plan.q_heads.begin * head_dim, plan.q_heads.end * head_dim},
                {q_size + plan.kv_heads.begin * head_dim, q_size + plan.kv_heads.end * head_dim},
                {q_size + kv_size + plan.kv_heads.begin * head_dim, q_size + kv_size + plan.kv_heads.end * head_dim}};
      std::vector<at::Tensor> parts;
      for (const auto& r : o.rows) parts.push_back(G.narrow(1, r.begin, r.size()));
      const at::Tensor xr = x.clone().requires_grad_(true);
      const at::Tensor y = qkv->forward(xr);
      (y * at::cat(parts, 1)).sum().backward();
      o.y = y.detach();
      o.gx = xr.grad();
      o.gw = qkv->weight.grad();
      // The same layer with a gradient only the first replica gets: refused on every rank.
      try {
        QKVParallelLinear again(QKVParallelLinearOptions(hidden, head_dim, heads, kv)
                                    .bias(false)
                                    .gather_output(true)
                                    .numerics(Numerics::kInvariant),
                                comm);
        again->load_weights(ckpt, "attn");
        again->forward(x.clone().requires_grad_(true)).sum().backward();
      } catch (const std::exception& e) {
        o.error = e.what();
      }
    });
  }
  const Out& one = seen[1][0];
  for (const int64_t world : {2, 4}) {
    for (int64_t r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      const Out& o = seen[world][r];
      CHECK(at::equal(o.gx, one.gx));
      int64_t local = 0;
      for (const auto& rows : o.rows) {
        CHECK(at::equal(o.y.narrow(1, local, rows.size()), one.y.narrow(1, rows.begin, rows.size())));
        CHECK(at::equal(o.gw.narrow(0, local, rows.size()), one.gw.narrow(0, rows.begin, rows.size())));
        local += rows.size();
      }
      if (world == 4)
        CHECK_THAT(o.error, Contains("replicated KV rows"));
      else
        CHECK(o.error.empty());
    }
  }
  CHECK(seen[1][0].error.empty());
}

TEST_CASE("invariant: quantized formats, sequence parallelism and unreduced outputs are refused by name",
          "[invariant][layers]") {
  run_ranks_in_threads(2, [&](Communicator& comm) {
    CHECK_THROWS_WITH(
        RowParallelLinear(RowParallelLinearOptions(64, 8).reduce_output(false).numerics(Numerics::kInvariant), comm),
        Contains("reduce_output"));
  });
  CHECK_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(128, 64)
                                             .quant(parse_quant_config("int8_weight_only"))
                                             .numerics(Numerics::kInvariant)),
                    Contains("invariant numerics covers unquantized layers"));
  CHECK(parse_numerics("Invariant") == Numerics::kInvariant);
  CHECK_THROWS_WITH(parse_numerics("exact"), Contains("auto, default or invariant"));
}

namespace {

// One rank's outputs and gradients from a layer at sizes off the 64 x world grid, with
// where they sit in TP 1's tensors: `rows` are the global ranges of a column layer's
// output features (in local order) or a row layer's input features.
struct ShapeOut {
  at::Tensor y, gx, gw, gb;
  std::vector<Range> rows;
};

// A column layer's local output gradient from the whole one: its rows' columns, in order.
at::Tensor local_columns(const at::Tensor& whole, const std::vector<Range>& rows) {
  std::vector<at::Tensor> parts;
  for (const auto& r : rows) parts.push_back(whole.narrow(1, r.begin, r.size()));
  return at::cat(parts, 1).contiguous();
}

// Runs `body(comm)` at TP 1-4 and checks every rank's forward and backward against TP 1,
// bit for bit: a column layer's output and weight/bias gradients by its rows, a row
// layer's weight gradient by its input columns (its output and bias gradient whole).
void check_shapes_invariant(const std::string& what, bool row_layer,
                            const std::function<ShapeOut(Communicator&)>& body) {
  ShapeOut one;
  run_ranks_in_threads(1, [&](Communicator& comm) { one = body(comm); });
  for (int64_t world = 2; world <= 4; ++world) {
    std::vector<ShapeOut> seen(world);
    run_ranks_in_threads(world, [&](Communicator& comm) { seen[comm.rank()] = body(comm); });
    for (int64_t r = 0; r < world; ++r) {
      INFO(what << " world " << world << " rank " << r);
      const ShapeOut& o = seen[r];
      CHECK(at::equal(o.gx, one.gx));
      if (row_layer) {
        CHECK(at::equal(o.y, one.y));
        CHECK(at::equal(o.gb, one.gb));
      }
      int64_t local = 0;
      for (const auto& rows : o.rows) {
        INFO("features [" << rows.begin << ", " << rows.end << ")");
        if (row_layer) {
          CHECK(at::equal(o.gw.narrow(1, local, rows.size()), one.gw.narrow(1, rows.begin, rows.size())));
        } else {
          CHECK(at::equal(o.y.narrow(1, local, rows.size()), one.y.narrow(1, rows.begin, rows.size())));
          CHECK(at::equal(o.gw.narrow(0, local, rows.size()), one.gw.narrow(0, rows.begin, rows.size())));
          CHECK(at::equal(o.gb.narrow(0, local, rows.size()), one.gb.narrow(0, rows.begin, rows.size())));
        }
        local += rows.size();
      }
    }
  }
}

}  // namespace

TEST_CASE(
    "invariant: Row, Column, QKV and GateUp at sizes off the 64 x world grid give TP 1's bits at TP 2-4, "
    "forward and backward, at M = 1, 7 and 300",
    "[invariant][layers]") {
  // The sizes of small Llama / Qwen2 / Qwen3 folders: intermediate 1000, 700, 520; hidden
  // 320, 256, 192; head_dim 64 and 48 with one KV head (replicated at TP 2-4).
  struct Dense {
    int64_t in, out;
  };
  struct Heads {
    int64_t hidden, head_dim, heads;
  };
  const std::vector<Dense> dense{{320, 1000}, {1000, 320}, {256, 520}, {520, 256}, {192, 700}, {700, 192}};
  const std::vector<Heads> attention{{192, 48, 4}, {320, 64, 5}, {256, 48, 4}};
  for (const int64_t m : {1, 7, 300}) {
    for (const auto& [in, out] : dense) {
      Checkpoint ckpt;
      ckpt.add("l.weight", randn({out, in}, in + out).to(at::kFloat));
      ckpt.add("l.bias", randn({out}, in + out + 1).to(at::kFloat));
      const at::Tensor x = randn({m, in}, 2 * in + m).to(at::kFloat), G = randn({m, out}, 3 * out + m).to(at::kFloat);
      const std::string what = "M=" + std::to_string(m) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
      check_shapes_invariant("Column " + what, false, [&](Communicator& comm) {
        ColumnParallelLinear l(ColumnParallelLinearOptions(in, out).numerics(Numerics::kInvariant), comm);
        l->load_weights(ckpt, "l");
        const at::Tensor xr = x.clone().requires_grad_(true);
        const at::Tensor y = l->forward(xr);
        (y * local_columns(G, {l->local_range()})).sum().backward();
        return ShapeOut{y.detach(), xr.grad(), l->weight.grad(), l->bias.grad(), {l->local_range()}};
      });
      check_shapes_invariant("Row " + what, true, [&](Communicator& comm) {
        RowParallelLinear l(RowParallelLinearOptions(in, out).input_is_parallel(false).numerics(Numerics::kInvariant),
                            comm);
        l->load_weights(ckpt, "l");
        const at::Tensor xr = x.clone().requires_grad_(true);
        const at::Tensor y = l->forward(xr);
        (y * G).sum().backward();
        return ShapeOut{y.detach(), xr.grad(), l->weight.grad(), l->bias.grad(), {l->local_range()}};
      });
      if (in >= out) continue;
      // The MLP's fused gate/up at (hidden, intermediate) = (in, out).
      Checkpoint mlp;
      for (const char* n : {"gate_proj", "up_proj"}) {
        mlp.add(std::string("mlp.") + n + ".weight", randn({out, in}, in + out + n[0]).to(at::kFloat));
        mlp.add(std::string("mlp.") + n + ".bias", randn({out}, in + out + n[0] + 1).to(at::kFloat));
      }
      const at::Tensor G2 = randn({m, 2 * out}, 4 * out + m).to(at::kFloat);
      check_shapes_invariant("GateUp " + what, false, [&](Communicator& comm) {
        GateUpParallelLinear l(GateUpParallelLinearOptions(in, out).bias(true).numerics(Numerics::kInvariant), comm);
        l->load_weights(mlp, "mlp");
        const Range r = l->local_range();
        const std::vector<Range> rows{r, {out + r.begin, out + r.end}};
        const at::Tensor xr = x.clone().requires_grad_(true);
        const at::Tensor y = l->forward(xr);
        (y * local_columns(G2, rows)).sum().backward();
        return ShapeOut{y.detach(), xr.grad(), l->weight.grad(), l->bias.grad(), rows};
      });
    }
    for (const auto& [hidden, head_dim, heads] : attention) {
      const int64_t q_size = heads * head_dim, kv_size = head_dim;  // one KV head
      Checkpoint ckpt;
      for (const char* n : {"q", "k", "v"}) {
        const int64_t rows = n[0] == 'q' ? q_size : kv_size;
        ckpt.add(std::string("attn.") + n + "_proj.weight", randn({rows, hidden}, hidden + n[0]).to(at::kFloat));
        ckpt.add(std::string("attn.") + n + "_proj.bias", randn({rows}, hidden + n[0] + 1).to(at::kFloat));
      }
      ckpt.add("attn.o_proj.weight", randn({hidden, q_size}, hidden + 5).to(at::kFloat));
      ckpt.add("attn.o_proj.bias", randn({hidden}, hidden + 6).to(at::kFloat));
      const at::Tensor x = randn({m, hidden}, hidden + m).to(at::kFloat);
      const at::Tensor G = randn({m, q_size + 2 * kv_size}, hidden + 2 * m).to(at::kFloat);
      const at::Tensor xo = randn({m, q_size}, hidden + 3 * m).to(at::kFloat);
      const at::Tensor Go = randn({m, hidden}, hidden + 4 * m).to(at::kFloat);
      const std::string what = "M=" + std::to_string(m) + " hidden=" + std::to_string(hidden) +
                               " head_dim=" + std::to_string(head_dim) + " heads=" + std::to_string(heads) + " kv=1";
      const auto qkv_of = [&](Communicator& comm) {
        QKVParallelLinear qkv(
            QKVParallelLinearOptions(hidden, head_dim, heads, 1).bias(true).numerics(Numerics::kInvariant), comm);
        qkv->load_weights(ckpt, "attn");
        return qkv;
      };
      check_shapes_invariant("QKV " + what, false, [&](Communicator& comm) {
        QKVParallelLinear qkv = qkv_of(comm);
        const auto& plan = qkv->head_plan();
        // Each rank's rows of [q | k | v]: a replicated KV head's rows get its whole gradient.
        const std::vector<Range> rows{
            {plan.q_heads.begin * head_dim, plan.q_heads.end * head_dim},
            {q_size + plan.kv_heads.begin * head_dim, q_size + plan.kv_heads.end * head_dim},
            {q_size + kv_size + plan.kv_heads.begin * head_dim, q_size + kv_size + plan.kv_heads.end * head_dim}};
        const at::Tensor xr = x.clone().requires_grad_(true);
        const at::Tensor y = qkv->forward(xr);
        (y * local_columns(G, rows)).sum().backward();
        return ShapeOut{y.detach(), xr.grad(), qkv->weight.grad(), qkv->bias.grad(), rows};
      });
      check_shapes_invariant("O " + what, true, [&](Communicator& comm) {
        QKVParallelLinear qkv = qkv_of(comm);
        RowParallelLinear o(RowParallelLinearOptions(q_size, hidden)
                                .split(qkv->attention_output_split())
                                .input_is_parallel(false)
                                .numerics(Numerics::kInvariant),
                            comm);
        o->load_weights(ckpt, "attn.o_proj");
        const at::Tensor xr = xo.clone().requires_grad_(true);
        const at::Tensor y = o->forward(xr);
        (y * Go).sum().backward();
        return ShapeOut{y.detach(), xr.grad(), o->weight.grad(), o->bias.grad(), {o->local_range()}};
      });
    }
  }
}

TEST_CASE("invariant: the canonical GEMM gives the same bits on every ISA this CPU runs", "[invariant]") {
  // Each chunk's steps are fused multiply-adds in k order from zero on the scalar, AVX2 and
  // AVX-512 kernels alike (the scalar one with std::fma), so TP_CPU_ISA changes no bit.
  std::vector<cpu::Isa> isas{cpu::Isa::kScalar};
  if (cpu::max_isa() >= cpu::Isa::kAvx2) isas.push_back(cpu::Isa::kAvx2);
  if (cpu::max_isa() >= cpu::Isa::kAvx512) isas.push_back(cpu::Isa::kAvx512);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t chunk : {16, 64}) {
      // On AVX-512 (cpu/invariant_rows.h: rows 4 at a time, 4 or 8 panels side by side) M = 1,
      // 3, 7 and 37 leave partial row blocks; n = 300 is two groups of 8 panels and a partial
      // group with a partial last panel.
      for (const auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{
               {1, 45}, {3, 45}, {4, 45}, {7, 45}, {37, 45}, {1, 300}, {2, 300}, {4, 300}}) {
        const int64_t k = 1000;
        const at::Tensor a = randn({m, k}, 30 + m).to(at::kFloat).contiguous();
        const at::Tensor b = cpu::invariant_pack(randn({n, k}, 31).to(dtype));
        const at::Tensor want = cpu::invariant_gemm_pieces(a, b, n, 0, chunk, cpu::Isa::kScalar);
        for (const auto isa : isas) {
          INFO("dtype=" << dtype << " chunk=" << chunk << " M=" << m << " isa=" << cpu::to_string(isa));
          CHECK(at::equal(cpu::invariant_gemm_pieces(a, b, n, 0, chunk, isa), want));
        }
      }
    }
  }
}
