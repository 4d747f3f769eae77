// The process_group strategy: the c10d group's own allreduce (Gloo: ring
// reduce-scatter + allgather; NCCL for device tensors).

#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/communicator_state.h"

namespace tp::detail {

/// Each element's final value is computed once, by the rank owning its ring segment,
/// and then copied to the others, so every rank ends with the same bits; the "bitwise
/// identical across ranks" tests check it at world 2, 3, 4 and 8.
void all_reduce_process_group(const CommunicatorState& s, at::Tensor& t, const char* op) {
  // half / bfloat16 are summed in fp32: rounding after every hop of the ring would
  // lose bits at each rank boundary.
  const bool widen = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  at::Tensor buf = widen ? t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous)
                         : t.contiguous();
  std::vector<at::Tensor> bufs{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = s.options.timeout;
  run_collective(s, op, buf.is_cpu(), [&] { return s.group->allreduce(bufs, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

}  // namespace tp::detail
