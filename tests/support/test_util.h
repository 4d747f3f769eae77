#pragma once
// Shared helpers for the torch-based tests: seeded random data, the single-device
// reference, and per-dtype tolerances.

#include <cstdint>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include "tp/comm/launch.h"

namespace tp::test {

/// A CPU generator seeded deterministically, so every rank can regenerate the
/// same "global" tensors without communicating.
inline at::Generator generator(uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  return g;
}

/// Normal(0, 1) data in float64: never zeros, the same on every rank for one seed.
inline at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  auto g = generator(seed);
  return at::randn(shape, g, at::TensorOptions().dtype(at::kDouble));
}

/// Uniform integer in [lo, hi] from a seed (for random shapes).
inline int64_t randint(int64_t lo, int64_t hi, uint64_t seed) {
  auto g = generator(seed);
  return at::randint(lo, hi + 1, {1}, g).item<int64_t>();
}

/// Relative tolerance of a GEMM output in `dtype` against a float64 reference,
/// scaled by the reference's magnitude: rounding of inputs and accumulation.
inline double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return 1e-12;
    case at::kFloat: return 2e-5;
    case at::kHalf: return 4e-3;
    case at::kBFloat16: return 3e-2;
    default: return 1e-6;
  }
}

/// max |a - b| / max(1, max |b|), computed in float64.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  if (b64.numel() == 0) return 0.0;
  const double scale = std::max(1.0, b64.abs().max().item<double>());
  return (a64 - b64).abs().max().item<double>() / scale;
}

/// Options with a short timeout, so a broken test fails instead of hanging CI.
inline CommunicatorOptions test_comm_options() {
  CommunicatorOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  return o;
}

inline const char* dtype_name(at::ScalarType t) { return c10::toString(t); }

}  // namespace tp::test
