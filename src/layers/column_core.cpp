#include "layers/column_core.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "layers/layer_common.h"
#include "layers/loading/strict_load.h"
#include "layers/lora/lora_base.h"
#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"
#include "tp/loader/load_shard.h"

namespace tp::detail {

std::shared_ptr<ColumnCore> make_column_core(const std::string& layer, const ColumnSpec& spec, const Communicator& comm,
                                             const ColumnPlanner& plan_of, torch::nn::Module& owner) {
  const auto method = make_quant_method(spec.quant);
  const bool invariant = resolve_numerics(spec.numerics) == Numerics::kInvariant;
  if (invariant) check_invariant_supported(layer, *method, spec.device);
  auto policy = aligned_policy(layer, spec.split, *method, ShardMode::kColumn);
  if (invariant && spec.invariant_size > 0) policy = invariant_split_policy(policy, spec.invariant_size);
  auto plans = with_layer_context(layer, [&] {
    std::vector<SegmentPlan> all;
    for (int64_t r = 0; r < comm.world_size(); ++r) all.push_back(plan_of(r, policy));
    return all;
  });
  auto core = std::make_shared<ColumnCore>(layer, comm, plans, spec.in_features, method, spec.bias,
                                           at::TensorOptions().dtype(spec.dtype).device(spec.device), owner);
  std::shared_ptr<const InvariantPlan> plan;
  if (invariant) {
    const int64_t boundaries = spec.boundary_granularity > 0 ? spec.boundary_granularity : policy.granularity;
    plan = column_invariant_plan(layer, comm, plans, spec.in_features, boundaries);
  }
  std::vector<int64_t> out_sizes;
  for (const auto& p : plans) out_sizes.push_back(p.local_size);
  core->set_step(spec.sequence_parallel ? Reduction::all_gather(comm, spec.sequence_dim, {}, /*partial_grad=*/true)
                                        : Reduction::none(comm),
                 spec.gather_output ? Reduction::all_gather(comm, -1, out_sizes) : Reduction::none(comm),
                 std::move(plan));
  return core;
}

ColumnCore::ColumnCore(std::string layer, Communicator comm, std::vector<SegmentPlan> plans, int64_t in_features,
                       std::shared_ptr<QuantMethod> method, bool bias, const at::TensorOptions& options,
                       torch::nn::Module& owner)
    : layer_(std::move(layer)),
      comm_(std::move(comm)),
      plans_(std::move(plans)),
      in_features_(in_features),
      method_(std::move(method)) {
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(plans_.size()) == comm_.world_size());
  const int64_t out_local = plan().local_size;
  method_->create_weights(owner, out_local, in_features_, options);
  weight_ = method_->weight();
  if (bias) bias_ = owner.register_parameter("bias", at::empty({out_local}, options));

  // Replicated pieces: a segment piece whose source rows other ranks hold as well (KV
  // heads when world > num_kv_heads). Each such group gets one slot of the backward's
  // replica all-reduce, numbered in (segment, first holder) order, the same on every rank.
  auto replicas = std::make_shared<ReplicaSum>();
  replicas->comm = comm_;
  const auto& mine = plan();
  for (size_t s = 0; s < mine.pieces.size(); ++s) {
    std::vector<Range> seen;
    for (const auto& p : plans_) {
      const auto& piece = p.pieces[s];
      if (piece.size() == 0 || std::find(seen.begin(), seen.end(), piece.source) != seen.end()) continue;
      int64_t holders = 0;
      for (const auto& q : plans_) {
        const Range other = q.pieces[s].source;
        const bool overlaps = other.begin < piece.source.end && piece.source.begin < other.end;
        TORCH_INTERNAL_ASSERT(!overlaps || other == piece.source, layer_, ": segment '", piece.name,
                              "' has pieces that overlap without being equal: ", piece.source, " and ", other);
        holders += overlaps ? 1 : 0;
      }
      seen.push_back(piece.source);
      if (holders < 2) continue;
      if (mine.pieces[s].source == piece.source)
        replicas->mine.push_back({mine.pieces[s].local_offset, replicas->rows, piece.size()});
      replicas->rows += piece.size();
    }
  }
  if (replicas->rows > 0) replicas_ = std::move(replicas);
}

void ColumnCore::reset_parameters() {
  method_->reset_parameters(in_features_);
  reset_bias(bias_, in_features_);
}

void ColumnCore::set_step(Reduction entry, Reduction exit, std::shared_ptr<const InvariantPlan> invariant) {
  entry_ = entry;
  exit_ = std::move(exit);
  auto base = std::make_shared<LoRABase>();
  base->layer = layer_;
  base->comm = comm_;
  base->in_features = in_features_;
  base->plans = plans_;
  // One segment (ColumnParallelLinear): its adapter's segment is "linear", as a row layer's.
  for (auto& p : base->plans)
    if (p.pieces.size() == 1) p.pieces[0].name = "linear";
  base->entry = entry;
  if (replicas_) {
    for (const auto& p : replicas_->mine) base->replicas.push_back({p.local_offset, p.slot_offset, p.rows});
    base->replica_rows = replicas_->rows;
  }
  base->invariant = invariant != nullptr;
  base->options = at::TensorOptions().dtype(method_->activation_dtype()).device(method_->weight_device());
  lora_ = std::make_shared<LoRAImpl>(std::move(base));
  step_ = make_column_step(
      {layer_, method_, std::move(entry), plan().local_size, in_features_, replicas_, std::move(invariant)});
}

at::Tensor ColumnCore::forward(const at::Tensor& x) const {
  check_input(layer_, x, in_features_, "in_features", method_->activation_dtype(), method_->weight_device());
  at::Tensor y = step_->forward(x, weight_, bias_);
  if (lora_->active()) y = lora_->add_to(x, std::move(y));
  // gather_output: the output's all-gather, with every segment rebuilt whole (gather()).
  return exit_.op == ReduceOp::kAllGather ? gather(y, exit_.dim) : y;
}

TokenQuant ColumnCore::input_quant(const at::Tensor& x) const {
  // An adapter reads the input itself: the codes would not do.
  const bool takes = step_->name() == "default/column" && entry_.op == ReduceOp::kNone && !lora_->active();
  return takes && x.defined() ? method_->token_quant(x) : TokenQuant::kNone;
}

at::Tensor ColumnCore::forward_quantized(const at::Tensor& codes, const at::Tensor& scales) const {
  TORCH_CHECK_VALUE(codes.defined() && codes.dim() >= 1 && codes.size(-1) == in_features_, layer_,
                    ": pre-quantized input must be [..., in_features = ", in_features_, "]; got ",
                    codes.defined() ? codes.sizes() : c10::IntArrayRef{});
  TORCH_CHECK_VALUE(!lora_->active(), layer_,
                    ": a pre-quantized input is not taken while an adapter is selected (it reads the input itself)");
  const at::Tensor y = step_->forward_quantized(codes, scales, bias_);
  return exit_.op == ReduceOp::kAllGather ? gather(y, exit_.dim) : y;
}

at::Tensor ColumnCore::gather(const at::Tensor& y_local, int64_t dim) const {
  if (comm_.world_size() == 1) return y_local;
  std::vector<int64_t> sizes;
  for (const auto& p : plans_) sizes.push_back(p.local_size);
  // One collective for all segments; then each segment is rebuilt from the ranks'
  // pieces in source order. A replicated piece (KV heads when world > num_kv_heads)
  // is taken once, from its first holder. All of it is autograd ops over a
  // differentiable all-gather, so the backward routes every piece's gradient to the
  // rank it came from (zeros to the copies not taken).
  const at::Tensor all = gather_from_parallel(y_local, comm_, dim, sizes);
  std::vector<at::Tensor> out;
  const auto& mine = plan();
  for (size_t s = 0; s < mine.pieces.size(); ++s) {
    std::vector<std::pair<Range, at::Tensor>> blocks;  // (source range, data)
    int64_t rank_offset = 0;
    for (const auto& p : plans_) {
      const auto& piece = p.pieces[s];
      const bool seen =
          std::any_of(blocks.begin(), blocks.end(), [&](const auto& b) { return b.first == piece.source; });
      if (!seen && piece.size() > 0)
        blocks.emplace_back(piece.source, all.narrow(dim, rank_offset + piece.local_offset, piece.size()));
      rank_offset += p.local_size;
    }
    std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
    int64_t covered = 0;
    for (const auto& b : blocks) {
      TORCH_INTERNAL_ASSERT(b.first.begin == covered, layer_, ": segment '", mine.pieces[s].name,
                            "' pieces do not tile it");
      covered = b.first.end;
      out.push_back(b.second);
    }
    TORCH_INTERNAL_ASSERT(covered == mine.pieces[s].segment_size);
  }
  return out.empty() ? all : at::cat(out, dim);
}

std::pair<at::Tensor, at::Tensor> ColumnCore::gather_parameters() const {
  TORCH_CHECK_VALUE(method_->trainable(), layer_, ": gather_weights needs an unquantized layer; this one is ",
                    method_->name(), ", whose weights are frozen (they are still the checkpoint's)");
  at::NoGradGuard no_grad;
  at::Tensor w = gather(weight_, 0);
  at::Tensor b = bias_.defined() ? gather(bias_, 0) : at::Tensor();
  // At world size 1 the gather is the parameter itself: hand out a copy.
  w = w.is_same(weight_) ? w.clone() : w.contiguous();
  if (b.defined()) b = b.is_same(bias_) ? b.clone() : b.contiguous();
  return {w, b};
}

std::vector<at::Tensor> ColumnCore::split(const at::Tensor& y, bool gathered) const {
  const auto& mine = plan();
  const int64_t expected = gathered ? mine.global_size : mine.local_size;
  TORCH_CHECK_VALUE(y.defined() && y.dim() >= 1 && y.size(-1) == expected, layer_, ": cannot split a tensor of shape ",
                    y.sizes(), "; expected [..., ", expected, "] (the ", gathered ? "gathered" : "local", " output)");
  std::vector<at::Tensor> parts;
  for (const auto& piece : mine.pieces) {
    parts.push_back(gathered ? y.narrow(-1, piece.fused_offset, piece.segment_size)
                             : y.narrow(-1, piece.local_offset, piece.size()));
  }
  return parts;
}

void ColumnCore::load(const Checkpoint& checkpoint, const std::vector<std::string>& prefixes) {
  const auto& mine = plan();
  TORCH_INTERNAL_ASSERT(prefixes.size() == mine.pieces.size());
  std::vector<WeightPart> parts;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    const auto& piece = mine.pieces[i];
    parts.push_back({prefixes[i], piece.source, piece.local_offset, piece.segment_size});
  }
  load_parts(checkpoint, parts, layer_);
}

void ColumnCore::load_parts(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts,
                            const std::string& what) {
  std::vector<std::string> prefixes;
  for (const auto& part : parts) prefixes.push_back(part.prefix);
  // Collective: a failure on any rank (a bad slice only it reads) fails every rank.
  run_collectively(comm_, layer_ + ".load_weights", [&] {
    load_strictly(checkpoint, prefixes, {what, bias_.defined(), method_->name(), method_->trainable()},
                  [&](const Checkpoint& ckpt) { load_local(ckpt, parts, what); });
  });
}

void ColumnCore::load_local(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts,
                            const std::string& what) {
  // Every local row is written by exactly one part: a gap would keep stale weights.
  std::vector<Range> local;
  for (const auto& part : parts) {
    if (part.range.size() > 0) local.push_back({part.local_offset, part.local_offset + part.range.size()});
  }
  std::sort(local.begin(), local.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  int64_t covered = 0;
  for (const auto& r : local) {
    TORCH_INTERNAL_ASSERT(r.begin == covered, what, ": load parts do not tile the local rows at ", covered);
    covered = r.end;
  }
  TORCH_INTERNAL_ASSERT(covered == plan().local_size, what, ": load parts cover ", covered, " of ", plan().local_size,
                        " local rows");
  method_->load(checkpoint, parts, ShardMode::kColumn, what);
  method_->finalize();
  if (!bias_.defined()) return;
  at::NoGradGuard no_grad;
  for (const auto& part : parts) {
    const auto& source = checkpoint.get(part.prefix + ".bias", what);
    check_bias(what, source, part.logical_size);
    bias_.narrow(0, part.local_offset, part.range.size())
        .copy_(load_shard(source, ShardMode::kColumn, part.range, {}, what));
  }
}

}  // namespace tp::detail
