#pragma once
// Making a rank-local failure collective. Each rank runs its part; then the ranks tell
// each other whether it worked, and all of them throw if any rank failed. A layer's
// construction or checkpoint load that fails on one rank (a bad slice of a tensor, an
// allocation, an I/O error) then fails on every rank at once, naming the rank, instead
// of leaving the other ranks waiting in their next collective until the timeout.

#include <functional>
#include <string>

#include "tp/comm/communicator.h"

namespace tp {

/// Runs `fn` on this rank, then exchanges with every rank whether each rank's `fn`
/// returned or threw: one all_gather of a fixed-size record per rank (kind + message,
/// messages past ~4 KB cut), on the group's CPU backend if it has one, else on its
/// device. If any rank threw, every rank throws the same error, naming each failed rank
/// and its message:
///   "RowParallelLinear.load_weights failed on rank 2 of 4: RowParallelLinear: tensor ..."
/// with the error type of the lowest failed rank (c10::ValueError, TypeError, IndexError,
/// NotImplementedError, else c10::Error; in Python ValueError, TypeError, ...). World
/// size 1 runs `fn` alone: nothing is exchanged and its exception passes unchanged.
/// A collective: every rank must call it at the same point. `fn` itself must not run
/// collectives (a rank that failed early would not join them). `what` names the
/// operation in the message.
/// Example: tp::run_collectively(comm, "embedding load", [&] { embed.copy_(ckpt.get(name).read_all()); });
void run_collectively(const Communicator& comm, const std::string& what, const std::function<void()>& fn);

}  // namespace tp
