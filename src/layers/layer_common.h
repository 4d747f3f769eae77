#pragma once
// Private helpers shared by the layer implementations.

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "tp/comm/communicator.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/segments.h"
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

/// The token dim of a sequence-parallel forward: nullopt when `sequence_parallel` is
/// off, else `dim` wrapped into [0, x.dim() - 1) (the last dim holds the features;
/// naming it is an error that says so).
std::optional<int64_t> sequence_dim_of(const std::string& layer, const at::Tensor& x, bool sequence_parallel,
                                       int64_t dim);

/// `prefix + "." + name`, or `name` alone for an empty prefix.
std::string join_name(const std::string& prefix, const std::string& name);

/// A fused layer's full weight [global_out, in] (and bias) cut into its segments, as
/// `prefix + "." + names[i] + ".weight"` (".bias"); `plan` gives the segment offsets.
std::map<std::string, at::Tensor> split_segments(const SegmentPlan& plan, const at::Tensor& weight,
                                                 const at::Tensor& bias, const std::string& prefix,
                                                 const std::vector<std::string>& names);

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

/// The end every pretty_print shares:
/// ", bias=..., [gather_output=true, ][sequence_parallel=true, ][quant=..., ]rank=r/w)".
void print_tail(std::ostream& stream, bool bias, bool gather_output, const QuantMethod& method,
                const Communicator& comm, bool sequence_parallel = false);

}  // namespace tp::detail
