// VocabParallelEmbedding, ParallelLMHead, vocab_parallel_cross_entropy and
// vocab_parallel_argmax at world sizes 1-4 (ranks as threads), against at::embedding,
// at::linear, at::cross_entropy and at::argmax on the full tables with autograd, in
// float64: outputs and every gradient, uneven, padded and empty vocabulary slices.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/gather_weights.h"
#include "tp/layers/sequence_parallel.h"
#include "tp/layers/vocab/loss.h"
#include "tp/layers/vocab/parallel_lm_head.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"

using namespace tp;
using tp::test::randn;

namespace {

struct VocabCase {
  int64_t vocab, hidden, pad, world, tokens;
  uint64_t seed;
};

std::string describe(const VocabCase& c) {
  std::ostringstream os;
  os << "vocab=" << c.vocab << " hidden=" << c.hidden << " pad=" << c.pad << " world=" << c.world
     << " tokens=" << c.tokens << " seed=" << c.seed;
  return os.str();
}

// Cases with uneven slices (vocab not a multiple of the world), padding, and ranks
// that own nothing (vocab 3 at world 4).
std::vector<VocabCase> cases() {
  std::vector<VocabCase> out;
  uint64_t seed = 40;
  for (int64_t world = 1; world <= 4; ++world) {
    out.push_back({37, 12, 1, world, 9, ++seed});
    out.push_back({37, 12, 8, world, 9, ++seed});
  }
  out.push_back({3, 5, 1, 4, 6, ++seed});
  out.push_back({5, 5, 4, 4, 6, ++seed});
  return out;
}

at::Tensor random_ids(const VocabCase& c, at::IntArrayRef shape) {
  auto gen = tp::test::generator(c.seed * 3 + 1);
  auto ids = at::randint(0, c.vocab, shape, gen, at::kLong);
  ids.view(-1)[0] = c.vocab - 1;  // the last token is always looked up (it sits next to the padding)
  return ids;
}

// The rows of `full` ([vocab, ...]) a rank holds, padding rows as zeros.
at::Tensor local_rows(const at::Tensor& full, const VocabPartition& p, int64_t rank) {
  const Range rows = p.range(rank), real = p.real(rank);
  auto out = at::zeros({rows.size(), full.size(1)}, full.options());
  if (real.size() > 0) out.narrow(0, 0, real.size()).copy_(full.narrow(0, real.begin, real.size()));
  return out;
}

}  // namespace

TEST_CASE("VocabParallelEmbedding equals at::embedding, forward and weight gradient", "[layers]") {
  for (const auto& c : cases()) {
    for (bool sequence_parallel : {false, true}) {
      INFO(describe(c) << " sequence_parallel=" << sequence_parallel);
      const auto table = randn({c.vocab, c.hidden}, c.seed);
      Checkpoint ckpt;
      ckpt.add("model.embed_tokens.weight", table);
      const auto ids = random_ids(c, {c.tokens, 2});
      const auto upstream = randn({c.tokens, 2, c.hidden}, c.seed + 9);  // d loss / d output
      // Reference: autograd through at::embedding on the full table.
      const auto leaf = table.clone().requires_grad_(true);
      const auto want = at::embedding(leaf, ids);
      (want * upstream).sum().backward();
      const auto want_grad = leaf.grad();

      std::vector<at::Tensor> out(c.world), grad(c.world);
      std::vector<VocabPartition> parts(c.world);
      std::vector<std::vector<int64_t>> seq(c.world);
      run_ranks_in_threads(
          c.world,
          [&](Communicator& comm) {
            VocabParallelEmbedding embed(VocabParallelEmbeddingOptions(c.vocab, c.hidden)
                                             .pad_to_multiple_of(c.pad)
                                             .sequence_parallel(sequence_parallel)
                                             .dtype(at::kDouble),
                                         comm);
            embed->load_weights(ckpt, "model.embed_tokens");
            const auto y = embed->forward(ids);
            const int64_t r = comm.rank();
            seq[r] = sequence_sizes(c.tokens, comm.world_size());
            int64_t offset = 0;
            for (int64_t q = 0; q < r; ++q) offset += seq[r][q];
            const auto up = sequence_parallel ? upstream.narrow(0, offset, seq[r][r]) : upstream;
            (y * up).sum().backward();
            out[r] = y.detach();
            grad[r] = embed->weight.grad().defined() ? embed->weight.grad() : at::zeros_like(embed->weight);
            parts[r] = embed->partition();
          },
          test::test_comm_options());
      int64_t offset = 0;
      for (int64_t r = 0; r < c.world; ++r) {
        INFO("rank " << r << " rows " << parts[r].range(r) << " real " << parts[r].real(r));
        const auto expect = sequence_parallel ? want.detach().narrow(0, offset, seq[r][r]) : want.detach();
        offset += sequence_parallel ? seq[r][r] : 0;
        REQUIRE(out[r].sizes() == expect.sizes());
        CHECK(at::equal(out[r], expect));  // one nonzero term per element: exact
        // Gradients only into this rank's real rows; padding rows get none.
        CHECK(test::relative_error(grad[r], local_rows(want_grad, parts[r], r)) <= 1e-14);
      }
    }
  }
}

TEST_CASE("VocabParallelEmbedding: an id outside the vocabulary is an error on every rank", "[layers]") {
  for (int64_t world : {1, 3}) {
    std::vector<std::string> errors(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          VocabParallelEmbedding embed(VocabParallelEmbeddingOptions(10, 4), comm);
          try {
            embed->forward(at::tensor({3, 10, 2, -1}, at::kLong).view({2, 2}));
          } catch (const c10::Error& e) {
            errors[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    for (const auto& e : errors) {
      CHECK_THAT(e, Catch::Contains("token id 10 at index [0, 1]") &&
                        Catch::Contains("outside the vocabulary [0, 10) (and 1 more)"));
    }
  }
  VocabParallelEmbedding embed(VocabParallelEmbeddingOptions(10, 4));
  CHECK_THROWS_WITH(embed->forward(at::zeros({2}, at::kFloat)), Catch::Contains("must be int64 or int32"));
}

TEST_CASE("VocabParallelEmbedding loads strictly and zeroes padding rows", "[layers]") {
  Checkpoint ckpt;
  ckpt.add("e.weight", randn({10, 4}, 3));
  ckpt.add("bad.weight", randn({12, 4}, 3));
  ckpt.add("fp8.weight", randn({10, 4}, 3).to(at::kFloat8_e4m3fn));
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        VocabParallelEmbedding embed(VocabParallelEmbeddingOptions(10, 4).pad_to_multiple_of(8), comm);
        embed->load_weights(ckpt, "e");  // padded 16: [0,8) and [8,16); rank 1 holds 2 real rows
        if (comm.rank() == 1) {
          TORCH_CHECK(embed->weight.narrow(0, 2, 6).abs().sum().item<double>() == 0.0, "padding rows not zero");
          TORCH_CHECK(embed->vocab_range() == (Range{8, 10}), "vocab_range ", embed->vocab_range());
        }
        bool shape = false, dtype = false;
        try {
          embed->load_weights(ckpt, "bad");
        } catch (const c10::Error& e) {
          shape = std::string(e.what()).find("has shape [12, 4]; expected [10, 4]") != std::string::npos;
        }
        try {
          embed->load_weights(ckpt, "fp8");
        } catch (const c10::Error& e) {
          dtype = std::string(e.what()).find("never quantized") != std::string::npos;
        }
        TORCH_CHECK(shape && dtype, "strict loading: shape error ", shape, ", dtype error ", dtype);
      },
      test::test_comm_options());
}

TEST_CASE("ParallelLMHead: local slices, -inf padding, gathered logits", "[layers]") {
  for (const auto& c : cases()) {
    INFO(describe(c));
    const auto w = randn({c.vocab, c.hidden}, c.seed + 1);
    const auto x = randn({c.tokens, c.hidden}, c.seed + 2);
    const auto want = at::linear(x, w);
    Checkpoint ckpt;
    ckpt.add("lm_head.weight", w);
    std::vector<at::Tensor> local(c.world), gathered(c.world);
    std::vector<VocabPartition> parts(c.world);
    run_ranks_in_threads(
        c.world,
        [&](Communicator& comm) {
          const auto opts = ParallelLMHeadOptions(c.hidden, c.vocab).pad_to_multiple_of(c.pad).dtype(at::kDouble);
          ParallelLMHead head(opts, comm), all(ParallelLMHeadOptions(opts).gather_output(true), comm);
          head->load_weights(ckpt, "lm_head");
          all->load_weights(ckpt, "lm_head");
          local[comm.rank()] = head->forward(x);
          gathered[comm.rank()] = all->forward(x);
          parts[comm.rank()] = head->partition();
        },
        test::test_comm_options());
    for (int64_t r = 0; r < c.world; ++r) {
      const Range rows = parts[r].range(r), real = parts[r].real(r);
      REQUIRE(local[r].size(-1) == rows.size());
      CHECK(test::relative_error(local[r].narrow(-1, 0, real.size()), want.narrow(-1, real.begin, real.size())) <=
            1e-14);
      if (real.size() < rows.size())
        CHECK(local[r].narrow(-1, real.size(), rows.size() - real.size()).eq(-INFINITY).all().item<bool>());
      REQUIRE(gathered[r].sizes() == want.sizes());
      CHECK(test::relative_error(gathered[r], want) <= 1e-14);
    }
  }
}

TEST_CASE("vocab_parallel_cross_entropy equals at::cross_entropy: loss and gradients of x and W", "[layers]") {
  for (const auto& c : cases()) {
    for (bool tied : {false, true}) {
      INFO(describe(c) << " tied=" << tied);
      const auto w = randn({c.vocab, c.hidden}, c.seed + 1) * 2;  // spread the logits
      auto target = random_ids(c, {c.tokens});
      target[1] = -100;  // an ignored row
      const auto ids = random_ids(c, {c.tokens});
      // Reference: the full logits, at::cross_entropy (mean over the kept rows). Tied:
      // the same table also embeds `ids`, and both uses add to its gradient.
      const auto w_leaf = w.clone().requires_grad_(true);
      const auto x0 = randn({c.tokens, c.hidden}, c.seed + 2);
      const auto x_leaf = x0.clone().requires_grad_(true);
      const auto x_in = tied ? x_leaf + at::embedding(w_leaf, ids) : x_leaf;
      const auto per_row = at::cross_entropy_loss(at::linear(x_in, w_leaf), target, {}, at::Reduction::None, -100);
      const auto want_loss = per_row.detach();
      per_row.sum().backward();

      std::vector<at::Tensor> loss(c.world), gx(c.world), gw(c.world);
      std::vector<VocabPartition> parts(c.world);
      std::vector<int64_t> n_params(c.world);
      run_ranks_in_threads(
          c.world,
          [&](Communicator& comm) {
            const int64_t r = comm.rank();
            VocabParallelEmbedding embed(
                VocabParallelEmbeddingOptions(c.vocab, c.hidden).pad_to_multiple_of(c.pad).dtype(at::kDouble), comm);
            ParallelLMHead head{nullptr};
            if (tied) {
              head = ParallelLMHead(embed);
              TORCH_CHECK(head->weight.is_same(embed->weight), "a tied head must hold the embedding's tensor");
              n_params[r] = static_cast<int64_t>(head->parameters().size());
            } else {
              head = ParallelLMHead(
                  ParallelLMHeadOptions(c.hidden, c.vocab).pad_to_multiple_of(c.pad).dtype(at::kDouble), comm);
            }
            {
              at::NoGradGuard no_grad;
              head->weight.copy_(local_rows(w, head->partition(), r));
            }
            const auto x = x0.clone().requires_grad_(true);
            const auto h = tied ? x + embed->forward(ids) : x;
            const auto l = head->cross_entropy(head->forward(h), target);
            l.sum().backward();
            loss[r] = l.detach();
            gx[r] = x.grad();
            gw[r] = head->weight.grad();
            parts[r] = head->partition();
          },
          test::test_comm_options());
      for (int64_t r = 0; r < c.world; ++r) {
        INFO("rank " << r);
        if (tied) CHECK(n_params[r] == 0);  // the weight is the embedding's parameter, listed once
        CHECK(test::relative_error(loss[r], want_loss) <= 1e-13);
        CHECK(at::equal(loss[r], loss[0]));
        CHECK(loss[r][1].item<double>() == 0.0);
        CHECK(test::relative_error(gx[r], x_leaf.grad()) <= 1e-13);
        CHECK(test::relative_error(gw[r], local_rows(w_leaf.grad(), parts[r], r)) <= 1e-13);
      }
    }
  }
}

TEST_CASE("vocab_parallel_argmax: the global argmax, ties to the lowest id, padding never wins", "[layers]") {
  for (const auto& c : cases()) {
    INFO(describe(c));
    auto logits = randn({c.tokens, c.vocab}, c.seed + 5);
    // Row 0: the maximum twice, at the first and the last token (different ranks when
    // world > 1): the lowest id must win. Row 1: every logit equal.
    logits[0][0] = 100.0, logits[0][c.vocab - 1] = 100.0;
    logits[1].fill_(0.5);
    const auto want = logits.argmax(-1);
    std::vector<at::Tensor> got(c.world);
    run_ranks_in_threads(
        c.world,
        [&](Communicator& comm) {
          const auto p = partition_vocab(c.vocab, comm.world_size(), c.pad);
          const Range rows = p.range(comm.rank()), real = p.real(comm.rank());
          // The local slice, with its padding columns set far above every real logit.
          auto local = at::full({c.tokens, rows.size()}, 1e9, at::kDouble);
          if (real.size() > 0) local.narrow(-1, 0, real.size()).copy_(logits.narrow(-1, real.begin, real.size()));
          got[comm.rank()] = vocab_parallel_argmax(local, p, comm);
        },
        test::test_comm_options());
    for (int64_t r = 0; r < c.world; ++r) CHECK(at::equal(got[r], want));
  }
}

TEST_CASE("vocab_parallel_cross_entropy refuses targets outside the vocabulary and mismatched shapes", "[layers]") {
  const auto p = partition_vocab(10, 1);
  Communicator single;
  const auto logits = at::randn({3, 10}, at::kDouble);
  CHECK_THROWS_WITH(vocab_parallel_cross_entropy(logits, at::tensor({1, 10, 2}, at::kLong), p, single),
                    Catch::Contains("token id 10") && Catch::Contains("outside the vocabulary [0, 10)"));
  CHECK_THROWS_WITH(vocab_parallel_cross_entropy(logits, at::tensor({1, 2}, at::kLong), p, single),
                    Catch::Contains("does not match the logits' rows"));
  CHECK_THROWS_WITH(
      vocab_parallel_cross_entropy(at::randn({3, 9}, at::kDouble), at::tensor({1, 2, 3}, at::kLong), p, single),
      Catch::Contains("expected [..., 10]"));
}

TEST_CASE("gather_weights gives the vocabulary layers' whole tables, padding left out, at TP 1-4", "[layers]") {
  for (const auto& c : cases()) {
    INFO(describe(c));
    const auto table = randn({c.vocab, c.hidden}, c.seed), head_w = randn({c.vocab, c.hidden}, c.seed + 1);
    Checkpoint ckpt;
    ckpt.add("model.embed_tokens.weight", table);
    ckpt.add("lm_head.weight", head_w);
    std::vector<std::map<std::string, at::Tensor>> got(c.world);
    run_ranks_in_threads(
        c.world,
        [&](Communicator& comm) {
          const auto options =
              VocabParallelEmbeddingOptions(c.vocab, c.hidden).pad_to_multiple_of(c.pad).dtype(at::kDouble);
          VocabParallelEmbedding embed(options, comm);
          embed->load_weights(ckpt, "model.embed_tokens");
          ParallelLMHead head(ParallelLMHeadOptions(c.hidden, c.vocab).pad_to_multiple_of(c.pad).dtype(at::kDouble),
                              comm);
          head->load_weights(ckpt, "lm_head");
          ParallelLMHead tied(embed);
          torch::nn::Module model;
          model.register_module("embed_tokens", embed.ptr());
          model.register_module("lm_head", head.ptr());
          model.register_module("tied_head", tied.ptr());
          got[comm.rank()] = gather_weights(model, "model");
        },
        test::test_comm_options());
    for (int64_t r = 0; r < c.world; ++r) {
      INFO("rank " << r);
      REQUIRE(got[r].size() == 2);  // the tied head writes nothing of its own
      CHECK(at::equal(got[r].at("model.embed_tokens.weight"), table));
      CHECK(at::equal(got[r].at("model.lm_head.weight"), head_w));
    }
  }
}
