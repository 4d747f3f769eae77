#include "quant/int8/cuda.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tp::cuda {

Int8Prepared prepare_int8(bool w8a8, const at::Tensor& weight, const at::Tensor& weight_scale) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.scalar_type() == at::kChar, "prepare_int8: weight must be int8 ",
                    "[N, K]; got ", weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0);
  Int8Prepared p;
  p.w8a8 = w8a8;
  p.weight = weight.contiguous();
  const auto s = weight_scale.to(weight.device(), at::kFloat).contiguous();
  TORCH_CHECK_VALUE(s.numel() == N, "prepare_int8: weight_scale has ", s.numel(), " values; expected ", N);
  p.scale = w8a8 ? s.reshape({N}) : s.reshape({N, 1});
  return p;
}

at::Tensor apply(const Int8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  const int64_t K = p.weight.size(1);
  if (K == 0 || p.weight.size(0) == 0) {
    // A rank that owns no columns (or rows): the sum over nothing, plus the bias.
    return tp::cuda::linear(x, at::zeros(p.weight.sizes(), x.options()), bias);
  }
  if (p.w8a8) return int8_linear(x, p.weight, p.scale, bias);
  return weight_only_linear(x, p.weight, 8, p.scale, std::nullopt, K, bias);
}

}  // namespace tp::cuda
