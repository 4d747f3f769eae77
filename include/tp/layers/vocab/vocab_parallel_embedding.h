#pragma once
// VocabParallelEmbedding: a token embedding table with its rows (the vocabulary) split
// over ranks.
//
// Split states: the token ids are mirrored on every rank; the table is split on dim 0
// (tp::partition_vocab, optionally padded); each rank looks up the ids it owns and gives
// zeros for the others, so the partial embeddings sum to the embedding. The sum is
// all-reduced to a mirrored [..., embedding_dim], or, under sequence parallelism,
// reduce-scattered along dim 0 (the tokens) so each rank keeps its slice of them.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/layers/lora/lora.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/range.h"
#include "tp/shard/vocab.h"

namespace tp {

/// Options for VocabParallelEmbedding. Sizes are GLOBAL.
/// Example: tp::VocabParallelEmbedding embed(tp::VocabParallelEmbeddingOptions(128256, 4096), comm);
struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim);
  /// The vocabulary size (real tokens).
  TORCH_ARG(int64_t, num_embeddings);
  TORCH_ARG(int64_t, embedding_dim);
  /// Pad the vocabulary to a multiple of this and split it in whole units of it (1: no
  /// padding). The padding rows are zero and no token maps to them.
  TORCH_ARG(int64_t, pad_to_multiple_of) = 1;
  /// Per-rank weights for unequal devices (empty: even): each rank's share of the padded
  /// rows within one pad_to_multiple_of unit of its weight's (tp::partition_vocab).
  TORCH_ARG(std::vector<double>, split_weights) = {};
  /// Reduce-scatter the output along dim 0 (the tokens) instead of all-reducing it: rank
  /// r keeps rows tp::sequence_ranges(ids.size(0), world)[r] (tp/layers/sequence_parallel.h).
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// false: the parameters are allocated uninitialized (at::empty) and left unfilled, as
  /// torch.nn.utils.skip_init does, for a load_weights to fill (CausalLM::from_pretrained
  /// builds its layers so; LoadSession::expect_filled names any tensor a load left unfilled).
  /// true: reset_parameters() fills them at construction.
  TORCH_ARG(bool, init_weights) = true;
};

/// The module behind the VocabParallelEmbedding holder.
class VocabParallelEmbeddingImpl : public torch::nn::Cloneable<VocabParallelEmbeddingImpl> {
 public:
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, Communicator comm = {})
      : VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions(num_embeddings, embedding_dim), std::move(comm)) {}
  explicit VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options, Communicator comm = {});

  void reset() override;
  /// N(0, 1) rows (torch::nn::Embedding's initialisation); padding rows zero.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// ids: integer tensor [...] (int64 or int32), the same on every rank, every id in
  /// [0, num_embeddings) (else an error naming the id, on every rank) -> [..., embedding_dim]
  /// mirrored, or with sequence_parallel this rank's rows of dim 0.
  at::Tensor forward(const at::Tensor& ids);

  /// Loads `prefix + ".weight"` ([num_embeddings, embedding_dim], a floating dtype),
  /// reading only this rank's rows; padding rows are set to zero.
  /// Example: embed->load_weights(ckpt, "model.embed_tokens").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);
  /// {prefix + ".weight": the whole [num_embeddings, embedding_dim] table} (every rank
  /// gets it: an all-gather, so every rank calls this), what load_weights reads.
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix) const;

  /// This table's LoRA adapters (tp/layers/lora/lora.h; PEFT's lora_embedding_A [r, vocab],
  /// split with the table's rows, and lora_embedding_B [embedding_dim, r], whole), added to
  /// the partial embedding before its one reduction; registered as its child "lora" on the
  /// first call.
  LoRAImpl& lora();

  /// Which rows every rank owns.
  const VocabPartition& partition() const { return partition_; }
  /// This rank's rows of the padded table, [begin, end).
  Range local_range() const { return partition_.range(comm.rank()); }
  /// This rank's real tokens (local_range() without the padding).
  Range vocab_range() const { return partition_.real(comm.rank()); }

  VocabParallelEmbeddingOptions options;
  Communicator comm;
  at::Tensor weight;  // [local rows (padding included), embedding_dim]

 private:
  VocabPartition partition_;
  std::shared_ptr<LoRAImpl> lora_;
};

/// A ModuleHolder for VocabParallelEmbeddingImpl.
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace tp
