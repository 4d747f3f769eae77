// Splitting one dimension over ranks (docs/DESIGN.md §3 "Sharding").
//
// Everything is counted in whole units of `granularity` and turned back into
// elements only at the end, so every boundary is a multiple of it by construction.
// Even and weighted splits (the largest remainder method) are both exact integer
// arithmetic.

#include "tp/shard/split.h"

#include "shard/shard_fail.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

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

// A weight w > 0 as the odd integer m and exponent e with w = m * 2^e (every finite
// double is one exactly).
struct Dyadic {
  uint64_t m = 0;
  int e = 0;
};

Dyadic dyadic(double w) {
  int exp = 0;
  const double frac = std::frexp(w, &exp);  // w = frac * 2^exp, frac in [0.5, 1)
  Dyadic d{static_cast<uint64_t>(std::ldexp(frac, 53)), exp - 53};
  while ((d.m & 1) == 0) {
    d.m >>= 1;
    ++d.e;
  }
  return d;
}

// A non-negative integer of any size, little-endian 32-bit limbs: just what the
// weighted split needs (weights as integers span up to ~2100 bits when their
// exponents are far apart).
class BigUint {
 public:
  BigUint() = default;
  /// v * 2^shift.
  BigUint(uint64_t v, int shift) {
    limbs_.assign(static_cast<size_t>(shift / 32) + 3, 0);
    const unsigned __int128 wide = static_cast<unsigned __int128>(v) << (shift % 32);
    for (size_t k = 0; k < 3; ++k)
      limbs_[static_cast<size_t>(shift / 32) + k] = static_cast<uint32_t>(wide >> (32 * k));
    trim();
  }
  void add(const BigUint& o) {
    limbs_.resize(std::max(limbs_.size(), o.limbs_.size()) + 1, 0);
    uint64_t carry = 0;
    for (size_t k = 0; k < limbs_.size(); ++k) {
      carry += static_cast<uint64_t>(limbs_[k]) + (k < o.limbs_.size() ? o.limbs_[k] : 0);
      limbs_[k] = static_cast<uint32_t>(carry);
      carry >>= 32;
    }
    trim();
  }
  void mul(uint64_t f) {  // f < 2^63
    limbs_.resize(limbs_.size() + 2, 0);
    unsigned __int128 carry = 0;
    for (auto& limb : limbs_) {
      carry += static_cast<unsigned __int128>(limb) * f;
      limb = static_cast<uint32_t>(carry);
      carry >>= 32;
    }
    trim();
  }
  int compare(const BigUint& o) const {
    if (limbs_.size() != o.limbs_.size()) return limbs_.size() < o.limbs_.size() ? -1 : 1;
    for (size_t k = limbs_.size(); k-- > 0;) {
      if (limbs_[k] != o.limbs_[k]) return limbs_[k] < o.limbs_[k] ? -1 : 1;
    }
    return 0;
  }
  /// *this = *this mod d, returning the quotient, which must fit in int64.
  int64_t divmod(const BigUint& d) {
    BigUint r;
    uint64_t q = 0;
    for (size_t bit = limbs_.size() * 32; bit-- > 0;) {
      r.shift_left_one((limbs_[bit / 32] >> (bit % 32)) & 1u);
      q <<= 1;
      if (r.compare(d) >= 0) {
        r.subtract(d);
        q |= 1;
      }
    }
    *this = r;
    return static_cast<int64_t>(q);
  }

 private:
  void shift_left_one(uint32_t low_bit) {
    uint32_t carry = low_bit;
    for (auto& limb : limbs_) {
      const uint32_t next = limb >> 31;
      limb = (limb << 1) | carry;
      carry = next;
    }
    if (carry) limbs_.push_back(carry);
  }
  void subtract(const BigUint& o) {  // requires *this >= o
    int64_t borrow = 0;
    for (size_t k = 0; k < limbs_.size(); ++k) {
      int64_t v = static_cast<int64_t>(limbs_[k]) - (k < o.limbs_.size() ? o.limbs_[k] : 0) - borrow;
      borrow = v < 0 ? 1 : 0;
      limbs_[k] = static_cast<uint32_t>(v + (borrow << 32));
    }
    trim();
  }
  void trim() {
    while (!limbs_.empty() && limbs_.back() == 0) limbs_.pop_back();
  }
  std::vector<uint32_t> limbs_;  // empty: zero
};

// Largest remainder: every rank first gets floor(ideal); the units left over go one
// each to the ranks with the largest fractional parts, equal fractions in rotation
// order. So every share is floor(ideal) or ceil(ideal), and equal weights give
// exactly the even split. All in exact integer arithmetic: the weights, scaled by
// one power of two to integers W[r], give ideal = units * W[r] / S with S = sum W,
// whose floor and remainder are computed exactly - so ties are real ties (weights
// 1, 4, 1 over 2 units: three fractions of exactly 1/3, broken by rotation), never
// decided by a rounding error.
std::vector<int64_t> weighted_units(int64_t units, const std::vector<double>& weights, int64_t rotation) {
  const int64_t world = static_cast<int64_t>(weights.size());
  std::vector<Dyadic> d(weights.size());
  int min_e = std::numeric_limits<int>::max();
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] == 0) continue;
    d[i] = dyadic(weights[i]);
    min_e = std::min(min_e, d[i].e);
  }
  BigUint sum;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] != 0) sum.add(BigUint(d[i].m, d[i].e - min_e));
  }

  std::vector<int64_t> n(weights.size(), 0);
  std::vector<BigUint> rem(weights.size());  // units * W mod S: the fraction times S
  std::vector<int64_t> order;                // ranks that may receive leftover units
  int64_t assigned = 0;
  for (int64_t r = 0; r < world; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (weights[i] == 0) continue;  // a weight of 0 owns nothing, not even a leftover
    rem[i] = BigUint(d[i].m, d[i].e - min_e);
    rem[i].mul(static_cast<uint64_t>(units));
    n[i] = rem[i].divmod(sum);  // <= units, since W <= S
    assigned += n[i];
    order.push_back(r);
  }
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const size_t ia = static_cast<size_t>(a), ib = static_cast<size_t>(b);
    const int c = rem[ia].compare(rem[ib]);
    if (c != 0) return c > 0;
    return queue_position(a, world, rotation) < queue_position(b, world, rotation);
  });
  // The leftover, units - sum(floor), is the sum of the fractions: an integer below
  // the number of ranks with a nonzero fraction, so each gets at most one.
  const int64_t leftover = units - assigned;
  if (leftover < 0 || leftover > static_cast<int64_t>(order.size())) {
    shard_fail("split: internal error: ", leftover, " leftover units for ", order.size(), " ranks");
  }
  for (int64_t k = 0; k < leftover; ++k) ++n[static_cast<size_t>(order[static_cast<size_t>(k)])];
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

Range split_for_rank(int64_t total, int64_t world, int64_t rank, const SplitPolicy& policy, const std::string& what) {
  if (world < 1) {
    shard_fail("split_for_rank(", what, "): invalid world_size ", world, " (world_size should be >= 1)");
  }
  if (rank < 0 || rank >= world) {
    shard_fail("split_for_rank(", what, "): invalid rank ", rank, " (rank should be in the 0..", world - 1, " range)");
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
  if (total > kMaxInt64 - pad)
    shard_fail("round_up: ", total, " rounded up to a multiple of ", granularity, " overflows int64");
  return total + pad;
}

}  // namespace tp
