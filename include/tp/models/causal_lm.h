#pragma once
// CausalLM: a whole decoder from a Hugging Face folder (Llama, Qwen2, Qwen3, Mistral,
// Phi-3, GPT-NeoX, Gemma 2, Gemma 3 text), tensor-parallel over a Communicator:
// VocabParallelEmbedding, the DecoderLayers, the final norm and a ParallelLMHead (tied to
// the embedding when the config says so), with the family's embedding scale and final
// soft cap.
//
// Split states: token ids and hidden states are mirrored; logits are split over the
// vocabulary (ParallelLMHead's local slice, padding columns -inf); greedy decoding and
// the loss work on those slices (vocab_parallel_argmax / _cross_entropy).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "tp/comm/communicator.h"
#include "tp/layers/vocab/parallel_lm_head.h"
#include "tp/layers/vocab/sampling.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/attention_dp.h"
#include "tp/models/decoder_layer.h"
#include "tp/models/kv_cache.h"
#include "tp/models/model_config.h"
#include "tp/models/model_split.h"
#include "tp/models/norm.h"
#include "tp/models/peft_config.h"
#include "tp/models/rotary_embedding.h"

namespace tp {

/// How a CausalLM is built from its config.
/// Example: tp::CausalLMOptions().dtype(at::kDouble).pad_vocab_to_multiple_of(64)
struct CausalLMOptions {
  /// The compute dtype; Undefined: the config's (config.json's "dtype").
  TORCH_ARG(at::ScalarType, dtype) = at::ScalarType::Undefined;
  TORCH_ARG(at::Device, device) = at::kCPU;
  /// VocabParallelEmbedding / ParallelLMHead padding (1: none).
  TORCH_ARG(int64_t, pad_vocab_to_multiple_of) = 1;
  /// Use only the first N decoder layers (0: all), e.g. for a benchmark of a few layers.
  TORCH_ARG(int64_t, num_layers) = 0;
  /// Mixture-of-experts layers: the number of groups the experts are distributed over
  /// (expert parallelism), each group's ranks splitting its experts (expert tensor
  /// parallelism). 1: every rank a slice of every expert; 0: each expert whole on one
  /// rank; 2 at TP 4: two groups of two (MoEParallelMLPOptions::expert_parallel_size).
  TORCH_ARG(int64_t, expert_parallel_size) = 1;
  /// Per-rank weights for unequal devices (llama.cpp's --tensor-split; empty: even), e.g.
  /// {3, 1} gives rank 0 three quarters of every layer: heads, MLP rows, experts and
  /// vocabulary rows each cut within one alignment unit of the weights, the leftover units
  /// rotating over the layers (tp/models/model_split.h; split_plan() prints the result).
  /// A weight no layer can honour is refused before anything is built, naming the weights
  /// that work.
  TORCH_ARG(std::vector<double>, split_weights) = {};
  /// Attention data parallelism (tp/models/attention_dp.h; TensorRT-LLM's
  /// enable_attention_dp): D groups of world / D consecutive ranks, each with its own batch
  /// (the ids each rank passes are its group's: any prompt count, zero included, and
  /// length), attention, KV cache, embedding and LM head (split over the group's ranks), the
  /// MLP and experts over every rank. 1: plain tensor parallelism. Training sums the
  /// replicated parameters' gradients over the groups: reduce_data_parallel_grads().
  TORCH_ARG(int64_t, attention_data_parallel_size) = 1;
  /// The order of every sum (tp/layers/numerics/numerics.h; kAuto reads TP_NUMERICS). kInvariant:
  /// logits, losses and gradients with the bits of TP 1 at every TP size and of a
  /// prompt alone in any batch; the vocabulary is then padded to a multiple of
  /// kInvariantChunk as well (padding rows are never seen).
  TORCH_ARG(Numerics, numerics) = Numerics::kAuto;
  /// false: every parameter allocated uninitialized (at::empty), as torch.nn.utils.skip_init
  /// or transformers' meta-device loading leave them, for load_weights to fill: no
  /// random draw before a load (the layers' init_weights option). from_pretrained always
  /// builds so, and its LoadSession::expect_filled names any tensor the load left unfilled.
  /// true: random weights, as every layer's reset_parameters() draws them.
  TORCH_ARG(bool, init_weights) = true;
};

/// The module behind the CausalLM holder.
class CausalLMImpl : public torch::nn::Cloneable<CausalLMImpl> {
 public:
  CausalLMImpl(ModelConfig config, CausalLMOptions options = {}, Communicator comm = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// ids: int64 [batch, seq], the same on every rank -> local logits
  /// [batch, seq', local vocab rows] with seq' = seq, or the last `logits_to_keep`
  /// positions (0: all). With a cache, the tokens continue the cached sequence (their
  /// positions start at cache->length, which this advances); without, they start at 0.
  at::Tensor forward(const at::Tensor& ids, KVCache* cache = nullptr, int64_t logits_to_keep = 0);

  /// Local logits -> all of them, [..., vocab_size] (an all-gather; padding left out).
  at::Tensor gather_logits(const at::Tensor& local_logits) const;

  /// An empty cache for `batch` sequences of up to `capacity` positions.
  KVCache make_cache(int64_t batch, int64_t capacity) const;

  /// Greedy decoding: `new_tokens` tokens after `prompt` (int64 [batch, seq]), each the
  /// argmax over the whole vocabulary (ties: lowest id), with a KV cache: one forward of
  /// the prompt, then one token at a time. Returns int64 [batch, new_tokens], the same on
  /// every rank. LongRoPE (Phi-3): once the sequence outgrows
  /// original_max_position_embeddings, the cache is dropped and the whole sequence runs
  /// again with the long factors, as transformers' generate does.
  at::Tensor generate_greedy(const at::Tensor& prompt, int64_t new_tokens);

  /// What generate() does: how many tokens, how they are chosen (sampling.temperature 0:
  /// greedy; the filters of tp/layers/vocab/sampling.h, drawn without gathering the
  /// logits), and where a row stops.
  struct GenerateOptions {
    int64_t max_new_tokens = 16;
    SamplingParams sampling = greedy_sampling();
    /// A row ends with the first of these it emits (transformers' eos_token_id).
    std::vector<int64_t> stop_token_ids;
    /// Written after a row's stop token.
    int64_t pad_token_id = 0;
    static SamplingParams greedy_sampling() {
      SamplingParams p;
      p.temperature = 0;
      return p;
    }
  };
  /// Generated tokens and how many of them each row has (up to and including its stop token).
  struct Generated {
    at::Tensor tokens;   ///< int64 [batch, steps run]: max_new_tokens, fewer once every row stopped
    at::Tensor lengths;  ///< int64 [batch]
  };
  /// Decoding with a KV cache (LongRoPE's re-run as generate_greedy says), each token chosen by
  /// vocab_parallel_sample with step = its index among the new tokens and the row's prompt
  /// and tokens so far as the repetition penalty's history. The same on every rank, and the
  /// same tokens at every TP size wherever the logits are (invariant numerics).
  Generated generate(const at::Tensor& prompt, const GenerateOptions& options);

  /// Loads every tensor of the model from `checkpoint` (Hugging Face names), this rank's
  /// shards only.
  void load_weights(const Checkpoint& checkpoint);

  /// Every tensor load_weights reads, whole, under its Hugging Face name (the shards
  /// all-gathered: every rank calls this and gets all of them), so rank 0 can write a
  /// folder that loads at any TP size: tp::save_sharded_safetensors(dir, model->gather_weights(), ...)
  /// next to the config.json. (tp::gather_weights on this module gathers the same
  /// tensors under its module paths instead.)
  std::map<std::string, at::Tensor> gather_weights() const;

  /// What every rank holds (heads, MLP rows, experts, vocabulary rows per layer, and the
  /// bytes of its parameters and buffers, measured and all-gathered: every rank calls
  /// this); to_string() prints it. Example: std::cout << model->split_plan().to_string();
  SplitPlan split_plan() const;

  /// Attention data parallelism, after a backward: every parameter outside the MLPs and
  /// experts (attention, norms, embedding, LM head; one copy per group) gets the sum of its
  /// groups' gradients (a parameter without one counts as zeros), so a step sees the
  /// gradient of every group's loss, as a single device would. Collective; a no-op without
  /// attention data parallelism.
  void reduce_data_parallel_grads();

  /// config.json, then the safetensors of `folder` (sharded or not), through
  /// ModelConfig and open_checkpoint, strictly: a tensor of the folder that nothing
  /// reads (but those LoadSessionOptions::default_allow_unread() allows, and the layers
  /// options.num_layers leaves out) is an error on every rank (LoadSession::finish), and so
  /// is a parameter no tensor filled: the model is built with init_weights(false) whatever
  /// `options` says, so it costs the allocation and the reads, no random draw.
  /// Example: auto model = tp::CausalLMImpl::from_pretrained("/models/Qwen3-0.6B", {}, comm);
  static std::shared_ptr<CausalLMImpl> from_pretrained(const std::string& folder, CausalLMOptions options = {},
                                                       Communicator comm = {});

  ModelConfig config;
  CausalLMOptions options;
  /// Which LoRA adapter each row of a batch takes (tp/models/adapters.h): every layer's
  /// adapters read this one selection. Empty: the base model alone.
  std::shared_ptr<LoRASelection> adapter_selection = std::make_shared<LoRASelection>();
  /// The adapters the model holds, by name, as their folders configured them.
  std::map<std::string, PeftLoRAConfig> adapter_configs;
  Communicator comm;
  /// The attention's groups (AttentionDataParallel::none(comm) without them): the embedding,
  /// the layers' attention, the final norm's stream and the LM head run over dp.attention.
  AttentionDataParallel dp;
  at::ScalarType dtype = at::kFloat;  // resolved compute dtype
  VocabParallelEmbedding embed_tokens{nullptr};
  std::vector<DecoderLayer> layers;  // also in layer_list, registered as "layers" ("layers.{i}.*")
  torch::nn::ModuleList layer_list{nullptr};
  Norm norm{nullptr};
  ParallelLMHead lm_head{nullptr};
  RotaryEmbedding rotary;
  /// Gemma 3's sliding layers' own RoPE (config.has_local_rope), else unused.
  RotaryEmbedding local_rotary;

  /// The (cos, sin) tables of `positions` for each RoPE the layers use: [0] the model's,
  /// [1] the sliding layers' local one (Gemma 3; else the same tables).
  std::vector<std::pair<at::Tensor, at::Tensor>> rotary_tables(const at::Tensor& positions) const;
  /// Which of rotary_tables layer i reads.
  int64_t rotary_table_of(int64_t layer) const { return config.has_local_rope && config.is_sliding(layer) ? 1 : 0; }
  /// The head's output as the family finishes it: Gemma 2's final soft cap on the real
  /// vocabulary columns (the padding stays -inf), else unchanged.
  at::Tensor finish_logits(const at::Tensor& local_logits) const;
};

/// A ModuleHolder for CausalLMImpl.
TORCH_MODULE(CausalLM);

}  // namespace tp
