#pragma once
// Ways to get a Communicator: N ranks as threads of one process (fast tests), or one
// rank per process from torchrun-style environment variables.

#include <cstdint>
#include <functional>
#include <string>

#include "tp/comm/communicator.h"

namespace c10d {
class Store;
}

namespace tp {

/// Builds a Gloo process group (over loopback/TCP) for `rank` of `world`, meeting
/// through `store`, and wraps it. The launchers below are built on this.
Communicator make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                    CommunicatorOptions options = {});

/// Runs `fn(comm)` on `world` ranks, each a thread with its own Gloo process group
/// over an in-process store, and waits for all. If any rank throws, rethrows the
/// first error with its rank in the message (after the others finish or time out).
/// Example: tp::run_ranks_in_threads(3, [&](tp::Communicator& c) { ... });
void run_ranks_in_threads(int64_t world, const std::function<void(Communicator&)>& fn,
                          CommunicatorOptions options = {});

/// One rank of a multi-process group, from RANK, WORLD_SIZE, MASTER_ADDR and
/// MASTER_PORT (torchrun's variables), rendezvousing through a c10d TCP store that
/// rank 0 hosts. Missing or malformed variables are an error naming them.
Communicator communicator_from_env(CommunicatorOptions options = {});

/// The same with the values given explicitly.
Communicator connect_tcp(const std::string& master_addr, int port, int64_t rank, int64_t world,
                         CommunicatorOptions options = {});

}  // namespace tp
