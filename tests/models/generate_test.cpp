// CausalLM::generate (tp/models/causal_lm.h) with vocabulary-parallel sampling: a small
// Llama with invariant numerics (the logits' bits the same at every TP size) generates the
// same tokens at TP 1-4 for every seed and filter; stop tokens end their rows (padded after,
// lengths counted) and generation once every row has stopped; greedy is generate_greedy.
// The sampler itself against a single-device reference: tests/layers/vocab/sampling_test.cpp.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/causal_lm.h"

using namespace tp;

namespace {

// 12 query heads over 4 KV heads (uneven at TP 3), an odd vocabulary (uneven slices).
ModelConfig small_llama() {
  return ModelConfig::from_json(R"({"model_type": "llama", "hidden_size": 96, "intermediate_size": 80,
    "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 301,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": false})");
}

// The model's tensors, drawn once (seed 51), so every TP size loads the same weights.
const Checkpoint& weights() {
  static const Checkpoint ckpt = [] {
    at::manual_seed(51);
    CausalLM model(small_llama(), CausalLMOptions().dtype(at::kFloat));
    Checkpoint c;
    for (const auto& [name, t] : model->gather_weights()) c.add(name, t);
    return c;
  }();
  return ckpt;
}

// Every rank's fn(model) at `world`, the model with invariant numerics and weights().
template <class F>
auto on_each_rank(int64_t world, const F& fn) {
  std::vector<decltype(fn(std::declval<CausalLMImpl&>()))> out(static_cast<size_t>(world));
  run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        CausalLMImpl model(small_llama(),
                           CausalLMOptions().dtype(at::kFloat).numerics(Numerics::kInvariant).init_weights(false),
                           comm);
        model.load_weights(weights());
        out[static_cast<size_t>(comm.rank())] = fn(model);
      },
      test::test_comm_options());
  return out;
}

std::vector<CausalLMImpl::Generated> generate_at(int64_t world, const at::Tensor& prompt,
                                                 const CausalLMImpl::GenerateOptions& options) {
  return on_each_rank(world, [&](CausalLMImpl& model) { return model.generate(prompt, options); });
}

}  // namespace

TEST_CASE("CausalLM::generate samples the same tokens at TP 1-4 for every seed and filter", "[models][sampling]") {
  const at::Tensor prompt = at::tensor({5, 17, 200, 3, 9, 42, 42, 7}, at::kLong).view({2, 4});
  std::vector<SamplingParams> filters(4);
  filters[1].top_k = 20, filters[1].temperature = 0.8;
  filters[2].top_p = 0.9, filters[2].repetition_penalty = 1.3;
  filters[3].min_p = 0.02, filters[3].temperature = 1.5;
  for (size_t f = 0; f < filters.size(); ++f) {
    for (uint64_t seed : {0, 1, 2}) {
      CausalLMImpl::GenerateOptions options;
      options.max_new_tokens = 6;
      options.sampling = filters[f];
      options.sampling.seed = seed;
      const auto one = generate_at(1, prompt, options).at(0);
      REQUIRE(one.tokens.sizes() == c10::IntArrayRef({2, 6}));
      CHECK(at::equal(one.lengths, at::full({2}, 6, at::kLong)));
      for (int64_t world = 2; world <= 4; ++world) {
        INFO("filter " << f << " seed " << seed << " TP " << world);
        for (const auto& got : generate_at(world, prompt, options)) CHECK(at::equal(got.tokens, one.tokens));
      }
      // Another seed gives other tokens somewhere (a 301-token vocabulary, 12 draws).
      options.sampling.seed = seed + 100;
      CHECK_FALSE(at::equal(generate_at(1, prompt, options).at(0).tokens, one.tokens));
    }
  }
}

TEST_CASE("CausalLM::generate: stop tokens end their rows, padded after and counted, and greedy is generate_greedy",
          "[models][sampling]") {
  const at::Tensor prompt = at::tensor({5, 17, 200, 3, 9, 42, 42, 7}, at::kLong).view({2, 4});
  CausalLMImpl::GenerateOptions options;
  options.max_new_tokens = 8;
  options.sampling.temperature = 1.0;
  options.sampling.seed = 7;
  const auto free_run = generate_at(1, prompt, options).at(0);
  // Row 0's third token as the stop token: row 0 ends there, row 1 runs on (unless it emits
  // it too: then at its own first one).
  const int64_t stop = free_run.tokens[0][2].item<int64_t>();
  options.stop_token_ids = {stop};
  options.pad_token_id = -1;
  for (int64_t world = 1; world <= 3; ++world) {
    for (const auto& got : generate_at(world, prompt, options)) {
      INFO("TP " << world);
      for (int64_t r = 0; r < 2; ++r) {
        int64_t first = 8;
        for (int64_t i = 0; i < 8; ++i)
          if (free_run.tokens[r][i].item<int64_t>() == stop) {
            first = i;
            break;
          }
        const int64_t length = std::min<int64_t>(first + 1, 8);
        CHECK(got.lengths[r].item<int64_t>() == length);
        CHECK(at::equal(got.tokens[r].narrow(0, 0, length), free_run.tokens[r].narrow(0, 0, length)));
        if (got.tokens.size(1) > length)
          CHECK(at::equal(got.tokens[r].narrow(0, length, got.tokens.size(1) - length),
                          at::full({got.tokens.size(1) - length}, -1, at::kLong)));
      }
    }
  }
  // Every row stopped: generation ends there.
  options.stop_token_ids = {free_run.tokens[0][1].item<int64_t>(), free_run.tokens[1][1].item<int64_t>()};
  const auto early = generate_at(2, prompt, options).at(0);
  CHECK(early.tokens.size(1) <= 2);

  // Greedy: generate with temperature 0 is generate_greedy, at TP 1 and 3.
  CausalLMImpl::GenerateOptions greedy;
  greedy.max_new_tokens = 5;
  for (int64_t world : {1, 3}) {
    const auto via_greedy = on_each_rank(world, [&](CausalLMImpl& model) { return model.generate_greedy(prompt, 5); });
    const auto sampled = generate_at(world, prompt, greedy);
    for (int64_t r = 0; r < world; ++r) CHECK(at::equal(sampled[static_cast<size_t>(r)].tokens, via_greedy[r]));
  }
}
