#pragma once
// tp-bench's checkpoint: where the block's weights live (Hugging Face names of one
// Llama-style layer), writing them once, and reading their sizes back.

#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>

#include "layer_bench.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quantize.h"

namespace tp::bench {

inline const std::string kAttn = "model.layers.0.self_attn";
inline const std::string kMlp = "model.layers.0.mlp";
inline const std::string kQ = kAttn + ".q_proj", kK = kAttn + ".k_proj", kV = kAttn + ".v_proj", kO = kAttn + ".o_proj";
inline const std::string kGate = kMlp + ".gate_proj", kUp = kMlp + ".up_proj", kDown = kMlp + ".down_proj";

/// "float32", "bfloat16", ...: the names tp-bench prints and takes.
std::string dtype_name(c10::ScalarType dtype);

/// "h4096-i14336-q32-kv8-d128": a shape in file names and signatures.
std::string shape_tag(const BlockShape& s);

/// One layer's stored tensors by suffix, read back from the checkpoint.
QuantizedTensors read_layer(const Checkpoint& ckpt, const std::string& prefix);

/// Bytes of every checkpoint tensor under `prefix` (the weight as stored, scales included).
int64_t stored_bytes(const Checkpoint& ckpt, const std::string& prefix);

struct CheckpointFile {
  std::string path;
  bool written = false;  // false: a cached file was reused
  double write_s = 0.0;
};

/// Writes the block's weights once: random N(0, 1/in) in float32, stored in `dtype`
/// (format none) or quantized from float32 by quantize_weight, under
/// config.ckpt_dir or ~/.cache/tp/bench. A cached file is reused when its metadata
/// says it holds the same shape, seed, format and dtype.
CheckpointFile ensure_checkpoint(const BenchConfig& config, const std::string& format, c10::ScalarType dtype);

}  // namespace tp::bench
