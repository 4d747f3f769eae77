#include "tp/layers/column_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/column_core.h"
#include "layers/layer_common.h"
#include "tp/comm/collective_status.h"

namespace tp {

namespace {
constexpr const char* kLayer = "ColumnParallelLinear";
}

ColumnParallelLinearOptions::ColumnParallelLinearOptions(int64_t in_features, int64_t out_features)
    : in_features_(in_features), out_features_(out_features) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void ColumnParallelLinearImpl::reset() {
  // Collective: a rank-local failure (options that differ between ranks, an allocation)
  // fails every rank instead of leaving the others in their first collective.
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    detail::check_options(kLayer, {{"in_features", options.in_features()}, {"out_features", options.out_features()}},
                          options.dtype());
    detail::ColumnSpec spec{options.in_features(), options.bias(),         options.quant(),
                            options.split(),       options.dtype(),        options.device(),
                            options.numerics(),    options.out_features(), 0};
    spec.gather_output = options.gather_output();
    spec.sequence_parallel = options.sequence_parallel();
    spec.sequence_dim = options.sequence_dim();
    core_ = detail::make_column_core(
        kLayer, spec, comm,
        [&](int64_t r, const SplitPolicy& policy) {
          return plan_single("out_features", options.out_features(), comm.world_size(), r, policy);
        },
        *this);
    weight = core_->weight();
    bias = core_->bias();
    if (options.init_weights()) reset_parameters();
  });
}

void ColumnParallelLinearImpl::reset_parameters() { core_->reset_parameters(); }

void ColumnParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::ColumnParallelLinear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", local_out=" << local_range();
  detail::print_tail(stream, options.bias(), options.gather_output(), core_->method(), comm,
                     options.sequence_parallel());
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) { return core_->forward(x); }

TokenQuant ColumnParallelLinearImpl::input_quant(const at::Tensor& x) const { return core_->input_quant(x); }

at::Tensor ColumnParallelLinearImpl::forward_quantized(const at::Tensor& codes, const at::Tensor& scales) {
  return core_->forward_quantized(codes, scales);
}

void ColumnParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  core_->load(checkpoint, {prefix});
}

std::map<std::string, at::Tensor> ColumnParallelLinearImpl::gather_weights(const std::string& prefix) const {
  const auto [w, b] = core_->gather_parameters();
  std::map<std::string, at::Tensor> out{{detail::join_name(prefix, "weight"), w}};
  if (b.defined()) out[detail::join_name(prefix, "bias")] = b;
  return out;
}

Range ColumnParallelLinearImpl::local_range() const { return core_->plan().pieces.at(0).source; }

std::vector<Range> ColumnParallelLinearImpl::ranges() const {
  std::vector<Range> out;
  for (const auto& p : core_->plans()) out.push_back(p.pieces.at(0).source);
  return out;
}

const Reduction& ColumnParallelLinearImpl::input_reduction() const { return core_->input_reduction(); }
const Reduction& ColumnParallelLinearImpl::output_reduction() const { return core_->output_reduction(); }

LoRAImpl& ColumnParallelLinearImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", core_->lora());
  return *core_->lora();
}

}  // namespace tp
