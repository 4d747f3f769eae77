#pragma once
// All-reduce over the process group's own collectives: its allreduce, and the bf16
// wire over its allgather (process_group.cpp).

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"

namespace tp::detail {

/// The process group's own allreduce (process_group.cpp).
void all_reduce_process_group(const CommunicatorState& s, at::Tensor& t, const char* op);

/// float32 sent as bf16 through the group's allgather, summed in fp32 in rank order
/// (kNcclBf16Wire; process_group.cpp).
void all_reduce_bf16_wire(const CommunicatorState& s, at::Tensor& t, const char* op);

}  // namespace tp::detail
