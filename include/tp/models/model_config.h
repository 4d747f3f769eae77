#pragma once
// ModelConfig: what a Hugging Face checkpoint folder says about itself in config.json
// (docs/checkpoint_formats.md): the decoder's sizes, biases, RoPE parameters, dtype,
// and its quantization_config turned into a QuantConfig per linear layer.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tp/layers/moe/checkpoint_layout.h"
#include "tp/layers/moe/router.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/loader/fused_layout.h"
#include "tp/quant/quant_config.h"

namespace tp {

class Checkpoint;

namespace detail {
struct QuantizationParser;
}

/// The decoder families tp reads (config.json's model_type).
enum class ModelType {
  kLlama,
  kQwen2,
  kQwen3,
  kMistral,
  kPhi3,
  kGptNeoX,
  kGemma2,
  kGemma3,
  kMixtral,
  kQwen2Moe,
  kQwen3Moe,
  kGlm4Moe,
  kGptOss,
};
/// The family's model_type ("llama", "gemma3_text", ...), as model_families() names it.
const char* to_string(ModelType type);

/// One decoder family tp reads.
struct ModelFamily {
  const char* model_type;  ///< config.json's model_type ("qwen3_moe")
  ModelType type;
  bool mixture_of_experts;  ///< its decoder layers (some or all) are MoEParallelMLP blocks
};
/// Every family tp reads, in ModelType order: the registry (src/models/model_families.cpp)
/// that parsing config.json, to_string(ModelType) and the Python tp.ModelType read.
const std::vector<ModelFamily>& model_families();

/// The RoPE variants tp reads (rope_type).
enum class RopeType {
  kDefault,   ///< inv_freq[i] = theta^(-2i / rotary_dim)
  kLlama3,    ///< Llama 3.1's frequency-band scaling (factor, low/high_freq_factor, original max positions)
  kLinear,    ///< positions divided by `factor` (Gemma 3's global layers)
  kLongRope,  ///< Phi-3's LongRoPE: per-frequency short / long factors, cos and sin scaled
  kYarn,      ///< YaRN: frequencies blended between interpolated and original by a ramp, cos and sin scaled (GPT-OSS)
};
/// "default", "llama3", "linear", "longrope", "yarn".
const char* to_string(RopeType type);

/// Rotary position embedding parameters, from transformers 5's `rope_parameters` or
/// transformers 4's top-level `rope_theta` + `rope_scaling` (either spelling).
struct RopeParameters {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  /// kLlama3 and kLinear (read from the config, every one of them required there).
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  /// kLlama3, kLongRope: the context the model was pretrained with.
  int64_t original_max_position_embeddings = 0;
  /// kLongRope: one factor per frequency (rotary_dim / 2 each): the short ones while
  /// the sequence (its largest position + 1) fits original_max_position_embeddings,
  /// the long ones beyond; cos and sin are multiplied by attention_factor.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  /// kYarn (also factor, original_max_position_embeddings and attention_factor, which
  /// defaults to 0.1 ln(factor) + 1, or the mscale / mscale_all_dim ratio): the ramp's
  /// rotation bounds, and whether its ends are rounded to whole dimensions (truncate).
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
};

/// The normalisation layers of a family.
enum class NormKind {
  kRMS,            ///< weight * x / rms(x) (Llama, Qwen, Mistral, Phi-3)
  kRMSUnitOffset,  ///< (1 + weight) * x / rms(x), all in float32 (Gemma)
  kRMSScaleFirst,  ///< weight * x / rms(x), the product in float32, cast last (GPT-OSS)
  kLayerNorm,      ///< LayerNorm with weight and bias (GPT-NeoX)
};
/// "rms", "rms_unit_offset", "rms_scale_first", "layer_norm".
const char* to_string(NormKind kind);

/// The MLP activation (config.json's hidden_act / hidden_activation).
enum class Activation {
  kSilu,      ///< "silu" / "swish"
  kGelu,      ///< "gelu": the exact (erf) GELU
  kGeluTanh,  ///< "gelu_pytorch_tanh": torch's tanh approximation
  kGeluNew,   ///< "gelu_new": the same formula in transformers' operations
  kGeluFast,  ///< "gelu_fast": with its truncated constant 0.7978845608 (GPT-NeoX-20B)
};
/// "silu", "gelu", "gelu_tanh", "gelu_new", "gelu_fast".
const char* to_string(Activation act);

/// Where a family stores each tensor: the names (without ".weight" / ".bias") and the
/// declared layouts of the fused projections (tp/loader/fused_layout.h).
struct CheckpointNames {
  std::string embed = "model.embed_tokens";
  std::string final_norm = "model.norm";
  std::string lm_head = "lm_head";
  std::string layers = "model.layers";  ///< layer i is "<layers>.<i>"
  /// Under a layer:
  std::string attention = "self_attn";
  std::string o_proj = "o_proj";  ///< under attention
  std::string mlp = "mlp";
  std::string up_proj = "up_proj";  ///< under mlp, the ungated MLP's first projection
  std::string down_proj = "down_proj";
  std::string input_norm = "input_layernorm";
  std::string post_attention_norm = "post_attention_layernorm";
  std::string pre_feedforward_norm = "pre_feedforward_layernorm";    ///< Gemma
  std::string post_feedforward_norm = "post_feedforward_layernorm";  ///< Gemma
  QKVCheckpointLayout qkv;                                           ///< under attention
  GateUpCheckpointLayout gate_up;                                    ///< under mlp
  /// A mixture-of-experts layer's block under the layer ("block_sparse_moe" for
  /// Mixtral, "mlp" for the Qwen-MoE families), and how its router, experts and shared
  /// expert are named in it (tp/layers/moe/moe_parallel_mlp.h).
  std::string moe = "mlp";
  MoECheckpointLayout moe_layout;
};

/// The mixture-of-experts MLPs of a model (tp::MoEParallelMLP): none when num_experts is 0.
struct MoEParameters {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  /// One expert's intermediate size (Mixtral: intermediate_size; Qwen-MoE: moe_intermediate_size).
  int64_t intermediate_size = 0;
  /// How the router scores and weighs the experts (Mixtral: softmax, renormalised;
  /// Qwen-MoE: by norm_topk_prob, the weights in the model's dtype).
  MoERouterOptions router;
  /// The shared expert's intermediate size (Qwen2-MoE: shared_expert_intermediate_size;
  /// 0: none), and whether a sigmoid gate scales it (Qwen2-MoE's shared_expert_gate).
  int64_t shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  /// Biases on every expert's projections (GPT-OSS).
  bool expert_bias = false;
  /// The experts' activation when it is not the model's hidden_act ("swiglu_oai" with its
  /// alpha and limit: GPT-OSS); empty: hidden_act.
  std::string activation;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  /// Which layers are MoE (Qwen-MoE: decoder_sparse_step, mlp_only_layers; the rest dense).
  std::vector<bool> layers;
  /// How many groups the experts are distributed over (not in config.json:
  /// CausalLMOptions::expert_parallel_size sets it; MoEParallelMLPOptions says how).
  int64_t expert_parallel_size = 1;
};

/// Which linear layers of a checkpoint are quantized, and how: config.json's
/// quantization_config, read once. Supported: compressed-tensors (config_groups of
/// float-quantized FP8 per tensor / channel / 128x128 block, int-quantized W8A8 and
/// W8A16, pack-quantized W4A16 sym / asym; `ignore`), GPTQ (4 bits, group 32/64/128,
/// sym or asym, checkpoint_format gptq = v1 or gptq_v2 = v2; desc_act refused), AWQ
/// GEMM (zero_point) and HF fine-grained FP8 (weight_block_size [128, 128], dynamic
/// activations). Anything else is an error naming the field and its value.
class CheckpointQuantization {
 public:
  /// An unquantized checkpoint.
  CheckpointQuantization() = default;

  /// quantization_config's quant_method ("compressed-tensors", "gptq", "awq", "fp8"),
  /// or "none".
  const std::string& method() const { return method_; }
  bool quantized() const { return method_ != "none"; }

  /// The format of the linear layer `module` (its checkpoint name without ".weight",
  /// e.g. "model.layers.0.mlp.down_proj"); QuantConfig{} (kNone) for a layer stored
  /// unquantized. A layer that two compressed-tensors groups claim is an error.
  QuantConfig for_module(const std::string& module) const;

  /// One line per rule, for messages and repr: "gptq: int4_gptq:g128:sym:v2 for every
  /// decoder linear; lm_head unquantized".
  std::string describe() const;

  // How a name is matched, and the rules read from the config.
  enum class Match {
    kExact,         ///< the module name itself
    kRegex,         ///< compressed-tensors "re:<regex>": Python's re.match (anchored at the start)
    kLinear,        ///< compressed-tensors "Linear": every linear layer
    kTransformers,  ///< transformers' modules_to_not_convert: prefix up to a '.' (regex allowed) or suffix
    kSubstring,     ///< AutoAWQ's modules_to_not_convert: any substring
    kLmHead,        ///< the name "lm_head"
  };
  struct Pattern {
    Match match = Match::kExact;
    std::string text;
    bool matches(const std::string& module) const;
  };
  struct Rule {
    std::string name;  // "group_0", or the method
    std::vector<Pattern> targets;
    QuantConfig config;
  };

 private:
  friend struct detail::QuantizationParser;
  std::string method_ = "none";
  std::vector<Rule> rules_;      // a module takes the config of the rule whose targets match it
  std::vector<Pattern> ignore_;  // modules left unquantized whatever the rules say
};

/// config.json of a decoder checkpoint: Llama, Qwen2, Qwen3, Mistral, Phi-3, GPT-NeoX,
/// Gemma 2 or Gemma 3 (text). The family sets the architecture fields below (the norm,
/// the activation, the residual form, the checkpoint names and fused layouts), some
/// from the family's own config fields; docs/checkpoint_formats.md lists them.
/// Example:
///   auto config = tp::ModelConfig::from_pretrained("/models/Qwen3-8B");
///   auto opts = tp::decoder_layer_options(config, 0);   // tp/models/layer_options.h
struct ModelConfig {
  /// Reads `folder`/config.json (and, for GPTQ checkpoints whose config.json has no
  /// quantization_config, `folder`/quantize_config.json).
  static ModelConfig from_pretrained(const std::string& folder);
  /// Parses config.json's text; `where` names it in errors.
  static ModelConfig from_json(const std::string& text, const std::string& where = "config.json");

  ModelType model_type = ModelType::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  /// num_key_value_heads (absent: num_attention_heads).
  int64_t num_key_value_heads = 0;
  /// head_dim (absent, and always for Qwen2: hidden_size / num_attention_heads).
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  /// Biases of q/k/v (Llama and Qwen3: attention_bias; Qwen2: always).
  bool qkv_bias = false;
  /// Bias of o_proj (Llama and Qwen3: attention_bias; Qwen2: never).
  bool o_bias = false;
  /// Biases of gate/up/down (Llama: mlp_bias; Qwen: never).
  bool mlp_bias = false;
  /// The LM head is model.embed_tokens.weight (no lm_head.weight in the files).
  bool tie_word_embeddings = false;
  /// The norms' epsilon (rms_norm_eps, or GPT-NeoX's layer_norm_eps).
  double norm_eps = 1e-6;
  RopeParameters rope;

  // The architecture, as the family defines it.
  NormKind norm = NormKind::kRMS;
  Activation hidden_act = Activation::kSilu;
  /// act(gate) * up through gate_up (true), or act(up) through up_proj (GPT-NeoX).
  bool gated_mlp = true;
  /// out = x + attention(norm1(x)) + mlp(norm2(x)) with one all-reduce for both sums
  /// (GPT-NeoX's use_parallel_residual); false: the sequential pre-norm residuals.
  bool parallel_residual = false;
  /// Per-head norms of q and k before RoPE (Qwen3, Gemma 3).
  bool qk_norm = false;
  /// Gemma 2 / 3: the attention and MLP outputs normed before their residual adds
  /// (post_attention_layernorm, post_feedforward_layernorm), the MLP input by
  /// pre_feedforward_layernorm.
  bool sandwich_norms = false;
  /// The leading part of each head RoPE rotates (partial_rotary_factor * head_dim; the
  /// rest passes through); head_dim when the config has no partial rotary.
  int64_t rotary_dim = 0;
  /// Sliding-window attention: a query at position p sees keys p - window < j <= p
  /// (0: none), on the layers `sliding_layers` marks (Mistral, Phi-3: every layer).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  /// The multiplier of q . k (head_dim^-0.5, or Gemma's query_pre_attn_scalar^-0.5).
  double attention_scale = 0;
  /// GPT-OSS: a learned logit per query head ("self_attn.sinks") joins each query's
  /// softmax over the keys and takes its share of the probability, attending to nothing.
  bool attention_sinks = false;
  /// Gemma 2's soft caps: cap * tanh(x / cap) on the attention scores and the final
  /// logits (0: none).
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  /// Embeddings multiplied by sqrt(hidden_size) (Gemma; in the model's dtype).
  bool scale_embeddings = false;
  /// Gemma 3: the sliding layers' own RoPE (rope_local_base_freq, no scaling).
  bool has_local_rope = false;
  RopeParameters local_rope;
  CheckpointNames names;
  MoEParameters moe;
  /// Layers the checkpoint stores after the decoder's num_hidden_layers that the model
  /// does not use (GLM's multi-token-prediction layers: num_nextn_predict_layers);
  /// CausalLM::from_pretrained leaves them unread.
  int64_t extra_layers = 0;
  /// Whether layer `layer`'s MLP is a mixture of experts.
  bool is_moe(int64_t layer) const {
    return moe.num_experts > 0 && layer >= 0 && layer < static_cast<int64_t>(moe.layers.size()) &&
           moe.layers[static_cast<size_t>(layer)];
  }
  /// dtype (transformers 5) or torch_dtype (4.x) the tensors were saved in (absent: float32).
  at::ScalarType dtype = at::kFloat;
  /// quantization_config (absent: unquantized).
  CheckpointQuantization quantization;
  /// Where it was read from ("/models/x/config.json"), for messages.
  std::string source;

  /// Query width num_attention_heads * head_dim (q_proj's out_features, o_proj's in_features).
  int64_t q_size() const { return num_attention_heads * head_dim; }
  /// Key / value width num_key_value_heads * head_dim.
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  /// Whether layer `layer` attends through the sliding window.
  bool is_sliding(int64_t layer) const {
    return sliding_window > 0 && layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
           sliding_layers[static_cast<size_t>(layer)];
  }
  /// "<names.layers>.<layer>"
  std::string layer_prefix(int64_t layer) const { return names.layers + "." + std::to_string(layer); }
  /// The format of a linear layer, by checkpoint name (quantization.for_module).
  QuantConfig quant_config(const std::string& module) const { return quantization.for_module(module); }

  /// A mixture of experts' checkpoint stores its experts per expert, under the family's
  /// names ("block_sparse_moe.experts.0.w1.weight"), or fused as transformers 5 holds
  /// them ("mlp.experts.gate_up_proj" [experts, 2 * intermediate, hidden],
  /// save_pretrained(save_original_format=False)); config.json does not say which.
  /// This reads it from `checkpoint`'s names (the first MoE layer's) and makes `names`
  /// follow; both at once is an error naming them. CausalLM::from_pretrained calls it.
  void use_expert_layout_of(const Checkpoint& checkpoint);
  /// Holds the sizes against `checkpoint`'s tensor headers, before anything is allocated
  /// (only the headers are read): vocab_size and hidden_size against the embedding, an
  /// untied lm_head and the final norm; num_hidden_layers (+ extra_layers) against the
  /// layers the checkpoint holds, of which the first `num_layers` (0: all) must be there;
  /// in each of those, the norms, the attention's widths (num_attention_heads,
  /// num_key_value_heads, head_dim), the MLP's intermediate_size and a mixture of experts'
  /// num_experts and expert intermediate size, wherever the tensor is stored unquantized.
  /// A disagreement is a c10::ValueError listing each one (the tensor, its shape, the
  /// field and its value), so a folder whose config.json is not its tensors' is refused in
  /// the time it takes to read the headers, and an absurd size (hidden_size 2^40) by a
  /// check rather than by the allocator. CausalLM::from_pretrained calls it on every rank.
  void check_sizes(const Checkpoint& checkpoint, int64_t num_layers = 0) const;
  /// The order of the layers' sums (not in config.json: CausalLMOptions::numerics sets
  /// it; tp/layers/numerics/numerics.h says what kInvariant guarantees).
  Numerics numerics = Numerics::kAuto;
  /// Per-rank weights of the model's split (not in config.json: CausalLMOptions::split_weights
  /// sets it; empty: even; tp/models/model_split.h says how each layer is cut).
  std::vector<double> split_weights;
};

}  // namespace tp
