// Splitting one dimension over ranks (DESIGN.md §3 "Sharding").
//
// Everything is counted in whole units of `granularity` and turned back into
// elements only at the end, so every boundary is a multiple of it by construction.
// Even splits use exact integer arithmetic; weighted splits use the largest
// remainder method, which is the only floating-point step.

#include "tp/shard/split.h"

#include "shard/shard_fail.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <sstream>

namespace tp {
namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

using detail::shard_fail;

// Rank `r`'s place in the queue for remainder units: rank `rotation % world` is
// first, the next rank second, and so on around the ring. Negative rotations count
// back from the last rank, so callers may pass any layer-index arithmetic.
int64_t queue_position(int64_t r, int64_t world, int64_t rotation) {
  const int64_t start = ((rotation % world) + world) % world;
  return (r - start + world) % world;
}

void check_args(int64_t total, int64_t world, const SplitPolicy& policy, const std::string& what) {
  if (world < 1) {
    shard_fail("split(", what, "): invalid world_size ", world, " (world_size should be >= 1)");
  }
  if (policy.granularity < 1) {
    shard_fail("split(", what, "): invalid granularity ", policy.granularity, " (granularity should be >= 1)");
  }
  if (total < 0) shard_fail("split(", what, "): invalid size ", total, " (size should be >= 0)");
  if (!policy.weights.empty()) {
    if (static_cast<int64_t>(policy.weights.size()) != world) {
      shard_fail("split(", what, "): got ", policy.weights.size(), " weights for world_size ", world,
           " (weights should have one entry per rank, or none for an even split)");
    }
    bool any_positive = false;
    for (size_t r = 0; r < policy.weights.size(); ++r) {
      const double w = policy.weights[r];
      // !(w >= 0) also catches NaN, which compares false with everything.
      if (!(w >= 0) || !std::isfinite(w)) {
        shard_fail("split(", what, "): invalid weight ", w, " for rank ", r, " (weights should be finite and >= 0)");
      }
      any_positive = any_positive || w > 0;
    }
    if (!any_positive) {
      shard_fail("split(", what, "): all ", world, " weights are 0 (at least one rank must own a share)");
    }
  }
  if (!policy.partial_tail && total % policy.granularity != 0) {
    shard_fail(what, "=", total, " is not a multiple of the granularity ", policy.granularity, "; pad ", what, " to ",
         round_up(total, policy.granularity));
  }
}

std::vector<int64_t> even_units(int64_t units, int64_t world, int64_t rotation) {
  std::vector<int64_t> n(static_cast<size_t>(world), units / world);
  const int64_t rem = units % world;
  for (int64_t r = 0; r < world; ++r) {
    if (queue_position(r, world, rotation) < rem) ++n[static_cast<size_t>(r)];
  }
  return n;
}

// Largest remainder: every rank first gets floor(ideal); the units left over go one
// each to the ranks with the largest fractional parts, equal fractions in rotation
// order. So every share is floor(ideal) or ceil(ideal), and equal weights give
// exactly the even split. long double keeps units * w exact for any realistic size.
std::vector<int64_t> weighted_units(int64_t units, const std::vector<double>& weights, int64_t rotation) {
  const int64_t world = static_cast<int64_t>(weights.size());
  long double sum = 0;
  for (double w : weights) sum += w;

  std::vector<int64_t> n(weights.size(), 0);
  std::vector<long double> frac(weights.size(), 0);
  std::vector<int64_t> order;  // ranks that may receive leftover units
  int64_t assigned = 0;
  for (int64_t r = 0; r < world; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (weights[i] == 0) continue;  // a weight of 0 owns nothing, not even a leftover
    const long double ideal = static_cast<long double>(units) * weights[i] / sum;
    const long double whole = std::min(std::floor(ideal), static_cast<long double>(units));
    n[i] = static_cast<int64_t>(whole);
    frac[i] = ideal - whole;
    assigned += n[i];
    order.push_back(r);
  }
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const size_t ia = static_cast<size_t>(a), ib = static_cast<size_t>(b);
    if (frac[ia] != frac[ib]) return frac[ia] > frac[ib];
    return queue_position(a, world, rotation) < queue_position(b, world, rotation);
  });

  // In exact arithmetic the leftover is below the number of ranks with a nonzero
  // fraction, so one pass suffices; the loops only guard against rounding.
  for (size_t k = 0; assigned < units; k = (k + 1) % order.size()) {
    ++n[static_cast<size_t>(order[k])];
    ++assigned;
  }
  for (size_t k = order.size(); assigned > units;) {
    k = (k == 0 ? order.size() : k) - 1;  // smallest fractions give back first
    int64_t& nk = n[static_cast<size_t>(order[k])];
    if (nk > 0) {
      --nk;
      --assigned;
    }
  }
  return n;
}

}  // namespace

std::vector<Range> split(int64_t total, int64_t world, const SplitPolicy& policy, const std::string& what) {
  check_args(total, world, policy, what);
  // A partial last unit counts as a unit; the ranges are clamped to total below.
  const int64_t units = total / policy.granularity + (total % policy.granularity != 0 ? 1 : 0);
  const std::vector<int64_t> n = policy.weights.empty() ? even_units(units, world, policy.rotation)
                                                        : weighted_units(units, policy.weights, policy.rotation);
  std::vector<Range> ranges;
  ranges.reserve(n.size());
  int64_t begin = 0;
  for (int64_t count : n) {
    const int64_t end = std::min(total, begin + count * policy.granularity);
    ranges.push_back({begin, end});
    begin = end;
  }
  if (begin != total) {
    // Our own invariant, not a user error; still an exception rather than abort().
    shard_fail("split(", what, "): internal error: ranges cover ", begin, " of ", total, " elements");
  }
  return ranges;
}

Range split_for_rank(int64_t total, int64_t world, int64_t rank, const SplitPolicy& policy,
                     const std::string& what) {
  if (world < 1) {
    shard_fail("split_for_rank(", what, "): invalid world_size ", world, " (world_size should be >= 1)");
  }
  if (rank < 0 || rank >= world) {
    shard_fail("split_for_rank(", what, "): invalid rank ", rank, " (rank should be in the 0..", world - 1,
         " range)");
  }
  // The whole split, not just this rank's arithmetic: a weighted share depends on
  // everyone's remainders, and one code path keeps every rank in agreement.
  return split(total, world, policy, what)[static_cast<size_t>(rank)];
}

int64_t combine_granularity(int64_t a, int64_t b) {
  if (a < 1 || b < 1) {
    shard_fail("combine_granularity: invalid granularity ", (a < 1 ? a : b), " (granularity should be >= 1)");
  }
  const int64_t a_part = a / std::gcd(a, b);
  if (a_part > kMaxInt64 / b) shard_fail("combine_granularity: lcm(", a, ", ", b, ") overflows int64");
  return a_part * b;
}

int64_t round_up(int64_t total, int64_t granularity) {
  if (granularity < 1) {
    shard_fail("round_up: invalid granularity ", granularity, " (granularity should be >= 1)");
  }
  if (total < 0) shard_fail("round_up: invalid size ", total, " (size should be >= 0)");
  const int64_t pad = (granularity - total % granularity) % granularity;
  if (total > kMaxInt64 - pad) shard_fail("round_up: ", total, " rounded up to a multiple of ", granularity, " overflows int64");
  return total + pad;
}

}  // namespace tp
