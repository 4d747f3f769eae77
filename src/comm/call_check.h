#pragma once
// Checking that every rank makes the same collective call (CommunicatorOptions::
// verify_calls): a fixed-size fingerprint of the call, exchanged before the
// collective; a mismatch is an error on every rank, naming both calls.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"

namespace tp::detail {

/// Which collective a fingerprint describes.
enum class CallKind : int64_t {
  kAllReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kAllReduceFusion = 6,  ///< [11]: norm, quant and which optional tensors (fusion.cpp); [14]: eps's bits
};

/// Marks, in [13], a fingerprint a rank sends instead of its call when it refused its
/// own arguments: the peers then fail at once, saying so, instead of at the timeout.
constexpr int64_t kRefusedCall = -2;

/// One rank's view of a collective call, in a fixed-size record so that exchanging
/// it can never itself disagree in size. Layout (int64):
///   [0] kind  [1] dtype (-1: none)  [2] ndim (-1: none)  [3..11) dims, -1 for the
///   dimension whose extent may differ (all_gather), or, past kMaxDims, [3] a hash
///   [11] dim or root (-1: none)  [12] strategy (-1: none)  [13] number of sizes
///   [14] hash of sizes  [15] wire precision (-1: none)
using Fingerprint = std::array<int64_t, 16>;

Fingerprint fingerprint(CallKind kind, const at::Tensor* t, int64_t free_dim, int64_t dim_or_root,
                        std::optional<AllReduceStrategy> strategy, const std::vector<int64_t>* sizes,
                        std::optional<WirePrecision> wire = std::nullopt);

/// "all_reduce(dtype=Float, shape=[4, 8], strategy=shm_one_shot, wire=native)".
std::string describe(const Fingerprint& f);

/// Throws the error every rank gets when `rank`'s call differs from this rank's.
[[noreturn]] void calls_disagree(const CommunicatorState& s, const char* op, const Fingerprint& mine, int64_t rank,
                                 const Fingerprint& theirs);

/// Exchanges `mine` with every rank (through the shared-memory workspace once there
/// is one, else the process group's allgather on `device`); every rank throws if any
/// two disagree (each differs from at least one other, so none is left waiting).
/// Nothing happens with verify_calls off.
void verify_call(const CommunicatorState& s, const char* op, const Fingerprint& mine, at::Device device);

}  // namespace tp::detail
