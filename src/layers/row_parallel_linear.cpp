#include "tp/layers/row_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/layer_common.h"
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
  detail::check_options(kLayer, {{"in_features", options.in_features()}, {"out_features", options.out_features()}},
                        options.dtype());
  method_ = make_quant_method(options.quant());
  const auto policy = detail::aligned_policy(kLayer, options.split(), *method_, ShardMode::kRow);
  ranges_ = detail::with_layer_context(
      kLayer, [&] { return split(options.in_features(), comm.world_size(), policy, "in_features"); });
  range_ = ranges_.at(comm.rank());
  const auto tensor_options = at::TensorOptions().dtype(options.dtype()).device(options.device());
  method_->create_weights(*this, options.out_features(), range_.size(), tensor_options);
  weight = method_->weight();
  bias =
      options.bias() ? register_parameter("bias", at::empty({options.out_features()}, tensor_options)) : at::Tensor();
  reset_parameters();
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
  detail::print_tail(stream, options.bias(), /*gather_output=*/false, *method_, comm);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  if (options.input_is_parallel()) {
    detail::check_input(kLayer, x, range_.size(), "the local in_features", method_->activation_dtype(),
                        method_->weight_device());
  } else {
    detail::check_input(kLayer, x, options.in_features(), "in_features", method_->activation_dtype(),
                        method_->weight_device());
    x = x.narrow(-1, range_.begin, range_.size());
  }
  // Bias contract: only rank 0 adds the bias, so the reduction counts it once.
  const bool add_bias = bias.defined() && comm.rank() == 0;
  at::Tensor y;
  if (range_.size() == 0) {
    // No input columns here: skip the GEMM and contribute zeros (plus the bias on rank 0).
    y = at::zeros(detail::with_last_dim(x, options.out_features()), x.options());
    if (add_bias) y.add_(bias);
  } else {
    y = method_->apply(x, add_bias ? std::optional<at::Tensor>(bias) : std::nullopt);
  }
  if (options.reduce_output()) comm.all_reduce(y, options.all_reduce(), options.wire());
  return y;
}

void RowParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  method_->load(checkpoint, {WeightPart{prefix, range_, 0, options.in_features()}}, ShardMode::kRow, kLayer);
  method_->finalize();
  if (!bias.defined()) return;
  const auto& source = checkpoint.get(prefix + ".bias", kLayer);
  TORCH_CHECK_VALUE(source.shape() == std::vector<int64_t>{options.out_features()}, kLayer, ": tensor '", source.name(),
                    "' has shape ", c10::IntArrayRef(source.shape()), "; expected [", options.out_features(), "]");
  at::NoGradGuard no_grad;
  bias.copy_(load_shard(source, ShardMode::kRow, range_, {}, kLayer));
}

}  // namespace tp
