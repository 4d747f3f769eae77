// all_reduce_fusion's front end: validation, the strategy (as all_reduce resolves it for
// the same tensor), the call check, and the dispatch: fused into the shared-memory
// strategies' pass (shared_memory.cpp), composed everywhere else (the all-reduce, then
// the same row epilogue, fusion_rows.cpp; on a device, its CUDA kernel).

#include <cstring>
#include <ostream>

#include <ATen/ATen.h>

#include "comm/all_reduce/front_end.h"
#include "comm/all_reduce/fusion_rows.h"
#include "comm/all_reduce/select.h"
#include "comm/call_check.h"
#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "comm/run_collective.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/communicator.h"

#ifdef TP_WITH_CUDA
#include "comm/nccl/fusion_epilogue_cuda.h"
#endif

namespace tp {

const char* to_string(AllReduceFusionNorm n) {
  switch (n) {
    case AllReduceFusionNorm::kNone: return "none";
    case AllReduceFusionNorm::kRMS: return "rms";
    case AllReduceFusionNorm::kRMSUnitOffset: return "rms_unit_offset";
    case AllReduceFusionNorm::kRMSScaleFirst: return "rms_scale_first";
    case AllReduceFusionNorm::kLayerNorm: return "layer_norm";
  }
  return "unknown";
}

const char* to_string(AllReduceFusionQuant q) {
  switch (q) {
    case AllReduceFusionQuant::kNone: return "none";
    case AllReduceFusionQuant::kFp8PerToken: return "fp8_per_token";
    case AllReduceFusionQuant::kInt8PerToken: return "int8_per_token";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& out, AllReduceFusionNorm n) { return out << to_string(n); }
std::ostream& operator<<(std::ostream& out, AllReduceFusionQuant q) { return out << to_string(q); }

namespace detail {
namespace {

constexpr const char* kOp = "all_reduce_fusion";

bool is_fusion_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// A [hidden] parameter: defined, 1-D, the input's dtype and device.
void check_vector(const at::Tensor& v, const char* name, const at::Tensor& in) {
  const int64_t hidden = in.size(-1);
  TORCH_CHECK_VALUE(v.dim() == 1 && v.size(0) == hidden, op_name(kOp), ": ", name, " has shape ", v.sizes(),
                    "; expected [", hidden, "] (the input's last dimension, of input ", in.sizes(), ")");
  TORCH_CHECK_TYPE(v.scalar_type() == in.scalar_type() && v.device() == in.device(), op_name(kOp), ": ", name, " is ",
                   v.scalar_type(), " on ", v.device(), "; expected the input's ", in.scalar_type(), " on ",
                   in.device());
}

void check_params(const at::Tensor& in, const AllReduceFusionParams& p) {
  TORCH_CHECK_VALUE(in.defined() && in.dim() >= 1, op_name(kOp), ": allreduce_in must be a tensor [..., hidden]; got ",
                    in.defined() ? "a 0-d tensor" : "an undefined tensor");
  TORCH_CHECK_TYPE(is_fusion_dtype(in.scalar_type()), op_name(kOp), ": allreduce_in is ", in.scalar_type(),
                   "; expected float32, bfloat16 or float16 (use all_reduce and the separate steps for other dtypes)");
  TORCH_CHECK_VALUE(in.size(-1) > 0, op_name(kOp), ": allreduce_in ", in.sizes(), " has no hidden dimension");
  TORCH_CHECK_VALUE(in.is_cpu() || in.is_cuda(), op_name(kOp), ": allreduce_in is on ", in.device(),
                    "; expected a CPU or CUDA tensor");
  if (p.bias.defined()) check_vector(p.bias, "bias", in);
  if (p.residual_in.defined()) {
    TORCH_CHECK_VALUE(p.residual_in.sizes() == in.sizes(), op_name(kOp), ": residual_in has shape ",
                      p.residual_in.sizes(), "; expected allreduce_in's ", in.sizes());
    TORCH_CHECK_TYPE(p.residual_in.scalar_type() == in.scalar_type() && p.residual_in.device() == in.device(),
                     op_name(kOp), ": residual_in is ", p.residual_in.scalar_type(), " on ", p.residual_in.device(),
                     "; expected the input's ", in.scalar_type(), " on ", in.device());
  }
  if (p.norm == AllReduceFusionNorm::kNone) {
    TORCH_CHECK_VALUE(!p.norm_weight.defined() && !p.norm_bias.defined(), op_name(kOp),
                      ": norm_weight / norm_bias given with norm=none; set params.norm");
    TORCH_CHECK_VALUE(p.quant_out == AllReduceFusionQuant::kNone, op_name(kOp), ": quant_out=", p.quant_out,
                      " quantizes the norm's output but norm=none; set params.norm");
    return;
  }
  TORCH_CHECK_VALUE(p.norm_weight.defined(), op_name(kOp), ": norm=", p.norm, " needs norm_weight");
  check_vector(p.norm_weight, "norm_weight", in);
  if (p.norm_bias.defined()) {
    TORCH_CHECK_VALUE(p.norm == AllReduceFusionNorm::kLayerNorm, op_name(kOp), ": norm_bias given with norm=", p.norm,
                      "; only layer_norm has a bias");
    check_vector(p.norm_bias, "norm_bias", in);
  }
  TORCH_CHECK_VALUE(p.eps >= 0 && std::isfinite(p.eps), op_name(kOp), ": eps=", p.eps,
                    " must be finite and non-negative");
}

Fingerprint fusion_fingerprint(const at::Tensor& in, const AllReduceFusionParams& p, AllReduceStrategy taken,
                               WirePrecision wire) {
  const int64_t code = static_cast<int64_t>(p.norm) | static_cast<int64_t>(p.quant_out) << 4 |
                       int64_t{p.bias.defined()} << 8 | int64_t{p.residual_in.defined()} << 9 |
                       int64_t{p.norm_bias.defined()} << 10;
  Fingerprint f = fingerprint(CallKind::kAllReduceFusion, &in, -1, code, taken, nullptr, wire);
  std::memcpy(&f[14], &p.eps, sizeof(double));
  return f;
}

// Tells the peers that this rank refused its arguments (they are waiting to compare
// this call with theirs), so they fail now instead of at the timeout. Best effort: the
// rank's own error is the one that matters here.
void refuse_collectively(const CommunicatorState& s, const at::Tensor& in) {
  if (s.world == 1 || !s.options.verify_calls) return;
  try {
    ensure_host_ids(s, kOp);
    Fingerprint refused;
    refused.fill(-1);
    refused[0] = static_cast<int64_t>(CallKind::kAllReduceFusion);
    refused[13] = kRefusedCall;
    verify_call(s, kOp, refused, in.defined() ? in.device() : at::Device(at::kCPU));
  } catch (const std::exception&) {
    // The peers disagreed with the refusal, as they should: they throw too.
  }
}

// `given` if the caller passed it (checked to be what would be allocated), else a new tensor.
at::Tensor output(const at::Tensor& given, const char* name, at::IntArrayRef shape, const at::TensorOptions& options) {
  if (!given.defined()) return at::empty(shape, options);
  TORCH_CHECK_VALUE(given.sizes() == shape && given.scalar_type() == options.dtype().toScalarType() &&
                        given.device() == options.device() && given.is_contiguous(),
                    op_name(kOp), ": the given ", name, " is ", given.scalar_type(), given.sizes(), " on ",
                    given.device(), (given.is_contiguous() ? "" : ", not contiguous"), "; expected a contiguous ",
                    options.dtype(), shape, " on ", options.device());
  return given;
}

// The outputs (those in `out` reused), and the raw view of the call the epilogue reads.
FusionRows plan_rows(const at::Tensor& x, const AllReduceFusionParams& p, const at::Tensor& residual,
                     AllReduceFusionResult& out) {
  FusionRows rows;
  rows.hidden = x.size(-1);
  rows.rows = x.numel() / rows.hidden;
  rows.dtype = x.scalar_type();
  rows.norm = p.norm;
  rows.quant = p.quant_out;
  rows.eps = static_cast<float>(p.eps);
  out.residual_out = output(out.residual_out, "residual_out", x.sizes(), x.options());
  rows.residual_out = out.residual_out.data_ptr();
  if (residual.defined()) rows.residual_in = residual.data_ptr();
  if (p.norm == AllReduceFusionNorm::kNone) return rows;
  rows.norm_weight = p.norm_weight.data_ptr();
  if (p.norm_bias.defined()) rows.norm_bias = p.norm_bias.data_ptr();
  out.norm_out = output(out.norm_out, "norm_out", x.sizes(), x.options());
  rows.norm_out = out.norm_out.data_ptr();
  if (p.quant_out == AllReduceFusionQuant::kNone) return rows;
  const auto code = p.quant_out == AllReduceFusionQuant::kFp8PerToken ? at::kFloat8_e4m3fn : at::kChar;
  out.quant_out = output(out.quant_out, "quant_out", x.sizes(), x.options().dtype(code));
  std::vector<int64_t> scale_shape = x.sizes().vec();
  scale_shape.back() = 1;
  out.scale_out = output(out.scale_out, "scale_out", scale_shape, x.options().dtype(at::kFloat));
  rows.quant_out = out.quant_out.data_ptr();
  rows.scale_out = out.scale_out.data_ptr<float>();
  return rows;
}

// The epilogue over an already reduced sum [rows, hidden] (the composed path, world 1).
void finish_all(const FusionRows& rows, const at::Tensor& sum) {
#ifdef TP_WITH_CUDA
  if (sum.is_cuda()) {
    launch_fusion_epilogue_cuda(rows, sum.data_ptr());
    return;
  }
#endif
  TORCH_INTERNAL_ASSERT(sum.is_cpu(), "all_reduce_fusion: a ", sum.device(), " tensor in a build without CUDA");
  // Row by row on this thread: no ATen op, so no OpenMP team spinning beside the ranks.
  const at::Tensor c = sum.contiguous();
  const auto* base = static_cast<const char*>(c.data_ptr());
  for (int64_t r = 0; r < rows.rows; ++r) {
    const void* part = base + r * rows.hidden * c.element_size();
    rows.finish(r, &part, 1, c.scalar_type());
  }
}

// Contiguous, and with the bias kept out of the way of a parameter that records grad.
// (A detach only where autograd would record: it allocates a tensor, a few percent of a
// decode boundary.)
at::Tensor plain(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.requires_grad() ? t.detach().contiguous() : t.contiguous();
}

}  // namespace

AllReduceFusionResult all_reduce_fusion_impl(const CommunicatorState& s, const at::Tensor& in_arg,
                                             const AllReduceFusionParams& p_arg, AllReduceFusionResult out) {
  FusionRows rows;
  at::Tensor x, residual;
  AllReduceFusionParams p = p_arg;
  try {
    check_params(in_arg, p_arg);
    p.bias = plain(p.bias);
    p.norm_weight = plain(p.norm_weight);
    p.norm_bias = plain(p.norm_bias);
    x = plain(in_arg);
    residual = plain(p.residual_in);
    rows = plan_rows(x, p, residual, out);
    // The row layers' bias contract: rank 0's copy joins rank 0's partial sum, so it is
    // counted once, and ranks whose copies differ (a randomly initialized layer) still
    // end with the same bits, those of the unfused path.
    if (p.bias.defined() && s.rank == 0) x = x + p.bias;
  } catch (...) {
    refuse_collectively(s, in_arg);
    throw;
  }
  ensure_host_ids(s, kOp);
  const AllReduceStrategy taken = resolve_strategy(s, p.strategy, x);
  check_possible(s, taken, x, kOp);
  const WirePrecision wire = resolve_wire(s, p.wire, taken, x);
  count_call(s, x, p.strategy, taken, wire, kOp);
  if (s.world == 1) {
    finish_all(rows, x);
    return out;
  }
  // Shapes agree across ranks, so every rank skips an empty call alike.
  if (rows.rows == 0) return out;
  const bool bf16 = wire == WirePrecision::kBFloat16;
  const bool fused = is_shared_memory(taken) && ShmAllReduce::fits_fused(rows, bf16);
  // As all_reduce: a shared-memory step compares the call in the step that moves its
  // data; the first one (which creates the workspace) and the other paths exchange it first.
  const bool shm_step = is_shared_memory(taken) && s.shm != nullptr;
  const Fingerprint mine = fusion_fingerprint(x, p, taken, wire);
  if (!shm_step) verify_call(s, kOp, mine, x.device());
  const Fingerprint* in_step = shm_step && s.options.verify_calls ? &mine : nullptr;
  if (fused) {
    shm_workspace(s).run_fused(
        x, rows, taken == AllReduceStrategy::kSharedMemoryTwoShot, bf16, kOp, in_step,
        [&](int64_t rank, const Fingerprint& theirs) { calls_disagree(s, kOp, mine, rank, theirs); });
    return out;
  }
  at::Tensor sum = x.clone();
  run_all_reduce(s, sum, taken, bf16, kOp, in_step);
  finish_all(rows, sum);
  return out;
}

}  // namespace detail

AllReduceFusionResult Communicator::all_reduce_fusion(const at::Tensor& allreduce_in,
                                                      const AllReduceFusionParams& params,
                                                      AllReduceFusionResult out) const {
  return detail::all_reduce_fusion_impl(*state_, allreduce_in, params, std::move(out));
}

AllReduceFusionResult Communicator::all_reduce_fusion(const at::Tensor& allreduce_in,
                                                      const AllReduceFusionParams& params) const {
  return detail::all_reduce_fusion_impl(*state_, allreduce_in, params, {});
}

}  // namespace tp
