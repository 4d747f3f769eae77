#include "tp/layers/vocab/loss.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>

#include "cpu/invariant_gemm.h"
#include "layers/numerics/canonical_sum.h"
#include "layers/vocab/common.h"

namespace tp {
namespace {

using detail::check_local_logits;
using detail::gather_stacked;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The arithmetic dtype: float32 for half/bfloat16/float32 logits, float64 for float64.
at::ScalarType compute_dtype(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// exp of every element of t (float32) through one scalar path, std::exp in float64 rounded
// once: ATen's exp runs a row's elements through a vector loop and its last few through a
// scalar one, which may round differently, and where a rank's vocabulary slice ends
// depends on the TP size (models/invariant_activation.h says the same of the MLP's
// activation). Invariant numerics only.
at::Tensor exp_elementwise(const at::Tensor& t) {
  const at::Tensor x = t.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) o[i] = static_cast<float>(std::exp(static_cast<double>(in[i])));
  return out;
}

// The canonical sum over the vocabulary of exp [..., real] (float32): each rank's
// subtrees over its chunks, exchanged and evaluated as one device would.
at::Tensor canonical_sum_exp(const at::Tensor& exp, const Communicator& comm, int64_t begin, int64_t real,
                             const detail::CanonicalSum& sum, int64_t chunk) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < exp.dim(); ++d) rows *= exp.size(d);
  const at::Tensor e = exp.reshape({rows, real}).contiguous();
  const at::Tensor pieces = cpu::invariant_sum_pieces(e, begin / chunk, chunk);
  const at::Tensor s = detail::canonical_sums(comm, {sum}, {pieces}, {e.size(0), 1}).at(0);
  return s.defined() ? s : at::zeros({e.size(0), 1}, e.options());
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            const Communicator& comm, int64_t begin, int64_t real, int64_t ignore_index,
                            const std::optional<detail::CanonicalSum>& canonical, int64_t chunk) {
    const auto lf = logits.narrow(-1, 0, real).to(compute_dtype(logits));  // padding columns left out
    const auto row_shape = target.sizes();
    // The row max over all ranks (an empty slice contributes -inf).
    const at::Tensor local_max = real > 0 ? lf.amax(-1) : at::full(row_shape, -kInf, lf.options());
    const at::Tensor max = gather_stacked(local_max, comm).amax(0);
    const at::Tensor shifted = lf - max.unsqueeze(-1);
    const at::Tensor exp = canonical ? exp_elementwise(shifted) : shifted.exp();
    // The target's logit from the rank that owns it, zeros elsewhere; one all-reduce for it and the sum of exps.
    const at::Tensor ignored = target.eq(ignore_index);
    const at::Tensor mine = target.ge(begin).logical_and(target.lt(begin + real));
    const at::Tensor index = (target - begin).masked_fill(mine.logical_not(), 0);
    const at::Tensor picked =
        real > 0 ? shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0)
                 : at::zeros(row_shape, lf.options());
    at::Tensor sum_exp, target_logit;
    if (canonical) {
      // Invariant numerics: the exponentials summed in the canonical tree over the whole
      // vocabulary; the target's logit is one rank's value plus zeros, exact in any order.
      sum_exp = canonical_sum_exp(exp, comm, begin, real, *canonical, chunk).view(row_shape);
      target_logit = picked.contiguous();
      comm.all_reduce(target_logit, AllReduceStrategy::kAuto, WirePrecision::kNative);
    } else {
      at::Tensor sums = at::stack({exp.sum(-1), picked}).contiguous();
      comm.all_reduce(sums, AllReduceStrategy::kAuto, WirePrecision::kNative);
      sum_exp = sums[0];
      target_logit = sums[1];
    }
    const at::Tensor loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0);
    ctx->save_for_backward({exp / sum_exp.unsqueeze(-1), index, mine, ignored});
    ctx->saved_data["width"] = logits.size(-1);
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &softmax = saved[0], &index = saved[1], &mine = saved[2], &ignored = saved[3];
    const at::Tensor grad_loss = grad_outputs[0].to(softmax.scalar_type()).masked_fill(ignored, 0);
    at::Tensor g = softmax.clone();
    if (g.size(-1) > 0) g.scatter_add_(-1, index.unsqueeze(-1), mine.to(g.scalar_type()).neg().unsqueeze(-1));
    g.mul_(grad_loss.unsqueeze(-1));
    const int64_t width = ctx->saved_data.at("width").toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt());
    at::Tensor grad = g.to(dtype);
    if (g.size(-1) < width) grad = at::constant_pad_nd(grad, {0, width - g.size(-1)});  // padding: no gradient
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                        const VocabPartition& partition, const Communicator& comm, int64_t ignore_index,
                                        Numerics numerics) {
  constexpr const char* kOp = "vocab_parallel_cross_entropy";
  check_local_logits(kOp, local_logits, partition, comm);
  TORCH_CHECK_TYPE(target.defined() && target.scalar_type() == at::kLong, kOp, ": target must be int64; got ",
                   target.defined() ? c10::toString(target.scalar_type()) : "an undefined tensor");
  TORCH_CHECK_VALUE(target.sizes() == local_logits.sizes().slice(0, local_logits.dim() - 1), kOp, ": target shape ",
                    target.sizes(), " does not match the logits' rows ", local_logits.sizes(), " (expected [",
                    local_logits.sizes().slice(0, local_logits.dim() - 1), "])");
  TORCH_CHECK_VALUE(target.device() == local_logits.device(), kOp, ": target on ", target.device(), ", logits on ",
                    local_logits.device());
  // A target outside the vocabulary (and not ignore_index) would get a loss from no rank.
  const at::Tensor kept = target.ne(ignore_index);
  if (kept.any().item<bool>())
    detail::check_token_ids(kOp, target.masked_select(kept), partition.vocab_size, target.device());
  const Range real = partition.real(comm.rank());
  std::optional<detail::CanonicalSum> canonical;
  int64_t chunk = 1;
  if (resolve_numerics(numerics) == Numerics::kInvariant && local_logits.scalar_type() != at::kDouble) {
    chunk = detail::invariant_chunk(partition.pad_to_multiple_of);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t r = 0; r < comm.world_size(); ++r) ranges.emplace_back(partition.real(r).begin, partition.real(r).end);
    canonical = detail::split_sum(partition.vocab_size, chunk, ranges, kOp);
  }
  return VocabParallelCrossEntropy::apply(local_logits, target, comm, real.begin, real.size(), ignore_index, canonical,
                                          chunk);
}

at::Tensor vocab_parallel_argmax(const at::Tensor& local_logits, const VocabPartition& partition,
                                 const Communicator& comm) {
  constexpr const char* kOp = "vocab_parallel_argmax";
  check_local_logits(kOp, local_logits, partition, comm);
  at::NoGradGuard no_grad;
  const Range real = partition.real(comm.rank());
  const auto row_shape = local_logits.sizes().slice(0, local_logits.dim() - 1);
  const auto opts = local_logits.options().dtype(at::kDouble);
  // (value, global id) per row as float64: every float dtype converts exactly, and ids
  // up to 2^53 are exact. An empty slice offers -inf.
  at::Tensor value, id;
  if (real.size() > 0) {
    const auto part = local_logits.narrow(-1, 0, real.size());
    const auto local_id = part.argmax(-1);  // the first maximum: the lowest id on this rank
    value = part.gather(-1, local_id.unsqueeze(-1)).squeeze(-1).to(at::kDouble);
    id = (local_id + real.begin).to(at::kDouble);
  } else {
    value = at::full(row_shape, -kInf, opts);
    id = at::zeros(row_shape, opts);
  }
  const at::Tensor all = gather_stacked(at::stack({value, id}, -1), comm);  // [world, ..., 2]
  const at::Tensor values = all.select(-1, 0), ids = all.select(-1, 1);
  // Ranks own increasing ids, so the first rank holding the maximum has its lowest id.
  const at::Tensor winner = values.eq(values.amax(0, /*keepdim=*/true)).to(at::kInt).argmax(0, /*keepdim=*/true);
  return ids.gather(0, winner).squeeze(0).to(at::kLong);
}

}  // namespace tp
