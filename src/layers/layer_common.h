#pragma once
// Private helpers shared by the layer implementations.

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "tp/comm/communicator.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/shard_mode.h"
#include "tp/shard/split.h"

namespace tp::detail {

/// Runs `f`, turning a ShardError (tp/shard has no torch) into a c10::ValueError
/// that starts with the layer's name.
template <class F>
auto with_layer_context(const std::string& layer, F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const ShardError& e) {
    TORCH_CHECK_VALUE(false, layer, ": ", e.what());
  }
}

/// `policy` with its granularity combined with the quant method's alignment for
/// `mode`: every shard boundary must respect both. Errors carry the layer's name.
SplitPolicy aligned_policy(const std::string& layer, const SplitPolicy& policy, const QuantMethod& method,
                           ShardMode mode);

/// Checks a forward input: defined, at least 1-D, last dim `expected_in`, the
/// activation dtype, on the weights' device. Messages name the layer and numbers.
void check_input(const std::string& layer, const at::Tensor& x, int64_t expected_in, const char* in_name,
                 at::ScalarType dtype, const at::Device& device);

/// x's shape with the last dimension replaced by `last`.
std::vector<int64_t> with_last_dim(const at::Tensor& x, int64_t last);

/// The random initialisation torch::nn::Linear gives a bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void reset_bias(at::Tensor& bias, int64_t global_in_features);

/// One named size of a layer's options, for check_options.
struct NamedSize {
  const char* name;
  int64_t value;
};

/// Validates what every layer's options share: every size positive (the message lists
/// them all), and a floating-point dtype.
void check_options(const std::string& layer, std::initializer_list<NamedSize> sizes, at::ScalarType dtype);

/// The end every pretty_print shares: ", bias=..., [gather_output=true, ][quant=..., ]rank=r/w)".
void print_tail(std::ostream& stream, bool bias, bool gather_output, const QuantMethod& method,
                const Communicator& comm);

}  // namespace tp::detail
