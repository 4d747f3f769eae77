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

#include "tp/loader/read_log.h"
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
  Checkpoint();
  /// Adds a source under its own name; a duplicate name is an error. Only this
  /// checkpoint gains it: copies and views made before keep what they had. Add before
  /// sharing a checkpoint between threads.
  void add(std::shared_ptr<const TensorSource> source);
  /// Adds an in-memory tensor under `name`.
  void add(const std::string& name, const at::Tensor& tensor);
  /// Adds `source` under `name`, which may differ from the source's own name: a view of
  /// part of another tensor, whose messages name that tensor (one expert of a fused
  /// [experts, ...] tensor read as an expert's own weight).
  void add(const std::string& name, std::shared_ptr<const TensorSource> source);
  bool contains(const std::string& name) const;
  /// The source named `name`; an error naming it (and `where`, e.g. the layer) if absent.
  /// Recorded as read in every ReadLog this checkpoint is a view for (see recording).
  const TensorSource& get(const std::string& name, const std::string& where = "") const;
  std::vector<std::string> names() const;
  /// The names that start with `prefix` ("model.layers.0.mlp.up_proj."), sorted.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;
  size_t size() const { return sources_->size(); }

  /// A view of the same tensors (shared, not copied) that also records in `log` the
  /// name of every tensor its get() returns. A view of a view records into both logs;
  /// copies of a view record where it does. This is how a load learns what it consumed
  /// (LoadSession, and each layer's strict check) without state shared between ranks.
  Checkpoint recording(std::shared_ptr<ReadLog> log) const;
  /// Whether a log this checkpoint records into allows `name` to stay unread
  /// (ReadLog::allows_unread: a LoadSession's allow list).
  bool may_stay_unread(const std::string& name) const;

 private:
  using Sources = std::map<std::string, std::shared_ptr<const TensorSource>>;
  std::shared_ptr<Sources> sources_;  // shared by copies and views; add() copies it first when shared
  std::vector<std::shared_ptr<ReadLog>> logs_;
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
