// Attention data parallelism in CausalLM (tp/models/attention_dp.h), on the folders
// transformers wrote (tests/python/hf_fixtures.py; float64, two layers), against the same
// folder at TP 1 (itself equal to transformers within 1e-12: causal_lm_test.cpp) run on each
// group's prompts alone:
// - DP 2 over two ranks, DP 2 x TP 2 over four, DP 3 with 3, 1 and 0 prompts of lengths 5,
//   7 and none: every group's logits within 1e-12 and its greedy tokens equal;
// - one SGD step of the summed loss of every group (each group's cross entropy over its
//   tokens, divided by all groups' token count) with reduce_data_parallel_grads: every
//   weight after it equal to the TP 1 step on the same loss, within 1e-12;
// - an attention_data_parallel_size that does not divide the world refused on every rank.
//
// The folders come from the CTest fixture "models: Hugging Face folders".

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <iostream>
#include <map>

#include "support/hf_fixtures.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/models/causal_lm.h"

using namespace tp;
using Catch::Contains;
using tp::test::fixture_dir;

namespace {

constexpr double kLr = 0.5;

struct Layout {
  int64_t world, dp;
  std::vector<std::pair<int64_t, int64_t>> batches;  // per group: prompts, length
};

// Group g's prompts: random ids of the folder's vocabulary, the same for every caller.
at::Tensor prompts(int64_t group, int64_t count, int64_t length, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + group);
  return at::randint(vocab, {count, length}, gen, at::kLong);
}

// The summed loss of a group's tokens over all groups' token count, and one SGD step.
void step(CausalLMImpl& model, const at::Tensor& ids, int64_t all_tokens) {
  if (ids.numel() > 0) {
    const at::Tensor logits = model.forward(ids);
    const at::Tensor loss =
        model.lm_head->cross_entropy(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, logits.size(-1)}),
                                     ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
    (loss.sum() / static_cast<double>(all_tokens)).backward();
  } else {
    // No tokens: the group's collectives still run (the MLP's span every group).
    model.forward(ids).sum().backward();
  }
}

}  // namespace

TEST_CASE("CausalLM with attention data parallelism equals TP 1 on each group's prompts", "[models][hf][dp]") {
  const std::string folder = fixture_dir() + "/llama";
  const int64_t vocab = 128, new_tokens = 6;
  for (const Layout& layout :
       {Layout{2, 2, {{2, 5}, {1, 7}}}, Layout{4, 2, {{2, 6}, {3, 4}}}, Layout{3, 3, {{3, 5}, {1, 7}, {0, 0}}}}) {
    const int64_t per = layout.world / layout.dp;
    std::vector<at::Tensor> logits(layout.world), tokens(layout.world);
    std::vector<std::string> errors(layout.world);
    run_ranks_in_threads(
        layout.world,
        [&](Communicator& comm) {
          const int64_t group = comm.rank() / per;
          try {
            const auto model = CausalLMImpl::from_pretrained(
                folder, CausalLMOptions().dtype(at::kDouble).attention_data_parallel_size(layout.dp), comm);
            const auto [count, length] = layout.batches[group];
            const at::Tensor ids = prompts(group, count, length, vocab);
            at::NoGradGuard no_grad;
            logits[comm.rank()] = model->gather_logits(model->forward(ids));
            tokens[comm.rank()] = model->generate_greedy(ids, new_tokens);
          } catch (const c10::Error& e) {
            errors[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    const auto reference = CausalLMImpl::from_pretrained(folder, CausalLMOptions().dtype(at::kDouble));
    for (int64_t r = 0; r < layout.world; ++r) {
      const int64_t group = r / per;
      const auto [count, length] = layout.batches[group];
      INFO("world " << layout.world << ", DP " << layout.dp << ", rank " << r << " (group " << group << ", " << count
                    << " prompts of " << length << "): " << errors[r]);
      REQUIRE(errors[r].empty());
      CHECK(tokens[r].sizes() == at::IntArrayRef{count, new_tokens});
      if (count == 0) continue;
      at::NoGradGuard no_grad;
      const at::Tensor ids = prompts(group, count, length, vocab);
      const at::Tensor want = reference->gather_logits(reference->forward(ids));
      const double scale = std::max(1.0, want.abs().max().item<double>());
      CHECK((logits[r] - want).abs().max().item<double>() <= 1e-12 * scale);
      CHECK(at::equal(tokens[r], reference->generate_greedy(ids, new_tokens)));
    }
  }
}

TEST_CASE("CausalLM with attention data parallelism: one SGD step equals TP 1's on every group's loss",
          "[models][hf][dp]") {
  const std::string folder = fixture_dir() + "/llama";
  const int64_t vocab = 128;
  for (const Layout& layout :
       {Layout{2, 2, {{2, 5}, {1, 7}}}, Layout{3, 3, {{2, 4}, {1, 6}, {0, 0}}}, Layout{4, 2, {{1, 5}, {2, 3}}}}) {
    int64_t all_tokens = 0;
    for (const auto& [count, length] : layout.batches) all_tokens += count * std::max<int64_t>(length - 1, 0);
    const int64_t per = layout.world / layout.dp;
    std::map<std::string, at::Tensor> got;
    run_ranks_in_threads(
        layout.world,
        [&](Communicator& comm) {
          const auto model = CausalLMImpl::from_pretrained(
              folder, CausalLMOptions().dtype(at::kDouble).attention_data_parallel_size(layout.dp), comm);
          const int64_t group = comm.rank() / per;
          const auto [count, length] = layout.batches[group];
          step(*model, prompts(group, count, length, vocab), all_tokens);
          model->reduce_data_parallel_grads();
          {
            at::NoGradGuard no_grad;
            for (auto& p : model->parameters())
              if (p.grad().defined()) p.sub_(p.grad() * kLr);
          }
          auto weights = model->gather_weights();
          if (comm.rank() == 0) got = std::move(weights);
        },
        test::test_comm_options());
    const auto reference = CausalLMImpl::from_pretrained(folder, CausalLMOptions().dtype(at::kDouble));
    for (int64_t g = 0; g < layout.dp; ++g) {
      const auto [count, length] = layout.batches[g];
      if (count > 0) step(*reference, prompts(g, count, length, vocab), all_tokens);
    }
    {
      at::NoGradGuard no_grad;
      for (auto& p : reference->parameters())
        if (p.grad().defined()) p.sub_(p.grad() * kLr);
    }
    const auto want = reference->gather_weights();
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (const auto& [name, w] : want) {
      INFO("world " << layout.world << ", DP " << layout.dp << ": " << name);
      REQUIRE(got.count(name));
      const double diff = (got[name] - w).abs().max().item<double>() / std::max(1.0, w.abs().max().item<double>());
      CHECK(diff <= 1e-12);
      worst = std::max(worst, diff);
    }
    std::cout << "attention DP " << layout.dp << " over " << layout.world
              << " ranks: max relative weight difference after one step " << worst << "\n";
  }
}

TEST_CASE("CausalLM with attention data parallelism samples each prompt's tokens as one batch at TP 1 does",
          "[models][hf][dp][sampling]") {
  // The draws are per (seed, step, global row, token): rows 0-1 in group 0 and row 2 in
  // group 1 draw as rows 0-2 of one batch.
  const std::string folder = fixture_dir() + "/llama";
  const at::Tensor batch = prompts(7, 3, 5, 128);
  CausalLMImpl::GenerateOptions opts;
  opts.max_new_tokens = 8;
  opts.sampling.temperature = 0.9, opts.sampling.top_p = 0.95, opts.sampling.seed = 11;
  std::vector<at::Tensor> got(2);
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        const auto model = CausalLMImpl::from_pretrained(
            folder, CausalLMOptions().dtype(at::kDouble).attention_data_parallel_size(2), comm);
        const at::Tensor mine = comm.rank() == 0 ? batch.narrow(0, 0, 2) : batch.narrow(0, 2, 1);
        got[comm.rank()] = model->generate(mine, opts).tokens;
      },
      test::test_comm_options());
  const auto reference = CausalLMImpl::from_pretrained(folder, CausalLMOptions().dtype(at::kDouble));
  const at::Tensor want = reference->generate(batch, opts).tokens;
  CHECK(at::equal(at::cat({got[0], got[1]}), want));
  // Without the global row, group 1's prompt would draw as a batch's row 0 does.
  CHECK(!at::equal(got[1], reference->generate(batch.narrow(0, 2, 1), opts).tokens));
}

TEST_CASE("CausalLM: an attention_data_parallel_size that does not divide the world is refused on every rank",
          "[models][hf][dp]") {
  std::vector<std::string> errors(3);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        try {
          CausalLMImpl::from_pretrained(fixture_dir() + "/llama",
                                        CausalLMOptions().dtype(at::kDouble).attention_data_parallel_size(2), comm);
        } catch (const c10::Error& e) {
          errors[comm.rank()] = e.what_without_backtrace();
        }
      },
      test::test_comm_options());
  for (const auto& e : errors) CHECK_THAT(e, Contains("attention_data_parallel_size=2 must divide the world size 3"));
}
