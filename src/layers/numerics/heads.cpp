#include "tp/layers/numerics/heads.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cpu/invariant_gemm.h"
#include "layers/numerics/canonical_sum.h"
#include "tp/layers/numerics/numerics.h"

namespace tp {
namespace {

using detail::canonical_sums;
using detail::CanonicalSum;
using detail::chunks_of;
using detail::evaluate_tree;
using detail::evaluate_whole;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HeadsHolder : torch::CustomClassHolder {
  HeadsByRank q, kv;
  int64_t group = 1;
};

// Rank r's heads of [lo, hi) (global), as the canonical sum's leaves lo.. (empty when none
// or when an earlier rank holds the same heads: each head is counted at its first holder).
Range first_held(const HeadsByRank& h, int64_t r, int64_t lo, int64_t hi) {
  const Range mine = h.ranges[r];
  for (int64_t s = 0; s < r; ++s)
    if (h.ranges[s] == mine) return {0, 0};
  const int64_t b = std::max(mine.begin, lo), e = std::min(mine.end, hi);
  return b < e ? Range{b - lo, e - lo} : Range{0, 0};
}

// The canonical sums of per-head values over heads [lo_g, lo_g + leaves) for every group g
// of `groups`: values [heads_local, ...] float32, this rank's heads from `local_begin`.
// Returns every group's sum (undefined where it has no leaves).
std::vector<at::Tensor> sums_over_heads(const HeadsByRank& h, const at::Tensor& values, int64_t local_begin,
                                        int64_t groups, int64_t leaves) {
  const int64_t world = static_cast<int64_t>(h.ranges.size()), rank = world > 1 ? h.comm.rank() : 0;
  std::vector<CanonicalSum> sums;
  std::vector<at::Tensor> mine;
  const auto shape = values.sizes().slice(1);
  for (int64_t g = 0; g < groups; ++g) {
    CanonicalSum s;
    s.leaves = leaves;
    for (int64_t r = 0; r < world; ++r) {
      const Range held = first_held(h, r, g * leaves, (g + 1) * leaves);
      s.pieces_by_rank.push_back(held.size() ? cpu::dyadic_pieces(held.begin, held.end)
                                             : std::vector<cpu::ChunkSpan>{});
    }
    std::vector<at::Tensor> pieces;
    for (const auto& p : s.pieces_by_rank[rank]) {
      // The piece's subtree from its leaves (this rank's heads g * leaves + lo ..).
      std::vector<cpu::ChunkSpan> leaf_spans;
      std::vector<at::Tensor> leaf_values;
      for (int64_t i = 0; i < p.size; ++i) {
        leaf_spans.push_back({i, 1});
        leaf_values.push_back(values[g * leaves + p.lo + i - local_begin]);
      }
      pieces.push_back(evaluate_tree(p.size, leaf_spans, leaf_values));
    }
    std::vector<int64_t> empty_shape{0};
    for (const auto d : shape) empty_shape.push_back(d);
    mine.push_back(pieces.empty() ? at::empty(empty_shape, values.options()) : at::stack(pieces));
    sums.push_back(std::move(s));
  }
  if (world == 1) {
    std::vector<at::Tensor> out;
    for (size_t g = 0; g < sums.size(); ++g)
      out.push_back(evaluate_tree(sums[g].leaves, sums[g].pieces_by_rank[0], mine[g].unbind(0)));
    return out;
  }
  return canonical_sums(h.comm, sums, mine, shape);
}

struct ExpandKv : torch::autograd::Function<ExpandKv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& k, const c10::intrusive_ptr<HeadsHolder>& heads) {
    const auto& q = heads->q;
    const int64_t rank = q.ranges.size() > 1 ? q.comm.rank() : 0;
    const Range qr = q.ranges[rank], kvr = heads->kv.ranges[rank];
    std::vector<int64_t> index;
    for (int64_t h = qr.begin; h < qr.end; ++h) index.push_back(h / heads->group - kvr.begin);
    ctx->saved_data["heads"] = at::IValue::make_capsule(heads);
    ctx->saved_data["kv_local"] = k.size(1);
    return k.index_select(1, at::tensor(index, at::TensorOptions(at::kLong).device(k.device())));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto heads = c10::static_intrusive_pointer_cast<HeadsHolder>(ctx->saved_data.at("heads").toCapsule());
    const int64_t kv_local = ctx->saved_data.at("kv_local").toInt();
    const auto& q = heads->q;
    const int64_t rank = q.ranges.size() > 1 ? q.comm.rank() : 0;
    const at::Tensor g = grads[0];  // [b, nq_local, L, d]
    // Per query head, [b, L, d], summed over each KV head's group.
    const at::Tensor values = g.transpose(0, 1).to(at::kFloat).contiguous();
    const auto sums = sums_over_heads(q, values, q.ranges[rank].begin, heads->kv.total, heads->group);
    const Range kvr = heads->kv.ranges[rank];
    std::vector<at::Tensor> out;
    for (int64_t h = kvr.begin; h < kvr.end; ++h)
      out.push_back(sums[h].defined() ? sums[h] : at::zeros_like(values[0]));
    at::Tensor grad = kv_local == 0 ? at::zeros({g.size(0), 0, g.size(2), g.size(3)}, g.options())
                                    : at::stack(out, 1).to(g.scalar_type());
    return {grad, at::Tensor()};
  }
};

struct ScaleByWeight : torch::autograd::Function<ScaleByWeight> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& x,
                            const c10::intrusive_ptr<HeadsHolder>& heads) {
    ctx->saved_data["heads"] = at::IValue::make_capsule(heads);
    ctx->save_for_backward({w, x});
    return w * x;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto heads = c10::static_intrusive_pointer_cast<HeadsHolder>(ctx->saved_data.at("heads").toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &w = saved[0], &x = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor grad_w, grad_x;
    if (ctx->needs_input_grad(1)) grad_x = g * w;
    if (ctx->needs_input_grad(0)) {
      const auto& h = heads->q;
      const int64_t d = w.size(-1), rank = h.ranges.size() > 1 ? h.comm.rank() : 0;
      const int64_t local = h.ranges[rank].size();
      // The products in float32; per head and column, summed over tokens by the canonical
      // kernel ([local * d, tokens] rows).
      const at::Tensor p = (g.to(at::kFloat) * x.to(at::kFloat)).reshape({-1, local * d});
      const int64_t tokens = p.size(0), leaves = chunks_of(tokens, kInvariantChunk);
      at::Tensor per_head = evaluate_whole(leaves, cpu::invariant_sum_pieces(p.t().contiguous(), 0, kInvariantChunk));
      per_head = per_head.defined() ? per_head.view({local, d}) : at::zeros({local, d}, p.options());
      const auto sums = sums_over_heads(h, per_head, h.ranges[rank].begin, 1, h.total);
      grad_w = (sums[0].defined() ? sums[0] : at::zeros({d}, p.options())).to(w.scalar_type());
    }
    return {grad_w, grad_x, at::Tensor()};
  }
};

}  // namespace

at::Tensor expand_kv_invariant(const at::Tensor& k, const HeadsByRank& q_heads, const HeadsByRank& kv_heads,
                               int64_t group) {
  auto heads = c10::make_intrusive<HeadsHolder>();
  heads->q = q_heads;
  heads->kv = kv_heads;
  heads->group = group;
  return ExpandKv::apply(k, heads);
}

at::Tensor scale_by_weight_invariant(const at::Tensor& w, const at::Tensor& x, const HeadsByRank& heads) {
  auto holder = c10::make_intrusive<HeadsHolder>();
  holder->q = heads;
  return ScaleByWeight::apply(w, x, holder);
}

}  // namespace tp
