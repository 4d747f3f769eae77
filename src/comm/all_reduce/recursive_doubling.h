#pragma once
// All-reduce by recursive doubling over the group's send/recv (recursive_doubling.cpp).

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"

namespace tp::detail {

/// Butterfly over the group's send/recv (recursive_doubling.cpp). `bf16_wire`: a
/// float32 tensor's partial sums travel as bfloat16.
void all_reduce_recursive_doubling(const CommunicatorState& s, at::Tensor& t, bool bf16_wire, const char* op);

}  // namespace tp::detail
