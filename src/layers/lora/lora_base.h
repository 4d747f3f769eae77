#pragma once
// Private: what a LoRA is cut by — its base layer's plan on this rank and every rank's
// (for gathering), the input's entry, the replicated rows. The layers build it
// (ColumnCore::set_step, RowParallelLinearImpl::reset); tp/layers/lora/lora.h reads it.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/TensorBody.h>

#include "tp/comm/communicator.h"
#include "tp/comm/reduction.h"
#include "tp/shard/range.h"
#include "tp/shard/segments.h"

namespace tp::detail {

struct LoRABase {
  std::string layer;
  Communicator comm;
  /// Row-parallel base: A split with `in_ranges`, B whole. Column: A whole, B split with `plans`.
  bool row = false;
  int64_t in_features = 0;         // global
  std::vector<Range> in_ranges;    // row: every rank's input columns
  std::vector<SegmentPlan> plans;  // column: every rank's plan of the output; row: one segment, whole
  Reduction entry;                 // column: none (mirrored input) or the sequence-parallel all-gather
  /// Column: this rank's rows that other ranks hold too (replicated KV heads) and their
  /// slots in the backward's all-reduce (the base's ReplicaSum, the same numbering).
  struct Replica {
    int64_t local_offset = 0, slot_offset = 0, rows = 0;
  };
  std::vector<Replica> replicas;
  int64_t replica_rows = 0;  // 0: no row is replicated (on any rank)
  bool invariant = false;
  at::TensorOptions options;

  const SegmentPlan& plan() const { return plans.at(row ? 0 : comm.rank()); }
};

}  // namespace tp::detail
