#pragma once
// LoRA: low-rank adapters on a tensor-parallel linear layer, cut by the layer's own plan
// (never by `dim / world`), as PEFT defines them: y = base(x) + scaling (x A^T) B^T with
// A [r, in], B [out, r], scaling = alpha / r (rsLoRA: alpha / sqrt(r)).
//
//   base layer                 A                            B
//   column (Column, QKV,       whole on every rank          each segment's rows this rank
//   GateUp)                    (one per segment)            holds (uneven, weighted, aligned,
//                                                           replicated KV heads alike)
//   row (RowParallelLinear)    this rank's input columns    whole on every rank
//   VocabParallelEmbedding     A [r, vocab]: this rank's    whole on every rank
//   (PEFT's lora_embedding_*)  token columns
//   ParallelLMHead             whole on every rank          this rank's real vocabulary rows
//
// A column layer's adapter output is this rank's rows, like the base's; a row layer's (and
// the embedding's: the ids looked up in A^T) is a partial sum added to the base's before its
// one reduction (still one collective). The
// gradients follow the split states: a mirrored factor (a column layer's A, a row layer's
// B) gets the sum of every rank's part, a replicated KV head's rows of B the sum over its
// replicas, as the base's weights do. Several adapters live on one layer by name; which one
// each row of a batch takes is a LoRASelection, shared by every adapter of a model.
//
// Example:
//   auto qkv = tp::QKVParallelLinear(tp::QKVParallelLinearOptions(4096, 128, 32, 8), comm);
//   qkv->lora().add("math", tp::LoRAConfig().rank(16).alpha(32));    // A random, B zeros
//   qkv->lora().selection().select("math");                          // every row
//   at::Tensor y = qkv(x);                                           // base + adapter

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "tp/loader/checkpoint.h"

namespace tp {
namespace detail {
struct LoRABase;
}

/// One adapter's hyper-parameters (PEFT's LoraConfig fields that change the arithmetic).
struct LoRAConfig {
  /// alpha / rank, or alpha / sqrt(rank) with use_rslora.
  double scaling() const;

  TORCH_ARG(int64_t, rank) = 8;
  TORCH_ARG(double, alpha) = 8.0;
  TORCH_ARG(bool, use_rslora) = false;
};

/// Which adapter each row of a batch takes (a row: one index of the input's first
/// dimension; "" takes none). Empty: no adapter anywhere. The same on every rank.
class LoRASelection {
 public:
  /// Every row takes adapter `name` ("" = none).
  void select(const std::string& name);
  /// Row i takes per_row[i]; a forward's input must then have per_row.size() rows.
  void select_rows(std::vector<std::string> per_row);
  void clear() { select(""); }
  /// The adapters in use (sorted, without "").
  std::vector<std::string> names() const;
  /// One name for every row ("" when rows differ or none is selected).
  const std::string& whole() const { return whole_; }
  const std::vector<std::string>& per_row() const { return per_row_; }

 private:
  std::string whole_;
  std::vector<std::string> per_row_;
};

class LoRAImpl : public torch::nn::Module {
 public:
  /// Built by the layers (ColumnCore, RowParallelLinear, the vocabulary layers) from their plan; users reach it
  /// through `layer->lora()`.
  explicit LoRAImpl(std::shared_ptr<const detail::LoRABase> base);

  /// A new adapter on every segment of the layer, or on `segments` (names from
  /// segment_names()). Initialised as PEFT does by default (A Kaiming-uniform, the same
  /// on every rank; B zeros; the embedding's A zeros and B N(0, 1)), so the layer's output
  /// is unchanged until the zero factor is trained.
  /// Refused under invariant numerics and for a name the layer has already.
  void add(const std::string& name, const LoRAConfig& config, const std::vector<std::string>& segments = {});
  /// A new adapter read from `checkpoint`: segment i from `prefixes[i] + ".lora_A.weight"`
  /// and `".lora_B.weight"` (the embedding's: ".lora_embedding_A" and "_B"; an empty
  /// prefix: segment i has no adapter), this rank's slice
  /// of each. Strict and collective: a wrong shape or dtype, a non-finite value or a
  /// missing tensor fails on every rank, naming the tensor and the numbers.
  void load(const Checkpoint& checkpoint, const std::string& name, const LoRAConfig& config,
            const std::vector<std::string>& prefixes);
  /// The adapter's whole A and B (every rank's slices gathered, on every rank: collective)
  /// under the names load reads with `prefixes`.
  std::map<std::string, at::Tensor> gather(const std::string& name, const std::vector<std::string>& prefixes) const;
  void remove(const std::string& name);
  /// Adds adapter `name`'s scaling * B A to this rank's slice of the base's `weight` (an
  /// unquantized weight of the factors' dtype), or takes it back out (`unmerge`). A merged
  /// adapter adds nothing in forward (the base computes it), and while one is merged no
  /// other adapter may be selected. Local: every rank merges its own slice.
  void merge_into(const std::string& name, at::Tensor weight, bool unmerge = false);
  bool merged(const std::string& name) const;

  /// The adapters, in the order they were added (parameters() lists theirs in it).
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return adapters_.count(name) > 0; }
  const LoRAConfig& config(const std::string& name) const;
  /// The base layer's output segments ("linear" for ColumnParallelLinear, RowParallelLinear
  /// and ParallelLMHead; q, k, v; gate, up; "embedding").
  std::vector<std::string> segment_names() const;
  /// Adapter `name`'s local A and B of `segment` (undefined where it has none).
  at::Tensor lora_A(const std::string& name, const std::string& segment) const;
  at::Tensor lora_B(const std::string& name, const std::string& segment) const;

  /// The selection this layer reads (its own until a model shares one among its layers).
  LoRASelection& selection() { return *selection_; }
  void share_selection(std::shared_ptr<LoRASelection> selection);
  /// Whether the selection names an adapter this layer has.
  bool active() const;

  /// The layers' hooks. Column: x the layer's input ([..., in], this rank's tokens under
  /// sequence parallelism), y its local output before any gather -> y plus the adapters.
  /// Row: x this rank's input columns, y its partial sum before the reduction.
  at::Tensor add_to(const at::Tensor& x, at::Tensor y) const;

  void pretty_print(std::ostream& stream) const override;

 private:
  struct Adapter {
    LoRAConfig config;
    std::shared_ptr<torch::nn::Module> module;
    std::vector<at::Tensor> A, B;  // per segment; undefined: no adapter on that segment
    bool merged = false;
    struct Prepared;                     // what the inference path derives from A and B
    std::shared_ptr<Prepared> prepared;  // made on first use, again once A or B changed
  };
  Adapter& make(const std::string& name, const LoRAConfig& config, const std::vector<bool>& on);
  at::Tensor delta(const Adapter& adapter, const at::Tensor& x) const;
  void add_in_place(const Adapter& adapter, const at::Tensor& x, at::Tensor& y) const;
  size_t segment_index(const std::string& segment) const;

  std::shared_ptr<const detail::LoRABase> base_;
  std::map<std::string, Adapter> adapters_;
  std::shared_ptr<LoRASelection> selection_;
};

TORCH_MODULE(LoRA);

}  // namespace tp
