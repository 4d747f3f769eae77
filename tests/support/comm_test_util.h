#pragma once
// Shared helpers for the comm tests: rank-seeded inputs and their float64 reference,
// tolerances, an environment-variable guard. Ranks run as threads, and Catch2
// assertions are not thread-safe: rank threads only record what they saw (one slot
// per rank) and the checks run on the main thread after the ranks are joined.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "support/tp_catch.h"
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"

// Its own namespace: every test area links into one tp_tests binary, and inline helpers
// with the same name in two areas would silently collide.
namespace tp::comm_test {

inline constexpr uint64_t kSeed = 977;

inline CommunicatorOptions test_options(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  CommunicatorOptions o;
  o.timeout = timeout;
  return o;
}

/// Rank `rank`'s input for case `seed`: standard normal values (never all zeros),
/// rounded to `dtype`. Any rank can regenerate any other rank's input.
inline at::Tensor rank_input(uint64_t seed, int64_t rank, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 131 + static_cast<uint64_t>(rank));
  at::Tensor x = at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
  if (dtype == at::kBool) return x > 0;
  if (at::isIntegralType(dtype, /*includeBool=*/false)) return (x * 100).round().to(dtype);
  return x.to(dtype);
}

/// The float64 sum over ranks of rank_input.
inline at::Tensor reference_sum(uint64_t seed, int64_t world, at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor sum = at::zeros(shape, at::kDouble);
  for (int64_t r = 0; r < world; ++r) sum += rank_input(seed, r, shape, dtype).to(at::kDouble);
  return sum;
}

/// Tolerances for a sum of up to 4 inputs accumulated in fp32 (fp64 for double),
/// then rounded to the dtype.
inline std::pair<double, double> tolerance(at::ScalarType dtype) {  // {rtol, atol}
  switch (dtype) {
    case at::kDouble: return {1e-12, 1e-12};
    case at::kFloat: return {1e-5, 1e-5};
    case at::kHalf: return {2e-3, 2e-3};
    case at::kBFloat16: return {1e-2, 1e-2};
    default: return {0, 0};
  }
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// Sets (or, with nullopt, unsets) an environment variable for a scope; restores it.
class EnvGuard {
 public:
  EnvGuard(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

inline const std::vector<at::ScalarType> kFloatTypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

}  // namespace tp::comm_test
