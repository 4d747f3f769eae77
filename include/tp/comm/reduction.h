#pragma once
// Reduction: what a layer does with a tensor its ranks hold as pieces or partial sums —
// a group and an operation — as one value the layer builds once, at construction, from
// the Options its user wrote (reduce_output, gather_output, sequence_parallel stay as
// spellings of it). It is the layers' description of their collectives, inspectable
// (`output_reduction()` on every linear layer) and applied by one differentiable call.
//
//   op               forward                                   backward (the conjugate)
//   kNone            identity                                  identity
//   kAllReduce       the partial sums added on every rank      identity
//   kReduceScatter   added, then rank r keeps sizes[r] along   all-gather
//                    `dim` (tokens: sequence parallelism)
//   kAllGather       every rank's sizes[r] pieces along `dim`  this rank's piece, or (partial_grad)
//                    concatenated in rank order                the gradients reduce-scattered
//
// Per-rank extents may differ (a rank may hold none): `sizes` lists them in rank order;
// left empty, a reduce-scatter cuts the dimension by tp::sequence_ranges' rule and an
// all-gather exchanges the extents (one small all-gather first). The collectives are
// those of tp/comm/differentiable.h, with their contract on order and shapes.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"

namespace tp {

/// The collective of a Reduction (the table above).
enum class ReduceOp { kNone, kAllReduce, kReduceScatter, kAllGather };

const char* to_string(ReduceOp op);

/// A collective over `group`, as a value. Example:
///   auto r = tp::Reduction::reduce_scatter(comm, /*dim=*/0, {5, 3, 0, 4});  // uneven token counts
///   at::Tensor mine = r.apply(partial);                                    // [sizes[rank], ...]
struct Reduction {
  Communicator group;
  ReduceOp op = ReduceOp::kNone;
  /// The dimension a reduce-scatter cuts or an all-gather joins (negative counts from the end).
  int64_t dim = 0;
  /// Every rank's extent along `dim`, in rank order (empty: the rule above).
  std::vector<int64_t> sizes;
  /// kAllReduce: the algorithm (kAuto: chosen per call) and the wire precision.
  AllReduceStrategy strategy = AllReduceStrategy::kAuto;
  WirePrecision wire = WirePrecision::kDefault;
  /// kAllGather: whether each rank's gradient of the gathered tensor is a partial sum (it
  /// feeds a column-parallel GEMM, as under sequence parallelism: the backward
  /// reduce-scatters) or mirrored (the backward keeps this rank's piece).
  bool partial_grad = false;

  static Reduction none(Communicator group);
  static Reduction all_reduce(Communicator group, AllReduceStrategy strategy = AllReduceStrategy::kAuto,
                              WirePrecision wire = WirePrecision::kDefault);
  static Reduction reduce_scatter(Communicator group, int64_t dim, std::vector<int64_t> sizes = {});
  static Reduction all_gather(Communicator group, int64_t dim, std::vector<int64_t> sizes = {},
                              bool partial_grad = false);

  /// Applies the collective to x, differentiably (the table above). Collective: every rank
  /// of the group calls it with the same Reduction, in the same order.
  at::Tensor apply(const at::Tensor& x) const;
  /// Like apply, but may reduce x in place and return it when nothing records a gradient
  /// (x must be a temporary no one else holds); apply otherwise.
  at::Tensor apply_consuming(at::Tensor x) const;
  /// Whether the forward moves data between ranks (false for kNone and at world size 1).
  bool communicates() const { return op != ReduceOp::kNone && group.world_size() > 1; }
};

/// "all_reduce(auto)", "reduce_scatter(dim=0, sizes=[3,3,2])", "none".
std::ostream& operator<<(std::ostream& out, const Reduction& r);

}  // namespace tp
