#pragma once
// Sequence parallelism (Megatron's sequence_parallel): between a row-parallel layer
// and the next column-parallel one, activations are split along the token dim
// instead of mirrored, so the norms, residuals and dropout in between run on 1/world
// of the tokens. A RowParallelLinear with sequence_parallel reduce-scatters its
// output to the pieces below; a column layer with sequence_parallel all-gathers them.
//
// The token split rule: T tokens over `world` ranks are split like any dimension
// (tp::split(T, world), an even split): every rank gets T / world tokens and the first
// T % world ranks one more, in rank order (T = 10 over 4: 3, 3, 2, 2; T = 2 over 3:
// 1, 1, 0 - a rank may hold none). Every rank computes every rank's piece from T
// alone, without communicating.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/shard/range.h"

namespace tp {

/// Every rank's tokens [begin, end) of a sequence of `tokens`, in rank order (the rule
/// above). Example: tp::sequence_ranges(10, 4) -> [0,3) [3,6) [6,8) [8,10).
std::vector<Range> sequence_ranges(int64_t tokens, int64_t world);

/// The sizes of sequence_ranges(tokens, world), for the collectives' `sizes`.
std::vector<int64_t> sequence_sizes(int64_t tokens, int64_t world);

/// Enters a sequence-parallel region: this rank's tokens of a mirrored x along `dim`
/// (the rule above); the backward all-gathers the gradient (scatter_to_parallel).
/// To leave one, gather_from_parallel(x, comm, dim) (backward: this rank's piece).
at::Tensor scatter_to_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim = 0);

}  // namespace tp
