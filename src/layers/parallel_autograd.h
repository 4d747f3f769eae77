#pragma once
// The collectives the vocab layers use, as autograd functions (Megatron's f / g and the
// sequence-parallel pair), private to the layers area until the differentiable
// collectives of issue 13 land in comm/; each backward is the conjugate collective.
//
//   copy_to_parallel         forward identity          backward all-reduce
//   reduce_from_parallel     forward all-reduce        backward identity
//   reduce_scatter_dim0      forward reduce-scatter    backward all-gather   (along dim 0)
//   gather_last_dim          forward all-gather        backward split        (along the last dim)
//
// At world size 1 each is the identity (no node in the graph). Every rank must call
// them in the same order, forward and backward alike: a rank whose slice is empty still
// takes part, with an empty tensor.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"

namespace tp::detail {

/// Identity; the gradient is summed over ranks (a mirrored input read by every rank's
/// shard of a column-parallel layer).
at::Tensor copy_to_parallel(const at::Tensor& x, const Communicator& comm);

/// The sum over ranks (a new tensor); the gradient passes unchanged (it is mirrored).
at::Tensor reduce_from_parallel(const at::Tensor& x, const Communicator& comm);

/// The sum over ranks, of which this rank keeps rows `sizes[rank]` along dim 0 (the
/// tokens, under sequence parallelism); the gradient is all-gathered back.
at::Tensor reduce_scatter_dim0(const at::Tensor& x, const Communicator& comm, const std::vector<int64_t>& sizes);

/// Every rank's x concatenated along the last dim (`sizes[r]`: rank r's width); the
/// gradient is this rank's slice of the incoming one.
at::Tensor gather_last_dim(const at::Tensor& x, const Communicator& comm, const std::vector<int64_t>& sizes);

}  // namespace tp::detail
