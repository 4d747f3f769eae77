#pragma once
// The algorithm an AllReduce uses, chosen per call.

#include <cstdint>
#include <iosfwd>
#include <string>

namespace tp {

/// AllReduce algorithms. `kAuto` picks one per call from (device, world size, bytes,
/// dtype, whether the ranks share one host). More strategies (recursive doubling,
/// NCCL variants) join this enum as they land.
enum class AllReduceStrategy {
  kAuto,                 ///< let the selector choose (the default everywhere)
  kProcessGroup,         ///< the c10d process group's own allreduce (Gloo ring on CPU)
  kSharedMemoryOneShot,  ///< CPU, ranks on one host: each rank sums every rank's buffer
  kSharedMemoryTwoShot,  ///< CPU, ranks on one host: reduce-scatter of slices, then all-gather
  kNccl,                 ///< CUDA tensors on an NCCL group (c10d's or tp's raw NCCL): NCCL's allreduce
  kNcclBf16Wire,         ///< float32 CUDA tensors: sent as bf16 (half the bytes) through the group's
                         ///< allgather, summed in fp32 in rank order; lossy, never chosen by kAuto
};

/// "auto", "process_group", "shm_one_shot", "shm_two_shot", "nccl", "nccl_bf16_wire".
const char* to_string(AllReduceStrategy s);

/// Writes to_string(s), so strategies print in error messages and test output.
std::ostream& operator<<(std::ostream& out, AllReduceStrategy s);

/// Parses the names `to_string` prints (case-insensitive); throws c10::ValueError
/// listing the valid names otherwise. Used for the TP_ALLREDUCE environment variable.
AllReduceStrategy parse_all_reduce_strategy(const std::string& name);

}  // namespace tp
