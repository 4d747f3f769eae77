#pragma once
// ParallelLMHead: the output projection to vocabulary logits, column-parallel over the
// vocabulary (split like VocabParallelEmbedding, padding included), optionally tied to
// an embedding's weight.
//
// Split states: x is mirrored; the weight is split on dim 0 (the vocabulary); the
// logits are split on their last dim, or mirrored with gather_output. Padding columns
// of a local slice are -inf, so they never win an argmax and get zero softmax weight;
// a gathered result leaves them out ([..., vocab_size]). Training never needs the full
// logits: cross_entropy() and argmax() work on the local slices (tp/layers/vocab/loss.h).

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
#include "tp/layers/numerics/numerics.h"
#include "tp/layers/vocab/sampling.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/range.h"
#include "tp/shard/vocab.h"

namespace tp {
namespace detail {
class LinearStep;
}

/// Options for ParallelLMHead. Sizes are GLOBAL.
/// Example: tp::ParallelLMHead head(tp::ParallelLMHeadOptions(4096, 128256), comm);
struct ParallelLMHeadOptions {
  ParallelLMHeadOptions(int64_t hidden_size, int64_t vocab_size);
  TORCH_ARG(int64_t, hidden_size);
  /// Real tokens (without padding).
  TORCH_ARG(int64_t, vocab_size);
  /// As VocabParallelEmbeddingOptions::pad_to_multiple_of (a tied head takes the embedding's).
  TORCH_ARG(int64_t, pad_to_multiple_of) = 1;
  /// Per-rank weights for unequal devices (empty: even): each rank's share of the padded
  /// rows within one pad_to_multiple_of unit of its weight's (tp::partition_vocab).
  TORCH_ARG(std::vector<double>, split_weights) = {};
  /// All-gather the logits (without padding) so every rank gets [..., vocab_size].
  TORCH_ARG(bool, gather_output) = false;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// false: the parameters are allocated uninitialized (at::empty) and left unfilled, as
  /// torch.nn.utils.skip_init does, for a load_weights to fill (CausalLM::from_pretrained
  /// builds its layers so; LoadSession::expect_filled names any tensor a load left unfilled).
  /// true: reset_parameters() fills them at construction.
  TORCH_ARG(bool, init_weights) = true;
  /// The order of its sums (tp/layers/numerics/numerics.h): kAuto reads TP_NUMERICS.
  TORCH_ARG(Numerics, numerics) = Numerics::kAuto;
};

/// The module behind the ParallelLMHead holder.
class ParallelLMHeadImpl : public torch::nn::Cloneable<ParallelLMHeadImpl> {
 public:
  /// An untied head with a weight of its own ([local rows, hidden_size], registered as "weight").
  explicit ParallelLMHeadImpl(ParallelLMHeadOptions options, Communicator comm = {});
  /// A head tied to `embedding`: its `weight` IS the embedding's weight (one tensor,
  /// registered as a parameter of the embedding only, so an optimizer sees it once and
  /// both uses add to its gradient). Sizes, padding, dtype, device and communicator are
  /// the embedding's.
  /// Example: tp::ParallelLMHead head(embed, /*gather_output=*/false);
  explicit ParallelLMHeadImpl(const VocabParallelEmbedding& embedding, bool gather_output = false,
                              Numerics numerics = Numerics::kAuto);

  void reset() override;
  /// Untied: N(0, 1/hidden_size) rows, padding rows zero. Tied: nothing (the embedding owns the weight).
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  /// x: [..., hidden_size] -> local logits [..., local rows] (padding columns -inf), or
  /// [..., vocab_size] with gather_output.
  at::Tensor forward(const at::Tensor& x);

  /// Per-token cross entropy from this rank's local logits (forward's output without
  /// gather_output); see vocab_parallel_cross_entropy.
  at::Tensor cross_entropy(const at::Tensor& local_logits, const at::Tensor& target, int64_t ignore_index = -100) const;
  /// The greedy token of each row, from the local logits; see vocab_parallel_argmax.
  at::Tensor argmax(const at::Tensor& local_logits) const;
  /// A sampled token of each row of local_logits [rows, local rows]; see vocab_parallel_sample.
  at::Tensor sample(const at::Tensor& local_logits, const SamplingParams& params, int64_t step,
                    const at::Tensor& previous = at::Tensor(), int64_t first_row = 0) const;

  /// Untied: loads `prefix + ".weight"` ([vocab_size, hidden_size], floating), reading
  /// only this rank's rows. Tied: an error (load the embedding).
  /// Example: head->load_weights(ckpt, "lm_head").
  void load_weights(const Checkpoint& checkpoint, const std::string& prefix);
  /// Untied: {prefix + ".weight": the whole [vocab_size, hidden_size] weight} (an
  /// all-gather: every rank calls this). Tied: nothing (the embedding writes the weight,
  /// as a tied Hugging Face checkpoint stores it once).
  std::map<std::string, at::Tensor> gather_weights(const std::string& prefix) const;

  bool tied() const { return tied_; }
  const VocabPartition& partition() const { return partition_; }
  /// This rank's rows of the padded vocabulary (the local logits' columns).
  Range local_range() const { return partition_.range(comm.rank()); }
  /// This rank's real tokens.
  Range vocab_range() const { return partition_.real(comm.rank()); }
  /// This head's LoRA adapters (tp/layers/lora/lora.h: A [r, hidden] whole, B [vocab, r]
  /// split with the vocabulary, the padding columns left alone), its own even when the head
  /// is tied; registered as its child "lora" on the first call.
  LoRAImpl& lora();

  ParallelLMHeadOptions options;
  Communicator comm;
  at::Tensor weight;  // [local rows, hidden_size]; tied: the embedding's weight itself

 private:
  bool tied_ = false;
  VocabPartition partition_;
  Numerics numerics_ = Numerics::kDefault;          // resolved at construction
  std::shared_ptr<const detail::LinearStep> step_;  // the GEMM and its collectives (layers/step.h)
  at::Tensor padding_mask_;  // [local rows] bool, true on padding rows; undefined without padding
  std::shared_ptr<LoRAImpl> lora_;
};

/// A ModuleHolder for ParallelLMHeadImpl.
TORCH_MODULE(ParallelLMHead);

}  // namespace tp
