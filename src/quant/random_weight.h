#pragma once
// The random initialisation every quantized method's reset_parameters quantizes.

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace tp::detail {

/// A float32 [out, in] weight drawn as torch::nn::Linear draws one, U(-1/sqrt(fan_in),
/// 1/sqrt(fan_in)) with the GLOBAL fan-in, for a method's reset_parameters to quantize.
at::Tensor random_linear_weight(int64_t out, int64_t in, int64_t global_in_features);

/// Calls fill(first_row, rows) over the rows [0, n) of an [n, k] weight, in chunks of
/// about kRandomInitChunkElements elements, each a whole number of `row_multiple` rows
/// (the last one may be shorter). A quantized method's reset_parameters draws and
/// quantizes one chunk at a time, so what it holds at once is one chunk's float copy and
/// temporaries, not the whole weight's (a Llama-3-70B gate_up at TP 1 is 1.9 G elements,
/// 7.5 GB in float32 before any temporary).
void for_each_row_chunk(int64_t n, int64_t k, int64_t row_multiple, const std::function<void(int64_t, int64_t)>& fill);
constexpr int64_t kRandomInitChunkElements = int64_t{1} << 22;

}  // namespace tp::detail
