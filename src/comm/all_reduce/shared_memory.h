#pragma once
// AllReduce through POSIX shared memory, for ranks on one host (threads of one
// process or separate processes alike). Private to the comm module.
//
// One segment per communicator, created on first use: rank 0 creates it under a
// unique name, the name travels to the others through the process group, every rank
// maps it, and rank 0 unlinks the name at once, so nothing is left in /dev/shm even
// if a process dies later. Per rank the segment holds three flags (sequence numbers)
// and two data buffers (double buffering: consecutive calls need no barrier), plus
// a shared result area for the two-shot algorithm. Messages larger than one buffer
// go through in chunks, each chunk one step of the protocol.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tp::detail {

struct FusionRows;

/// Shared-memory all-reduce workspace of one rank.
class ShmAllReduce {
 public:
  /// Bytes of one data buffer (per rank, per parity); a longer message is chunked.
  static constexpr int64_t kBufferBytes = int64_t{2} << 20;

  /// Collective: every rank constructs it at the same point. `broadcast_from_rank0`
  /// and `barrier` run over the communicator's process group.
  ShmAllReduce(int64_t rank, int64_t world, std::chrono::milliseconds timeout,
               const std::function<void(at::Tensor&)>& broadcast_from_rank0, const std::function<void()>& barrier);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  /// A description of the call that all ranks must agree on (see communicator.cpp).
  using Fingerprint = std::array<int64_t, 16>;
  /// Called, and must throw, when peer `rank` published a different fingerprint.
  using OnMismatch = std::function<void(int64_t rank, const Fingerprint& theirs)>;

  /// Sums `t` (CPU; float32, float64, bfloat16 or float16) over all ranks in place.
  /// Every rank sums the ranks in order 0..world-1 in fp32 (fp64 for float64), so all
  /// end bitwise identical. Ranks publish their inputs in the tensor's own dtype
  /// (bfloat16 and float16 widen exactly when summed), or, with `bf16_wire` for a
  /// float32 tensor, rounded to bfloat16; the two-shot result slices travel the same
  /// way. `op` names the caller's collective in errors. With a
  /// `fingerprint`, the ranks compare it through the segment before reducing (instead
  /// of a process-group exchange, which would cost more than the reduction itself);
  /// on a mismatch every rank calls `on_mismatch`, and the workspace stays usable.
  void run(at::Tensor& t, bool two_shot, bool bf16_wire, const char* op, const Fingerprint* fingerprint = nullptr,
           const OnMismatch& on_mismatch = {});

  /// Reduce-scatter: the sum over all ranks of `flat` (contiguous, [n], a dtype run
  /// takes), of which this rank keeps only elements [lo, hi), written to `out`
  /// ([hi - lo], same dtype). Each rank publishes its input and reads only its own
  /// range from every peer, so it receives (world - 1) * (hi - lo) elements instead of
  /// the whole sum; the ranks' ranges may differ in length, or be empty. Sums run
  /// over ranks 0..world-1 in order in fp32 (fp64 for float64), as run() does, so each
  /// element is bitwise what the all-reduce gives. `fingerprint` / `on_mismatch`: as
  /// for run().
  void reduce_scatter(const at::Tensor& flat, int64_t lo, int64_t hi, at::Tensor& out, const char* op,
                      const Fingerprint* fingerprint = nullptr, const OnMismatch& on_mismatch = {});

  /// run() fused with all_reduce_fusion's epilogue: `in` ([rows.rows, rows.hidden],
  /// contiguous, rows.dtype) is summed over the ranks a row at a time, in the same
  /// order as run(), inside rows.finish (handed every rank's part of the row). One-shot: every rank
  /// sums and finishes every row. Two-shot: each chunk's rows are split among the ranks
  /// by whole rows (a rank normalizes whole tokens), each rank finishes its own and
  /// publishes them packed in the result area, and every rank copies the others' (a
  /// step of fewer than 2 x world rows is finished whole by every rank, as one-shot).
  /// `bf16_wire`: a float32 input travels as bfloat16. Needs fits_fused(rows, bf16_wire).
  void run_fused(const at::Tensor& in, const FusionRows& rows, bool two_shot, bool bf16_wire, const char* op,
                 const Fingerprint* fingerprint = nullptr, const OnMismatch& on_mismatch = {});
  /// Whether one row of `rows` fits a step (its input in one buffer, its packed outputs
  /// in the result area); a longer row takes the composed path.
  static bool fits_fused(const FusionRows& rows, bool bf16_wire);

  /// Only compares `fingerprint` across the ranks (one step of the protocol, no data),
  /// for collectives that run over the process group.
  void exchange(const Fingerprint& fingerprint, const char* op, const OnMismatch& on_mismatch);

 private:
  // Per rank: three flags, the fingerprint of the call once per buffer parity, then
  // liveness: 1 once the rank's workspace is destroyed, and the rank's pid.
  enum Slot : int64_t { kArrived = 0, kReduced = 1, kDone = 2, kFingerprint = 3, kLeft = 5, kPid = 6, kSlots = 7 };

  void check_usable(const char* op) const;
  /// Throws if `peer` can no longer arrive.
  void check_alive(int64_t peer, uint64_t target, const char* waiting_for, const char* op);
  std::atomic<uint64_t>& flag(int64_t rank, Slot slot) const;
  Fingerprint* fingerprint(int64_t rank, int64_t parity) const;
  void* data(int64_t rank, int64_t parity) const;
  void* result(int64_t parity) const;
  /// Spins (then yields, then sleeps) until every peer's `slot` >= target; throws
  /// after the timeout, naming the peers that did not get there, or as soon as one of
  /// them is gone (its workspace destroyed, or its process exited).
  void wait_peers(Slot slot, uint64_t target, const char* waiting_for, const char* op);
  // T: the tensor's element type; P: what travels through the segment; Acc: the sum's.
  /// Starts a step: waits until this parity's buffers are free, writes `values` (and
  /// the fingerprint) into this rank's buffer, waits for every peer's, compares the
  /// fingerprints. Returns the step's buffer parity.
  template <typename T, typename P>
  int64_t publish(const T* values, int64_t n, const char* op, const Fingerprint* fingerprint,
                  const OnMismatch& on_mismatch);
  /// Sums elements [lo, hi) of every rank's published buffer into out[0, hi - lo).
  template <typename P, typename Acc, typename Out>
  void sum_ranks(int64_t parity, int64_t lo, int64_t hi, Out* out) const;
  template <typename T, typename P, typename Acc>
  void step(T* values, int64_t n, bool two_shot, const char* op, const Fingerprint* fingerprint,
            const OnMismatch& on_mismatch);
  template <typename T, typename P, typename Acc>
  void run_typed(T* values, int64_t n, bool two_shot, const char* op, const Fingerprint* fingerprint,
                 const OnMismatch& on_mismatch);

  template <typename T, typename P>
  void run_fused_typed(const T* values, const FusionRows& rows, bool two_shot, const char* op,
                       const Fingerprint* fingerprint, const OnMismatch& on_mismatch);

  template <typename T, typename Acc>
  void reduce_scatter_typed(const T* values, int64_t n, int64_t lo, int64_t hi, T* out, const char* op,
                            const Fingerprint* fingerprint, const OnMismatch& on_mismatch);

  int64_t rank_;
  int64_t world_;
  std::chrono::milliseconds timeout_;
  void* base_ = nullptr;  // the mapping, bytes_ long
  size_t bytes_ = 0;
  uint64_t seq_ = 0;       // the last step's sequence number, the same on every rank
  bool broken_ = false;    // a step timed out: peers are at unknown points
  const char* what_ = "";  // the current step's algorithm, for error messages
  // Peers whose process this rank can watch: another process, visible in this pid
  // namespace when the workspace was set up (ranks as threads share our pid).
  std::vector<bool> watch_pid_;
};

}  // namespace tp::detail
