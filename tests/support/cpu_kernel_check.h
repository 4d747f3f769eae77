#pragma once
// What the CPU kernel tests share: the ISAs to force (every one this CPU can run, so
// each per-ISA build is tested on the machine that has it) and the bound a float32
// dot product must meet against float64.

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "cpu/features.h"

namespace tp::test {

/// Every ISA this CPU can run, the portable one first.
inline std::vector<cpu::Isa> isas_here() {
  std::vector<cpu::Isa> out;
  for (const cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512})
    if (static_cast<int>(isa) <= static_cast<int>(cpu::max_isa())) out.push_back(isa);
  return out;
}

/// Bitwise equality of two float32 tensors (at::equal would let -0 == +0 pass).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.contiguous().view(at::kInt), b.contiguous().view(at::kInt));
}

/// The worst-case error of y = x w^T in float32, element by element, over float64
/// inputs that are exact: a dot product of k terms in any summation order is within
/// gamma_{k + extra} sum |x_i w_i| (gamma_n = n u / (1 - n u), u = 2^-24; Higham,
/// Accuracy and Stability of Numerical Algorithms, 3.1); `extra` counts the further
/// float32 roundings of each term or result (a bias add, a scale product). A wrong or
/// missing term errs by O(|x w|) and is far outside it.
inline at::Tensor float32_dot_bound(const at::Tensor& x, const at::Tensor& w, int64_t extra = 0) {
  const double nu = static_cast<double>(x.size(-1) + extra) * std::ldexp(1.0, -24);
  return at::matmul(x.to(at::kDouble).abs(), w.to(at::kDouble).abs().t()) * (nu / (1.0 - nu)) + 1e-300;
}

}  // namespace tp::test
