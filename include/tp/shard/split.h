#pragma once
// Splitting one dimension of `total` elements over `world` ranks.
//
// No torch here (docs/DESIGN.md §2): errors are tp::ShardError (a std::invalid_argument),
// which the layers rethrow as c10::ValueError with the layer's name in front.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tp/shard/range.h"

namespace tp {

/// A request that cannot be split as asked. The message names the dimension, the
/// constraint and what would fix it (padding, or the world sizes that work).
class ShardError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// How one dimension is split.
/// Example: `SplitPolicy{}.with_granularity(128).with_rotation(layer_index)`.
struct SplitPolicy {
  /// Every boundary is a multiple of this many elements (quant block, head size, tile).
  int64_t granularity = 1;
  /// Per-rank ratios for unequal devices; empty means an even split. Must have
  /// `world` entries, each >= 0, not all 0. A rank of weight 0 owns nothing.
  std::vector<double> weights;
  /// Which rank the remainder units start at: rank `rotation % world` takes the
  /// first extra unit, the next rank the second, and so on. Giving each layer a
  /// different rotation moves the remainder across ranks instead of always
  /// loading rank 0.
  int64_t rotation = 0;
  /// Allow a `total` that is not a multiple of `granularity`: the split counts
  /// ceil(total / granularity) units, the last one short, and clamps every range to
  /// `total`, so only the rank owning the tail gets a boundary off the granularity
  /// (at `total` itself). For formats whose last quant block may be partial
  /// (fp8_block: out_features=1000 is 7 full 128-blocks and one of 104).
  bool partial_tail = false;

  SplitPolicy with_granularity(int64_t g) const {
    auto p = *this;
    p.granularity = g;
    return p;
  }
  SplitPolicy with_weights(std::vector<double> w) const {
    auto p = *this;
    p.weights = std::move(w);
    return p;
  }
  SplitPolicy with_rotation(int64_t r) const {
    auto p = *this;
    p.rotation = r;
    return p;
  }
  SplitPolicy with_partial_tail(bool t) const {
    auto p = *this;
    p.partial_tail = t;
    return p;
  }
};

/// Splits `[0, total)` into `world` contiguous ranges, in rank order.
/// Even split: `total / granularity` units, each rank gets `units / world`, and the
/// `units % world` remainder units go one each to ranks `rotation, rotation+1, ...`
/// (10 units over 4 ranks, rotation 0 -> 3,3,2,2). Weighted split: each rank's
/// share is within one unit of `units * w[r] / sum(w)` (largest remainder, ties
/// broken in rotation order). `what` names the dimension in error messages.
/// With `partial_tail`, units are ceil(total / granularity) and ranges are clamped
/// to `total` (1000 over 2 ranks at granularity 128 -> [0,512), [512,1000)).
/// Throws ShardError when `total` is not a multiple of `granularity` and
/// `partial_tail` is off (saying what padding fixes it) or the arguments are out of
/// range.
std::vector<Range> split(int64_t total, int64_t world, const SplitPolicy& policy = {},
                         const std::string& what = "dimension");

/// This rank's range of `split(total, world, policy, what)`.
Range split_for_rank(int64_t total, int64_t world, int64_t rank, const SplitPolicy& policy = {},
                     const std::string& what = "dimension");

/// Least common multiple of two granularities (both >= 1): a boundary that must
/// satisfy both a quant block and a kernel tile, say.
int64_t combine_granularity(int64_t a, int64_t b);

/// The smallest multiple of `granularity` that is >= `total`: the padded size an
/// error message suggests.
int64_t round_up(int64_t total, int64_t granularity);

}  // namespace tp
