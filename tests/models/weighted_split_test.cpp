// Whole-model weighted splits (CausalLMOptions::split_weights, tp/models/model_split.h),
// on the folders transformers wrote (tests/python/hf_fixtures.py; float64, two layers):
// - 3:1 at TP 2 and 1:2:1 at TP 3: the logits of a prompt within 1e-12 of transformers'
//   and 16 greedy tokens equal to its generate(do_sample=False);
// - the plan every rank prints is what the layers hold (heads, MLP rows, vocabulary rows),
//   each rank's bytes of the cut tensors within one alignment unit per cut of its weight's
//   share, and the leftover heads rotating over the layers (Qwen2's 6 KV groups at 3:1 give
//   rank 0 five groups in layer 0 and four in layer 1);
// - weights no layer can honour are refused on every rank, naming weights that work.
//
// The folders come from the CTest fixture "models: Hugging Face folders".

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <iostream>
#include <numeric>

#include "support/hf_fixtures.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/causal_lm.h"
#include "tp/models/model_split.h"

using namespace tp;
using Catch::Contains;
using tp::test::fixture_dir;

namespace {

struct RankResult {
  at::Tensor logits, generated;
  SplitPlan plan;
  std::vector<LayerShare> held;  // per layer, what this rank's layers hold
  int64_t vocab_rows = 0;
  std::string error;
};

// The bytes one unit of each cut of `config` holds (float64): a KV-head group's Q, K, V
// and O rows with their biases, one MLP row's gate, up and down, one vocabulary row of
// the embedding and of an untied head. A rank's bytes may differ from its weight's share
// by one of each per layer.
double unit_bytes_tolerance(const ModelConfig& c, int64_t layers) {
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double group = static_cast<double>(c.num_attention_heads / c.num_key_value_heads);
  const double attention = (group + 2) * d * (h + 1) + group * d * h;
  const double mlp = 3 * h + 2;
  const double row_biases = 2 * h;  // o_proj's and down_proj's, whole where they are held
  const double vocab = h * (c.tie_word_embeddings ? 1 : 2);
  return 8.0 * (static_cast<double>(layers) * (attention + mlp + row_biases) + vocab);
}

}  // namespace

TEST_CASE("CausalLM split by weights 3:1 and 1:2:1 equals transformers, its plan what every rank holds",
          "[models][hf][split]") {
  struct Case {
    std::string name;
    std::vector<double> weights;
  };
  for (const Case& cs :
       {Case{"llama", {3, 1}}, Case{"llama", {1, 2, 1}}, Case{"qwen2", {3, 1}}, Case{"qwen2", {1, 2, 1}}}) {
    const std::string folder = fixture_dir() + "/" + cs.name;
    const test::ModelReference ref = test::model_reference(cs.name);
    const at::Tensor &prompt = ref.prompt, &want_logits = ref.logits, &want_tokens = ref.generated;
    const double scale = ref.scale;
    const int64_t world = static_cast<int64_t>(cs.weights.size());
    std::vector<RankResult> ranks(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          auto& out = ranks[comm.rank()];
          try {
            const auto model = CausalLMImpl::from_pretrained(
                folder, CausalLMOptions().dtype(at::kDouble).split_weights(cs.weights), comm);
            out.logits = model->gather_logits(model->forward(prompt));
            out.generated = model->generate_greedy(prompt, want_tokens.size(1));
            out.plan = model->split_plan();
            for (const auto& layer : model->layers) {
              LayerShare s;
              s.q_heads = layer->qkv->head_plan().q_heads.size();
              s.kv_heads = layer->qkv->head_plan().kv_heads.size();
              s.mlp_rows = layer->gate_up->local_range().size();
              out.held.push_back(s);
            }
            out.vocab_rows = model->embed_tokens->local_range().size();
          } catch (const c10::Error& e) {
            out.error = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    const ModelConfig config = ModelConfig::from_pretrained(folder);
    const double weight_sum = std::accumulate(cs.weights.begin(), cs.weights.end(), 0.0);
    for (int64_t r = 0; r < world; ++r) {
      const auto& got = ranks[r];
      INFO(cs.name << " at " << world << " ranks, rank " << r << ": " << got.error);
      REQUIRE(got.error.empty());
      const double err = (got.logits - want_logits).abs().max().item<double>();
      INFO("max |logit err| " << err << " (max |logit| " << scale << ")\n" << got.plan.to_string());
      CHECK(err <= 1e-12 * scale);
      CHECK(at::equal(got.generated, want_tokens));
      // The plan: what the layers hold, the same on every rank.
      REQUIRE(got.plan.layers.size() == got.held.size());
      for (size_t i = 0; i < got.held.size(); ++i) {
        CHECK(got.plan.layers[i][r].q_heads == got.held[i].q_heads);
        CHECK(got.plan.layers[i][r].kv_heads == got.held[i].kv_heads);
        CHECK(got.plan.layers[i][r].mlp_rows == got.held[i].mlp_rows);
      }
      CHECK(got.plan.vocab_rows[r] == got.vocab_rows);
      CHECK(got.plan.split_bytes == ranks[0].plan.split_bytes);
      CHECK(got.plan.to_string() == ranks[0].plan.to_string());
      // The bytes: within one unit of each cut of the weight's share.
      const auto& bytes = got.plan.split_bytes;
      const double total = static_cast<double>(std::accumulate(bytes.begin(), bytes.end(), int64_t{0}));
      const double ideal = total * cs.weights[r] / weight_sum;
      INFO("split bytes " << bytes[r] << ", ideal " << ideal);
      CHECK(std::abs(static_cast<double>(bytes[r]) - ideal) <=
            unit_bytes_tolerance(config, static_cast<int64_t>(got.held.size())));
      CHECK(got.plan.whole_bytes[r] == ranks[0].plan.whole_bytes[0]);
    }
    if (cs.name == "qwen2" && world == 2) {
      // 6 KV groups at 3:1 are 4.5 : 1.5: the leftover group goes to rank 0 in layer 0 and
      // to rank 1 in layer 1 (2 query heads a group).
      const auto& layers = ranks[0].plan.layers;
      CHECK(layers[0][0].q_heads == 10);
      CHECK(layers[0][1].q_heads == 2);
      CHECK(layers[1][0].q_heads == 8);
      CHECK(layers[1][1].q_heads == 4);
    }
    std::cout << ranks[0].plan.to_string();
  }
}

TEST_CASE("plan_model_split: weights no layer can honour are refused, naming weights that work", "[models][split]") {
  ModelConfig config = ModelConfig::from_pretrained(fixture_dir() + "/llama");  // 8 heads over 4 KV groups
  const auto refusal = [&](std::vector<double> weights, int64_t world) {
    config.split_weights = std::move(weights);
    try {
      plan_model_split(config, world, config.num_hidden_layers);
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  // Rank 0's 1/16 of 4 KV groups rounds to none; mixing toward the even split, 0.128 is
  // the first weight whose share (0.51 of a group) wins the leftover group.
  CHECK_THAT(refusal({1, 15}, 2), Contains("rank 0 gets none of the 8 query heads of layer 0's attention") &&
                                      Contains("give every rank a share of everything: 0.128:0.872"));
  CHECK_THAT(refusal({3, 1}, 3), Contains("2 weights for a world of 3 ranks"));
  CHECK_THAT(refusal({1, 0}, 2), Contains("rank 1's weight 0 must be a finite positive"));
  CHECK_THAT(refusal({1, std::nan("")}, 2), Contains("finite positive"));
  CHECK_THAT(refusal({-1, 2}, 2), Contains("finite positive"));
  CHECK(refusal({1, 3}, 2).empty());
  CHECK(refusal({1, 1, 1, 1, 1, 1, 1, 1}, 8).empty());  // KV heads replicated, groups equal
  // Replicated KV heads (4 over 8 ranks): each pair of ranks holds one whatever its weights.
  CHECK_THAT(refusal({1, 1, 1, 1, 1, 1, 2, 2}, 8),
             Contains("groups' weights must have equal sums") &&
                 Contains("the nearest that do: 1.25:1.25:1.25:1.25:1.25:1.25:1.25:1.25"));

  // The MLP's leftover rows rotate too: 250 rows at 1:2:1 are 62.5 : 125 : 62.5, the extra
  // row going to the first of ranks 0 and 2 from the layer's rotation (i + 1): rank 2 in
  // layers 0 and 1, rank 0 in layer 2.
  config.split_weights = {1, 2, 1};
  config.intermediate_size = 250;
  config.num_hidden_layers = 3;
  const SplitPlan plan = plan_model_split(config, 3, 3);
  for (int64_t i = 0; i < 3; ++i) {
    CHECK(plan.layers[i][1].mlp_rows == 125);
    CHECK(plan.layers[i][0].mlp_rows == (i == 2 ? 63 : 62));
    CHECK(plan.layers[i][2].mlp_rows == (i == 2 ? 62 : 63));
  }
  std::cout << plan.to_string();

  // Refused by CausalLM on every rank, before anything is built; invariant numerics too.
  for (const auto& [weights, numerics, message] :
       {std::tuple{std::vector<double>{1, 15}, Numerics::kDefault, "cannot be honoured"},
        std::tuple{std::vector<double>{1, 1}, Numerics::kInvariant,
                   "weighted splits (split_weights) are not covered"}}) {
    std::vector<std::string> errors(2);
    run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          try {
            CausalLMImpl::from_pretrained(
                fixture_dir() + "/llama",
                CausalLMOptions().dtype(at::kDouble).split_weights(weights).numerics(numerics), comm);
          } catch (const c10::Error& e) {
            errors[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    for (const auto& e : errors) CHECK_THAT(e, Contains(message));
  }
}
