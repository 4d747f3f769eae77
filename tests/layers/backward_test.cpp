// The layers' backward at TP 1-4 (ranks as threads over Gloo), in float64, against
// at::linear with autograd on the full weights: input, weight and bias gradients within
// 1e-10, random shapes with uneven and zero-size shards, GQA with replicated KV heads,
// and the sequence-parallel mode.
//
// The loss is <y, G> for a fixed random G: a mirrored output (gather_output, a row
// layer) counts once, as every rank computes the same loss; split outputs add up over
// ranks. The reference builds the same loss from the single-device output.

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

// What one rank saw: its output and the gradients of its input and parameters.
struct RankOut {
  at::Tensor y, gx, gw, gb;
};

RankOut record(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return {y.detach().clone(), x.grad().clone(), w.grad().clone(), b.defined() ? b.grad().clone() : at::Tensor()};
}

// The single-device reference: output and gradients of loss(Y) w.r.t. x, W, b.
struct Reference {
  at::Tensor y, gx, gw, gb;
};

template <class Loss>
Reference reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool bias, Loss loss) {
  auto xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true), br = b.clone().requires_grad_(true);
  const auto y = at::linear(xr, wr, bias ? std::optional<at::Tensor>(br) : std::nullopt);
  loss(y).backward();
  return {y.detach(), xr.grad(), wr.grad(), bias ? br.grad() : at::Tensor()};
}

double err(const at::Tensor& a, const at::Tensor& b) { return test::relative_error(a, b); }

// Rank r's tokens along `dim` (the rule of tp/layers/sequence_parallel.h).
Range tokens_of(int64_t tokens, int64_t world, int64_t rank) { return sequence_ranges(tokens, world).at(rank); }

// A shape [..., tokens, features]: 2-D or 3-D, and the token dim for sequence parallelism.
std::vector<int64_t> act_shape(uint64_t seed, int64_t features, int64_t tokens) {
  if (seed % 3 == 0) return {2, tokens, features};
  return {tokens, features};
}
int64_t token_dim(const std::vector<int64_t>& shape) { return static_cast<int64_t>(shape.size()) - 2; }
std::vector<int64_t> with_last(std::vector<int64_t> s, int64_t last) {
  s.back() = last;
  return s;
}

// A split policy: even with a granularity, or weighted with one rank at zero.
SplitPolicy random_policy(int64_t world, uint64_t seed, int64_t granularity) {
  auto policy = SplitPolicy{}.with_granularity(granularity);
  if (world > 1 && seed % 4 == 1) {
    std::vector<double> w(world, 1.0);
    w[seed % world] = 0.0;
    policy = policy.with_weights(w);
  }
  return policy;
}

struct LinearCase {
  int64_t world = 1, in = 0, out = 0, tokens = 0;
  bool bias = true;
  SplitPolicy policy;
  std::vector<int64_t> shape;  // x's shape
  uint64_t seed = 0;
};

std::string describe(const LinearCase& c) {
  std::ostringstream os;
  os << "world=" << c.world << " in=" << c.in << " out=" << c.out << " x=" << c10::IntArrayRef(c.shape)
     << " bias=" << c.bias << " granularity=" << c.policy.granularity << " weights=" << c.policy.weights.size()
     << " seed=" << c.seed;
  return os.str();
}

LinearCase random_linear(int64_t world, uint64_t seed, bool split_out) {
  LinearCase c;
  c.world = world;
  c.seed = seed;
  const int64_t granularity = seed % 2 ? 1 : 4;
  // Sometimes fewer units than ranks: zero-size shards.
  const int64_t units = test::randint(1, 9, seed + 1);
  const int64_t other = test::randint(1, 24, seed + 2);
  (split_out ? c.out : c.in) = units * granularity;
  (split_out ? c.in : c.out) = other;
  c.tokens = test::randint(1, 6, seed + 3);
  c.shape = act_shape(seed, c.in, c.tokens);
  c.bias = seed % 5 != 0;
  c.policy = random_policy(world, seed, granularity);
  return c;
}

}  // namespace

TEST_CASE("ColumnParallelLinear backward matches at::linear autograd", "[layers][autograd]") {
  uint64_t seed = 3000;
  for (int64_t world = 1; world <= 4; ++world) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool gather = variant % 2 == 1, sp = variant >= 2;
      const auto c = random_linear(world, ++seed, /*split_out=*/true);
      INFO(describe(c) << " gather_output=" << gather << " sequence_parallel=" << sp);
      const auto x = randn(c.shape, seed * 11 + 1), w = randn({c.out, c.in}, seed * 11 + 2);
      const auto b = randn({c.out}, seed * 11 + 3), G = randn(with_last(c.shape, c.out), seed * 11 + 4);
      Checkpoint ckpt;
      ckpt.add("fc.weight", w);
      if (c.bias) ckpt.add("fc.bias", b);
      const int64_t tdim = token_dim(c.shape);
      std::vector<RankOut> outs(world);
      std::vector<Range> ranges(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            ColumnParallelLinear fc(ColumnParallelLinearOptions(c.in, c.out)
                                        .bias(c.bias)
                                        .gather_output(gather)
                                        .sequence_parallel(sp)
                                        .sequence_dim(tdim)
                                        .split(c.policy)
                                        .dtype(at::kDouble),
                                    comm);
            fc->load_weights(ckpt, "fc");
            const int64_t r = comm.rank();
            const Range range = fc->local_range(), tok = tokens_of(c.tokens, world, r);
            auto xr = (sp ? x.narrow(tdim, tok.begin, tok.size()) : x).clone().requires_grad_(true);
            const auto y = fc->forward(xr);
            (y * (gather ? G : G.narrow(-1, range.begin, range.size()))).sum().backward();
            outs[r] = record(y, xr, fc->weight, fc->bias);
            ranges[r] = range;
          },
          test::test_comm_options());
      const auto ref = reference(x, w, b, c.bias, [&](const at::Tensor& y) { return (y * G).sum(); });
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r << " range " << ranges[r]);
        const Range rg = ranges[r], tok = tokens_of(c.tokens, world, r);
        CHECK(err(outs[r].y, gather ? ref.y : ref.y.narrow(-1, rg.begin, rg.size())) <= kTol);
        CHECK(err(outs[r].gx, sp ? ref.gx.narrow(tdim, tok.begin, tok.size()) : ref.gx) <= kTol);
        CHECK(err(outs[r].gw, ref.gw.narrow(0, rg.begin, rg.size())) <= kTol);
        if (c.bias) CHECK(err(outs[r].gb, ref.gb.narrow(0, rg.begin, rg.size())) <= kTol);
      }
    }
  }
}

TEST_CASE("RowParallelLinear backward matches at::linear autograd", "[layers][autograd]") {
  uint64_t seed = 4000;
  for (int64_t world = 1; world <= 4; ++world) {
    for (int variant = 0; variant < 4; ++variant) {
      // 0: parallel input; 1: whole input (scattered); 2: reduce_output(false) reduced
      // by the caller; 3: sequence parallel (reduce-scattered over tokens), whole input.
      const bool whole = variant == 1 || variant == 3, unreduced = variant == 2, sp = variant == 3;
      const auto c = random_linear(world, ++seed, /*split_out=*/false);
      INFO(describe(c) << " variant=" << variant);
      const auto x = randn(c.shape, seed * 11 + 1), w = randn({c.out, c.in}, seed * 11 + 2);
      const auto b = randn({c.out}, seed * 11 + 3), G = randn(with_last(c.shape, c.out), seed * 11 + 4);
      Checkpoint ckpt;
      ckpt.add("o.weight", w);
      if (c.bias) ckpt.add("o.bias", b);
      const int64_t tdim = token_dim(c.shape);
      std::vector<RankOut> outs(world);
      std::vector<Range> ranges(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            RowParallelLinear o(RowParallelLinearOptions(c.in, c.out)
                                    .bias(c.bias)
                                    .input_is_parallel(!whole)
                                    .reduce_output(!unreduced)
                                    .sequence_parallel(sp)
                                    .sequence_dim(tdim)
                                    .split(c.policy)
                                    .dtype(at::kDouble),
                                comm);
            o->load_weights(ckpt, "o");
            const int64_t r = comm.rank();
            const Range range = o->local_range(), tok = tokens_of(c.tokens, world, r);
            auto xr = (whole ? x : x.narrow(-1, range.begin, range.size())).clone().requires_grad_(true);
            auto y = o->forward(xr);
            if (unreduced) y = reduce_from_parallel(y, comm);  // the partial sum, reduced by the caller
            (y * (sp ? G.narrow(tdim, tok.begin, tok.size()) : G)).sum().backward();
            outs[r] = record(y, xr, o->weight, o->bias);
            ranges[r] = range;
          },
          test::test_comm_options());
      const auto ref = reference(x, w, b, c.bias, [&](const at::Tensor& y) { return (y * G).sum(); });
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r << " range " << ranges[r]);
        const Range rg = ranges[r], tok = tokens_of(c.tokens, world, r);
        CHECK(err(outs[r].y, sp ? ref.y.narrow(tdim, tok.begin, tok.size()) : ref.y) <= kTol);
        CHECK(err(outs[r].gx, whole ? ref.gx : ref.gx.narrow(-1, rg.begin, rg.size())) <= kTol);
        CHECK(err(outs[r].gw, ref.gw.narrow(1, rg.begin, rg.size())) <= kTol);
        if (c.bias) {
          // Every rank's mirrored bias gets the full gradient, bit for bit the same.
          CHECK(err(outs[r].gb, ref.gb) <= kTol);
          CHECK(at::equal(outs[r].gb, outs[0].gb));
        }
      }
    }
  }
}

namespace {

// Rank r's local rows of a fused output: (fused source, local offset) per piece.
std::vector<SegmentPiece> pieces_of(const QKVParallelLinear& qkv) { return qkv->head_plan().qkv_plan().pieces; }

// The rows of a global fused tensor (dim `dim`) that a rank holds, in its local order.
at::Tensor local_rows(const at::Tensor& t, const std::vector<SegmentPiece>& pieces, int64_t dim) {
  std::vector<at::Tensor> parts;
  for (const auto& p : pieces) parts.push_back(t.narrow(dim, p.fused_source().begin, p.size()));
  return at::cat(parts, dim);
}

struct QKVCase {
  int64_t world = 1, hidden = 0, head_dim = 0, heads = 0, kv_heads = 0, tokens = 0;
  bool bias = false, gather = false, sp = false;
  std::vector<double> weights;  // empty: even
  uint64_t seed = 0;
};

std::string describe(const QKVCase& c) {
  std::ostringstream os;
  os << "world=" << c.world << " hidden=" << c.hidden << " head_dim=" << c.head_dim << " heads=" << c.heads
     << " kv_heads=" << c.kv_heads << " tokens=" << c.tokens << " bias=" << c.bias << " gather=" << c.gather
     << " sp=" << c.sp << " weights=" << c.weights.size() << " seed=" << c.seed;
  return os.str();
}

// Runs a QKV case; checks gradients against the reference and, for replicated KV
// heads, that the copies are identical after one SGD step.
void run_qkv(const QKVCase& c) {
  INFO(describe(c));
  const int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, total = q + 2 * kv;
  const std::vector<int64_t> shape = act_shape(c.seed, c.hidden, c.tokens);
  const int64_t tdim = token_dim(shape);
  const auto x = randn(shape, c.seed * 13 + 1), w = randn({total, c.hidden}, c.seed * 13 + 2);
  const auto b = randn({total}, c.seed * 13 + 3), G = randn(with_last(shape, total), c.seed * 13 + 4);
  Checkpoint ckpt;
  ckpt.add("attn.q_proj.weight", w.narrow(0, 0, q));
  ckpt.add("attn.k_proj.weight", w.narrow(0, q, kv));
  ckpt.add("attn.v_proj.weight", w.narrow(0, q + kv, kv));
  if (c.bias) {
    ckpt.add("attn.q_proj.bias", b.narrow(0, 0, q));
    ckpt.add("attn.k_proj.bias", b.narrow(0, q, kv));
    ckpt.add("attn.v_proj.bias", b.narrow(0, q + kv, kv));
  }
  const double lr = 0.1;
  std::vector<RankOut> outs(c.world);
  std::vector<std::vector<SegmentPiece>> pieces(c.world);
  std::vector<at::Tensor> stepped_w(c.world), stepped_b(c.world);
  run_ranks_in_threads(
      c.world,
      [&](Communicator& comm) {
        SplitPolicy policy;
        policy.weights = c.weights;
        QKVParallelLinear qkv(QKVParallelLinearOptions(c.hidden, c.head_dim, c.heads, c.kv_heads)
                                  .bias(c.bias)
                                  .gather_output(c.gather)
                                  .sequence_parallel(c.sp)
                                  .sequence_dim(tdim)
                                  .split(policy)
                                  .dtype(at::kDouble),
                              comm);
        qkv->load_weights(ckpt, "attn");
        const int64_t r = comm.rank();
        const auto mine = pieces_of(qkv);
        const Range tok = tokens_of(c.tokens, c.world, r);
        auto xr = (c.sp ? x.narrow(tdim, tok.begin, tok.size()) : x).clone().requires_grad_(true);
        const auto y = qkv->forward(xr);
        (y * (c.gather ? G : local_rows(G, mine, -1))).sum().backward();
        outs[r] = record(y, xr, qkv->weight, qkv->bias);
        pieces[r] = mine;
        at::NoGradGuard no_grad;  // one SGD step
        qkv->weight.sub_(lr * qkv->weight.grad());
        if (c.bias) qkv->bias.sub_(lr * qkv->bias.grad());
        stepped_w[r] = qkv->weight.clone();
        if (c.bias) stepped_b[r] = qkv->bias.clone();
      },
      test::test_comm_options());
  // The loss the ranks computed, from the single-device output: <Y, G> once when
  // gathered (mirrored), else every rank's pieces, a replicated KV head once per copy.
  const auto ref = reference(x, w, b, c.bias, [&](const at::Tensor& y) {
    if (c.gather) return (y * G).sum();
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (const auto& mine : pieces) loss = loss + (local_rows(y, mine, -1) * local_rows(G, mine, -1)).sum();
    return loss;
  });
  for (int64_t r = 0; r < c.world; ++r) {
    INFO("rank " << r);
    const Range tok = tokens_of(c.tokens, c.world, r);
    CHECK(err(outs[r].y, c.gather ? ref.y : local_rows(ref.y, pieces[r], -1)) <= kTol);
    CHECK(err(outs[r].gx, c.sp ? ref.gx.narrow(tdim, tok.begin, tok.size()) : ref.gx) <= kTol);
    CHECK(err(outs[r].gw, local_rows(ref.gw, pieces[r], 0)) <= kTol);
    if (c.bias) CHECK(err(outs[r].gb, local_rows(ref.gb, pieces[r], 0)) <= kTol);
    // Replicated rows: the same bits as every other holder's, before and after the step.
    for (int64_t s = 0; s < r; ++s) {
      for (size_t i = 0; i < pieces[r].size(); ++i) {
        const auto& pr = pieces[r][i];
        const auto& ps = pieces[s][i];
        if (pr.size() == 0 || pr.source != ps.source) continue;
        INFO("segment " << pr.name << " " << pr.source << " held by ranks " << s << " and " << r);
        CHECK(at::equal(stepped_w[r].narrow(0, pr.local_offset, pr.size()),
                        stepped_w[s].narrow(0, ps.local_offset, ps.size())));
        if (c.bias)
          CHECK(at::equal(stepped_b[r].narrow(0, pr.local_offset, pr.size()),
                          stepped_b[s].narrow(0, ps.local_offset, ps.size())));
      }
    }
  }
}

}  // namespace

TEST_CASE("QKVParallelLinear backward: GQA, replicated KV heads, zero query heads", "[layers][autograd]") {
  uint64_t seed = 5000;
  struct Heads {
    int64_t heads, kv_heads;
  };
  const Heads configs[] = {{6, 3}, {8, 2}, {4, 1}, {6, 6}};
  for (int64_t world = 1; world <= 4; ++world) {
    for (const auto& h : configs) {
      // KV heads split over ranks, or replicated when world > kv_heads (world % kv == 0).
      if (world > h.kv_heads && world % h.kv_heads != 0) continue;
      QKVCase c;
      c.world = world, c.heads = h.heads, c.kv_heads = h.kv_heads, c.seed = ++seed;
      c.head_dim = 2 + static_cast<int64_t>(seed % 3), c.hidden = test::randint(3, 20, seed);
      c.tokens = test::randint(1, 5, seed + 1);
      c.bias = seed % 2 == 0, c.gather = seed % 3 == 1, c.sp = seed % 4 == 2;
      run_qkv(c);
    }
  }
  // A rank that owns no query heads but holds a KV replica: world 4, 2 KV heads
  // replicated twice, query heads of group 0 all on rank 0.
  for (bool gather : {false, true}) {
    QKVCase c;
    c.world = 4, c.heads = 4, c.kv_heads = 2, c.head_dim = 3, c.hidden = 7, c.tokens = 3, c.bias = true;
    c.gather = gather, c.weights = {1, 0, 1, 1}, c.seed = 5100 + gather;
    run_qkv(c);
  }
}

TEST_CASE("GateUpParallelLinear backward matches at::linear autograd", "[layers][autograd]") {
  uint64_t seed = 6000;
  for (int64_t world = 1; world <= 4; ++world) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool gather = variant == 1, sp = variant == 2;
      const int64_t hidden = test::randint(1, 16, ++seed), inter = test::randint(1, 9, seed + 1);
      const int64_t tokens = test::randint(1, 5, seed + 2);
      const bool bias = seed % 2 == 0;
      const auto policy = random_policy(world, seed, 1);
      INFO("world=" << world << " hidden=" << hidden << " intermediate=" << inter << " tokens=" << tokens
                    << " bias=" << bias << " gather=" << gather << " sp=" << sp << " seed=" << seed);
      const auto shape = act_shape(seed, hidden, tokens);
      const int64_t tdim = token_dim(shape);
      const auto x = randn(shape, seed * 7 + 1), w = randn({2 * inter, hidden}, seed * 7 + 2);
      const auto b = randn({2 * inter}, seed * 7 + 3), G = randn(with_last(shape, 2 * inter), seed * 7 + 4);
      Checkpoint ckpt;
      ckpt.add("mlp.gate_proj.weight", w.narrow(0, 0, inter));
      ckpt.add("mlp.up_proj.weight", w.narrow(0, inter, inter));
      if (bias) {
        ckpt.add("mlp.gate_proj.bias", b.narrow(0, 0, inter));
        ckpt.add("mlp.up_proj.bias", b.narrow(0, inter, inter));
      }
      std::vector<RankOut> outs(world);
      std::vector<Range> ranges(world);
      // Rank's rows of the fused [gate | up] dim, in its local order.
      auto local = [&](const at::Tensor& t, const Range& r, int64_t dim) {
        return at::cat({t.narrow(dim, r.begin, r.size()), t.narrow(dim, inter + r.begin, r.size())}, dim);
      };
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            GateUpParallelLinear gu(GateUpParallelLinearOptions(hidden, inter)
                                        .bias(bias)
                                        .gather_output(gather)
                                        .sequence_parallel(sp)
                                        .sequence_dim(tdim)
                                        .split(policy)
                                        .dtype(at::kDouble),
                                    comm);
            gu->load_weights(ckpt, "mlp");
            const int64_t r = comm.rank();
            const Range range = gu->local_range(), tok = tokens_of(tokens, world, r);
            auto xr = (sp ? x.narrow(tdim, tok.begin, tok.size()) : x).clone().requires_grad_(true);
            const auto y = gu->forward(xr);
            (y * (gather ? G : local(G, range, -1))).sum().backward();
            outs[r] = record(y, xr, gu->weight, gu->bias);
            ranges[r] = range;
          },
          test::test_comm_options());
      const auto ref = reference(x, w, b, bias, [&](const at::Tensor& y) { return (y * G).sum(); });
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r << " range " << ranges[r]);
        const Range tok = tokens_of(tokens, world, r);
        CHECK(err(outs[r].y, gather ? ref.y : local(ref.y, ranges[r], -1)) <= kTol);
        CHECK(err(outs[r].gx, sp ? ref.gx.narrow(tdim, tok.begin, tok.size()) : ref.gx) <= kTol);
        CHECK(err(outs[r].gw, local(ref.gw, ranges[r], 0)) <= kTol);
        if (bias) CHECK(err(outs[r].gb, local(ref.gb, ranges[r], 0)) <= kTol);
      }
    }
  }
}

TEST_CASE("A gated MLP trains the same at TP 1-4, with and without sequence parallelism", "[layers][autograd]") {
  // The case: GateUp -> SiLU(gate) * up -> Row. Its input gradient was wrong
  // by 60-100 % at TP > 1 before the collectives were differentiable.
  const int64_t hidden = 12, inter = 10, tokens = 5;  // 10 over 3 or 4, 5 tokens over 2-4: uneven
  const auto x = randn({tokens, hidden}, 71), G = randn({tokens, hidden}, 72);
  const auto wg = randn({inter, hidden}, 73), wu = randn({inter, hidden}, 74), wd = randn({hidden, inter}, 75);
  const auto bd = randn({hidden}, 76);
  Checkpoint ckpt;
  ckpt.add("mlp.gate_proj.weight", wg);
  ckpt.add("mlp.up_proj.weight", wu);
  ckpt.add("mlp.down_proj.weight", wd);
  ckpt.add("mlp.down_proj.bias", bd);
  auto xr = x.clone().requires_grad_(true);
  auto wgr = wg.clone().requires_grad_(true), wur = wu.clone().requires_grad_(true);
  auto wdr = wd.clone().requires_grad_(true), bdr = bd.clone().requires_grad_(true);
  const auto ref_y = at::linear(at::silu(at::linear(xr, wgr)) * at::linear(xr, wur), wdr, bdr);
  (ref_y * G).sum().backward();
  for (bool sp : {false, true}) {
    for (int64_t world = 1; world <= 4; ++world) {
      INFO("world=" << world << " sequence_parallel=" << sp);
      std::vector<at::Tensor> gx(world), gwg(world), gwd(world), gbd(world), y(world);
      std::vector<Range> ranges(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            GateUpParallelLinear gu(GateUpParallelLinearOptions(hidden, inter).sequence_parallel(sp).dtype(at::kDouble),
                                    comm);
            RowParallelLinear down(
                RowParallelLinearOptions(inter, hidden).bias(true).sequence_parallel(sp).dtype(at::kDouble), comm);
            gu->load_weights(ckpt, "mlp");
            down->load_weights(ckpt, "mlp.down_proj");
            const int64_t r = comm.rank();
            const Range tok = tokens_of(tokens, world, r);
            auto xi = (sp ? x.narrow(0, tok.begin, tok.size()) : x).clone().requires_grad_(true);
            auto [gate, up] = gu->split(gu->forward(xi));
            const auto out = down->forward(at::silu(gate) * up);
            (out * (sp ? G.narrow(0, tok.begin, tok.size()) : G)).sum().backward();
            y[r] = out.detach();
            gx[r] = xi.grad();
            gwg[r] = gu->weight.grad();
            gwd[r] = down->weight.grad();
            gbd[r] = down->bias.grad();
            ranges[r] = gu->local_range();
          },
          test::test_comm_options());
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r);
        const Range rg = ranges[r], tok = tokens_of(tokens, world, r);
        auto rows = [&](const at::Tensor& t) { return sp ? t.narrow(0, tok.begin, tok.size()) : t; };
        CHECK(err(y[r], rows(ref_y.detach())) <= kTol);
        CHECK(err(gx[r], rows(xr.grad())) <= kTol);
        CHECK(err(gwg[r], at::cat({wgr.grad().narrow(0, rg.begin, rg.size()),
                                   wur.grad().narrow(0, rg.begin, rg.size())})) <= kTol);
        CHECK(err(gwd[r], wdr.grad().narrow(1, rg.begin, rg.size())) <= kTol);
        CHECK(err(gbd[r], bdr.grad()) <= kTol);
      }
    }
  }
}

TEST_CASE("Sequence-parallel token pieces follow the documented rule", "[layers][autograd]") {
  const auto r = sequence_ranges(10, 4);
  REQUIRE(r.size() == 4);
  CHECK(r[0] == Range{0, 3});
  CHECK(r[1] == Range{3, 6});
  CHECK(r[2] == Range{6, 8});
  CHECK(r[3] == Range{8, 10});
  CHECK(sequence_sizes(2, 3) == std::vector<int64_t>{1, 1, 0});
  CHECK(sequence_sizes(0, 2) == std::vector<int64_t>{0, 0});
  // The row layer's output pieces are exactly these, whatever the token count.
  for (int64_t world = 2; world <= 4; ++world) {
    for (int64_t tokens : {1, 2, 5, 7}) {
      std::vector<int64_t> got(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            RowParallelLinear o(RowParallelLinearOptions(4, 3).sequence_parallel(true).dtype(at::kDouble), comm);
            got[comm.rank()] = o->forward(at::randn({tokens, o->local_range().size()}, at::kDouble)).size(0);
          },
          test::test_comm_options());
      INFO("world=" << world << " tokens=" << tokens);
      CHECK(got == sequence_sizes(tokens, world));
    }
  }
}

TEST_CASE("sequence_dim must be a token dim", "[layers][autograd]") {
  ColumnParallelLinear fc(ColumnParallelLinearOptions(4, 3).sequence_parallel(true).sequence_dim(1));
  REQUIRE_THROWS_WITH(fc->forward(at::randn({2, 4})), Catch::Contains("sequence_dim=1 is not a token dim"));
  REQUIRE_NOTHROW(fc->forward(at::randn({2, 5, 4})));
}
