#pragma once
// The broadcast and barrier behind Communicator, also used by the all-reduce paths,
// and the argument checks the collectives share (collectives.cpp).

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"

namespace tp::detail {

/// Argument checks shared by the collectives: `t` is defined; `dim` wrapped into
/// [0, ndim); `sizes` has one extent per rank, none negative.
void check_defined(const at::Tensor& t, const char* op);
int64_t wrap_dim(const at::Tensor& t, int64_t dim, const char* op);
void check_sizes(const CommunicatorState& s, const std::vector<int64_t>& sizes, const char* op);

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root);
void barrier_impl(const CommunicatorState& s);

}  // namespace tp::detail
