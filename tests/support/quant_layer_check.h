#pragma once
// The check every quantized format runs: Column, Row, QKV and GateUp layers at the
// given world sizes (ranks as threads), loading their shards of a checkpoint made by
// quantize_weight from random global float weights, against the float64 reference
// quantize_activation(x) @ dequantize_weight(W)^T + b.
//
// Row layers quantize activations per rank on their local slice of x, so a
// per-token format's row output differs from the reference (which quantizes the
// whole row) by up to one activation rounding; the tolerance of those formats
// covers it (documented where each format sets it).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "tp/quant/quant_config.h"

namespace tp::test {

/// Global shapes of the four layers. Defaults fit every format's alignment
/// (multiples of 128 and of the INT4 groups) and split unevenly at world 3.
struct QuantLayerShapes {
  int64_t in = 384, out = 640;                                    // ColumnParallelLinear and RowParallelLinear
  int64_t hidden = 256, head_dim = 128, heads = 6, kv_heads = 1;  // QKV: MQA, so worlds 1-4 all split
  int64_t intermediate = 384;                                     // GateUp
  int64_t tokens = 5;
};

struct QuantCheck {
  QuantConfig config;
  at::ScalarType dtype;  // the layers' activation / output dtype
  double tolerance;      // bound on relative_error (max abs error / max(1, max |ref|))
  QuantLayerShapes shapes = {};
  std::vector<int64_t> worlds = {1, 2, 3, 4};
  bool bias = true;
  bool from_file = false;  // write the checkpoint as safetensors and load it through open_checkpoint
  uint64_t seed = 1;
  /// Where the layers (weights and activations) live: CUDA runs the formats' GPU paths;
  /// outputs come back to the CPU for the comparison.
  at::Device device = at::kCPU;
};

/// Runs every layer type at every world size; fails (Catch2 REQUIRE/CHECK) on an
/// error above the tolerance. Each case is labelled with layer, world and rank.
void check_quant_layers(const QuantCheck& check);

/// A random float weight [out, in] with rows of varied magnitude (so per-channel
/// scales differ), the same for one seed on every rank.
at::Tensor random_weight(int64_t out, int64_t in, uint64_t seed);

}  // namespace tp::test
