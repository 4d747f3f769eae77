#pragma once
// The algorithm an AllReduce uses, chosen per call, and the precision its data
// travels in (a separate, orthogonal setting).

#include <cstdint>
#include <iosfwd>
#include <string>

namespace tp {

/// AllReduce algorithms. `kAuto` picks one per call from (device, world size, bytes,
/// dtype, whether the ranks share one host, the tuning table): see AllReduceTable.
enum class AllReduceStrategy {
  kAuto,                 ///< let the selector choose (the default everywhere)
  kProcessGroup,         ///< the c10d process group's own allreduce (Gloo ring on CPU)
  kSharedMemoryOneShot,  ///< CPU, ranks on one host: each rank sums every rank's buffer
  kSharedMemoryTwoShot,  ///< CPU, ranks on one host: reduce-scatter of slices, then all-gather
  kNccl,                 ///< CUDA tensors on an NCCL group (c10d's or tp's raw NCCL): NCCL's allreduce
  kNcclBf16Wire,         ///< float32 CUDA tensors: sent as bf16 (half the bytes) through the group's
                         ///< allgather, summed in fp32 in rank order; lossy, never chosen by kAuto
  kRecursiveDoubling,    ///< butterfly over the group's send/recv: ceil(log2 world) rounds, any host
};

/// "auto", "process_group", "shm_one_shot", "shm_two_shot", "nccl", "nccl_bf16_wire",
/// "recursive_doubling".
const char* to_string(AllReduceStrategy s);

/// Writes to_string(s), so strategies print in error messages and test output.
std::ostream& operator<<(std::ostream& out, AllReduceStrategy s);

/// Parses the names `to_string` prints (case-insensitive); throws c10::ValueError
/// listing the valid names otherwise. Used for the TP_ALLREDUCE environment variable.
AllReduceStrategy parse_all_reduce_strategy(const std::string& name);

/// The precision an all_reduce's data travels in between ranks, whatever the algorithm.
///
/// - kNative: the reduction's own precision (float32/float64 as given; float16 and
///   bfloat16 widened to fp32, since partial sums are kept in fp32). Exact up to the
///   fp32/fp64 summation itself.
/// - kBFloat16: float32 tensors travel as bfloat16, half the bytes. Every partial sum
///   that crosses between ranks is rounded to bfloat16 (8 significant bits, relative
///   error at most 2^-8 per rounding); the additions stay fp32 and every rank still
///   ends bitwise identical. Bound, elementwise, with S = sum over ranks of |x_r|:
///     |result - exact sum| <= L * 2^-8 * (1 + 2^-6) * S + world * 2^-24 * S
///   where L, the roundings along the longest path, is 1 for shm_one_shot, 2 for
///   shm_two_shot (inputs, then the reduced slice) and ceil(log2 world) for
///   recursive_doubling. Tensors of other dtypes, and the process_group strategy
///   (Gloo would sum in bfloat16), ignore it and use kNative.
/// - kDefault: the communicator's setting (TP_ALLREDUCE_WIRE, else
///   CommunicatorOptions::wire, else kNative).
enum class WirePrecision {
  kDefault,
  kNative,
  kBFloat16,
};

/// "default", "native", "bf16".
const char* to_string(WirePrecision w);

std::ostream& operator<<(std::ostream& out, WirePrecision w);

/// Parses "default", "native", "bf16" (also "bfloat16"), case-insensitive; throws
/// c10::ValueError listing the valid names. Used for TP_ALLREDUCE_WIRE.
WirePrecision parse_wire_precision(const std::string& name);

}  // namespace tp
