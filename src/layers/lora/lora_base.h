#pragma once
// Private: what a LoRA is cut by — its base layer's plan on this rank and every rank's
// (for gathering), the input's entry, the replicated rows. The layers build it
// (ColumnCore::set_step, RowParallelLinearImpl::reset, the vocabulary layers' reset);
// tp/layers/lora/lora.h reads it.

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
  /// A VocabParallelEmbedding (row-like: A [r, vocab] split with the table's rows, B whole):
  /// the input is token ids, looked up in A^T (PEFT's lora_embedding_A / _B).
  bool embedding = false;
  int64_t in_features = 0;       // global (the embedding: the real vocabulary)
  std::vector<Range> in_ranges;  // row: every rank's input columns (the embedding: its padded rows)
  std::vector<Range> in_real;    // the embedding: every rank's real token ids (within in_ranges)
  int64_t pad_rows = 0;          // column: this rank's output columns after the plan's (LM head padding)
  std::string a_suffix = ".lora_A.weight", b_suffix = ".lora_B.weight";  // PEFT's tensor names
  std::vector<SegmentPlan> plans;  // column: every rank's plan of the output; row: one segment, whole
  Reduction entry;                 // column: none (mirrored input) or the sequence-parallel all-gather
  /// Column: the input entered through copy_to_parallel already (a mixture's shared expert),
  /// so A's gradient is summed over the ranks rather than x A^T's (which would sum x's twice).
  bool input_parallel = false;
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
  /// Rank `rank`'s columns of the global A (column: all of them).
  Range a_source(int64_t rank) const {
    if (!row) return {0, in_features};
    return embedding ? in_real.at(rank) : in_ranges.at(rank);
  }
  /// Where a_source(rank) sits in that rank's local A (the embedding's padding columns stay zero).
  int64_t a_offset(int64_t rank) const {
    return embedding && !in_real.at(rank).empty() ? in_real.at(rank).begin - in_ranges.at(rank).begin : 0;
  }
  /// Columns of this rank's local A.
  int64_t a_columns() const { return row ? in_ranges.at(comm.rank()).size() : in_features; }
};

}  // namespace tp::detail
