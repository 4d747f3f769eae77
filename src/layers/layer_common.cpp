#include "layers/layer_common.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <sstream>

namespace tp::detail {

SplitPolicy aligned_policy(const std::string& layer, const SplitPolicy& policy, const QuantMethod& method,
                           ShardMode mode) {
  return with_layer_context(layer, [&] {
    return policy.with_granularity(combine_granularity(policy.granularity, method.tp_alignment(mode)))
        .with_partial_tail(policy.partial_tail || method.allows_partial_block(mode));
  });
}

void check_input(const std::string& layer, const at::Tensor& x, int64_t expected_in, const char* in_name,
                 at::ScalarType dtype, const at::Device& device) {
  TORCH_CHECK_VALUE(x.defined(), layer, ": input is an undefined tensor");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == expected_in, layer, ": input has shape ", x.sizes(), " but ", in_name,
                    "=", expected_in, "; expected [..., ", expected_in, "]");
  TORCH_CHECK_TYPE(x.scalar_type() == dtype, layer, ": input has dtype ", x.scalar_type(),
                   " but the layer computes in ", dtype, "; convert the input or the layer (.to(", dtype, "))");
  TORCH_CHECK_VALUE(x.device() == device, layer, ": input is on ", x.device(), " but the layer's weights are on ",
                    device);
}

std::optional<int64_t> sequence_dim_of(const std::string& layer, const at::Tensor& x, bool sequence_parallel,
                                       int64_t dim) {
  if (!sequence_parallel) return std::nullopt;
  const int64_t n = x.dim();
  TORCH_CHECK_INDEX(n >= 2 && dim >= -n && dim < n - 1 && dim != -1, layer, ": sequence_dim=", dim,
                    " is not a token dim of the input of shape ", x.sizes(),
                    " (sequence parallelism needs [..., tokens, ..., features]; sequence_dim should be in the ", -n,
                    "..", n - 2, " range, not the last dim)");
  return dim < 0 ? dim + n : dim;
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::map<std::string, at::Tensor> split_segments(const SegmentPlan& plan, const at::Tensor& weight,
                                                 const at::Tensor& bias, const std::string& prefix,
                                                 const std::vector<std::string>& names) {
  TORCH_INTERNAL_ASSERT(names.size() == plan.pieces.size() && weight.size(0) == plan.global_size);
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& piece = plan.pieces[i];
    const auto name = join_name(prefix, names[i]);
    out[name + ".weight"] = weight.narrow(0, piece.fused_offset, piece.segment_size).clone();
    if (bias.defined()) out[name + ".bias"] = bias.narrow(0, piece.fused_offset, piece.segment_size).clone();
  }
  return out;
}

std::vector<int64_t> with_last_dim(const at::Tensor& x, int64_t last) {
  auto shape = x.sizes().vec();
  shape.back() = last;
  return shape;
}

void reset_bias(at::Tensor& bias, int64_t global_in_features) {
  if (!bias.defined()) return;
  const double bound = global_in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(global_in_features)) : 0.0;
  at::NoGradGuard no_grad;
  bias.uniform_(-bound, bound);
}

void check_options(const std::string& layer, std::initializer_list<NamedSize> sizes, at::ScalarType dtype) {
  bool positive = true;
  std::ostringstream names, got;
  size_t i = 0;
  for (const auto& s : sizes) {
    positive = positive && s.value > 0;
    names << (i == 0 ? "" : i + 1 == sizes.size() ? " and " : ", ") << s.name;
    got << (i == 0 ? "" : ", ") << s.name << "=" << s.value;
    ++i;
  }
  // "in_features and out_features must be positive; got in_features=0, out_features=6"
  TORCH_CHECK_VALUE(positive, layer, ": ", names.str(), " must be positive; got ", got.str());
  TORCH_CHECK_TYPE(at::isFloatingType(dtype), layer, ": dtype ", dtype,
                   " is not a floating-point type (use float32, float64, bfloat16 or float16)");
}

void print_tail(std::ostream& stream, bool bias, bool gather_output, const QuantMethod& method,
                const Communicator& comm, bool sequence_parallel) {
  stream << ", bias=" << (bias ? "true" : "false");
  if (gather_output) stream << ", gather_output=true";
  if (sequence_parallel) stream << ", sequence_parallel=true";
  if (!method.trainable()) stream << ", quant=" << method.name();
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

}  // namespace tp::detail
