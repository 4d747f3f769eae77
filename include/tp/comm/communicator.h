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
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/all_reduce_table.h"

namespace c10d {
class ProcessGroup;
}

namespace tp {

namespace detail {
struct CommunicatorState;
}

struct AllReduceFusionParams;
struct AllReduceFusionResult;

/// Settings shared by every collective of one communicator.
struct CommunicatorOptions {
  /// A collective that has not completed by then throws instead of hanging
  /// (a peer died, or ranks disagree on shapes). Default: TP_COMM_TIMEOUT_MS from
  /// the environment, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();
  /// Strategy used when a call passes kAuto and TP_ALLREDUCE is unset.
  AllReduceStrategy all_reduce = AllReduceStrategy::kAuto;
  /// Wire precision used when a call passes WirePrecision::kDefault and
  /// TP_ALLREDUCE_WIRE is unset (see WirePrecision for what bf16 costs in accuracy).
  WirePrecision wire = WirePrecision::kNative;
  /// A tuning table for kAuto, written by `tp-allreduce-bench --tune FILE`; empty: the
  /// built-in table. Loaded and validated at construction (errors name the file).
  /// Default: TP_ALLREDUCE_TABLE from the environment, else empty.
  std::string all_reduce_table = default_all_reduce_table();
  /// This rank's host identity, compared across ranks at construction to decide
  /// whether shared memory can be used. Empty: the hostname plus the kernel's boot id.
  /// Set it to tell apart ranks of one machine that cannot share memory (containers
  /// with private /dev/shm). Default: TP_COMM_HOST_ID from the environment, else empty.
  std::string host_id = default_host_id();
  /// Before each collective the ranks exchange a small fingerprint of the call
  /// (operation, dtype, shape, sizes, root or dim, strategy) and all refuse, naming
  /// both sides, if they disagree. Costs one small allgather per collective. Without
  /// it a disagreement times out, or with Gloo can abort the whole process (Gloo's
  /// transport thread throws, uncaught, when more bytes arrive than a rank expects).
  /// Default: TP_COMM_VERIFY from the environment (0 or 1), else on.
  bool verify_calls = default_verify_calls();

  static std::chrono::milliseconds default_timeout();
  static bool default_verify_calls();
  static std::string default_all_reduce_table();
  static std::string default_host_id();
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
  /// Loads the tuning table named by options.all_reduce_table, and reads
  /// TP_ALLREDUCE, TP_ALLREDUCE_WIRE and TP_COMM_DEBUG, once. Local: the ranks
  /// exchange their host ids (for ranks_on_one_host()) in their first collective.
  explicit Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group, CommunicatorOptions options = {});

  int64_t rank() const;
  int64_t world_size() const;
  const CommunicatorOptions& options() const;
  /// The wrapped group; null for world size 1.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const;
  /// Whether every rank runs on this host: their host ids (CommunicatorOptions::host_id,
  /// by default hostname and boot id) are all equal. The same answer on every rank.
  /// Only then can all_reduce use shared memory. The first call of this, of
  /// resolve_all_reduce or of any collective exchanges the ids: every rank must make
  /// it (launchers do, with their closing barrier).
  bool ranks_on_one_host() const;
  /// The table kAuto reads (the built-in one unless options.all_reduce_table names a file).
  const AllReduceTable& all_reduce_table() const;

  /// Sums `t` over all ranks, in place, and returns it. Accumulates in at least fp32
  /// (half and bfloat16 are widened for the reduction) and leaves every rank with
  /// bitwise-identical values. `t` must have the same shape and dtype on every rank,
  /// and every rank must resolve the same strategy and wire precision.
  /// `strategy` kAuto: TP_ALLREDUCE, else options().all_reduce, else the selector
  /// (resolve_all_reduce). `wire` kDefault: TP_ALLREDUCE_WIRE, else options().wire.
  /// A forced strategy that cannot run (shared memory across hosts, or for a dtype it
  /// does not reduce) is an error. With TP_COMM_DEBUG=1 each call logs its choice on stderr.
  at::Tensor& all_reduce(at::Tensor& t, AllReduceStrategy strategy = AllReduceStrategy::kAuto,
                         WirePrecision wire = WirePrecision::kDefault) const;

  /// The layer boundary in one collective (include "tp/comm/all_reduce_fusion.h"):
  /// sums `allreduce_in` ([..., hidden], this rank's partial sum; float32, bfloat16 or
  /// float16; not modified) over all ranks and, in the same pass on the shared-memory
  /// strategies, adds params.bias once, adds params.residual_in, normalizes and quantizes
  /// per token. The strategy resolves as all_reduce's would for `allreduce_in`; every
  /// rank gets bitwise-identical results. Not differentiable: under autograd use
  /// reduce_from_parallel and the separate steps (DecoderLayer does). A rank that refuses
  /// its arguments tells its peers (with verify_calls), so all of them fail at once.
  /// The outputs defined in `out` (contiguous, of the shapes and dtypes the result would
  /// have) are written in place and returned, as FlashInfer's preallocated outputs; the
  /// others are allocated.
  AllReduceFusionResult all_reduce_fusion(const at::Tensor& allreduce_in, const AllReduceFusionParams& params,
                                          AllReduceFusionResult out) const;
  AllReduceFusionResult all_reduce_fusion(const at::Tensor& allreduce_in, const AllReduceFusionParams& params) const;

  /// The strategy all_reduce(t, strategy) would take here (never kAuto), without
  /// communicating once the host ids are known (see ranks_on_one_host): a pure function of the settings, world size, t's device, size and
  /// dtype, ranks_on_one_host() and the table, so every rank gets the same answer.
  AllReduceStrategy resolve_all_reduce(const at::Tensor& t,
                                       AllReduceStrategy strategy = AllReduceStrategy::kAuto) const;

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

  /// The ranks `ranks` of this group as a communicator of their own (rank i of it is
  /// ranks[i]), with this one's options: collectives among them alone, as an attention
  /// group inside a larger world (tp/models/attention_dp.h). Collective over this whole
  /// group: every rank calls it, each with the list of its own new group (the lists
  /// disjoint, together every rank), the calls in the same order. A single rank gets a
  /// world-size-1 communicator; this rank missing from `ranks`, a repeated or out-of-range
  /// rank is an error.
  Communicator split(const std::vector<int64_t>& ranks) const;

  /// How many all_reduce calls took each strategy (the one actually taken,
  /// after resolving kAuto), so the choice is observable.
  std::map<AllReduceStrategy, int64_t> all_reduce_counts() const;
  /// How many all_reduce calls used each wire precision (kNative or kBFloat16, after
  /// resolving kDefault and the tensor's dtype).
  std::map<WirePrecision, int64_t> all_reduce_wire_counts() const;

 private:
  std::shared_ptr<detail::CommunicatorState> state_;
};

}  // namespace tp
