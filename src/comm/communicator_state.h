#pragma once
// What a Communicator handle shares with its copies, and the helpers every
// collective's implementation uses (naming, failing, starting and waiting). Private
// to the comm module.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/nccl.h"
#include "comm/shm_all_reduce.h"
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
  /// The shared-memory workspace, created by the first shared-memory all_reduce.
  mutable std::unique_ptr<ShmAllReduce> shm;

  mutable std::mutex counts_mutex;
  mutable std::map<AllReduceStrategy, int64_t> counts;  // guarded by counts_mutex
  mutable std::map<WirePrecision, int64_t> wire_counts;  // guarded by counts_mutex
};

/// "tp::Communicator::<op>".
std::string op_name(const char* op);

/// Rethrows whatever a collective threw (or its timeout) as a c10::Error that says
/// which collective, where, and what usually causes it.
[[noreturn]] void collective_failed(const CommunicatorState& s, const char* op, const std::string& original);

/// Held while a CPU collective is being started (not while it runs). torch 2.11's
/// ProcessGroupGloo::enqueue records every op in the process-wide FlightRecorder, whose
/// recordWithResetEnabled reads and inserts into a std::map (all_pg_status_) before
/// taking its own lock: several groups of one process (run_ranks_in_threads) starting
/// collectives at once corrupt it (seen as a segfault in _Rb_tree_insert_and_rebalance).
/// Starting a Gloo op never waits for peers, so holding this cannot deadlock. Not
/// taken for device collectives: NCCL's first op initialises its communicator and
/// blocks until every rank arrives.
std::mutex& cpu_start_mutex();

/// Starts a collective with `start()` (returning a c10d::Work) and waits for it, at
/// most the configured timeout. `cpu`: the op runs on a CPU backend (see cpu_start_mutex).
template <typename Start>
void run_collective(const CommunicatorState& s, const char* op, bool cpu, Start&& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work;
    if (cpu) {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      work = start();
    } else {
      work = start();
    }
    if (!cpu && current_stream_capturing()) {
      // Inside CUDA-graph capture the op exists only in the graph: no host wait (it
      // would query an event that is never recorded); the stream orders it.
      work->wait();
    } else {
      TORCH_CHECK(work->wait(s.options.timeout), "the collective did not complete within ",
                  s.options.timeout.count(), " ms");
    }
  } catch (const c10::Error& e) {
    collective_failed(s, op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    collective_failed(s, op, e.what());
  }
}

/// A contiguous tensor's bytes as a 1-D uint8 view (so byte-moving collectives work
/// for every dtype, bool and complex included).
inline at::Tensor as_bytes(const at::Tensor& contiguous) { return contiguous.view({-1}).view(at::kByte); }

// ---- all-reduce algorithms (one file each) ------------------------------------------

/// The process group's own allreduce (process_group_all_reduce.cpp).
void all_reduce_process_group(const CommunicatorState& s, at::Tensor& t, const char* op);

/// float32 sent as bf16 through the group's allgather, summed in fp32 in rank order
/// (kNcclBf16Wire; process_group_all_reduce.cpp).
void all_reduce_bf16_wire(const CommunicatorState& s, at::Tensor& t, const char* op);

/// Butterfly over the group's send/recv (recursive_doubling.cpp). `bf16_wire`: a
/// float32 tensor's partial sums travel as bfloat16.
void all_reduce_recursive_doubling(const CommunicatorState& s, at::Tensor& t, bool bf16_wire, const char* op);

// ---- other collectives' internals (collectives.cpp), used by the all-reduce paths ---

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root);
void barrier_impl(const CommunicatorState& s);

// ---- host identity (host_identity.cpp) ----------------------------------------------

/// This process's host id: CommunicatorOptions::host_id if set, else the hostname
/// followed by the kernel's boot id (so two machines that share a hostname differ).
std::string local_host_id(const CommunicatorOptions& options);

/// On the first call: exchanges every rank's host id over the group (a collective:
/// every rank's first collective gets here) and fills s.host_ids and
/// s.ranks_on_one_host, the same on every rank. Later calls return at once. `op`
/// names the collective in errors.
void ensure_host_ids(const CommunicatorState& s, const char* op);

}  // namespace tp::detail

namespace tp::detail {

// ---- all_reduce's front end (all_reduce.cpp) -----------------------------------------

/// The strategy a call takes: `requested` unless kAuto, else TP_ALLREDUCE, else
/// CommunicatorOptions::all_reduce, else the selector over the table. Never kAuto.
AllReduceStrategy resolve_strategy(const CommunicatorState& s, AllReduceStrategy requested, const at::Tensor& t);

/// The wire precision a call uses once `taken` is known: kNative or kBFloat16 (the
/// latter only for float32 tensors and the strategies that apply it).
WirePrecision resolve_wire(const CommunicatorState& s, WirePrecision requested, AllReduceStrategy taken,
                           const at::Tensor& t);

/// Validates, resolves and counts the strategy, then reduces `t` in place. `verify`:
/// exchange an all_reduce fingerprint first (the caller has not checked agreement).
void all_reduce_impl(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy requested,
                     WirePrecision wire, const char* op, bool verify);

}  // namespace tp::detail
