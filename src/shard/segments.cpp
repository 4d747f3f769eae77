// Fused dimensions as named segments, each split on its own (docs/DESIGN.md §3).
//
// Splitting each segment separately (rather than the fused total) is what keeps a
// rank's q rows q rows: a split of the fused [Q|K|V] would hand rank 1 the tail of Q
// and the head of K. The plan then keeps two coordinates per piece apart: where it
// comes from (segment / fused coordinates) and where it goes (local offset).

#include "tp/shard/segments.h"

#include "shard/shard_fail.h"

#include <cstddef>
#include <limits>
#include <sstream>

namespace tp {
namespace {

using detail::shard_fail;

void check_world_rank(const char* op, int64_t world, int64_t rank) {
  if (world < 1) shard_fail(op, ": invalid world_size ", world, " (world_size should be >= 1)");
  if (rank < 0 || rank >= world) {
    shard_fail(op, ": invalid rank ", rank, " (rank should be in the 0..", world - 1, " range)");
  }
}

}  // namespace

const SegmentPiece& SegmentPlan::piece(const std::string& name) const {
  for (const SegmentPiece& p : pieces) {
    if (p.name == name) return p;
  }
  std::ostringstream os;
  os << "SegmentPlan: no segment named \"" << name << "\" (segments: ";
  if (pieces.empty()) os << "none";
  for (size_t i = 0; i < pieces.size(); ++i) os << (i ? ", " : "") << '"' << pieces[i].name << '"';
  os << ')';
  throw ShardError(os.str());
}

std::vector<int64_t> SegmentPlan::local_sizes() const {
  std::vector<int64_t> sizes;
  sizes.reserve(pieces.size());
  for (const SegmentPiece& p : pieces) sizes.push_back(p.size());
  return sizes;
}

SegmentPlan make_segment_plan(const std::vector<Segment>& segments, const std::vector<Range>& ranges) {
  if (segments.size() != ranges.size()) {
    shard_fail("make_segment_plan: ", segments.size(), " segments but ", ranges.size(),
               " ranges (there should be one range per segment)");
  }
  SegmentPlan plan;
  plan.pieces.reserve(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    const Range& r = ranges[i];
    if (seg.size < 0) {
      shard_fail("make_segment_plan: invalid size ", seg.size, " for segment \"", seg.name, "\" (size should be >= 0)");
    }
    // piece(name) must be unambiguous, so a name may appear once.
    for (size_t j = 0; j < i; ++j) {
      if (segments[j].name == seg.name) {
        shard_fail("make_segment_plan: segment name \"", seg.name, "\" appears twice (names should be unique)");
      }
    }
    if (r.begin < 0 || r.begin > r.end || r.end > seg.size) {
      shard_fail("make_segment_plan: range ", r, " for segment \"", seg.name, "\" is not inside [0,", seg.size, ")");
    }
    if (plan.global_size > std::numeric_limits<int64_t>::max() - seg.size) {
      shard_fail("make_segment_plan: the total size of the segments overflows int64");
    }

    SegmentPiece p;
    p.name = seg.name;
    p.segment_size = seg.size;
    p.fused_offset = plan.global_size;  // segments before this one, all ranks
    p.source = r;
    p.local_offset = plan.local_size;  // pieces before this one, this rank only
    plan.pieces.push_back(p);

    plan.global_size += seg.size;
    plan.local_size += r.size();
  }
  return plan;
}

SegmentPlan plan_segments(const std::vector<Segment>& segments, int64_t world, int64_t rank,
                          const SplitPolicy& policy) {
  check_world_rank("plan_segments", world, rank);
  if (policy.granularity < 1) {
    shard_fail("plan_segments: invalid granularity ", policy.granularity, " (granularity should be >= 1)");
  }
  std::vector<Range> ranges;
  ranges.reserve(segments.size());
  for (const Segment& seg : segments) {
    if (seg.granularity < 1) {
      shard_fail("plan_segments: invalid granularity ", seg.granularity, " for segment \"", seg.name,
                 "\" (granularity should be >= 1)");
    }
    // The segment's name is the dimension an error names: "gate=11000 is not a
    // multiple of the granularity 128; pad gate to 11008".
    const SplitPolicy p = policy.with_granularity(combine_granularity(policy.granularity, seg.granularity));
    ranges.push_back(split_for_rank(seg.size, world, rank, p, seg.name));
  }
  return make_segment_plan(segments, ranges);
}

SegmentPlan plan_single(const std::string& name, int64_t total, int64_t world, int64_t rank,
                        const SplitPolicy& policy) {
  check_world_rank("plan_single", world, rank);
  return plan_segments({Segment{name, total, 1}}, world, rank, policy);
}

}  // namespace tp
