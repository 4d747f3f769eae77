#pragma once
// Library-internal access to a Communicator's state (the friend named in
// communicator.h), for what only the launchers know about a group.

#include "tp/comm/communicator.h"

namespace tp::detail {

struct CommunicatorAccess {
  /// Records that every rank of `comm` runs on this host (the launcher knows it:
  /// threads of one process, or a loopback rendezvous), which allows shared memory.
  static void set_ranks_on_one_host(Communicator& comm, bool on_one_host);
};

}  // namespace tp::detail
