#pragma once
// The broadcast and barrier behind Communicator, also used by the all-reduce paths
// (collectives.cpp).

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"

namespace tp::detail {

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root);
void barrier_impl(const CommunicatorState& s);

}  // namespace tp::detail
