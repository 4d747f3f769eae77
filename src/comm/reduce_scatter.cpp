// Communicator::reduce_scatter: each rank receives only its piece of the sum.
//
// The strategy is resolved as for an all_reduce of the same tensor (and counted in
// all_reduce_counts under it), then:
//  - shared memory (one host, CPU): every rank publishes its input in the segment and
//    sums only its own piece from every peer (ShmAllReduce::reduce_scatter), so it
//    reads world x its piece instead of world x the tensor;
//  - process group or recursive doubling (CPU, across hosts): a direct exchange of
//    the pieces over the group's send/recv, which moves (world - 1) / world of the
//    tensor per rank (an all_reduce moves about twice that, or all of it every round);
//  - device tensors (NCCL's or Gloo's): an all_reduce and this rank's slice.
// The pieces are cut along `dim` by `sizes` (uneven, zeros allowed); moving `dim` to
// the front makes each piece one contiguous range of the flattened tensor.

#include <mutex>
#include <numeric>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "comm/all_reduce/front_end.h"
#include "comm/all_reduce/select.h"
#include "comm/call_check.h"
#include "comm/collectives.h"
#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "comm/point_to_point.h"
#include "comm/run_collective.h"

namespace tp {
namespace detail {
namespace {

/// `moved` ([total, ...] contiguous) summed over the ranks; this rank's rows
/// [offset, offset + rows) of it, through the shared-memory segment.
at::Tensor shm_reduce_scatter(const CommunicatorState& s, const at::Tensor& moved, int64_t offset, int64_t rows,
                              const char* op) {
  const int64_t inner = moved.size(0) == 0 ? 0 : moved.numel() / moved.size(0);
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, moved.options());
  shm_workspace(s).reduce_scatter(moved.view({-1}), offset * inner, (offset + rows) * inner, out, op);
  return out;
}

/// The same over the process group's point-to-point transfers: each rank sends every
/// peer that peer's piece of its input and receives its own piece from every peer,
/// all posted at once (one round of latency), then sums the pieces in rank order
/// 0..world-1 in the accumulation type. Each rank sends and receives (world - 1) x its
/// piece: (world - 1) / world of the tensor when the pieces are even. (Gloo's own
/// reduce_scatter was slower than its all_reduce: benchmarks/RESULTS.md, "Measurements
/// behind the CPU kernels' shapes".)
at::Tensor direct_reduce_scatter(const CommunicatorState& s, const at::Tensor& moved, const std::vector<int64_t>& sizes,
                                 const char* op) {
  constexpr int kTag = 96;  // apart from recursive doubling's tags
  const int64_t inner = moved.size(0) == 0 ? 0 : moved.numel() / moved.size(0);
  const at::Tensor flat = moved.view({-1});
  std::vector<int64_t> offsets(s.world + 1, 0);
  for (int64_t r = 0; r < s.world; ++r) offsets[r + 1] = offsets[r] + sizes[r] * inner;
  auto piece_of = [&](int64_t r) { return flat.narrow(0, offsets[r], offsets[r + 1] - offsets[r]); };
  const int64_t mine = offsets[s.rank + 1] - offsets[s.rank];

  std::vector<Transfer> recvs(s.world), sends;
  {
    std::lock_guard<std::mutex> lock(cpu_start_mutex());
    for (int64_t p = 0; p < s.world; ++p) {
      if (p == s.rank) continue;
      // Every rank knows every piece's size, so both sides skip an empty one alike.
      if (mine > 0) {
        recvs[p] = post(s, op, "reduce_scatter", false, at::empty({mine}, flat.options()), p, kTag, "its piece");
      }
      if (offsets[p + 1] > offsets[p])
        sends.push_back(post(s, op, "reduce_scatter", true, piece_of(p), p, kTag, "its piece"));
    }
  }
  const at::ScalarType acc = accumulate_type(moved.scalar_type());
  at::Tensor sum;
  for (int64_t r = 0; r < s.world && mine > 0; ++r) {
    if (r != s.rank) wait(s, op, recvs[r]);
    const at::Tensor part = r == s.rank ? piece_of(r) : recvs[r].tensors[0];
    sum = r == 0 ? converted(part, acc) : added(sum, part, acc);
  }
  for (Transfer& x : sends) wait(s, op, x);
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] = sizes[s.rank];
  if (mine == 0) return at::empty(shape, moved.options());
  return (acc == moved.scalar_type() ? sum : converted(sum, moved.scalar_type())).view(shape);
}

}  // namespace
}  // namespace detail

at::Tensor Communicator::reduce_scatter(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) const {
  using namespace detail;
  const CommunicatorState& s = *state_;
  const char* op = "reduce_scatter";
  check_defined(t, op);
  const int64_t d = wrap_dim(t, dim, op);
  check_sizes(s, sizes, op);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  TORCH_CHECK_VALUE(total == t.size(d), op_name(op), ": sizes ", c10::IntArrayRef(sizes), " add up to ", total,
                    " but the tensor has extent ", t.size(d), " along dim ", d, " (shape ", t.sizes(),
                    "); the slices must cover it exactly");
  if (s.world == 1) {
    at::Tensor alias = t;  // counted and validated like world > 1; the reduction is a no-op
    all_reduce_impl(s, alias, AllReduceStrategy::kAuto, WirePrecision::kDefault, op, /*verify=*/false);
    return t;
  }
  ensure_host_ids(s, op);
  const AllReduceStrategy strategy = resolve_strategy(s, AllReduceStrategy::kAuto, t);
  check_possible(s, strategy, t, op);
  // The pieces travel in the tensor's own precision (no bfloat16 wire).
  verify_call(s, op, fingerprint(CallKind::kReduceScatter, &t, -1, d, strategy, &sizes, WirePrecision::kNative),
              t.device());
  const int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + s.rank, int64_t{0});
  if (!t.is_cpu() && t.numel() > 0) {
    // Device tensors: the all-reduce (which counts the call), then this rank's slice
    // (clone: do not keep the whole sum alive behind a narrow view).
    at::Tensor sum = t.clone(at::MemoryFormat::Contiguous);
    all_reduce_impl(s, sum, strategy, WirePrecision::kNative, op, /*verify=*/false);
    return sum.narrow(d, offset, sizes[s.rank]).clone(at::MemoryFormat::Contiguous);
  }
  count_call(s, t, AllReduceStrategy::kAuto, strategy, WirePrecision::kNative, op);
  // Shapes agree across ranks, so every rank skips an empty tensor alike.
  if (t.numel() == 0) return t.narrow(d, offset, sizes[s.rank]).clone(at::MemoryFormat::Contiguous);
  const at::Tensor moved = t.movedim(d, 0).contiguous();
  const at::Tensor piece = is_shared_memory(strategy) ? shm_reduce_scatter(s, moved, offset, sizes[s.rank], op)
                                                      : direct_reduce_scatter(s, moved, sizes, op);
  return piece.movedim(0, d).contiguous();
}

}  // namespace tp
