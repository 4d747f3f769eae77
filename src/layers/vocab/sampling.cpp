#include "tp/layers/vocab/sampling.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "layers/vocab/common.h"
#include "tp/layers/vocab/loss.h"

namespace tp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kFirstCandidates = 64;  // top-p's first round of candidates per rank
constexpr int64_t kCandidateGrowth = 8;   // and the factor of each further round
// A token more than this below its rank's largest value cannot win the draw there: the
// largest gets noise of at least -log(-log(2^-54)) = -3.62, any token at most
// -log(2^-54) = 37.43 (sampling_uniform's range), so it is not drawn for.
constexpr double kDrawWindow = 42.0;
// The first pass of the draw: the tokens this close to the rank's largest value.
constexpr double kNear = 8.0;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t row_key(uint64_t seed, int64_t step, int64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(row));
}

double uniform_of(uint64_t key, int64_t token) {
  const uint64_t h = splitmix64(key ^ static_cast<uint64_t>(token));
  return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
}

// (value, id) in the global order: larger values first, ties by the lower id.
bool ahead(double va, int64_t ia, double vb, int64_t ib) { return va > vb || (va == vb && ia < ib); }

// Each row's winner over every rank's (value, id) pair, [world, rows, 2]: the largest value,
// ties to the lowest id (ranks hold increasing ids, so the first rank holding it).
at::Tensor pick_winners(const at::Tensor& all) {
  const int64_t world = all.size(0), rows = all.size(1);
  const auto a = all.accessor<double, 3>();
  at::Tensor out = at::empty({rows}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    double best = -kInf;
    int64_t id = -1;
    for (int64_t w = 0; w < world; ++w) {
      const int64_t i = static_cast<int64_t>(a[w][r][1]);
      if (i >= 0 && (id < 0 || ahead(a[w][r][0], i, best, id))) best = a[w][r][0], id = i;
    }
    out[r] = id;
  }
  return out;
}

// The rows' values as float64 [rows, n] (n = this rank's real tokens).
struct Rows {
  at::Tensor values;
  int64_t rows = 0, n = 0, begin = 0;
  double* row(int64_t r) { return values.data_ptr<double>() + r * n; }
};

void repetition_penalty(Rows& x, const at::Tensor& previous, double penalty) {
  TORCH_CHECK_VALUE(previous.dim() == 2 && previous.size(0) == x.rows && previous.scalar_type() == at::kLong,
                    "vocab_parallel_sample: previous must be int64 [rows = ", x.rows, ", n]; got ",
                    previous.scalar_type(), " ", previous.sizes());
  const at::Tensor p = previous.contiguous();
  const auto a = p.accessor<int64_t, 2>();
  std::vector<char> seen(static_cast<size_t>(x.n));
  for (int64_t r = 0; r < x.rows; ++r) {
    std::fill(seen.begin(), seen.end(), 0);
    double* v = x.row(r);
    for (int64_t j = 0; j < p.size(1); ++j) {
      const int64_t i = a[r][j] - x.begin;
      if (i < 0 || i >= x.n || seen[static_cast<size_t>(i)]) continue;
      seen[static_cast<size_t>(i)] = 1;
      v[i] = v[i] > 0 ? v[i] / penalty : v[i] * penalty;  // transformers' torch.where(score < 0, ...)
    }
  }
}

// The row maxima over every rank: [rows]. A NaN on any rank is an error on every rank.
std::vector<double> global_max(Rows& x, const Communicator& comm, const char* op) {
  at::Tensor local = at::full({x.rows}, -kInf, at::kDouble);
  double* m = local.data_ptr<double>();
  for (int64_t r = 0; r < x.rows; ++r) {
    const double* v = x.row(r);
    for (int64_t i = 0; i < x.n; ++i) m[r] = std::isnan(v[i]) || std::isnan(m[r]) ? v[i] + m[r] : std::max(m[r], v[i]);
  }
  const at::Tensor all = detail::gather_stacked(local, comm).contiguous();  // [world, rows]
  for (int64_t w = 0; w < all.size(0); ++w)
    TORCH_CHECK_VALUE(!all[w].isnan().any().item<bool>(), op, ": the logits of rank ", w,
                      " hold NaN; no token can be sampled from them");
  const at::Tensor max = all.amax(0).contiguous();
  return std::vector<double>(max.data_ptr<double>(), max.data_ptr<double>() + x.rows);
}

// This rank's best `c` finite tokens of row r as (value, id), in the global order.
std::vector<std::pair<double, int64_t>> best_of_row(Rows& x, int64_t r, int64_t c) {
  std::vector<std::pair<double, int64_t>> all;
  const double* v = x.row(r);
  for (int64_t i = 0; i < x.n; ++i)
    if (v[i] > -kInf) all.emplace_back(v[i], x.begin + i);
  const auto order = [](const auto& a, const auto& b) { return ahead(a.first, a.second, b.first, b.second); };
  if (static_cast<int64_t>(all.size()) > c) {
    std::partial_sort(all.begin(), all.begin() + c, all.end(), order);
    all.resize(static_cast<size_t>(c));
  } else {
    std::sort(all.begin(), all.end(), order);
  }
  return all;
}

void top_k(Rows& x, int64_t k, const Communicator& comm) {
  at::Tensor mine = at::full({x.rows, k}, -kInf, at::kDouble);
  for (int64_t r = 0; r < x.rows; ++r) {
    const auto best = best_of_row(x, r, k);
    double* out = mine.data_ptr<double>() + r * k;
    for (size_t j = 0; j < best.size(); ++j) out[j] = best[j].first;
  }
  const at::Tensor all = detail::gather_stacked(mine, comm).permute({1, 0, 2}).reshape({x.rows, -1}).contiguous();
  for (int64_t r = 0; r < x.rows; ++r) {
    std::vector<double> v(all[r].data_ptr<double>(), all[r].data_ptr<double>() + all.size(1));
    std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<double>());
    const double kth = v[static_cast<size_t>(k - 1)];  // transformers keeps every token >= the k-th value
    double* row = x.row(r);
    for (int64_t i = 0; i < x.n; ++i)
      if (row[i] < kth) row[i] = -kInf;
  }
}

// transformers' top-p: a token stays while the probability of the tokens ahead of it in
// the global order is below top_p (so the first always stays).
void top_p(Rows& x, const std::vector<double>& max, double p, const Communicator& comm) {
  // The normalizer, from each rank's sum (added in rank order: the same on every rank).
  at::Tensor local = at::zeros({x.rows}, at::kDouble);
  for (int64_t r = 0; r < x.rows; ++r) {
    const double* v = x.row(r);
    double s = 0;
    for (int64_t i = 0; i < x.n; ++i)
      if (v[i] > -kInf) s += std::exp(v[i] - max[static_cast<size_t>(r)]);
    local.data_ptr<double>()[r] = s;
  }
  const at::Tensor z = detail::gather_stacked(local, comm).sum(0).contiguous();
  // The last kept token per row, (value, id); unsettled rows have id -1.
  std::vector<std::pair<double, int64_t>> last(static_cast<size_t>(x.rows), {0.0, -1});
  // Each row's tokens in the global order, sorted whole once a round needs a quarter of them.
  std::vector<std::vector<std::pair<double, int64_t>>> sorted(static_cast<size_t>(x.rows));
  for (int64_t c = kFirstCandidates;; c *= kCandidateGrowth) {
    // Per rank and row: c candidates (value, id; -inf / -1 past the rank's tokens) and the
    // value below which the rank sent nothing (-inf when it sent every finite token).
    at::Tensor mine = at::full({x.rows, 2 * c + 1}, -kInf, at::kDouble);
    for (int64_t r = 0; r < x.rows; ++r) {
      auto& whole = sorted[static_cast<size_t>(r)];
      if (whole.empty() && 4 * (c + 1) >= x.n) whole = best_of_row(x, r, x.n);
      const auto best = whole.empty() ? best_of_row(x, r, c + 1)
                                      : std::vector<std::pair<double, int64_t>>(
                                            whole.begin(), whole.begin() + std::min<int64_t>(c + 1, whole.size()));
      const int64_t sent = std::min<int64_t>(c, static_cast<int64_t>(best.size()));
      double* out = mine.data_ptr<double>() + r * (2 * c + 1);
      for (int64_t j = 0; j < c; ++j) {
        out[2 * j] = j < sent ? best[static_cast<size_t>(j)].first : -kInf;
        out[2 * j + 1] = j < sent ? static_cast<double>(best[static_cast<size_t>(j)].second) : -1.0;
      }
      if (static_cast<int64_t>(best.size()) > c) out[2 * c] = best[static_cast<size_t>(c - 1)].first;
    }
    const at::Tensor all = detail::gather_stacked(mine, comm).contiguous();  // [world, rows, 2c + 1]
    const auto a = all.accessor<double, 3>();
    bool settled = true;
    for (int64_t r = 0; r < x.rows; ++r) {
      if (last[static_cast<size_t>(r)].second >= 0) continue;
      std::vector<std::pair<double, int64_t>> merged;
      double frontier = -kInf;
      for (int64_t w = 0; w < all.size(0); ++w) {
        frontier = std::max(frontier, a[w][r][2 * c]);
        for (int64_t j = 0; j < c; ++j)
          if (a[w][r][2 * j + 1] >= 0) merged.emplace_back(a[w][r][2 * j], static_cast<int64_t>(a[w][r][2 * j + 1]));
      }
      std::sort(merged.begin(), merged.end(),
                [](const auto& u, const auto& v) { return ahead(u.first, u.second, v.first, v.second); });
      // A token's mass ahead is exact once it beats the frontier: nothing unsent is ahead of it.
      const double target = p * z[r].item<double>();
      double before = 0;
      size_t cut = merged.size();
      for (size_t j = 0; j < merged.size(); ++j) {
        if (before >= target) {
          cut = j;
          break;
        }
        before += std::exp(merged[j].first - max[static_cast<size_t>(r)]);
      }
      const bool exact = cut < merged.size() ? merged[cut].first > frontier : frontier == -kInf;
      if (!exact) {
        settled = false;
        continue;
      }
      last[static_cast<size_t>(r)] = merged[cut - 1];  // cut >= 1: the first token is always kept
    }
    if (settled) break;
  }
  for (int64_t r = 0; r < x.rows; ++r) {
    const auto [value, id] = last[static_cast<size_t>(r)];
    double* v = x.row(r);
    for (int64_t i = 0; i < x.n; ++i)
      if (ahead(value, id, v[i], x.begin + i)) v[i] = -kInf;
  }
}

}  // namespace

void SamplingParams::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature >= 0, "SamplingParams: temperature must be finite and ",
                    ">= 0 (0: greedy); got ", temperature);
  TORCH_CHECK_VALUE(top_k >= 0, "SamplingParams: top_k must be >= 0 (0: off); got ", top_k);
  TORCH_CHECK_VALUE(top_p > 0 && top_p <= 1, "SamplingParams: top_p must be in (0, 1] (1: off); got ", top_p);
  TORCH_CHECK_VALUE(min_p >= 0 && min_p <= 1, "SamplingParams: min_p must be in [0, 1] (0: off); got ", min_p);
  TORCH_CHECK_VALUE(std::isfinite(repetition_penalty) && repetition_penalty > 0,
                    "SamplingParams: repetition_penalty must be finite and > 0 (1: off); got ", repetition_penalty);
}

double sampling_uniform(uint64_t seed, int64_t step, int64_t row, int64_t token) {
  return uniform_of(row_key(seed, step, row), token);
}

at::Tensor vocab_parallel_sample(const at::Tensor& local_logits, const VocabPartition& partition,
                                 const Communicator& comm, const SamplingParams& params, int64_t step,
                                 const at::Tensor& previous, int64_t first_row) {
  constexpr const char* kOp = "vocab_parallel_sample";
  detail::check_local_logits(kOp, local_logits, partition, comm);
  TORCH_CHECK_VALUE(local_logits.dim() == 2, kOp, ": local logits must be [rows, local vocab]; got ",
                    local_logits.sizes());
  params.validate();
  const bool penalized = params.repetition_penalty != 1.0 && previous.defined();
  if (params.temperature == 0 && !penalized)  // greedy: the argmax as it is (NaN and ties as at::argmax)
    return vocab_parallel_argmax(local_logits, partition, comm);
  at::NoGradGuard no_grad;
  const Range real = partition.real(comm.rank());
  Rows x;
  x.rows = local_logits.size(0);
  x.n = real.size();
  x.begin = real.begin;
  x.values = local_logits.narrow(-1, 0, x.n).to(at::kCPU, at::kDouble).contiguous().clone();
  if (penalized) repetition_penalty(x, previous.to(at::kCPU), params.repetition_penalty);
  if (params.temperature > 0) x.values.div_(params.temperature);
  const std::vector<double> max = global_max(x, comm, kOp);
  if (params.temperature > 0) {
    if (params.top_k > 0 && params.top_k < partition.vocab_size) top_k(x, params.top_k, comm);
    if (params.top_p < 1) top_p(x, max, params.top_p, comm);
    if (params.min_p > 0) {
      for (int64_t r = 0; r < x.rows; ++r) {
        const double floor = max[static_cast<size_t>(r)] + std::log(params.min_p);
        double* v = x.row(r);
        for (int64_t i = 0; i < x.n; ++i)
          if (v[i] < floor) v[i] = -kInf;
      }
    }
  }
  // Each rank's best (value + noise, id); greedy: the value alone. The noise is drawn in two
  // passes: the tokens within kNear of the rank's largest value first, then the rest, of which
  // only those whose uniform draw is large enough to reach the best so far take the logarithms
  // (a token x below top - kNear needs noise of at least best - (top - kNear), i.e. a uniform of
  // at least exp(-exp(-that)); one nat of margin for the roundings). The same winner as drawing
  // for every token, at the cost of a hash for most of them.
  at::Tensor mine = at::empty({x.rows, 2}, at::kDouble);
  double* out = mine.data_ptr<double>();
  for (int64_t r = 0; r < x.rows; ++r) {
    const double* v = x.row(r);
    double top = -kInf;
    for (int64_t i = 0; i < x.n; ++i) top = std::max(top, v[i]);
    const uint64_t key = row_key(params.seed, step, first_row + r);
    const bool draw = params.temperature > 0;
    double best = -kInf;
    int64_t id = -1;
    const auto consider = [&](int64_t i, double value) {
      const int64_t token = x.begin + i;
      if (id < 0 || value > best || (value == best && token < id)) best = value, id = token;
    };
    for (int64_t i = 0; i < x.n; ++i) {
      if (v[i] == -kInf || (draw && v[i] < top - kNear)) continue;
      consider(i, draw ? v[i] - std::log(-std::log(uniform_of(key, x.begin + i))) : v[i]);
    }
    if (draw && id >= 0) {
      const double reach = std::exp(-std::exp(-(best - (top - kNear) - 1.0)));
      for (int64_t i = 0; i < x.n; ++i) {
        if (v[i] == -kInf || v[i] >= top - kNear || v[i] < top - kDrawWindow) continue;
        const double u = uniform_of(key, x.begin + i);
        if (u < reach) continue;
        consider(i, v[i] - std::log(-std::log(u)));
      }
    }
    out[2 * r] = best;
    out[2 * r + 1] = static_cast<double>(id);
  }
  return pick_winners(detail::gather_stacked(mine, comm).contiguous()).to(local_logits.device());
}

}  // namespace tp
