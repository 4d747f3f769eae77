#pragma once
// load_shard: one rank's slice of one checkpoint tensor.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "tp/loader/tensor_source.h"
#include "tp/shard/range.h"
#include "tp/shard/segments.h"
#include "tp/shard/shard_mode.h"

namespace tp {

/// How a tensor's stored layout relates to the logical weight it belongs to.
struct LoadOptions {
  /// Swap COLUMN and ROW for this tensor (input-activation scales: they follow the
  /// input dimension, so a column layer replicates them and a row layer splits them).
  bool flip_tp = false;
  /// One stored element covers this many logical elements of the split dimension
  /// (a block scale); the range is divided by it and must divide exactly, except
  /// that a range ending at `logical_size` may end inside a partial last block.
  int64_t scale_span = 1;
  /// The logical extent of the split dimension (e.g. out_features), when the last
  /// scale block may be partial; -1 when unknown (then every end must divide).
  int64_t logical_size = -1;
  /// This many logical elements share one stored element (int4 in int8/int32, fp4 in
  /// uint8); the range is divided by it and must divide exactly.
  int64_t elm_packing = 1;
};

/// Reads this rank's slice of `source`. `range` is in logical elements of the split
/// dimension (dim 0 for kColumn, dim 1 for kRow, swapped by flip_tp). Rules:
/// - a 0-d tensor, or a split dimension of width 1 (per-tensor / per-other-dim
///   scales), is returned whole;
/// - a 1-D tensor split along dim 1 is returned whole (a row-parallel bias is
///   replicated); split along dim 0 it is sliced (a column-parallel bias);
/// - otherwise the range is divided by scale_span * elm_packing and read.
/// `what` names the caller (layer) in error messages.
at::Tensor load_shard(const TensorSource& source, ShardMode mode, Range range, const LoadOptions& options = {},
                      const std::string& what = "load_shard");

/// load_shard's slice written into `dst` (a CPU tensor of the slice's shape: a narrow of
/// the parameter it belongs to; its dtype may differ from the checkpoint's, converted on
/// the way). Each rank's bytes are read once, straight into their final place where the
/// source allows (TensorSource::read_into: a safetensors file and a contiguous `dst`).
/// A `dst` of another shape is an error naming `what` and the tensor.
void load_shard_into(const TensorSource& source, ShardMode mode, Range range, const at::Tensor& dst,
                     const LoadOptions& options = {}, const std::string& what = "load_shard");

/// The same for a fused tensor stored as one `[A|B|C]` tensor along the split
/// dimension: reads each piece of `plan` from its fused_source() range and
/// concatenates them in plan order (this rank's local layout). The source's split
/// dimension must equal plan.global_size (after span/packing), else an error naming
/// the tensor and both sizes.
at::Tensor load_shard(const TensorSource& source, ShardMode mode, const SegmentPlan& plan,
                      const LoadOptions& options = {}, const std::string& what = "load_shard");

/// Checks that every value of `shard`, a slice of `source` this rank read (a scale:
/// one NaN or infinity there makes every output it scales NaN or infinite), is finite;
/// otherwise an error naming `what` (the layer), the tensor, the value and where it is
/// in the slice. Integer tensors pass.
void check_finite(const at::Tensor& shard, const TensorSource& source, const std::string& what);

}  // namespace tp
