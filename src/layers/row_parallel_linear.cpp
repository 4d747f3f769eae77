#include "tp/layers/row_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/layer_common.h"
#include "layers/loading/strict_load.h"
#include "layers/lora/lora_base.h"
#include "layers/numerics/invariant_linear.h"
#include "layers/step.h"
#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"
#include "tp/loader/load_shard.h"
#include "tp/quant/quant_method.h"

namespace tp {

namespace {
constexpr const char* kLayer = "RowParallelLinear";
}

RowParallelLinearOptions::RowParallelLinearOptions(int64_t in_features, int64_t out_features)
    : in_features_(in_features), out_features_(out_features) {}

RowParallelLinearImpl::RowParallelLinearImpl(RowParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void RowParallelLinearImpl::reset() {
  // Collective: a rank-local failure (options that differ between ranks, an allocation)
  // fails every rank instead of leaving the others in their first collective.
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    detail::check_options(kLayer, {{"in_features", options.in_features()}, {"out_features", options.out_features()}},
                          options.dtype());
    method_ = make_quant_method(options.quant());
    const bool invariant = resolve_numerics(options.numerics()) == Numerics::kInvariant;
    if (invariant) detail::check_invariant_supported(kLayer, *method_, options.device());
    auto policy = detail::aligned_policy(kLayer, options.split(), *method_, ShardMode::kRow);
    if (invariant) policy = detail::invariant_split_policy(policy, options.in_features());
    ranges_ = detail::with_layer_context(
        kLayer, [&] { return split(options.in_features(), comm.world_size(), policy, "in_features"); });
    range_ = ranges_.at(comm.rank());
    std::shared_ptr<const detail::InvariantPlan> plan;
    if (invariant) {
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const auto& r : ranges_) ranges.emplace_back(r.begin, r.end);
      plan = detail::with_layer_context(kLayer, [&] {
        return detail::row_invariant_plan(kLayer, comm, options.in_features(), options.out_features(), ranges,
                                          policy.granularity);
      });
    }
    // The options spell the output's reduction (tp/comm/reduction.h).
    exit_ = !options.reduce_output()      ? Reduction::none(comm)
            : options.sequence_parallel() ? Reduction::reduce_scatter(comm, options.sequence_dim())
                                          : Reduction::all_reduce(comm, options.all_reduce(), options.wire());
    const auto tensor_options = at::TensorOptions().dtype(options.dtype()).device(options.device());
    method_->create_weights(*this, options.out_features(), range_.size(), tensor_options);
    weight = method_->weight();
    bias =
        options.bias() ? register_parameter("bias", at::empty({options.out_features()}, tensor_options)) : at::Tensor();
    auto base = std::make_shared<detail::LoRABase>();
    base->layer = kLayer;
    base->comm = comm;
    base->row = true;
    base->in_features = options.in_features();
    base->in_ranges = ranges_;
    base->plans = {plan_single("linear", options.out_features(), 1, 0)};
    base->invariant = plan != nullptr;
    base->options = at::TensorOptions().dtype(method_->activation_dtype()).device(method_->weight_device());
    lora_ = std::make_shared<LoRAImpl>(std::move(base));
    step_ =
        detail::make_row_step({kLayer, method_, exit_, options.out_features(), range_.size(), std::move(plan), lora_});
    if (options.init_weights()) reset_parameters();
  });
}

void RowParallelLinearImpl::reset_parameters() {
  method_->reset_parameters(options.in_features());
  detail::reset_bias(bias, options.in_features());
}

void RowParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::RowParallelLinear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", local_in=" << range_;
  if (!options.input_is_parallel()) stream << ", input_is_parallel=false";
  if (!options.reduce_output()) stream << ", reduce_output=false";
  if (options.all_reduce() != AllReduceStrategy::kAuto) stream << ", all_reduce=" << to_string(options.all_reduce());
  if (options.wire() != WirePrecision::kDefault) stream << ", wire=" << to_string(options.wire());
  detail::print_tail(stream, options.bias(), /*gather_output=*/false, *method_, comm, options.sequence_parallel());
}

at::Tensor RowParallelLinearImpl::local_input(const at::Tensor& input) {
  at::Tensor x = input;
  if (options.input_is_parallel()) {
    detail::check_input(kLayer, x, range_.size(), "the local in_features", method_->activation_dtype(),
                        method_->weight_device());
  } else {
    detail::check_input(kLayer, x, options.in_features(), "in_features", method_->activation_dtype(),
                        method_->weight_device());
    // This rank's columns; the backward all-gathers the input gradient.
    std::vector<int64_t> sizes;
    for (const auto& r : ranges_) sizes.push_back(r.size());
    x = scatter_to_parallel(x, comm, -1, sizes);
  }
  return x;
}

at::Tensor RowParallelLinearImpl::forward_partial(const at::Tensor& input) {
  return step_->partial(local_input(input), weight);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  return step_->forward(local_input(input), weight, bias);
}

LoRAImpl& RowParallelLinearImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", lora_);
  return *lora_;
}

std::map<std::string, at::Tensor> RowParallelLinearImpl::gather_weights(const std::string& prefix) const {
  TORCH_CHECK_VALUE(method_->trainable(), kLayer, ": gather_weights needs an unquantized layer; this one is ",
                    method_->name(), ", whose weights are frozen (they are still the checkpoint's)");
  at::NoGradGuard no_grad;
  std::vector<int64_t> sizes;
  for (const auto& r : ranges_) sizes.push_back(r.size());
  at::Tensor w = gather_from_parallel(weight, comm, 1, sizes);
  std::map<std::string, at::Tensor> out{{detail::join_name(prefix, "weight"), w.is_same(weight) ? w.clone() : w}};
  if (bias.defined()) out[detail::join_name(prefix, "bias")] = bias.clone();  // mirrored: every rank's copy is the same
  return out;
}

void RowParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  // Strict (every tensor under `prefix` is read) and collective (an error on one rank is
  // thrown on every rank): docs/DESIGN.md, "Loading is strict and collective".
  run_collectively(comm, std::string(kLayer) + ".load_weights", [&] {
    detail::load_strictly(
        checkpoint, {prefix}, {kLayer, bias.defined(), method_->name(), method_->trainable()},
        [&](const Checkpoint& ckpt) {
          method_->load(ckpt, {WeightPart{prefix, range_, 0, options.in_features()}}, ShardMode::kRow, kLayer);
          method_->finalize();
          if (!bias.defined()) return;
          const auto& source = ckpt.get(prefix + ".bias", kLayer);
          detail::check_bias(kLayer, source, options.out_features());
          at::NoGradGuard no_grad;
          bias.copy_(load_shard(source, ShardMode::kRow, range_, {}, kLayer));
        });
  });
}

}  // namespace tp
