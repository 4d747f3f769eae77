#pragma once
// Private helpers of the GPU all-reduce strategies, implemented in nccl_communicator.cpp
// and used by the all-reduce front end and run_collective. Compiled with or without
// CUDA: without it they report that.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/all_reduce_strategy.h"

namespace c10d {
class ProcessGroup;
}

namespace tp::detail {

/// Whether the current CUDA stream is being captured into a CUDA graph: then a
/// collective must not wait on the host (the work only exists in the graph).
bool current_stream_capturing();

/// Throws, naming `op`, unless `strategy` (kNccl / kNcclBf16Wire) can reduce `t` on
/// `group` (null at world 1): a CUDA tensor; kNccl needs the group's CUDA backend to
/// be NCCL (c10d's or tp's raw one); kNcclBf16Wire needs float32.
void check_nccl_strategy(const c10d::ProcessGroup* group, AllReduceStrategy strategy, const at::Tensor& t,
                         const std::string& op);

/// `t` (float32) as the bf16 message kNcclBf16Wire sends: a flat contiguous tensor.
at::Tensor bf16_wire_message(const at::Tensor& t);

/// Writes into `t` the sum of every rank's bf16 message, widened to fp32 and added
/// in rank order (0, 1, ...), so every rank computes the same bits.
void sum_bf16_wire(const std::vector<at::Tensor>& gathered, at::Tensor& t);

}  // namespace tp::detail
