#include "tp/layers/gate_up_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/column_core.h"
#include "layers/layer_common.h"
#include "tp/comm/collective_status.h"

namespace tp {

namespace {
constexpr const char* kLayer = "GateUpParallelLinear";
}

GateUpParallelLinearOptions::GateUpParallelLinearOptions(int64_t hidden_size, int64_t intermediate_size)
    : hidden_size_(hidden_size), intermediate_size_(intermediate_size) {}

GateUpParallelLinearImpl::GateUpParallelLinearImpl(GateUpParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void GateUpParallelLinearImpl::reset() {
  // Collective: a rank-local failure (options that differ between ranks, an allocation)
  // fails every rank instead of leaving the others in their first collective.
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    detail::check_options(kLayer,
                          {{"hidden_size", options.hidden_size()}, {"intermediate_size", options.intermediate_size()}},
                          options.dtype());
    const std::vector<Segment> segments{{"gate", options.intermediate_size()}, {"up", options.intermediate_size()}};
    detail::ColumnSpec spec{options.hidden_size(),
                            options.bias(),
                            options.quant(),
                            options.split(),
                            options.dtype(),
                            options.device(),
                            options.numerics(),
                            options.intermediate_size(),
                            0};
    spec.gather_output = options.gather_output();
    spec.sequence_parallel = options.sequence_parallel();
    spec.sequence_dim = options.sequence_dim();
    core_ = detail::make_column_core(
        kLayer, spec, comm,
        [&](int64_t r, const SplitPolicy& policy) { return plan_segments(segments, comm.world_size(), r, policy); },
        *this);
    weight = core_->weight();
    bias = core_->bias();
    if (options.init_weights()) reset_parameters();
  });
}

void GateUpParallelLinearImpl::reset_parameters() { core_->reset_parameters(); }

void GateUpParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::GateUpParallelLinear(hidden_size=" << options.hidden_size()
         << ", intermediate_size=" << options.intermediate_size() << ", local_intermediate=" << local_range();
  detail::print_tail(stream, options.bias(), options.gather_output(), core_->method(), comm,
                     options.sequence_parallel());
}

at::Tensor GateUpParallelLinearImpl::forward(const at::Tensor& x) { return core_->forward(x); }

TokenQuant GateUpParallelLinearImpl::input_quant(const at::Tensor& x) const { return core_->input_quant(x); }

at::Tensor GateUpParallelLinearImpl::forward_quantized(const at::Tensor& codes, const at::Tensor& scales) {
  return core_->forward_quantized(codes, scales);
}

std::tuple<at::Tensor, at::Tensor> GateUpParallelLinearImpl::split(const at::Tensor& y) const {
  auto parts = core_->split(y, options.gather_output());
  return {parts[0], parts[1]};
}

void GateUpParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  load_weights(checkpoint, prefix, GateUpCheckpointLayout());
}

void GateUpParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix,
                                            const GateUpCheckpointLayout& layout) {
  const auto& plan = core_->plan();
  const auto& gate = plan.pieces.at(0);
  const auto& up = plan.pieces.at(1);
  // The separate layout's messages name each tensor already; a fused one names the layout too.
  const std::string what = layout.layout() == GateUpLayout::kSeparate
                               ? std::string(kLayer)
                               : std::string(kLayer) + " (checkpoint layout " + to_string(layout.layout()) + ")";
  std::vector<WeightPart> parts;
  if (layout.layout() == GateUpLayout::kSeparate) {
    parts = {{prefix + "." + layout.gate_name(), gate.source, gate.local_offset, gate.segment_size},
             {prefix + "." + layout.up_name(), up.source, up.local_offset, up.segment_size}};
  } else {
    const std::string name = prefix + "." + layout.fused_name();
    parts = {{name, gate.fused_source(), gate.local_offset, plan.global_size},
             {name, up.fused_source(), up.local_offset, plan.global_size}};
  }
  core_->load_parts(checkpoint, parts, what);
}

std::map<std::string, at::Tensor> GateUpParallelLinearImpl::gather_weights(const std::string& prefix,
                                                                           const GateUpCheckpointLayout& layout) const {
  const auto [w, b] = core_->gather_parameters();
  if (layout.layout() == GateUpLayout::kFused) {
    std::map<std::string, at::Tensor> out{{detail::join_name(prefix, layout.fused_name() + ".weight"), w}};
    if (b.defined()) out[detail::join_name(prefix, layout.fused_name() + ".bias")] = b;
    return out;
  }
  return detail::split_segments(core_->plan(), w, b, prefix, {layout.gate_name(), layout.up_name()});
}

Range GateUpParallelLinearImpl::local_range() const { return core_->plan().pieces.at(0).source; }

const Reduction& GateUpParallelLinearImpl::input_reduction() const { return core_->input_reduction(); }
const Reduction& GateUpParallelLinearImpl::output_reduction() const { return core_->output_reduction(); }

LoRAImpl& GateUpParallelLinearImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", core_->lora());
  return *core_->lora();
}

}  // namespace tp
