// MoEParallelMLP against a single-device reference built from the same global weights,
// token by token (this file's own routing and expert MLP, written out per token), in
// float64, forward and backward, for the families' variants:
//
//   mixtral   softmax top-2 of 16 renormalised, silu
//   qwen2     softmax top-4 of 16 not renormalised, weights in the input dtype, a shared
//             expert scaled by a sigmoid gate
//   deepseek  sigmoid scores, a correction bias, 4 groups of which the best 2, top-4,
//             renormalised, x 2.5, a shared expert without gate (DeepSeek-V3 / GLM-4.5)
//   gpt_oss   the top-2 logits (with the router's bias) softmaxed, expert biases, swiglu_oai
//
// at every split of 1-4 ranks: expert tensor parallelism (TP 1-4; 3: each expert's
// intermediate 20 split 7, 7, 6), expert parallelism (EP 2-4; 16 experts over 3: 6, 5, 5)
// and both (2 x 2 on 4 ranks). Checked: the output, the input's gradient and every
// parameter's (router, router bias, shared gate, every expert's weights and biases, the
// shared expert's) gathered as the weights are. 10 tokens: some experts receive none.
// Then: every quantized format's experts against the format's float64 model; errors by
// name. The fused 3-D layouts and what each rank reads: moe_loading_test.cpp; the variants,
// weights and checkpoints: moe_fixtures.h.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <thread>

#include "layers/moe/moe_fixtures.h"
#include "support/quant_formats.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/comm/reduction.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"
#include "tp/shard/split.h"

using namespace tp;
using namespace tp::test::moe;
using Catch::Contains;
using test::randn;

namespace {

at::Tensor activation(const Spec& s, const at::Tensor& g, const at::Tensor& u) {
  if (s.activation != "swiglu_oai") return at::silu(g) * u;
  const double alpha = 1.702, limit = 1.5;
  const auto gc = at::clamp_max(g, limit);
  return (at::clamp(u, -limit, limit) + 1) * gc * at::sigmoid(gc * alpha);
}

// The router logits of tokens x [tokens, hidden]: one GEMM over all tokens, as the
// routers of transformers compute them (in float32 a per-token product would round
// differently).
at::Tensor router_logits(const Spec& s, const Weights& w, const at::Tensor& x) {
  at::Tensor logits =
      s.router.logits_in_float32() ? at::linear(x.to(at::kFloat), w.router.to(at::kFloat)) : at::linear(x, w.router);
  return w.router_bias.defined() ? logits + w.router_bias : logits;
}

// The experts a token goes to, with their weights, from its logits: written out per token.
std::pair<std::vector<int64_t>, std::vector<at::Tensor>> route_token(const Spec& s, const Weights& w,
                                                                     const at::Tensor& logits, at::ScalarType dtype) {
  const auto& r = s.router;
  std::vector<int64_t> ids;
  std::vector<at::Tensor> weights;
  if (r.scoring() == MoEScoring::kSoftmaxOfTopK) {
    const auto [top, idx] = at::topk(logits, s.top_k);
    const auto p = at::softmax(top, 0);
    for (int64_t j = 0; j < s.top_k; ++j) {
      ids.push_back(idx[j].item<int64_t>());
      weights.push_back(p[j]);
    }
  } else if (r.scoring() == MoEScoring::kSoftmax) {
    const auto p = at::softmax(logits.to(at::kFloat), 0);
    const auto [top, idx] = at::topk(p, s.top_k);
    const auto total = top.sum();
    for (int64_t j = 0; j < s.top_k; ++j) {
      ids.push_back(idx[j].item<int64_t>());
      weights.push_back(r.normalize_top_k() ? top[j] / total : top[j]);
    }
  } else {
    const auto scores = at::sigmoid(logits.to(at::kFloat));
    at::Tensor choice = scores.detach() + (w.correction.defined() ? w.correction : at::zeros_like(scores));
    const int64_t per = kExperts / r.num_groups();
    // Group g's score: its two best; keep the top_k_groups best groups.
    std::vector<std::pair<float, int64_t>> groups;
    for (int64_t g = 0; g < r.num_groups(); ++g) {
      const auto two = std::get<0>(at::topk(choice.narrow(0, g * per, per), 2));
      groups.emplace_back(two.sum().item<float>(), g);
    }
    std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<char> keep(static_cast<size_t>(r.num_groups()), 0);
    for (int64_t g = 0; g < r.top_k_groups(); ++g) keep[static_cast<size_t>(groups[g].second)] = true;
    for (int64_t e = 0; e < kExperts; ++e)
      if (!keep[static_cast<size_t>(e / per)]) choice[e] = -std::numeric_limits<float>::infinity();
    const auto idx = std::get<1>(at::topk(choice.unsqueeze(0), s.top_k, -1, true, /*sorted=*/false))[0];
    // The weights as transformers computes them: the chosen scores (in the order an unsorted
    // top-k gives them) as one row, its sum.
    at::Tensor chosen = scores.index_select(0, idx).unsqueeze(0);
    if (r.normalize_top_k()) chosen = chosen / (chosen.sum(-1, /*keepdim=*/true) + 1e-20);
    chosen = chosen * r.scaling_factor();
    for (int64_t j = 0; j < s.top_k; ++j) {
      ids.push_back(idx[j].item<int64_t>());
      weights.push_back(chosen[0][j]);
    }
  }
  if (r.weights_in_input_dtype())
    for (auto& v : weights) v = v.to(dtype);
  return {ids, weights};
}

at::Tensor reference(const Spec& s, const Weights& w, const at::Tensor& x) {
  std::vector<at::Tensor> rows;
  const at::Tensor logits = router_logits(s, w, x);
  for (int64_t t = 0; t < x.size(0); ++t) {
    const auto xt = x[t];
    const auto [ids, weights] = route_token(s, w, logits[t], x.scalar_type());
    at::Tensor y = at::zeros({kHidden}, x.options());
    for (size_t j = 0; j < ids.size(); ++j) {
      const int64_t e = ids[j];
      at::Tensor g = at::mv(w.gate[e], xt), u = at::mv(w.up[e], xt);
      if (s.expert_bias) {
        g = g + w.gate_b[e];
        u = u + w.up_b[e];
      }
      at::Tensor o = at::mv(w.down[e], activation(s, g, u));
      if (s.expert_bias) o = o + w.down_b[e];
      y = y + o * weights[j];
    }
    if (s.shared > 0) {
      at::Tensor o = at::mv(w.s_down, activation(s, at::mv(w.s_gate, xt), at::mv(w.s_up, xt)));
      if (s.shared_gate) o = o * at::sigmoid(at::dot(w.shared_gate[0], xt));
      y = y + o;
    }
    rows.push_back(y);
  }
  return at::stack(rows);
}

// Every parameter's gradient, gathered under the checkpoint names as the weights are
// (the gradients swapped into the parameters for the gather). A parameter without a
// gradient (an expert no token reached) gathers as zeros.
std::map<std::string, at::Tensor> gathered_grads(MoEParallelMLP& moe, const std::string& prefix) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;
  for (auto& p : moe->parameters()) {
    saved.emplace_back(p, p.clone());
    p.copy_(p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  auto out = moe->gather_weights(prefix);
  for (auto& [p, v] : saved) p.copy_(v);
  return out;
}

// The reference's gradients under the checkpoint names (the correction bias is a buffer,
// not trained).
std::map<std::string, at::Tensor> reference_grads(const Weights& w) {
  std::map<std::string, at::Tensor> out;
  for_each_named(w, [&](const std::string& name, const at::Tensor& t) {
    if (name == "gate.e_score_correction_bias") return;
    out["moe." + name] = t.grad().defined() ? t.grad() : at::zeros_like(t);
  });
  return out;
}

// The message `f` throws, or "" (rank threads report here; Catch's assertions are not
// thread-safe, so the checks run after the ranks join, or under a lock).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// (world, expert_parallel_size): TP 1-4, EP 2-4, TP x EP 2 x 2.

}  // namespace

TEST_CASE("MoEParallelMLP equals the token-by-token reference at TP 1-4, EP 2-4 and TP x EP, forward and backward",
          "[layers][moe]") {
  for (const auto& spec : specs()) {
    INFO("variant " << spec.name);
    const Weights w = make_weights(spec, 1000);
    const Checkpoint ckpt = per_expert_checkpoint(w);
    const at::Tensor x0 = randn({kTokens, kHidden}, 99);
    const at::Tensor g = randn({kTokens, kHidden}, 98);
    const at::Tensor xr = x0.clone().requires_grad_(true);
    const at::Tensor yr = reference(spec, w, xr);
    (yr * g).sum().backward();
    const auto want_grads = reference_grads(w);
    {
      // Some experts must receive no token, or the empty path goes untested.
      std::vector<int64_t> hits(kExperts, 0);
      const at::Tensor logits = router_logits(spec, w, x0);
      for (int64_t t = 0; t < kTokens; ++t)
        for (const auto e : route_token(spec, w, logits[t], x0.scalar_type()).first) ++hits[static_cast<size_t>(e)];
      CHECK(std::count(hits.begin(), hits.end(), 0) > 0);
    }
    for (const auto& [world, ep] : kSplits) {
      INFO("world " << world << ", expert_parallel_size " << ep);
      std::mutex mu;
      double y_err = 0, x_err = 0, w_err = 0;
      std::string worst;
      run_ranks_in_threads(world, [&](Communicator& comm) {
        MoEParallelMLP moe(options_of(spec).expert_parallel_size(ep), comm);
        moe->load_weights(ckpt, "moe");
        const at::Tensor x = x0.clone().requires_grad_(true);
        const at::Tensor y = moe->forward(x);
        (y * g).sum().backward();
        const auto grads = gathered_grads(moe, "moe");
        std::lock_guard<std::mutex> lock(mu);
        CHECK(moe->local_experts() == split_for_rank(kExperts, ep, comm.rank() / (world / ep)));
        y_err = std::max(y_err, (y - yr).abs().max().item<double>());
        x_err = std::max(x_err, (x.grad() - xr.grad()).abs().max().item<double>());
        CHECK(grads.size() == want_grads.size() + (w.correction.defined() ? 1 : 0));
        for (const auto& [name, want] : want_grads) {
          REQUIRE(grads.count(name));
          const double err = (grads.at(name) - want).abs().max().item<double>();
          if (err > w_err) worst = name;
          w_err = std::max(w_err, err);
        }
      });
      INFO("worst gradient " << worst);
      CHECK(y_err <= 1e-12);
      CHECK(x_err <= 1e-12);
      CHECK(w_err <= 1e-12);
    }
  }
}

TEST_CASE(
    "MoEParallelMLP with reduce_output(false) hands on partial sums whose all-reduce is the block's output, "
    "forward and backward",
    "[layers][moe]") {
  // gpt_oss: expert biases (each down bias added by one rank of its group); qwen2: a shared
  // expert with its gate.
  for (const auto& spec : specs()) {
    if (spec.name != "gpt_oss" && spec.name != "qwen2") continue;
    INFO("variant " << spec.name);
    const Weights w = make_weights(spec, 2000);
    const Checkpoint ckpt = per_expert_checkpoint(w);
    const at::Tensor x0 = randn({kTokens, kHidden}, 97);
    const at::Tensor g = randn({kTokens, kHidden}, 96);
    const at::Tensor xr = x0.clone().requires_grad_(true);
    const at::Tensor yr = reference(spec, w, xr);
    (yr * g).sum().backward();
    for (const auto& [world, ep] : kSplits) {
      INFO("world " << world << ", expert_parallel_size " << ep);
      std::mutex mu;
      double y_err = 0, x_err = 0;
      bool spelled = true;
      run_ranks_in_threads(world, [&](Communicator& comm) {
        MoEParallelMLP moe(options_of(spec).expert_parallel_size(ep).reduce_output(false), comm);
        moe->load_weights(ckpt, "moe");
        const at::Tensor x = x0.clone().requires_grad_(true);
        const at::Tensor y = Reduction::all_reduce(comm).apply(moe->forward(x));
        (y * g).sum().backward();
        std::lock_guard<std::mutex> lock(mu);
        spelled = spelled && moe->output_reduction().op == ReduceOp::kNone;
        y_err = std::max(y_err, (y - yr).abs().max().item<double>());
        x_err = std::max(x_err, (x.grad() - xr.grad()).abs().max().item<double>());
      });
      CHECK(spelled);
      CHECK(y_err <= 1e-12);
      CHECK(x_err <= 1e-12);
    }
  }
}

TEST_CASE("quantized experts match the format's float64 model at TP 1-3, EP 2 and TP x EP", "[layers][moe][quant]") {
  // hidden 256 and intermediate 384: every format's alignment (128-blocks, INT4 groups)
  // at every split below (TP 3: 128 each). The reference quantizes each projection's
  // input as the format does (quantize_activation), the down projection's per rank on
  // that rank's slice of the intermediate activations, as the layer specifies.
  constexpr int64_t H = 256, I = 384, E = 4, K = 2, T = 6;
  const at::Tensor x = randn({T, H}, 5).to(at::kFloat);
  const at::Tensor router = randn({E, H}, 6);
  for (const auto& text : test::quantized_format_variants()) {
    const QuantConfig config = parse_quant_config(text);
    INFO("format " << text);
    Checkpoint ckpt;
    ckpt.add("moe.gate.weight", router.to(at::kFloat));
    std::vector<QuantizedTensors> gate(E), up(E), down(E);
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "moe.experts." + std::to_string(e) + ".";
      gate[e] = quantize_weight(randn({I, H}, 100 + e) / 16, config);
      up[e] = quantize_weight(randn({I, H}, 200 + e) / 16, config);
      down[e] = quantize_weight(randn({H, I}, 300 + e) / 20, config);
      add_to_checkpoint(ckpt, p + "gate_proj", gate[e]);
      add_to_checkpoint(ckpt, p + "up_proj", up[e]);
      add_to_checkpoint(ckpt, p + "down_proj", down[e]);
    }
    const auto dq = [&](const QuantizedTensors& t) { return dequantize_weight(t, config).to(at::kDouble); };
    const auto qa = [&](const at::Tensor& v, const QuantizedTensors& t) {
      return quantize_activation(v.to(at::kFloat), t, config).to(at::kDouble);
    };
    const auto [weights, ids] = at::topk(at::softmax(at::linear(x, router.to(at::kFloat)), -1), K, -1);
    const auto w = (weights / weights.sum(-1, true)).to(at::kDouble);
    for (const auto& [world, ep] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {3, 1}, {2, 2}, {4, 2}}) {
      INFO("world " << world << ", expert_parallel_size " << ep);
      // The reference of this split: each rank of an expert's group quantizes its slice.
      const int64_t per_group = world / ep;
      at::Tensor ref = at::zeros({T, H}, at::kDouble);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < K; ++j) {
          const int64_t e = ids[t][j].item<int64_t>();
          const auto xt = qa(x[t].unsqueeze(0), gate[e]);
          const auto h =
              at::silu(at::matmul(xt, dq(gate[e]).t())) * at::matmul(qa(x[t].unsqueeze(0), up[e]), dq(up[e]).t());
          const auto wd = dq(down[e]);
          for (int64_t r = 0; r < per_group; ++r) {
            const Range s =
                split_for_rank(I, per_group, r,
                               SplitPolicy{}.with_granularity(combine_granularity(
                                   tp_alignment(config, ShardMode::kColumn), tp_alignment(config, ShardMode::kRow))));
            if (s.empty()) continue;
            QuantizedTensors slice = down[e];  // quantize_activation reads only static scales
            const auto hq = qa(h.narrow(1, s.begin, s.size()), slice);
            ref[t] += (at::matmul(hq, wd.narrow(1, s.begin, s.size()).t()) * w[t][j]).squeeze(0);
          }
        }
      }
      std::vector<at::Tensor> out(static_cast<size_t>(world));
      std::vector<std::string> names(static_cast<size_t>(world));
      run_ranks_in_threads(world, [&](Communicator& comm) {
        MoEParallelMLP moe(MoEParallelMLPOptions(H, I, E, K).quant(config).expert_parallel_size(ep), comm);
        moe->load_weights(ckpt, "moe");
        names[static_cast<size_t>(comm.rank())] = moe->quant_name();
        at::NoGradGuard no_grad;
        out[static_cast<size_t>(comm.rank())] = moe->forward(x);
      });
      for (const auto& n : names) CHECK(n == to_string(config));
      // The gate / up outputs are float32 sums where the reference's are float64: where an
      // activation-quantizing format rounds the down projection's input, an element can
      // land one step apart (int8: 1/127 of the row's amax, ~4e-4 of the output here; FP8:
      // 2^-4 of the element, ~3e-3), so those formats' bound leaves room for a few such
      // steps (measured: no step, 1e-7 to 3e-7); the weight-only formats' is float32's
      // (measured 2e-7 to 2e-6). A wrong scale or slice is off by O(1).
      const auto probe = randn({2, I}, 9).to(at::kFloat);
      const bool activations = !at::equal(quantize_activation(probe, down[0], config), probe);
      const double bound = activations ? 1e-2 : 4 * test::tolerance(at::kFloat);
      for (const auto& y : out) CHECK(test::relative_error(y, ref) <= bound);
    }
  }
}

TEST_CASE("MoEParallelMLP refuses bad options and checkpoint tensors by name, on every rank", "[layers][moe][errors]") {
  CHECK_THROWS_WITH(MoEParallelMLP(MoEParallelMLPOptions(12, 20, 4, 5)), Contains("top_k=5"));
  CHECK_THROWS_WITH(MoEParallelMLP(MoEParallelMLPOptions(12, 20, 4, 2).activation("relu")), Contains("relu"));
  CHECK_THROWS_WITH(
      MoEParallelMLP(
          MoEParallelMLPOptions(12, 20, 16, 4).router(MoERouterOptions().scoring(MoEScoring::kSigmoid).num_groups(3))),
      Contains("num_groups=3") && Contains("num_experts=16"));
  CHECK_THROWS_WITH(MoEParallelMLP(MoEParallelMLPOptions(12, 20, 16, 4).router(MoERouterOptions().num_groups(4))),
                    Contains("sigmoid"));
  std::vector<std::string> ep_errors(4);
  run_ranks_in_threads(4, [&](Communicator& comm) {
    ep_errors[static_cast<size_t>(comm.rank())] =
        error_of([&] { MoEParallelMLP(MoEParallelMLPOptions(12, 20, 4, 2).expert_parallel_size(3), comm); });
  });
  for (const auto& e : ep_errors) CHECK_THAT(e, Contains("expert_parallel_size=3") && Contains("world size 4"));

  const Spec spec = specs()[0];
  const Weights w = make_weights(spec, 3000);
  const Checkpoint good = per_expert_checkpoint(w), fused = fused_checkpoint(w, false);
  // Expert 7 has no up projection: its owner fails, and every rank learns it.
  Checkpoint missing;
  for (const auto& name : good.names())
    if (name != "moe.experts.7.up_proj.weight") missing.add(name, good.get(name).read_all());
  // A tensor under the block that nothing reads.
  Checkpoint extra = good;
  extra.add("moe.experts.2.gate_proj.bias", at::zeros({kInter}, at::kDouble));
  // A fused tensor of the wrong shape.
  Checkpoint bad;
  for (const auto& name : fused.names())
    bad.add(name, name == "moe.experts.down_proj" ? at::zeros({kExperts, kHidden, kInter + 1}, at::kDouble)
                                                  : fused.get(name).read_all());
  const auto layout = MoECheckpointLayout().experts(ExpertLayout::kFused);
  std::vector<std::vector<std::string>> errors(3);
  run_ranks_in_threads(3, [&](Communicator& comm) {
    auto& mine = errors[static_cast<size_t>(comm.rank())];
    MoEParallelMLP ep(options_of(spec).expert_parallel_size(3), comm);
    MoEParallelMLP tp(options_of(spec), comm);
    mine.push_back(error_of([&] { ep->load_weights(missing, "moe"); }));
    mine.push_back(error_of([&] { tp->load_weights(extra, "moe"); }));
    mine.push_back(error_of([&] { ep->load_weights(extra, "moe"); }));
    mine.push_back(error_of([&] { tp->load_weights(bad, "moe", layout); }));
    mine.push_back(error_of([&] { tp->load_weights(good, "moe", layout); }));
    MoEParallelMLP int4(MoEParallelMLPOptions(128, 128, 4, 2).quant(parse_quant_config("int4_gptq")), comm);
    mine.push_back(error_of([&] { int4->load_weights(fused, "moe", layout); }));
  });
  for (const auto& e : errors) {
    REQUIRE(e.size() == 6);
    CHECK_THAT(e[0], Contains("moe.experts.7.up_proj.weight"));
    CHECK_THAT(e[1], Contains("moe.experts.2.gate_proj.bias"));
    CHECK_THAT(e[2], Contains("moe.experts.2.gate_proj.bias"));
    CHECK_THAT(e[3], Contains("moe.experts.down_proj[0]") && Contains("[12, 21]") && Contains("fused"));
    CHECK_THAT(e[4], Contains("no tensor 'moe.experts.gate_up_proj'"));
    CHECK_THAT(e[5], Contains("int4_gptq") && Contains("fused layout"));
  }
}

TEST_CASE("MoEParallelMLP clone() copies every expert's tensors", "[layers][moe]") {
  const Spec spec = specs()[1];
  const Weights w = make_weights(spec, 4000);
  const at::Tensor x = randn({kTokens, kHidden}, 3);
  std::mutex mu;
  run_ranks_in_threads(2, [&](Communicator& comm) {
    MoEParallelMLP moe(options_of(spec).expert_parallel_size(2), comm);
    moe->load_weights(per_expert_checkpoint(w), "moe");
    const auto copy = std::dynamic_pointer_cast<MoEParallelMLPImpl>(moe->clone());
    at::NoGradGuard no_grad;
    const at::Tensor y = moe->forward(x), y_copy = copy->forward(x);
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(copy != nullptr);
    for (const auto& p : moe->named_parameters()) {
      CHECK(at::equal(p.value(), copy->named_parameters()[p.key()]));
      CHECK(!p.value().is_same(copy->named_parameters()[p.key()]));
    }
    CHECK(at::equal(y, y_copy));
  });
}

TEST_CASE("quantized experts at inference run side by side on ATen's threads with the bits of one after another",
          "[layers][moe][quant]") {
  // At inference a quantized MoE runs its experts concurrently (one per thread); with grad
  // enabled, one after another. The outputs are added in expert order either way and tp's
  // kernels do not depend on the thread count, so the two must agree bit for bit; bf16 with
  // enough tokens per expert takes the formats' M >= 5 kernels too.
  constexpr int64_t H = 256, I = 384, E = 4, K = 2, T = 40;
  for (const char* text : {"int4_gptq:g128", "int8_weight_only", "fp8_block", "mxfp4"}) {
    INFO(text);
    run_ranks_in_threads(1, [&](Communicator& comm) {
      MoEParallelMLP moe(MoEParallelMLPOptions(H, I, E, K).quant(parse_quant_config(text)).dtype(at::kBFloat16), comm);
      const at::Tensor x = randn({T, H}, 17).to(at::kBFloat16);
      const at::Tensor one_by_one = moe->forward(x).detach();
      at::Tensor side_by_side;
      {
        c10::InferenceMode inference;
        side_by_side = moe->forward(x);
      }
      CHECK(at::equal(one_by_one.view(at::kShort), side_by_side.view(at::kShort)));
    });
  }
}
