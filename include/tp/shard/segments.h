#pragma once
// Fused tensors (QKV, gate||up) as lists of named segments, each split on its own.
//
// A rank's local tensor is the concatenation of its piece of every segment. For
// each piece the plan records two different numbers, never mixed:
//   source       - which elements of the segment this rank owns (segment coordinates;
//                  add fused_offset for coordinates in a fused [A|B|C] tensor);
//   local_offset - where the piece starts in this rank's local tensor.

#include <cstdint>
#include <string>
#include <vector>

#include "tp/shard/range.h"
#include "tp/shard/split.h"

namespace tp {

/// One named part of a fused dimension, e.g. {"q", 4096} or {"gate", 11008}.
struct Segment {
  std::string name;
  int64_t size = 0;
  /// Extra boundary granularity for this segment alone (combined with the policy's).
  int64_t granularity = 1;
};

/// This rank's piece of one segment.
struct SegmentPiece {
  std::string name;
  int64_t segment_size = 0;  // the whole segment, all ranks
  int64_t fused_offset = 0;  // where the segment starts in the global fused tensor
  Range source;              // owned elements, in segment coordinates
  int64_t local_offset = 0;  // where the piece starts in the local tensor

  int64_t size() const { return source.size(); }
  /// The owned elements in the coordinates of the global fused tensor.
  Range fused_source() const { return source.shifted(fused_offset); }
  /// Where the piece lies in the local tensor.
  Range local() const { return {local_offset, local_offset + source.size()}; }
};

/// A rank's plan for a fused dimension.
struct SegmentPlan {
  std::vector<SegmentPiece> pieces;
  int64_t global_size = 0;  // sum of segment sizes
  int64_t local_size = 0;   // sum of piece sizes

  /// The piece named `name`; throws ShardError listing the names if there is none.
  const SegmentPiece& piece(const std::string& name) const;
  /// Local sizes of each piece, in segment order (e.g. for splitting the output).
  std::vector<int64_t> local_sizes() const;
};

/// Builds the plan from explicit per-segment ranges (used by head plans, which
/// choose ranges in whole heads). `ranges[i]` is in segment i's coordinates and
/// must lie inside it.
SegmentPlan make_segment_plan(const std::vector<Segment>& segments, const std::vector<Range>& ranges);

/// Splits every segment independently with `policy` (granularity combined with the
/// segment's own) and returns rank `rank`'s plan.
SegmentPlan plan_segments(const std::vector<Segment>& segments, int64_t world, int64_t rank,
                          const SplitPolicy& policy = {});

/// A plan with a single segment: the plain column/row case, so layers have one path.
SegmentPlan plan_single(const std::string& name, int64_t total, int64_t world, int64_t rank,
                        const SplitPolicy& policy = {});

}  // namespace tp
