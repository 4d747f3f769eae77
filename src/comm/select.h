#pragma once
// The all-reduce selector: what kAuto resolves to.
//
// A pure function of what every rank knows identically (device kind, world size,
// message size, dtype), so all ranks pick the same algorithm without talking. It
// grows with the strategies (shared memory, recursive doubling, NCCL variants) and,
// later, a per-machine tuning table.

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "tp/comm/all_reduce_strategy.h"

namespace tp::detail {

/// Never returns kAuto. `bytes` is the size of the tensor as handed in (before any
/// widening for the reduction).
inline AllReduceStrategy select_all_reduce(bool is_cuda, int64_t world, int64_t bytes,
                                           c10::ScalarType dtype) {
  (void)is_cuda;
  (void)world;
  (void)bytes;
  (void)dtype;
  return AllReduceStrategy::kProcessGroup;
}

}  // namespace tp::detail
