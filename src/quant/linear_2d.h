#pragma once
// The frame of a weight-only or W8A8 method's apply(): x [..., K] as one contiguous
// [M, K] matrix for the kernels, their [M, N] result plus the bias, reshaped back to
// [..., N]. An empty x or weight gives zeros without calling the kernel.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

namespace tp::detail {

/// y = gemm(x2) (+ bias), x2 = x as [M, K]; gemm returns [M, N] in x's dtype.
template <class Gemm>
at::Tensor linear_2d(const at::Tensor& x, int64_t n, int64_t k, const std::optional<at::Tensor>& bias,
                     const Gemm& gemm) {
  auto out_shape = x.sizes().vec();
  out_shape.back() = n;
  const auto x2 = x.reshape({-1, k}).contiguous();
  at::Tensor y = x2.size(0) == 0 || n == 0 ? at::zeros({x2.size(0), n}, x.options()) : gemm(x2);
  if (bias) y = y + *bias;
  return y.view(out_shape);
}

/// The arguments of QuantMethod::apply_quantized, checked: codes [..., k] of `code_dtype`
/// on the CPU, scales float32 with one per token ([..., 1]).
inline void check_token_codes(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType code_dtype, int64_t k,
                              const std::string& what) {
  TORCH_CHECK_VALUE(codes.defined() && codes.dim() >= 1 && codes.scalar_type() == code_dtype && codes.size(-1) == k &&
                        codes.device().is_cpu(),
                    what, ": pre-quantized activations must be ", code_dtype, " [..., ", k, "] on the CPU; got ",
                    codes.defined() ? codes.sizes() : c10::IntArrayRef{}, " ",
                    codes.defined() ? codes.scalar_type() : at::ScalarType::Undefined);
  const int64_t tokens = codes.numel() / std::max<int64_t>(k, 1);
  TORCH_CHECK_VALUE(
      scales.defined() && scales.scalar_type() == at::kFloat && scales.numel() == tokens && scales.device().is_cpu(),
      what, ": pre-quantized activations need one float32 scale per token (", tokens, "); got ",
      scales.defined() ? scales.sizes() : c10::IntArrayRef{}, " ",
      scales.defined() ? scales.scalar_type() : at::ScalarType::Undefined);
}

}  // namespace tp::detail
