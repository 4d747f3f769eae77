#include "layers/numerics/invariant_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "cpu/invariant_gemm.h"
#include "tp/layers/numerics/numerics.h"

namespace tp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t rows_of(at::IntArrayRef shape) {
  int64_t t = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) t *= shape[i];
  return t;
}

// The canonical sum over a whole local dimension (no other rank holds any of it) from
// its pieces [pieces, M, n]; zeros [M, n] for an empty dimension.
at::Tensor local_sum(const at::Tensor& pieces, int64_t length, int64_t chunk) {
  const at::Tensor s = evaluate_whole(chunks_of(length, chunk), pieces);
  return s.defined() ? s : at::zeros(pieces.sizes().slice(1), pieces.options());
}

// The forward's reduced y [T, out_local] float32, before the bias.
at::Tensor forward_sum(const InvariantPlan& p, const at::Tensor& x2, const at::Tensor& weight) {
  const int64_t t = x2.size(0), out = weight.size(0);
  const at::Tensor pieces = cpu::invariant_gemm_pieces(x2, p.packed_weight(weight), out, p.in_first_chunk, p.in_chunk);
  if (!p.in_across_ranks) return local_sum(pieces, x2.size(1), p.in_chunk);
  at::Tensor y = canonical_sums(p.comm, {p.in_sum}, {pieces}, {t, out}).at(0);
  return y.defined() ? y : at::zeros({t, out}, x2.options());
}

// grad_x [T, in_local] float32: the segments' canonical sums over out_features, in order.
at::Tensor input_grad(const InvariantPlan& p, const at::Tensor& g, const at::Tensor& weight) {
  const int64_t t = g.size(0), in = weight.size(1);
  std::vector<at::Tensor> pieces;
  for (const auto& s : p.out_mine) {
    const at::Tensor a = g.narrow(1, s.local_offset, s.rows).contiguous();
    const at::Tensor b = cpu::invariant_pack(weight.narrow(0, s.local_offset, s.rows).t().contiguous());
    pieces.push_back(cpu::invariant_gemm_pieces(a, b, in, s.first_chunk, s.chunk));
  }
  std::vector<at::Tensor> sums;
  if (p.out_across_ranks) {
    sums = canonical_sums(p.comm, p.out_sums, pieces, {t, in});
  } else {
    for (size_t i = 0; i < pieces.size(); ++i) sums.push_back(evaluate_whole(p.out_sums[i].leaves, pieces[i]));
  }
  at::Tensor out;
  for (const auto& s : sums)
    if (s.defined()) out = out.defined() ? out + s : s;
  return out.defined() ? out : at::zeros({t, in}, g.options());
}

// The replicated rows' output gradient is the same on every holder (InvariantPlan::ReplicaSlot).
void check_replicas(const InvariantPlan& p, const at::Tensor& g) {
  const int64_t world = p.comm.world_size(), rank = p.comm.rank(), t = g.size(0);
  at::Tensor buffer = at::zeros({1, t, p.replica_rows}, g.options());
  for (const auto& s : p.replica_slots) {
    const int64_t local = s.local_offset_by_rank[rank];
    if (local >= 0) buffer[0].narrow(1, s.slot_offset, s.rows).copy_(g.narrow(1, local, s.rows));
  }
  const at::Tensor all = p.comm.all_gather(buffer, 0, std::vector<int64_t>(world, 1));
  for (const auto& s : p.replica_slots) {
    int64_t first = -1;
    for (int64_t r = 0; r < world; ++r) {
      if (s.local_offset_by_rank[r] < 0) continue;
      if (first < 0) {
        first = r;
        continue;
      }
      TORCH_CHECK_VALUE(at::equal(all[r].narrow(1, s.slot_offset, s.rows), all[first].narrow(1, s.slot_offset, s.rows)),
                        p.layer,
                        ": invariant numerics needs the gradient of replicated KV rows whole and equal on "
                        "every rank that holds them, but ranks ",
                        first, " and ", r,
                        " differ (tp's attention, "
                        "DecoderLayer, makes it so; an attention of your own must sum each KV head's gradient over its "
                        "whole group on every replica)");
    }
  }
}

struct Saved : torch::CustomClassHolder {
  std::shared_ptr<const InvariantPlan> plan;
  std::vector<int64_t> x_shape;
  at::ScalarType x_dtype = at::kFloat;
  bool add_bias = false, has_bias = false;
};

at::Tensor compute(const InvariantPlan& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   bool add_bias) {
  const auto shape = x.sizes();
  const at::Tensor x2 = x.reshape({rows_of(shape), shape.back()}).to(at::kFloat).contiguous();
  at::Tensor y = forward_sum(p, x2, weight);
  if (add_bias && bias.defined()) y = y + bias.to(at::kFloat);
  auto out_shape = shape.vec();
  out_shape.back() = weight.size(0);
  return y.to(x.scalar_type()).view(out_shape);
}

struct InvariantLinear : torch::autograd::Function<InvariantLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const std::shared_ptr<const InvariantPlan>& plan,
                            bool add_bias) {
    at::Tensor y = compute(*plan, x, weight, bias.value_or(at::Tensor()), add_bias);
    auto s = c10::make_intrusive<Saved>();
    s->plan = plan;
    s->x_shape = x.sizes().vec();
    s->x_dtype = x.scalar_type();
    s->add_bias = add_bias;
    s->has_bias = bias.has_value();
    ctx->saved_data["tp"] = at::IValue::make_capsule(std::move(s));
    ctx->save_for_backward({x, weight});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data.at("tp").toCapsule());
    const auto& p = *s->plan;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const int64_t t = rows_of(s->x_shape), in = weight.size(1), out = weight.size(0);
    const at::Tensor g = grads[0].reshape({t, out}).to(at::kFloat).contiguous();
    if (p.replica_rows > 0) check_replicas(p, g);
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = input_grad(p, g, weight).to(s->x_dtype).view(s->x_shape);
    const at::Tensor gt =
        ctx->needs_input_grad(1) || (s->has_bias && ctx->needs_input_grad(2)) ? g.t().contiguous() : at::Tensor();
    if (ctx->needs_input_grad(1)) {
      const at::Tensor xt = x.reshape({t, in}).t().contiguous();
      const at::Tensor pieces = cpu::invariant_gemm_pieces(gt, cpu::invariant_pack(xt), in, 0, kInvariantChunk);
      grad_w = local_sum(pieces, t, kInvariantChunk).to(weight.scalar_type());
    }
    if (s->has_bias && ctx->needs_input_grad(2)) {
      const at::Tensor pieces = cpu::invariant_sum_pieces(gt, 0, kInvariantChunk);
      grad_b = local_sum(pieces, t, kInvariantChunk).view({out}).to(s->x_dtype);
    }
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor InvariantPlan::packed_weight(const at::Tensor& weight) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto stamp = cpu::TensorStamp::of({weight});
  if (!packed_.defined() || stamp != stamp_) {
    packed_ = cpu::invariant_pack(weight.detach());
    stamp_ = stamp;
  }
  return packed_;
}

std::shared_ptr<InvariantPlan> row_invariant_plan(const std::string& layer, const Communicator& comm,
                                                  int64_t in_features, int64_t out_features,
                                                  const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                                  int64_t granularity) {
  auto p = std::make_shared<InvariantPlan>();
  p->comm = comm;
  p->layer = layer;
  p->in_chunk = invariant_chunk(granularity);
  p->in_across_ranks = comm.world_size() > 1;
  p->in_sum = split_sum(in_features, p->in_chunk, ranges, layer.c_str());
  p->in_first_chunk = ranges.at(comm.rank()).first / p->in_chunk;
  // out_features whole on every rank: one local sum.
  p->out_mine = {{0, out_features, 0, kInvariantChunk}};
  p->out_sums = {CanonicalSum{chunks_of(out_features, kInvariantChunk), {}}};
  return p;
}

std::shared_ptr<InvariantPlan> column_invariant_plan(const std::string& layer, const Communicator& comm,
                                                     const std::vector<SegmentPlan>& plans, int64_t in_features,
                                                     int64_t granularity) {
  auto p = std::make_shared<InvariantPlan>();
  p->comm = comm;
  p->layer = layer;
  p->in_chunk = kInvariantChunk;
  p->in_sum = CanonicalSum{chunks_of(in_features, kInvariantChunk), {}};
  p->out_across_ranks = comm.world_size() > 1;
  const int64_t chunk = invariant_chunk(granularity);
  const auto& mine = plans.at(comm.rank());
  for (size_t s = 0; s < mine.pieces.size(); ++s) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<Range> seen;
    for (const auto& plan : plans) {
      const auto& piece = plan.pieces[s];
      const bool first = piece.size() > 0 && std::find(seen.begin(), seen.end(), piece.source) == seen.end();
      if (first) seen.push_back(piece.source);
      ranges.emplace_back(first ? piece.source.begin : 0, first ? piece.source.end : 0);
    }
    for (const auto& source : seen) {
      InvariantPlan::ReplicaSlot slot{p->replica_rows, source.size(), {}};
      int64_t holders = 0;
      for (const auto& plan : plans) {
        const auto& piece = plan.pieces[s];
        const bool held = piece.size() > 0 && piece.source == source;
        holders += held ? 1 : 0;
        slot.local_offset_by_rank.push_back(held ? piece.local_offset : -1);
      }
      if (holders < 2) continue;
      p->replica_rows += slot.rows;
      p->replica_slots.push_back(std::move(slot));
    }
    const std::string what = layer + " (segment '" + mine.pieces[s].name + "')";
    p->out_sums.push_back(split_sum(mine.pieces[s].segment_size, chunk, ranges, what.c_str()));
    const auto& r = ranges.at(comm.rank());
    p->out_mine.push_back({mine.pieces[s].local_offset, r.second - r.first, r.first / chunk, chunk});
  }
  return p;
}

void check_invariant_supported(const std::string& layer, const QuantMethod& method, const at::Device& device) {
  TORCH_CHECK_VALUE(method.trainable(), layer, ": invariant numerics covers unquantized layers; the ", method.name(),
                    " format's GEMM does not follow the canonical order (use numerics=default)");
  TORCH_CHECK_VALUE(device.is_cpu(), layer, ": invariant numerics runs on the CPU; this layer is on ", device,
                    " (use numerics=default)");
}

SplitPolicy invariant_split_policy(const SplitPolicy& policy, int64_t size) {
  if (!policy.weights.empty() || policy.granularity <= 0) return policy;
  if (size % policy.granularity != 0 && !policy.partial_tail) return policy;
  return policy.with_granularity(std::lcm(policy.granularity, kInvariantChunk)).with_partial_tail(true);
}

at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool add_bias,
                            const std::shared_ptr<const InvariantPlan>& plan) {
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!grad) {
    at::NoGradGuard no_grad;
    return compute(*plan, x, weight, bias, add_bias);
  }
  return InvariantLinear::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, plan,
                                add_bias);
}

}  // namespace tp::detail
