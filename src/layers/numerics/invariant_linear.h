#pragma once
// Private: a layer's GEMM under invariant numerics (tp/layers/numerics/numerics.h), as one
// autograd function that also does the layer's collective:
//
//   forward   y = x W^T (+ b): the sum over in_features canonical; a row layer's ranks
//             each hold a chunk-aligned piece of in_features and exchange whole
//             subtrees (layers/numerics/canonical_sum.h), so every rank gets the reduced y
//             with the bits of TP 1; the bias is added after, on every rank.
//   backward  grad_x = grad_y W: the sum over out_features canonical, one tree per
//             output segment (q, k, v; gate, up), segments added in order; a column
//             layer's ranks exchange their segments' subtrees, so grad_x is already
//             reduced (no copy_to_parallel all-reduce after it).
//             grad_W = grad_y^T x and grad_b: sums over tokens, canonical, local.
// Each sum runs on cpu/invariant_gemm.h's kernel: float32 accumulation of float32 or
// bfloat16 operands, rounded to the layer's dtype once at the end.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cpu/tensor_stamp.h"
#include "layers/numerics/canonical_sum.h"
#include "tp/comm/communicator.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/segments.h"
#include "tp/shard/split.h"

namespace tp::detail {

/// How a layer's reductions are cut and held: built once by the layer.
struct InvariantPlan {
  Communicator comm;
  // The forward's sum over in_features: its chunk, this rank's first chunk, and (row
  // layers) every rank's pieces; a column layer holds all of in_features itself.
  int64_t in_chunk = 1;
  int64_t in_first_chunk = 0;
  bool in_across_ranks = false;
  CanonicalSum in_sum;
  // The backward's sum over out_features, one per segment: this rank's rows of it
  // (rows 0 where it contributes none) and (column layers) every rank's pieces.
  struct Segment {
    int64_t local_offset = 0;
    int64_t rows = 0;
    int64_t first_chunk = 0;
    int64_t chunk = 1;
  };
  std::vector<Segment> out_mine;
  bool out_across_ranks = false;
  std::vector<CanonicalSum> out_sums;
  /// Rows that several ranks hold (replicated KV heads): their output gradient must be
  /// whole and the same on every holder (tp's attention makes it so: tp/layers/numerics/heads.h),
  /// since each holder computes its weight gradient alone and only the first holder adds
  /// the rows to the input gradient. The backward checks it (one all-gather of those rows'
  /// gradients) and fails on every rank, naming the layer, where it is not.
  struct ReplicaSlot {
    int64_t slot_offset = 0, rows = 0;
    std::vector<int64_t> local_offset_by_rank;  // -1 where the rank does not hold it
  };
  std::vector<ReplicaSlot> replica_slots;
  int64_t replica_rows = 0;
  /// The layer's name for errors.
  std::string layer;

  /// The weight packed for the forward's kernel, re-packed when the weight changes (its
  /// storage, shape or version counter: cpu/tensor_stamp.h, whose caveat about inference
  /// tensors written in place applies).
  at::Tensor packed_weight(const at::Tensor& weight) const;

 private:
  mutable std::mutex mutex_;
  mutable at::Tensor packed_;
  mutable cpu::TensorStamp stamp_;
};

/// The row layer's plan: in_features split as `ranges` (every rank's [begin, end)) at
/// split granularity `granularity`; out_features whole on every rank.
std::shared_ptr<InvariantPlan> row_invariant_plan(const std::string& layer, const Communicator& comm,
                                                  int64_t in_features, int64_t out_features,
                                                  const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                                  int64_t granularity);

/// A column layer's plan: in_features whole on every rank; the output segments of
/// `plans` (every rank's) each split at multiples of `granularity`. A replicated piece
/// (KV heads) contributes to the backward's sums from its first holder only.
std::shared_ptr<InvariantPlan> column_invariant_plan(const std::string& layer, const Communicator& comm,
                                                     const std::vector<SegmentPlan>& plans, int64_t in_features,
                                                     int64_t granularity);

/// The split a layer uses under invariant numerics for a dimension of `size` elements. An
/// even split cuts it on the grid of lcm(granularity, kInvariantChunk), the last unit short
/// where `size` is not a multiple of it (SplitPolicy::partial_tail), so every rank boundary
/// is a multiple of kInvariantChunk at every world size and the sum over the dimension is
/// chunked by kInvariantChunk, a function of the global shape alone (intermediate 1000 at
/// TP 3: [0, 384) [384, 704) [704, 1000), 16 chunks of 64, the last of 40). A weighted split
/// (O's heads) keeps its granularity: its chunk is invariant_chunk(granularity). A `size`
/// that is not a multiple of the granularity without partial_tail is left to split()'s error.
SplitPolicy invariant_split_policy(const SplitPolicy& policy, int64_t size);

/// Throws (naming `layer`) unless invariant numerics covers it: an unquantized method
/// (a quantized format's dequantized GEMM is not ordered this way yet) on the CPU.
void check_invariant_supported(const std::string& layer, const QuantMethod& method, const at::Device& device);

/// y = x W^T (+ bias when add_bias) under `plan`, differentiable as described above.
/// x [..., in_local] in the weight's dtype (float32 or bfloat16), weight [out_local,
/// in_local] unquantized. Collective (row layers in the forward, column layers in the
/// backward): every rank calls it.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool add_bias,
                            const std::shared_ptr<const InvariantPlan>& plan);

}  // namespace tp::detail
