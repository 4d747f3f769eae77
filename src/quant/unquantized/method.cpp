#include "quant/unquantized/method.h"
#include "tp/loader/load_shard.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>

#if TP_WITH_CUDA
#include "gpu/gemm.h"
#endif

namespace tp::detail {

void UnquantizedMethod::create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                                       const at::TensorOptions& options) {
  weight_ = layer.register_parameter("weight", at::empty({out_local, in_local}, options));
  cpu_gemm_.bind(weight_);  // nothing to pack before reset_parameters or load fills it
}

void UnquantizedMethod::finalize() {
  if (weight_.is_cpu()) cpu_gemm_.prepare(weight_);
}

void UnquantizedMethod::reset_parameters(int64_t global_in_features) {
  // torch::nn::Linear's kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const double bound = global_in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(global_in_features)) : 0.0;
  at::NoGradGuard no_grad;
  weight_.uniform_(-bound, bound);
}

void UnquantizedMethod::load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
                             const std::string& layer) {
  const int64_t split = mode == ShardMode::kColumn ? 0 : 1;
  const int64_t other = 1 - split;
  at::NoGradGuard no_grad;
  for (const auto& part : parts) {
    const auto& source = checkpoint.get(part.prefix + ".weight", layer);
    const auto shape = source.shape();
    // at::isFloatingType counts the float8 types too: their codes would be used as
    // weights, without their scale (issue 14, failure 1).
    const auto dtype = source.dtype();
    TORCH_CHECK_VALUE(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                      layer, ": tensor '", source.name(), "' has dtype ", dtype,
                      ", the codes of a quantized checkpoint, but the layer's quant format is none, which loads "
                      "float64, float32, float16 or bfloat16 weights and would use those codes as weights. Build the "
                      "layer with the format the checkpoint's config.json quantization_config names (quant=",
                      at::isFloat8Type(dtype) ? "fp8_tensor, fp8_channel or fp8_block"
                      : dtype == at::kChar    ? "int8_w8a8 or int8_weight_only"
                                              : "...",
                      ")");
    TORCH_CHECK_VALUE(shape.size() == 2 && shape[other] == weight_.size(other) &&
                          (part.logical_size < 0 || shape[split] == part.logical_size),
                      layer, ": tensor '", source.name(), "' has shape ", c10::IntArrayRef(shape), "; expected [",
                      split == 0 ? part.logical_size : weight_.size(0), ", ",
                      split == 1 ? part.logical_size : weight_.size(1), "] (weight is [out_features, in_features])");
    LoadOptions options;
    options.logical_size = part.logical_size;
    // Straight from the file into the weight's rows (or columns), converted on the way.
    load_shard_into(source, mode, part.range, weight_.narrow(split, part.local_offset, part.range.size()), options,
                    layer);
  }
}

at::Tensor UnquantizedMethod::apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
#if TP_WITH_CUDA
  // cuBLASLt with the bias epilogue and our heuristic cache; float64 (and anything
  // else cuBLASLt does not take) stays on at::linear.
  const auto t = weight_.scalar_type();
  if (x.is_cuda() && (t == at::kFloat || t == at::kHalf || t == at::kBFloat16)) {
    return cuda::linear(x, weight_, bias);
  }
#endif
  if (cpu_gemm_.serves(x)) return cpu_gemm_.linear(x, bias);
  return at::linear(x, weight_, bias);
}

std::shared_ptr<QuantMethod> make_unquantized_method(const QuantConfig&) {
  return std::make_shared<UnquantizedMethod>();
}

QuantizedTensors quantize_unquantized(const at::Tensor& weight, const QuantConfig&) { return {{"weight", weight}}; }

at::Tensor dequantize_unquantized(const QuantizedTensors& tensors, const QuantConfig&) {
  const auto it = tensors.find("weight");
  TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(none): no 'weight' tensor");
  return it->second.to(at::kFloat);
}

at::Tensor quantize_activation_unquantized(const at::Tensor& x, const QuantizedTensors&, const QuantConfig&) {
  return x.to(at::kFloat);
}

int64_t unquantized_alignment(const QuantConfig&, ShardMode) { return 1; }

}  // namespace tp::detail
