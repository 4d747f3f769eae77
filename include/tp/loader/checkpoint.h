#pragma once
// A checkpoint as the layers see it: Hugging Face tensor names -> TensorSources,
// built in memory or opened from disk (one safetensors file, or a folder, sharded or
// not), and the WeightPart a layer reads from it.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/loader/tensor_source.h"
#include "tp/shard/range.h"

namespace tp {

/// Name -> source, the way a checkpoint is seen by the layers. Names are the
/// Hugging Face names ("model.layers.0.self_attn.q_proj.weight").
/// Example:
///   tp::Checkpoint ckpt;
///   ckpt.add("fc.weight", w);                 // an at::Tensor, or a TensorSource
///   layer->load_weights(ckpt, "fc");
class Checkpoint {
 public:
  Checkpoint() = default;
  /// Adds a source under its own name; a duplicate name is an error.
  void add(std::shared_ptr<const TensorSource> source);
  /// Adds an in-memory tensor under `name`.
  void add(const std::string& name, const at::Tensor& tensor);
  bool contains(const std::string& name) const;
  /// The source named `name`; an error naming it (and `where`, e.g. the layer) if absent.
  const TensorSource& get(const std::string& name, const std::string& where = "") const;
  std::vector<std::string> names() const;
  size_t size() const { return sources_.size(); }

 private:
  std::map<std::string, std::shared_ptr<const TensorSource>> sources_;
};

/// Opens a checkpoint as name -> source, every tensor read lazily from its file:
/// - a `.safetensors` file;
/// - a folder with `model.safetensors.index.json` (a sharded checkpoint: its
///   "weight_map" says which file holds each tensor; each file is mapped once);
/// - a folder with a single `model.safetensors`.
/// Example: auto ckpt = tp::open_checkpoint("/models/Llama-3.1-8B");
///          qkv->load_weights(ckpt, "model.layers.0.self_attn");
Checkpoint open_checkpoint(const std::string& path);

/// One checkpoint weight (e.g. "...q_proj") feeding part of a layer's local weight:
/// the logical range of the split dimension this rank reads from it, and where
/// that range lands in the local weight's split dimension.
struct WeightPart {
  std::string prefix;         // checkpoint name without ".weight" / ".weight_scale"
  Range range;                // in the checkpoint tensor's logical split dimension
  int64_t local_offset = 0;   // in the local weight's split dimension
  int64_t logical_size = -1;  // the checkpoint tensor's logical extent of that dimension
};

}  // namespace tp
