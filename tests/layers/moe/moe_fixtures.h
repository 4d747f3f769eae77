#pragma once
// The MoE tests' fixtures (moe_test.cpp, moe_loading_test.cpp): the families' variants, their
// global weights drawn at random, and those weights as checkpoints in the per-expert and the
// fused 3-D layouts.

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"

namespace tp::test::moe {

inline constexpr int64_t kHidden = 12, kInter = 20, kShared = 14, kExperts = 16, kTokens = 10;

struct Spec {
  std::string name;
  MoERouterOptions router;
  int64_t top_k = 2;
  std::string activation = "silu";
  int64_t shared = 0;  // shared expert's intermediate size
  bool shared_gate = false, expert_bias = false;
};

inline std::vector<Spec> specs() {
  std::vector<Spec> out;
  out.push_back({"mixtral", MoERouterOptions(), 2});
  out.push_back(
      {"qwen2", MoERouterOptions().normalize_top_k(false).weights_in_input_dtype(true), 4, "silu", kShared, true});
  out.push_back({"deepseek",
                 MoERouterOptions()
                     .scoring(MoEScoring::kSigmoid)
                     .score_correction_bias(true)
                     .num_groups(4)
                     .top_k_groups(2)
                     .scaling_factor(2.5)
                     .logits_in_float32(true),
                 4, "silu", kShared});
  out.push_back(
      {"gpt_oss", MoERouterOptions().scoring(MoEScoring::kSoftmaxOfTopK).bias(true), 2, "swiglu_oai", 0, false, true});
  return out;
}

inline MoEParallelMLPOptions options_of(const Spec& s) {
  return MoEParallelMLPOptions(kHidden, kInter, kExperts, s.top_k)
      .router(s.router)
      .activation(s.activation)
      .swiglu_limit(1.5)  // reached by these random values: the clamps are exercised
      .shared_expert_intermediate_size(s.shared)
      .shared_expert_gate(s.shared_gate)
      .expert_bias(s.expert_bias)
      .dtype(at::kDouble);
}

// The global weights, float64, every one a leaf that can take a gradient.
struct Weights {
  at::Tensor router, router_bias, correction, shared_gate;
  std::vector<at::Tensor> gate, up, down, gate_b, up_b, down_b;
  at::Tensor s_gate, s_up, s_down;

  std::vector<at::Tensor> leaves() const {
    std::vector<at::Tensor> out{router};
    for (const auto& t : {router_bias, shared_gate, s_gate, s_up, s_down})
      if (t.defined()) out.push_back(t);
    for (const auto* v : {&gate, &up, &down, &gate_b, &up_b, &down_b}) out.insert(out.end(), v->begin(), v->end());
    return out;
  }
};

inline Weights make_weights(const Spec& s, uint64_t seed) {
  Weights w;
  const double h = 1 / std::sqrt(double(kHidden)), i = 1 / std::sqrt(double(kInter));
  w.router = randn({kExperts, kHidden}, seed);
  if (s.router.bias()) w.router_bias = randn({kExperts}, seed + 1);
  // A correction large enough to change which experts are chosen (it has no gradient).
  if (s.router.score_correction_bias()) w.correction = (0.3 * randn({kExperts}, seed + 2)).to(at::kFloat);
  for (int64_t e = 0; e < kExperts; ++e) {
    w.gate.push_back(randn({kInter, kHidden}, seed + 10 + e) * h);
    w.up.push_back(randn({kInter, kHidden}, seed + 30 + e) * h);
    w.down.push_back(randn({kHidden, kInter}, seed + 50 + e) * i);
    if (s.expert_bias) {
      w.gate_b.push_back(randn({kInter}, seed + 70 + e) * 0.1);
      w.up_b.push_back(randn({kInter}, seed + 90 + e) * 0.1);
      w.down_b.push_back(randn({kHidden}, seed + 110 + e) * 0.1);
    }
  }
  if (s.shared > 0) {
    w.s_gate = randn({s.shared, kHidden}, seed + 130) * h;
    w.s_up = randn({s.shared, kHidden}, seed + 131) * h;
    w.s_down = randn({kHidden, s.shared}, seed + 132) / std::sqrt(double(s.shared));
    if (s.shared_gate) w.shared_gate = randn({1, kHidden}, seed + 133) * h;
  }
  for (auto t : w.leaves()) t.requires_grad_(true);
  return w;
}

// Every tensor of `w` under its per-expert checkpoint name (without the layer prefix),
// as transformers 4 writes them; absent (undefined) ones are skipped.
template <typename F>
void for_each_named(const Weights& w, F&& f) {
  const auto visit = [&](const std::string& name, const at::Tensor& t) {
    if (t.defined()) f(name, t);
  };
  visit("gate.weight", w.router);
  visit("gate.bias", w.router_bias);
  visit("gate.e_score_correction_bias", w.correction);
  for (int64_t e = 0; e < kExperts; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    visit(p + "gate_proj.weight", w.gate[e]);
    visit(p + "up_proj.weight", w.up[e]);
    visit(p + "down_proj.weight", w.down[e]);
    if (!w.gate_b.empty()) {
      visit(p + "gate_proj.bias", w.gate_b[e]);
      visit(p + "up_proj.bias", w.up_b[e]);
      visit(p + "down_proj.bias", w.down_b[e]);
    }
  }
  visit("shared_expert.gate_proj.weight", w.s_gate);
  visit("shared_expert.up_proj.weight", w.s_up);
  visit("shared_expert.down_proj.weight", w.s_down);
  visit("shared_expert_gate.weight", w.shared_gate);
}

// Per expert ("<prefix>.experts.<e>.gate_proj.weight", ...).
inline Checkpoint per_expert_checkpoint(const Weights& w, const std::string& prefix = "moe") {
  Checkpoint ckpt;
  for_each_named(w, [&](const std::string& name, const at::Tensor& t) { ckpt.add(prefix + "." + name, t.detach()); });
  return ckpt;
}

// The splits every test runs: {world, expert_parallel_size}.
inline const std::vector<std::pair<int64_t, int64_t>> kSplits{{1, 1}, {2, 1}, {3, 1}, {4, 1},
                                                              {2, 2}, {3, 3}, {4, 4}, {4, 2}};

// The fused layouts' tensors from the same weights: transformers 5's [E, 2I, H] gate_up
// ([gate | up] per expert) and [E, H, I] down, or GPT-OSS's transposed [E, H, 2I] with
// gate and up columns alternating, [E, I, H] down, and [E, 2I] / [E, H] biases.
inline Checkpoint fused_checkpoint(const Weights& w, bool gpt_oss) {
  Checkpoint ckpt;
  at::NoGradGuard no_grad;
  ckpt.add("moe.gate.weight", w.router.detach());
  if (w.router_bias.defined()) ckpt.add("moe.gate.bias", w.router_bias.detach());
  std::vector<at::Tensor> gu, d, gub, db;
  for (int64_t e = 0; e < kExperts; ++e) {
    if (gpt_oss) {
      gu.push_back(at::stack({w.gate[e], w.up[e]}, 1).flatten(0, 1).t());
      d.push_back(w.down[e].t());
      gub.push_back(at::stack({w.gate_b[e], w.up_b[e]}, 1).flatten());
      db.push_back(w.down_b[e]);
    } else {
      gu.push_back(at::cat({w.gate[e], w.up[e]}));
      d.push_back(w.down[e]);
    }
  }
  ckpt.add("moe.experts.gate_up_proj", at::stack(gu).contiguous());
  ckpt.add("moe.experts.down_proj", at::stack(d).contiguous());
  if (gpt_oss) {
    ckpt.add("moe.experts.gate_up_proj_bias", at::stack(gub));
    ckpt.add("moe.experts.down_proj_bias", at::stack(db));
  }
  return ckpt;
}

}  // namespace tp::test::moe
