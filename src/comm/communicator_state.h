#pragma once
// What a Communicator handle shares with its copies. Private to the comm area; the
// functions that act on it live in one header per concept (run_collective.h,
// collectives.h, host_identity.h, call_check.h, all_reduce/*.h).

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/all_reduce/shared_memory.h"
#include "tp/comm/all_reduce_table.h"
#include "tp/comm/communicator.h"

namespace tp::detail {

struct CommunicatorState {
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // null for the default world-1 communicator
  int64_t rank = 0;
  int64_t world = 1;
  CommunicatorOptions options;
  /// TP_ALLREDUCE, parsed once at construction; nullopt when unset or "auto".
  std::optional<AllReduceStrategy> env_all_reduce;
  /// TP_ALLREDUCE_WIRE, parsed once at construction; nullopt when unset or "default".
  std::optional<WirePrecision> env_wire;
  /// The tuning table kAuto reads (options.all_reduce_table, else the built-in one).
  std::shared_ptr<const AllReduceTable> table;
  /// Every rank runs on this host: the ranks' host ids agree. Exchanged by the first
  /// collective (ensure_host_ids), so constructing a Communicator stays local.
  mutable bool ranks_on_one_host = true;
  /// Each rank's host id (for error messages); empty for world 1.
  mutable std::vector<std::string> host_ids;
  mutable bool hosts_known = false;  // guarded by hosts_mutex
  mutable std::mutex hosts_mutex;
  /// TP_COMM_DEBUG=1: one line on stderr per all_reduce, naming the strategy taken.
  bool debug = false;
  /// How many split() calls this communicator has made: part of each new group's name,
  /// the same on every rank since every rank calls split in the same order.
  mutable std::atomic<int64_t> splits{0};
  /// The shared-memory workspace, created by the first shared-memory all_reduce.
  mutable std::unique_ptr<ShmAllReduce> shm;

  mutable std::mutex counts_mutex;
  mutable std::map<AllReduceStrategy, int64_t> counts;   // guarded by counts_mutex
  mutable std::map<WirePrecision, int64_t> wire_counts;  // guarded by counts_mutex
};

/// Reads the settings a Communicator with these options would read (the environment,
/// the tuning table) and throws what its constructor would throw. The group factories
/// call it before connecting: a bad setting is then every rank's own error, raised
/// before any rank opens a connection a failing peer would close under it.
void check_settings(const CommunicatorOptions& options);

}  // namespace tp::detail
