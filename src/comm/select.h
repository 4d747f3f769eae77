#pragma once
// The all-reduce selector: what kAuto resolves to.
//
// A pure function of what every rank knows identically (device kind, world size,
// message size, dtype, whether all ranks share this host), so all ranks pick the
// same algorithm without talking. A per-machine tuning table (written by a
// calibration run) is future work; the thresholds below were measured with
// tp-allreduce-bench on a 2-core x86 VM (benchmarks/RESULTS.md).

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "tp/comm/all_reduce_strategy.h"

namespace tp::detail {

/// One-shot while bytes * world (the bytes each rank reads) stays below this, two-shot
/// above. One-shot has one synchronisation round but every rank reads all world
/// inputs; two-shot reads 1/world of them, then copies the result, and wins once
/// bandwidth, not latency, dominates: measured (float32, ranks as threads) at world
/// 2 one-shot led up to 64 KiB and two-shot from 256 KiB; at world 3 and 4 two-shot
/// already leads at 64-256 KiB.
inline constexpr int64_t kShmTwoShotMinWorldBytes = int64_t{512} << 10;

/// The dtypes the shared-memory strategies reduce (accumulating in fp32, or fp64
/// for float64).
inline bool shm_supports_dtype(c10::ScalarType dtype) {
  return dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kBFloat16 ||
         dtype == c10::kHalf;
}

/// Never returns kAuto. `bytes` is the size of the tensor as handed in (before any
/// widening for the reduction). World 1 gets kProcessGroup (nothing to reduce).
inline AllReduceStrategy select_all_reduce(bool is_cuda, int64_t world, int64_t bytes,
                                           c10::ScalarType dtype, bool same_host) {
  if (is_cuda || world <= 1 || !same_host || !shm_supports_dtype(dtype)) {
    return AllReduceStrategy::kProcessGroup;
  }
  // Shared memory at every size: chunked through its buffers, it stays ahead of
  // Gloo's loopback TCP ring even for large messages.
  return bytes * world < kShmTwoShotMinWorldBytes ? AllReduceStrategy::kSharedMemoryOneShot
                                                   : AllReduceStrategy::kSharedMemoryTwoShot;
}

}  // namespace tp::detail
