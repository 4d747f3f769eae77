// The process_group strategy: the c10d group's own allreduce (Gloo: ring
// reduce-scatter + allgather; NCCL for device tensors).

#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/all_reduce/process_group.h"
#include "comm/communicator_state.h"
#include "comm/run_collective.h"

namespace tp::detail {

/// Each element's final value is computed once, by the rank owning its ring segment,
/// and then copied to the others, so every rank ends with the same bits; the "bitwise
/// identical across ranks" tests check it at world 2, 3, 4 and 8.
void all_reduce_process_group(const CommunicatorState& s, at::Tensor& t, const char* op) {
  // half / bfloat16 are summed in fp32: rounding after every hop of the ring would
  // lose bits at each rank boundary.
  const bool widen = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  at::Tensor buf =
      widen ? t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous) : t.contiguous();
  std::vector<at::Tensor> bufs{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = s.options.timeout;
  run_collective(s, op, buf.is_cpu(), [&] { return s.group->allreduce(bufs, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

/// Every rank's message gathered, then summed in fp32 in rank order
/// (comm/nccl/nccl_strategy.h), so the ranks agree bitwise and the sum keeps fp32
/// precision; only each rank's contribution is rounded to bf16.
void all_reduce_bf16_wire(const CommunicatorState& s, at::Tensor& t, const char* op) {
  // As bytes, so any backend moves it (not every one has a bf16 allgather).
  std::vector<at::Tensor> inputs{bf16_wire_message(t).view(at::kByte)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, t.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });
  for (auto& piece : outputs[0]) piece = piece.view(at::kBFloat16);
  sum_bf16_wire(outputs[0], t);
}

}  // namespace tp::detail
