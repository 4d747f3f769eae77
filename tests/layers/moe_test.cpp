// MoEParallelMLP (expert tensor parallelism, and expert parallelism) against a
// single-device reference built from the same global weights, token by token (each
// token's top-k experts, their renormalised softmax weights), float64, at TP 1-4 (3: each
// expert's intermediate 20 split 7, 7, 6) and EP 1-4 (16 experts: 6, 5, 5 at 3), forward
// and backward: the output, the input's gradient, the router's
// gradient and every expert's gathered weight gradient. 10 tokens over 8 experts, top 2:
// some experts receive no token.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <mutex>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/split.h"

using namespace tp;
using test::randn;

namespace {

constexpr int64_t kHidden = 12, kInter = 20, kExperts = 16, kTopK = 2, kTokens = 10;

struct Weights {
  at::Tensor router, gate[kExperts], up[kExperts], down[kExperts];
};

Weights make_weights() {
  Weights w;
  w.router = randn({kExperts, kHidden}, 1);
  for (int64_t e = 0; e < kExperts; ++e) {
    w.gate[e] = randn({kInter, kHidden}, 10 + e) / std::sqrt(kHidden);
    w.up[e] = randn({kInter, kHidden}, 30 + e) / std::sqrt(kHidden);
    w.down[e] = randn({kHidden, kInter}, 50 + e) / std::sqrt(kInter);
  }
  return w;
}

// Token by token: softmax, top-k, renormalised, sum of w * down(silu(gate x) * up x).
at::Tensor reference(const at::Tensor& x, const Weights& w, const at::Tensor& router) {
  std::vector<at::Tensor> rows;
  const auto probs = at::softmax(at::linear(x, router).to(at::kFloat), -1);
  for (int64_t t = 0; t < x.size(0); ++t) {
    auto [top, idx] = at::topk(probs[t], kTopK);
    top = top / top.sum();
    at::Tensor y = at::zeros({kHidden}, x.options());
    for (int64_t j = 0; j < kTopK; ++j) {
      const int64_t e = idx[j].item<int64_t>();
      const auto h = at::silu(at::mv(w.gate[e], x[t])) * at::mv(w.up[e], x[t]);
      y = y + at::mv(w.down[e], h) * top[j];
    }
    rows.push_back(y);
  }
  return at::stack(rows);
}

}  // namespace

TEST_CASE("MoEParallelMLP equals the token-by-token reference at TP 1-4 and EP 1-4, forward and backward",
          "[layers][moe]") {
  const Weights w = make_weights();
  Checkpoint ckpt;
  ckpt.add("moe.gate.weight", w.router);
  for (int64_t e = 0; e < kExperts; ++e) {
    const std::string p = "moe.experts." + std::to_string(e) + ".";
    ckpt.add(p + "gate_proj.weight", w.gate[e]);
    ckpt.add(p + "up_proj.weight", w.up[e]);
    ckpt.add(p + "down_proj.weight", w.down[e]);
  }
  const at::Tensor x0 = randn({kTokens, kHidden}, 99);
  // The reference and its gradients (a fixed random output gradient).
  const at::Tensor g = randn({kTokens, kHidden}, 98);
  at::Tensor xr = x0.clone().requires_grad_(true), rr = w.router.clone().requires_grad_(true);
  const at::Tensor yr = reference(xr, w, rr);
  (yr * g).sum().backward();
  {
    // Some experts must receive no token, or the empty path goes untested.
    const auto [_, idx] = at::topk(at::softmax(at::linear(x0, w.router).to(at::kFloat), -1), kTopK, -1);
    CHECK(at::bincount(idx.reshape({-1}), {}, kExperts).eq(0).any().item<bool>());
  }
  for (int64_t world = 1; world <= 8; ++world) {
    // 1-4: expert tensor parallelism at TP 1-4; 5-8: expert parallelism over 1-4 ranks
    // (16 experts: 6, 5, 5 at 3 ranks).
    const bool ep = world > 4;
    const int64_t ranks = ep ? world - 4 : world;
    INFO((ep ? "EP " : "TP ") << ranks);
    std::mutex mu;
    double y_err = 0, x_err = 0, r_err = 0, w_err = 0;
    run_ranks_in_threads(ranks, [&](Communicator& comm) {
      MoEParallelMLP moe(MoEParallelMLPOptions(kHidden, kInter, kExperts, kTopK).expert_parallel(ep).dtype(at::kDouble),
                         comm);
      if (ep) CHECK(moe->local_experts() == split_for_rank(kExperts, ranks, comm.rank()));
      moe->load_weights(ckpt, "moe");
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor y = moe->forward(x);
      (y * g).sum().backward();
      // The experts' weight gradients, gathered as the weights are (rank r's slice of each).
      std::map<std::string, at::Tensor> grads;
      {
        at::NoGradGuard no_grad;
        const auto saved_gu = moe->gate_up_weight.clone(), saved_d = moe->down_weight.clone();
        moe->gate_up_weight.copy_(moe->gate_up_weight.grad());
        moe->down_weight.copy_(moe->down_weight.grad());
        grads = moe->gather_weights("moe");
        moe->gate_up_weight.copy_(saved_gu);
        moe->down_weight.copy_(saved_d);
      }
      double werr = 0;
      for (int64_t e = 0; e < kExperts; ++e) {
        // d/dW of sum(g * y): the reference's own autograd, expert by expert.
        Weights we = w;
        we.gate[e] = w.gate[e].clone().requires_grad_(true);
        we.up[e] = w.up[e].clone().requires_grad_(true);
        we.down[e] = w.down[e].clone().requires_grad_(true);
        const at::Tensor loss = (reference(x0, we, w.router) * g).sum();
        if (loss.requires_grad()) loss.backward();  // else expert e got no token: its gradient must be 0
        const std::string p = "moe.experts." + std::to_string(e) + ".";
        const auto diff = [&](const at::Tensor& a, const at::Tensor& b) {
          return b.defined() ? (a - b).abs().max().item<double>() : a.abs().max().item<double>();
        };
        werr = std::max({werr, diff(grads.at(p + "gate_proj.weight"), we.gate[e].grad()),
                         diff(grads.at(p + "up_proj.weight"), we.up[e].grad()),
                         diff(grads.at(p + "down_proj.weight"), we.down[e].grad())});
      }
      std::lock_guard<std::mutex> lock(mu);
      y_err = std::max(y_err, (y - yr).abs().max().item<double>());
      x_err = std::max(x_err, (x.grad() - xr.grad()).abs().max().item<double>());
      r_err = std::max(r_err, (moe->router_weight.grad() - rr.grad()).abs().max().item<double>());
      w_err = std::max(w_err, werr);
    });
    CHECK(y_err <= 1e-12);
    CHECK(x_err <= 1e-12);
    CHECK(r_err <= 1e-12);
    CHECK(w_err <= 1e-12);
  }
}

TEST_CASE("MoEParallelMLP refuses bad options and checkpoint tensors by name, on every rank", "[layers][moe][errors]") {
  CHECK_THROWS_WITH(MoEParallelMLP(MoEParallelMLPOptions(12, 20, 4, 5)), Catch::Contains("top_k=5"));
  Checkpoint ckpt;
  ckpt.add("moe.gate.weight", randn({4, 12}, 1));
  run_ranks_in_threads(2, [&](Communicator& comm) {
    MoEParallelMLP moe(MoEParallelMLPOptions(12, 20, 4, 2).dtype(at::kDouble), comm);
    CHECK_THROWS_WITH(moe->load_weights(ckpt, "moe"), Catch::Contains("moe.experts.0.gate_proj.weight"));
  });
}
