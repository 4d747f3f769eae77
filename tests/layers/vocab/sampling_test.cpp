// vocab_parallel_sample (tp/layers/vocab/sampling.h) at world sizes 1-4 (ranks as threads),
// uneven and padded vocabulary slices: the same tokens at every TP size for every seed and
// filter, equal to a single-device reference sampler written here from transformers'
// warpers (repetition penalty, temperature, top-k, top-p, min-p) over the whole row with the
// same draws (sampling_uniform); the tokens' frequencies against the filtered softmax (a
// chi-square test); greedy as vocab_parallel_argmax; bad parameters and NaN logits refused
// on every rank.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/vocab/loss.h"
#include "tp/layers/vocab/sampling.h"

using namespace tp;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The single-device sampler: one row of logits (float64), its previous tokens.
int64_t reference_sample(std::vector<double> x, const std::vector<int64_t>& previous, const SamplingParams& p,
                         int64_t step, int64_t row) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<char> seen(x.size(), 0);
  for (const int64_t id : previous) {
    if (seen[static_cast<size_t>(id)]) continue;
    seen[static_cast<size_t>(id)] = 1;
    double& v = x[static_cast<size_t>(id)];
    v = v < 0 ? v * p.repetition_penalty : v / p.repetition_penalty;
  }
  if (p.temperature == 0) return std::max_element(x.begin(), x.end()) - x.begin();
  for (double& v : x) v /= p.temperature;
  const double max = *std::max_element(x.begin(), x.end());
  // Sorted descending, ties by id: the order top-k and top-p read.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  if (p.top_k > 0 && p.top_k < n) {
    const double kth = x[static_cast<size_t>(order[static_cast<size_t>(p.top_k - 1)])];
    for (double& v : x)
      if (v < kth) v = -kInf;
  }
  if (p.top_p < 1) {
    double z = 0;
    for (const double v : x)
      if (v > -kInf) z += std::exp(v - max);
    double before = 0;
    bool cut = false;
    for (const int64_t id : order) {
      double& v = x[static_cast<size_t>(id)];
      if (v == -kInf) continue;
      if (cut || before >= p.top_p * z) {
        cut = true;
        v = -kInf;
        continue;
      }
      before += std::exp(v - max);
    }
  }
  if (p.min_p > 0)
    for (double& v : x)
      if (v < max + std::log(p.min_p)) v = -kInf;
  int64_t best = -1;
  double best_value = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    if (x[static_cast<size_t>(i)] == -kInf) continue;
    const double g = -std::log(-std::log(sampling_uniform(p.seed, step, row, i)));
    if (best < 0 || x[static_cast<size_t>(i)] + g > best_value) best_value = x[static_cast<size_t>(i)] + g, best = i;
  }
  return best;
}

// Every rank's tokens from `logits` [rows, vocab] split over `world` ranks (padding
// columns set far above every logit, which must never matter).
std::vector<at::Tensor> sample_at(int64_t world, const at::Tensor& logits, int64_t pad, const SamplingParams& p,
                                  int64_t step, const at::Tensor& previous) {
  std::vector<at::Tensor> got(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        const auto part = partition_vocab(logits.size(1), comm.world_size(), pad);
        const Range rows = part.range(comm.rank()), real = part.real(comm.rank());
        auto local = at::full({logits.size(0), rows.size()}, 1e9, logits.options());
        if (real.size() > 0) local.narrow(-1, 0, real.size()).copy_(logits.narrow(-1, real.begin, real.size()));
        try {
          got[static_cast<size_t>(comm.rank())] = vocab_parallel_sample(local, part, comm, p, step, previous);
        } catch (const c10::Error& e) {
          errors[static_cast<size_t>(comm.rank())] = e.what_without_backtrace();
        }
      },
      test::test_comm_options());
  for (const auto& e : errors) REQUIRE(e.empty());
  return got;
}

std::vector<SamplingParams> filter_cases() {
  std::vector<SamplingParams> out;
  const auto add = [&](double t, int64_t k, double top_p, double min_p, double penalty) {
    SamplingParams p;
    p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.repetition_penalty = penalty;
    out.push_back(p);
  };
  add(1.0, 0, 1.0, 0.0, 1.0);     // plain softmax
  add(0.7, 5, 1.0, 0.0, 1.0);     // top-k
  add(1.3, 0, 0.9, 0.0, 1.0);     // top-p
  add(1.0, 0, 0.3, 0.0, 1.0);     // a small nucleus
  add(1.0, 0, 1.0, 0.05, 1.0);    // min-p
  add(0.8, 40, 0.95, 0.01, 1.2);  // all of them, with a repetition penalty
  add(0.0, 0, 1.0, 0.0, 1.3);     // greedy with a repetition penalty
  return out;
}

}  // namespace

TEST_CASE(
    "vocab_parallel_sample: the same tokens at TP 1-4 for every seed and filter, equal to the single-device "
    "sampler",
    "[layers][sampling]") {
  // A vocabulary of 1003 (uneven at 2-4, padded to 8), 3 rows, logits spread like a
  // model's (a few large ones, a long tail), two equal maxima in row 1 (ties to the low id).
  const int64_t vocab = 1003, rows = 3;
  at::Tensor logits = test::randn({rows, vocab}, 51) * 3.0;
  logits[1][17] = 12.0, logits[1][vocab - 5] = 12.0;
  const at::Tensor previous = at::tensor({3, 17, 500, 3, 999, 1000, 17, 2, 41, 600, 601, 602}, at::kLong).view({3, 4});
  for (const auto& params : filter_cases()) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      SamplingParams p = params;
      p.seed = seed;
      const int64_t step = static_cast<int64_t>(seed % 3);
      std::vector<int64_t> want;
      for (int64_t r = 0; r < rows; ++r) {
        const at::Tensor row = logits[r].contiguous();
        const at::Tensor prev = previous[r].contiguous();
        want.push_back(reference_sample(std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + vocab),
                                        std::vector<int64_t>(prev.data_ptr<int64_t>(), prev.data_ptr<int64_t>() + 4), p,
                                        step, r));
      }
      const at::Tensor expected = at::tensor(want, at::kLong);
      for (int64_t world = 1; world <= 4; ++world) {
        INFO("T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p << " min_p=" << p.min_p
                  << " penalty=" << p.repetition_penalty << " seed=" << seed << " world=" << world);
        for (const auto& got : sample_at(world, logits, 8, p, step, previous)) CHECK(at::equal(got, expected));
      }
    }
  }
}

TEST_CASE("vocab_parallel_sample: top-p settles a nucleus wider than the first rounds of candidates on every rank",
          "[layers][sampling]") {
  // Nearly flat logits: the 0.97 nucleus holds most of the 5000 tokens, far past the 64
  // candidates each rank sends first, so the rounds grow (64, 512, 4096: the last from each
  // rank's whole sorted slice) until it is settled.
  const at::Tensor logits = test::randn({2, 5000}, 52) * 0.05;
  SamplingParams p;
  p.top_p = 0.97;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    p.seed = seed;
    std::vector<int64_t> want;
    for (int64_t r = 0; r < 2; ++r) {
      const at::Tensor row = logits[r].contiguous();
      want.push_back(
          reference_sample(std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + 5000), {}, p, 0, r));
    }
    for (int64_t world = 1; world <= 4; world += 3)
      for (const auto& got : sample_at(world, logits, 1, p, 0, at::Tensor())) CHECK(at::equal(got, at::tensor(want)));
  }
}

TEST_CASE("vocab_parallel_sample: a far tail that holds most of the probability is drawn from exactly",
          "[layers][sampling]") {
  // One token 9 above 3000 equal ones: it has e^9 / (e^9 + 2999) = 73 % of the mass, the tail
  // (more than kNear below it: drawn for only where a uniform is large enough) the rest.
  at::Tensor logits = at::zeros({400, 3000}, at::kDouble);
  logits.select(1, 1234).fill_(9.0);
  SamplingParams p;
  std::vector<int64_t> want;
  for (int64_t r = 0; r < 400; ++r) {
    const at::Tensor row = logits[r].contiguous();
    want.push_back(
        reference_sample(std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + 3000), {}, p, 0, r));
  }
  const at::Tensor expected = at::tensor(want, at::kLong);
  const double top_share = expected.eq(1234).sum().item<double>() / 400;
  INFO("the top token drawn in " << top_share << " of the rows");
  CHECK(std::abs(top_share - std::exp(9.0) / (std::exp(9.0) + 2999)) < 0.08);
  for (int64_t world = 1; world <= 4; world += 3)
    for (const auto& got : sample_at(world, logits, 1, p, 0, at::Tensor())) CHECK(at::equal(got, expected));
}

TEST_CASE("vocab_parallel_sample: the tokens' frequencies are the filtered softmax (chi-square), at TP 3",
          "[layers][sampling]") {
  // 12 tokens; with top-k 8 and temperature 0.9 the probabilities of the 8 kept are
  // softmax(logits / 0.9) over them and the other 4 never appear.
  const std::vector<double> row = {2.0, 1.5, -1.0, 0.3, 1.1, -0.2, 0.8, 2.2, -3.0, 0.0, 0.5, -0.7};
  const int64_t vocab = static_cast<int64_t>(row.size()), draws = 6000;
  SamplingParams p;
  p.temperature = 0.9, p.top_k = 8;
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  std::vector<double> prob(static_cast<size_t>(vocab), 0.0);
  double z = 0;
  for (int64_t j = 0; j < 8; ++j) z += std::exp(row[order[j]] / 0.9);
  for (int64_t j = 0; j < 8; ++j) prob[order[j]] = std::exp(row[order[j]] / 0.9) / z;
  // One call of `draws` rows: each row its own draws (the row index is in the key).
  const at::Tensor logits = at::tensor(row, at::kDouble).unsqueeze(0).expand({draws, vocab}).contiguous();
  const auto got = sample_at(3, logits, 1, p, 0, at::Tensor());
  std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
  const auto tokens = got[0].contiguous();
  for (int64_t i = 0; i < draws; ++i) ++count[static_cast<size_t>(tokens.data_ptr<int64_t>()[i])];
  double chi2 = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (prob[i] == 0) {
      CHECK(count[i] == 0);
      continue;
    }
    const double e = prob[i] * draws;
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  INFO("chi-square " << chi2 << " over 7 degrees of freedom");
  // 7 degrees of freedom: P(chi2 > 24.32) = 0.001.
  CHECK(chi2 < 24.32);
}

TEST_CASE("vocab_parallel_sample: bad parameters and NaN logits are refused on every rank",
          "[layers][sampling][errors]") {
  const auto refused = [](const SamplingParams& p) {
    try {
      p.validate();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("accepted");
  };
  SamplingParams p;
  p.temperature = -1;
  CHECK_THAT(refused(p), Contains("temperature must be finite and >= 0"));
  p = {}, p.top_k = -2;
  CHECK_THAT(refused(p), Contains("top_k must be >= 0"));
  p = {}, p.top_p = 0;
  CHECK_THAT(refused(p), Contains("top_p must be in (0, 1]"));
  p = {}, p.min_p = 1.5;
  CHECK_THAT(refused(p), Contains("min_p must be in [0, 1]"));
  p = {}, p.repetition_penalty = 0;
  CHECK_THAT(refused(p), Contains("repetition_penalty must be finite and > 0"));

  // A NaN on the last rank only: every rank raises, naming it.
  at::Tensor logits = test::randn({2, 40}, 53);
  logits[1][39] = std::numeric_limits<double>::quiet_NaN();
  for (int64_t world = 1; world <= 4; ++world) {
    std::vector<std::string> errors(static_cast<size_t>(world));
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const auto part = partition_vocab(40, comm.world_size());
          const Range real = part.real(comm.rank());
          try {
            vocab_parallel_sample(logits.narrow(-1, real.begin, real.size()).contiguous(), part, comm, SamplingParams{},
                                  0);
          } catch (const c10::Error& e) {
            errors[static_cast<size_t>(comm.rank())] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    for (const auto& e : errors)
      CHECK_THAT(e, Contains("the logits of rank " + std::to_string(world - 1)) && Contains("hold NaN"));
  }
}

TEST_CASE("vocab_parallel_sample: greedy without a penalty is vocab_parallel_argmax", "[layers][sampling]") {
  const at::Tensor logits = test::randn({4, 300}, 54);
  SamplingParams p;
  p.temperature = 0;
  for (int64_t world = 1; world <= 4; ++world)
    for (const auto& got : sample_at(world, logits, 8, p, 0, at::Tensor())) CHECK(at::equal(got, logits.argmax(-1)));
}
