#pragma once
// The all-reduce selector: what kAuto resolves to.
//
// A pure function of what every rank knows identically (device kind, world size,
// message size, dtype, whether all ranks share one host, the tuning table), so all
// ranks pick the same algorithm without talking. The crossover sizes live in the
// table (AllReduceTable::builtin(), measured on the development VM, or one written
// by `tp-allreduce-bench --tune`).

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/all_reduce_table.h"

namespace tp::detail {

/// The dtypes the shared-memory strategies reduce (accumulating in fp32, or fp64
/// for float64).
inline bool shm_supports_dtype(c10::ScalarType dtype) {
  return dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kBFloat16 || dtype == c10::kHalf ||
         dtype == c10::kInt;
}

inline bool is_shared_memory(AllReduceStrategy s) {
  return s == AllReduceStrategy::kSharedMemoryOneShot || s == AllReduceStrategy::kSharedMemoryTwoShot;
}

/// Never returns kAuto. `bytes` is the size of the tensor as handed in (before any
/// widening for the reduction). World 1 gets kProcessGroup (nothing to reduce); device
/// tensors get kProcessGroup (the group's own: NCCL's allreduce on an NCCL group) -
/// kNccl and kNcclBf16Wire are taken only when asked for, and the table covers CPU only.
/// `table` is looked up first, then the built-in table (for a kind of group the
/// given table does not cover). A shared-memory choice for a dtype shared memory does
/// not reduce falls back to the process group.
inline AllReduceStrategy select_all_reduce(bool is_cuda, int64_t world, int64_t bytes, c10::ScalarType dtype,
                                           bool same_host, const AllReduceTable& table) {
  if (is_cuda || world <= 1) return AllReduceStrategy::kProcessGroup;
  const AllReduceTableEntry* entry = table.find(world, same_host);
  if (entry == nullptr) entry = AllReduceTable::builtin().find(world, same_host);
  if (entry == nullptr) return AllReduceStrategy::kProcessGroup;
  const AllReduceStrategy s = entry->strategy_for(bytes);
  if (is_shared_memory(s) && (!same_host || !shm_supports_dtype(dtype))) {
    return AllReduceStrategy::kProcessGroup;
  }
  return s;
}

}  // namespace tp::detail
