#pragma once
// The frame of a weight-only or W8A8 method's apply(): x [..., K] as one contiguous
// [M, K] matrix for the kernels, their [M, N] result plus the bias, reshaped back to
// [..., N]. An empty x or weight gives zeros without calling the kernel.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

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

}  // namespace tp::detail
