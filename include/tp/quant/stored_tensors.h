#pragma once
// What a format stores on a layer, tensor by tensor, and how each tensor lies along the
// weight's features: the one declaration (a row of the format table) that the DCP
// description of a quantized layer (python tp/dcp.py) and strict loading's names of
// quantized tensors (layers/loading/strict_load.cpp) read.
//
// A column layer splits the output features N, a row layer the input features K. Each
// stored tensor carries N along one dimension (or none: a per-tensor scale) and K along
// one dimension (or none: a per-row scale), each index of it covering a fixed number of
// features: 1 for a plain weight, 8 where eight 4-bit codes share an int32, the group or
// block size for a scale of a group or block (GPTQ's qweight [K/8, N]: N along dim 1, one
// feature an index; K along dim 0, eight features an index).

#include <cstdint>
#include <string>
#include <vector>

#include "tp/quant/quant_config.h"

namespace tp {

/// One tensor a format registers on a layer (QuantMethod::create_weights), with its axes
/// for `config` (the group size, the scale's name and the symmetry resolved).
struct StoredTensor {
  /// The parameter's name on the layer, and the checkpoint tensor's suffix ("qweight").
  std::string name;
  /// The dimension that carries the output features N (-1: none), and how many features
  /// one index of it covers.
  int64_t out_dim = -1;
  int64_t out_per_index = 1;
  /// The dimension that carries the input features K (-1: none), and how many features
  /// one index of it covers.
  int64_t in_dim = -1;
  int64_t in_per_index = 1;
};

/// Every tensor `config`'s format registers on a layer, in registration order (the layer's
/// own bias is not the format's and is not listed).
std::vector<StoredTensor> stored_tensors(const QuantConfig& config);

/// Names (after a layer's prefix) of checkpoint tensors that only quantized formats store:
/// every quantized format's stored tensors in each of its variants and the tensors its load
/// reads besides them (GPTQ's g_idx, compressed-tensors' weight_shape), and the tensors of
/// the quantized formats tp does not read (KV-cache scales, NVFP4's global scales, ...),
/// less the names the unquantized format stores. Sorted. Strict loading says that such a
/// tensor under an unquantized layer belongs to another format.
const std::vector<std::string>& quantized_tensor_names();

}  // namespace tp
