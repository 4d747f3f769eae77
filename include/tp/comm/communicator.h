#pragma once
// Communicator: the small, copyable handle a TP layer holds to talk to its peers.
//
// It wraps a c10d::ProcessGroup (Gloo on CPU, or any group a caller hands in). A
// default-constructed Communicator is world 1: every collective is a no-op that
// returns its input, so TP = 1 runs the same code path as TP > 1.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "tp/comm/all_reduce_strategy.h"

namespace c10d {
class ProcessGroup;
}

namespace tp {

namespace detail {
struct CommunicatorState;
struct CommunicatorAccess;
}

/// Settings shared by every collective of one communicator.
struct CommunicatorOptions {
  /// A collective that has not completed by then throws instead of hanging
  /// (a peer died, or ranks disagree on shapes). Default: TP_COMM_TIMEOUT_MS from
  /// the environment, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();
  /// Strategy used when a call passes kAuto and TP_ALLREDUCE is unset.
  AllReduceStrategy all_reduce = AllReduceStrategy::kAuto;
  /// Before each collective the ranks exchange a small fingerprint of the call
  /// (operation, dtype, shape, sizes, root or dim, strategy) and all refuse, naming
  /// both sides, if they disagree. Costs one small allgather per collective. Without
  /// it a disagreement times out, or with Gloo can abort the whole process (Gloo's
  /// transport thread throws, uncaught, when more bytes arrive than a rank expects).
  /// Default: TP_COMM_VERIFY from the environment (0 or 1), else on.
  bool verify_calls = default_verify_calls();

  static std::chrono::milliseconds default_timeout();
  static bool default_verify_calls();
};

/// A rank's view of its tensor-parallel group.
/// Example:
///   tp::run_ranks_in_threads(4, [](tp::Communicator& comm) {
///     auto t = at::ones({8});
///     comm.all_reduce(t);            // every rank: all 4.0
///   });
class Communicator {
 public:
  /// World size 1: collectives are no-ops.
  Communicator();
  /// Wraps a process group built elsewhere (e.g. by torch.distributed, or a launcher).
  explicit Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                        CommunicatorOptions options = {});

  int64_t rank() const;
  int64_t world_size() const;
  const CommunicatorOptions& options() const;
  /// The wrapped group; null for world size 1.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const;
  /// Whether every rank is known to run on this host (world 1, the thread launcher,
  /// connect_tcp over loopback). Only then can all_reduce use shared memory; a group
  /// handed in from outside counts as not on one host.
  bool ranks_on_one_host() const;

  /// Sums `t` over all ranks, in place, and returns it. Accumulates in at least fp32
  /// (half and bfloat16 are widened for the reduction) and leaves every rank with
  /// bitwise-identical values. `t` must have the same shape and dtype on every rank.
  at::Tensor& all_reduce(at::Tensor& t, AllReduceStrategy strategy = AllReduceStrategy::kAuto) const;

  /// Concatenates every rank's `t` along `dim`. `sizes[r]` is rank r's extent of
  /// `dim` (uneven and zero allowed); all other dimensions must agree.
  at::Tensor all_gather(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) const;

  /// Sums `t` over all ranks and returns this rank's slice of it along `dim`, with
  /// `sizes[r]` the extent of rank r's slice (they must add up to t.size(dim)).
  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) const;

  /// Copies root's `t` into every rank's `t` (same shape and dtype everywhere).
  void broadcast(at::Tensor& t, int64_t root) const;

  /// Returns once every rank has called it (or throws after the timeout).
  void barrier() const;

  /// How many all_reduce calls took each strategy (the one actually taken,
  /// after resolving kAuto), so the choice is observable.
  std::map<AllReduceStrategy, int64_t> all_reduce_counts() const;

 private:
  friend struct detail::CommunicatorAccess;  // lets the launchers record ranks_on_one_host
  std::shared_ptr<detail::CommunicatorState> state_;
};

}  // namespace tp
