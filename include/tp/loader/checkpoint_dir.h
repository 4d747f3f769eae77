#pragma once
// open_checkpoint: a checkpoint on disk (one safetensors file, or a Hugging Face
// folder, sharded or not) as the name -> source map the layers load from.

#include <string>

#include "tp/loader/tensor_source.h"

namespace tp {

/// Opens a checkpoint as name -> source, every tensor read lazily from its file:
/// - a `.safetensors` file;
/// - a folder with `model.safetensors.index.json` (a sharded checkpoint: its
///   "weight_map" says which file holds each tensor; each file is mapped once);
/// - a folder with a single `model.safetensors`.
/// Example: auto ckpt = tp::open_checkpoint("/models/Llama-3.1-8B");
///          qkv->load_weights(ckpt, "model.layers.0.self_attn");
Checkpoint open_checkpoint(const std::string& path);

}  // namespace tp
