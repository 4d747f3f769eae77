// The collectives other than all_reduce and reduce_scatter (all_gather, broadcast,
// barrier) over the process group.

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/all_reduce/front_end.h"
#include "comm/call_check.h"
#include "comm/collectives.h"
#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "comm/run_collective.h"

namespace tp {
namespace detail {

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root) {
  const char* op = "broadcast";
  TORCH_CHECK_VALUE(t.defined(), op_name(op), ": the tensor is undefined");
  TORCH_CHECK_VALUE(root >= 0 && root < s.world, op_name(op), ": invalid root ", root, " (root should be in the 0..",
                    s.world - 1, " range)");
  if (s.world == 1 || t.numel() == 0) return;
  ensure_host_ids(s, op);
  verify_call(s, op, fingerprint(CallKind::kBroadcast, &t, -1, root, std::nullopt, nullptr), t.device());
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> bufs{as_bytes(buf)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  opts.timeout = s.options.timeout;
  run_collective(s, op, buf.is_cpu(), [&] { return s.group->broadcast(bufs, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

void barrier_impl(const CommunicatorState& s) {
  if (s.world == 1) return;
  ensure_host_ids(s, "barrier");
  // The fingerprint travels on CPU when the group has a CPU backend (Gloo), else on
  // the group's device (an NCCL-only group handed in from Python).
  const auto devices = s.group->getDeviceTypes();
  const bool has_cpu =
      devices.empty() || std::any_of(devices.begin(), devices.end(), [](const c10::Device& d) { return d.is_cpu(); });
  verify_call(s, "barrier", fingerprint(CallKind::kBarrier, nullptr, -1, -1, std::nullopt, nullptr),
              has_cpu ? at::Device(at::kCPU) : devices.front());
  c10d::BarrierOptions opts;
  opts.timeout = s.options.timeout;
  // Straight to the backend: ProcessGroup::barrier assigns a function-static tensor,
  // a data race when several ranks of one process (run_ranks_in_threads) call it at
  // once. Its CPU kernel ends in the same backend call.
  const bool gloo = s.group->getBackendType() == c10d::ProcessGroup::BackendType::GLOO;
  run_collective(s, "barrier", gloo, [&] { return s.group->getDefaultBackend()->barrier(opts); });
}

void check_defined(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), op_name(op), ": the tensor is undefined");
}

int64_t wrap_dim(const at::Tensor& t, int64_t dim, const char* op) {
  const int64_t n = t.dim();
  TORCH_CHECK_INDEX(n > 0, op_name(op), ": dim=", dim, " is invalid for a 0-dimensional tensor; ",
                    "expected a tensor with at least one dimension");
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op_name(op), ": dim=", dim, " is out of range for a ", n,
                    "-D tensor of shape ", t.sizes(), " (dim should be in the ", -n, "..", n - 1, " range)");
  return dim < 0 ? dim + n : dim;
}

void check_sizes(const CommunicatorState& s, const std::vector<int64_t>& sizes, const char* op) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(sizes.size()) == s.world, op_name(op), ": sizes has ", sizes.size(),
                    " entries but world_size is ", s.world, "; pass one extent per rank");
  for (size_t r = 0; r < sizes.size(); ++r) {
    TORCH_CHECK_VALUE(sizes[r] >= 0, op_name(op), ": sizes[", r, "]=", sizes[r],
                      " is negative; expected extents >= 0 (sizes=", c10::IntArrayRef(sizes), ")");
  }
}

}  // namespace detail

at::Tensor Communicator::all_gather(const at::Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) const {
  using namespace detail;
  const CommunicatorState& s = *state_;
  const char* op = "all_gather";
  check_defined(t, op);
  const int64_t d = wrap_dim(t, dim, op);
  check_sizes(s, sizes, op);
  TORCH_CHECK_VALUE(sizes[s.rank] == t.size(d), op_name(op), ": sizes[", s.rank, "]=", sizes[s.rank],
                    " but this rank's tensor has extent ", t.size(d), " along dim ", d, " (shape ", t.sizes(),
                    "); sizes[r] must be rank r's extent");
  if (s.world == 1) return t;
  ensure_host_ids(s, op);
  verify_call(s, op, fingerprint(CallKind::kAllGather, &t, d, d, std::nullopt, &sizes), t.device());

  // Every rank pads its piece to the largest extent so the group's allgather sees
  // equal sizes; each piece is cut back to its own extent afterwards.
  const int64_t max_extent = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> padded_shape = t.sizes().vec();  // t's shape with dim d = max_extent
  padded_shape[d] = max_extent;
  std::vector<int64_t> out_shape = t.sizes().vec();  // t's shape with dim d = sum(sizes)
  out_shape[d] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t padded_numel = c10::multiply_integers(padded_shape);
  // Every rank computes the same padded_numel (other dims agree), so all skip alike.
  if (padded_numel == 0) return at::empty(out_shape, t.options());

  at::Tensor padded;
  if (t.size(d) == max_extent) {
    padded = t.contiguous();
  } else {
    padded = at::zeros(padded_shape, t.options());
    padded.narrow(d, 0, t.size(d)).copy_(t);
  }
  std::vector<at::Tensor> inputs{as_bytes(padded)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, t.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });

  std::vector<at::Tensor> pieces;
  pieces.reserve(s.world);
  for (int64_t r = 0; r < s.world; ++r) {
    pieces.push_back(outputs[0][r].view(t.scalar_type()).view(padded_shape).narrow(d, 0, sizes[r]));
  }
  return at::cat(pieces, d);
}

void Communicator::broadcast(at::Tensor& t, int64_t root) const { detail::broadcast_impl(*state_, t, root); }

void Communicator::barrier() const { detail::barrier_impl(*state_); }

}  // namespace tp
