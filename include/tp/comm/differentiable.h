#pragma once
// Differentiable collectives: the conjugate pairs a tensor-parallel forward is made of
// (Megatron's f and g), as autograd functions whose backward is the other collective.
//
//   function                               forward                       backward
//   copy_to_parallel                       identity                      all-reduce
//   reduce_from_parallel                   all-reduce                    identity
//   gather_from_parallel                   all-gather along dim          this rank's piece
//   scatter_to_parallel                    this rank's piece along dim   all-gather
//   gather_from_sequence_parallel          all-gather along dim          reduce-scatter
//   reduce_scatter_to_sequence_parallel    reduce-scatter along dim      all-gather
//
// Split states (docs/DESIGN.md): "mirrored" tensors hold the same values on every rank,
// and so do their gradients (every rank computes the same loss from them); a partial
// sum's gradient is the gradient of the reduced tensor. Under that contract each pair
// gives every rank the gradient of the single-device computation.
//
// Collective order: each of these calls a collective in its forward and/or its
// backward, so EVERY rank must call them in the same order, with the same shapes
// (up to the split dimension) and the same requires_grad, and must run the backward of
// every one it called (a rank whose output does not reach its loss still has to
// connect it, e.g. loss + 0 * y.sum()). The autograd engine runs the backward in an
// order fixed by the graph, so ranks that build the same graph meet in the same
// collectives. A rank whose piece is empty (zero tokens, zero columns) still takes
// part, with an empty piece. With world size 1 every function is the identity.
//
// When no input requires a gradient (or grad mode is off, or under InferenceMode) the
// forward is the plain collective, with no autograd bookkeeping.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"

namespace tp {

/// Identity forward; backward all-reduces the gradient (Megatron's f). Put it where a
/// mirrored tensor enters a region each rank computes a part of (a column-parallel
/// layer's input): the input gradient is the sum of every rank's partial gradient.
/// Example: auto y = at::linear(tp::copy_to_parallel(x, comm), w_local);
at::Tensor copy_to_parallel(const at::Tensor& x, const Communicator& comm);

/// All-reduce forward (`strategy` and `wire` as in Communicator::all_reduce); identity
/// backward (Megatron's g). Returns a new tensor (x itself at world size 1); x is left
/// as it was.
at::Tensor reduce_from_parallel(const at::Tensor& x, const Communicator& comm,
                                AllReduceStrategy strategy = AllReduceStrategy::kAuto,
                                WirePrecision wire = WirePrecision::kDefault);

/// All-gather along `dim` (rank r contributes sizes[r] entries, uneven and zero
/// allowed); backward: this rank's piece of the gradient. An empty `sizes` means
/// "exchange them": one small all-gather of every rank's extent first.
at::Tensor gather_from_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                const std::vector<int64_t>& sizes = {});

/// This rank's piece of a mirrored x along `dim` (rank r owns sizes[r] entries, in
/// rank order; they must add up to x.size(dim)); backward all-gathers the gradient.
at::Tensor scatter_to_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                               const std::vector<int64_t>& sizes);

/// Sequence parallelism: all-gather the token pieces along `dim` (sizes as in
/// gather_from_parallel; empty: exchanged); backward reduce-scatters the gradient
/// (every rank's partial gradient of the whole sequence, summed, and cut to this
/// rank's tokens). A column-parallel layer's input in sequence-parallel mode.
at::Tensor gather_from_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                         const std::vector<int64_t>& sizes = {});

/// Sequence parallelism: sums the partial x over ranks and keeps this rank's tokens
/// along `dim` (sizes[r] of them for rank r; they must add up to x.size(dim));
/// backward all-gathers the gradient. A row-parallel layer's output in
/// sequence-parallel mode, instead of an all-reduce.
at::Tensor reduce_scatter_to_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                               const std::vector<int64_t>& sizes);

/// Every rank's extent along `dim` of `x` (its own included), by one small all-gather.
/// The same vector on every rank.
std::vector<int64_t> exchange_sizes(const at::Tensor& x, const Communicator& comm, int64_t dim);

}  // namespace tp
