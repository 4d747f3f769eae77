// The families' part of config.json (docs/checkpoint_formats.md §2): what each
// model_type fixes (names, fused layouts, norms, residual form) and the fields it adds
// (sliding windows, partial rotary, soft caps, RoPE variants), and the registry of
// families (kFamilies). Adding a family: its ModelType value, one read_<family> below, one
// row of kFamilies, and what is new in its layer (src/models/decoder_layer.cpp) if
// anything is.

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "models/config_fields.h"
#include "tp/loader/checkpoint.h"

namespace tp::detail {
namespace {

// ---- RoPE ------------------------------------------------------------------------

std::vector<double> factors(const ConfigFields& rope, const std::string& key, int64_t count) {
  const auto& items = rope.array(key);
  if (static_cast<int64_t>(items.size()) != count)
    rope.fail(key,
              "has " + std::to_string(items.size()) + " factors; expected rotary_dim / 2 = " + std::to_string(count));
  std::vector<double> out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_number()) rope.fail(key, "must be a list of numbers; element " + std::to_string(i) + " is not");
    out.push_back(items[i].as_double(rope.path(key)));
    if (!(out.back() > 0)) rope.fail(key, "element " + std::to_string(i) + " must be > 0");
  }
  return out;
}

// rope_type and its parameters from one object (transformers 5's rope_parameters, or
// 4.x's rope_scaling with the top-level rope_theta).
void parse_rope_object(const ConfigFields& top, const ConfigFields& rope, const ModelConfig& c, RopeParameters& out) {
  // Older files say "type" instead of "rope_type".
  const std::string key = rope.has("rope_type") ? "rope_type" : (rope.has("type") ? "type" : "rope_type");
  const std::string type = rope.string(key, "default");
  if (type == "default") {
    out.type = RopeType::kDefault;
  } else if (type == "llama3") {
    out.type = RopeType::kLlama3;
    out.factor = rope.required_double("factor");
    out.low_freq_factor = rope.required_double("low_freq_factor");
    out.high_freq_factor = rope.required_double("high_freq_factor");
    out.original_max_position_embeddings = rope.required_int("original_max_position_embeddings");
    if (!(out.factor > 0)) rope.fail("factor", "must be > 0");
    if (!(out.high_freq_factor > out.low_freq_factor))
      rope.fail("high_freq_factor", "must be greater than low_freq_factor");
    if (out.original_max_position_embeddings <= 0) rope.fail("original_max_position_embeddings", "must be > 0");
  } else if (type == "linear") {
    out.type = RopeType::kLinear;
    out.factor = rope.required_double("factor");
    if (!(out.factor > 0)) rope.fail("factor", "must be > 0");
  } else if (type == "longrope" || type == "su") {
    // transformers' _compute_longrope_parameters: the pretrained context from the RoPE
    // object or the config's top level; the attention factor given, or from the
    // context's growth factor = max_position_embeddings / original.
    out.type = RopeType::kLongRope;
    const int64_t n = c.rotary_dim / 2;
    out.short_factor = factors(rope, "short_factor", n);
    out.long_factor = factors(rope, "long_factor", n);
    double factor = rope.number("factor", 1.0);
    if (rope.has("original_max_position_embeddings") || top.has("original_max_position_embeddings")) {
      // Phi-3 writes it at the top and in the RoPE object; transformers takes the top one.
      const auto& src = top.has("original_max_position_embeddings") ? top : rope;
      out.original_max_position_embeddings = src.required_positive("original_max_position_embeddings");
      factor = static_cast<double>(c.max_position_embeddings) / out.original_max_position_embeddings;
    } else {
      out.original_max_position_embeddings = c.max_position_embeddings;
    }
    if (rope.has("attention_factor")) {
      out.attention_factor = rope.required_double("attention_factor");
      if (!(out.attention_factor > 0)) rope.fail("attention_factor", "must be > 0");
    } else {
      out.attention_factor =
          factor <= 1.0
              ? 1.0
              : std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(out.original_max_position_embeddings)));
    }
  } else if (type == "yarn") {
    // transformers' _compute_yarn_parameters: the attention factor given, or from mscale /
    // mscale_all_dim, or 0.1 ln(factor) + 1; beta_fast / beta_slow 32 / 1 when absent or 0.
    out.type = RopeType::kYarn;
    out.factor = rope.required_double("factor");
    if (!(out.factor > 0)) rope.fail("factor", "must be > 0");
    const auto& src =
        !rope.has("original_max_position_embeddings") && top.has("original_max_position_embeddings") ? top : rope;
    out.original_max_position_embeddings = src.required_positive("original_max_position_embeddings");
    out.beta_fast = rope.number("beta_fast", 0.0);
    out.beta_slow = rope.number("beta_slow", 0.0);
    if (out.beta_fast == 0) out.beta_fast = 32.0;
    if (out.beta_slow == 0) out.beta_slow = 1.0;
    out.truncate = rope.boolean("truncate", true);
    const auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const double m = rope.number("mscale", 0.0), m_all = rope.number("mscale_all_dim", 0.0);
    if (rope.has("attention_factor")) {
      out.attention_factor = rope.required_double("attention_factor");
      if (!(out.attention_factor > 0)) rope.fail("attention_factor", "must be > 0");
    } else {
      out.attention_factor =
          m != 0 && m_all != 0 ? mscale(out.factor, m) / mscale(out.factor, m_all) : mscale(out.factor, 1.0);
    }
  } else {
    rope.fail(key, "is not supported; tp reads the RoPE types default, llama3, linear, longrope and yarn");
  }
}

// The model's RoPE, and Gemma 3's local one: transformers 5 writes rope_parameters (one
// object, or one per layer type); 4.x rope_theta + rope_scaling (+ rope_local_base_freq).
void parse_rope(const ConfigFields& f, ModelConfig& c) {
  const auto theta_of = [&](const ConfigFields& p, const char* fallback_key, double fallback) {
    return p.has("rope_theta") ? p.required_double("rope_theta") : f.number(fallback_key, fallback);
  };
  if (f.has("rope_parameters")) {
    const auto p = f.object("rope_parameters");
    if (p.has("full_attention") || p.has("sliding_attention")) {
      // Per layer type (Gemma 3): the global layers' and the sliding layers' own.
      for (const auto& key : p.keys())
        if (key != "full_attention" && key != "sliding_attention")
          p.fail(key, "is not a layer type tp reads (full_attention, sliding_attention)");
      const auto full = p.object("full_attention");
      parse_rope_object(f, full, c, c.rope);
      c.rope.theta = theta_of(full, "rope_theta", 10000.0);
      if (p.has("sliding_attention")) {
        const auto local = p.object("sliding_attention");
        parse_rope_object(f, local, c, c.local_rope);
        c.local_rope.theta = theta_of(local, "rope_local_base_freq", 10000.0);
        c.has_local_rope = true;
      }
    } else {
      parse_rope_object(f, p, c, c.rope);
      c.rope.theta = theta_of(p, "rope_theta", 10000.0);
    }
  } else {
    c.rope.theta = f.number("rope_theta", f.number("rotary_emb_base", 10000.0));
    if (f.has("rope_scaling")) parse_rope_object(f, f.object("rope_scaling"), c, c.rope);
  }
  if (!(c.rope.theta > 0)) f.fail("rope_theta", "must be > 0");
  if (c.has_local_rope && !(c.local_rope.theta > 0)) f.fail("rope_local_base_freq", "must be > 0");
}

// partial_rotary_factor (transformers 5: in rope_parameters or at the top; GPT-NeoX 4.x:
// rotary_pct) -> rotary_dim = int(head_dim * factor), as transformers computes it;
// `fallback` when the config names none (GPT-NeoX: 0.25).
void parse_partial_rotary(const ConfigFields& f, ModelConfig& c, double fallback = 1.0) {
  double factor = fallback;
  if (f.has("rope_parameters") && f.object("rope_parameters").has("partial_rotary_factor"))
    factor = f.object("rope_parameters").required_double("partial_rotary_factor");
  else if (f.has("partial_rotary_factor"))
    factor = f.required_double("partial_rotary_factor");
  else if (f.has("rotary_pct"))
    factor = f.required_double("rotary_pct");
  if (!(factor > 0 && factor <= 1)) f.fail("partial_rotary_factor", "must be in (0, 1]");
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor);
}

// ---- The rest ----------------------------------------------------------------------

Activation parse_activation(const ConfigFields& f, const std::string& key, const std::string& fallback) {
  const std::string act = f.string(key, fallback);
  if (act == "silu" || act == "swish") return Activation::kSilu;
  if (act == "gelu") return Activation::kGelu;
  if (act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (act == "gelu_new") return Activation::kGeluNew;
  if (act == "gelu_fast") return Activation::kGeluFast;
  f.fail(key, "is not supported; tp reads silu, gelu, gelu_pytorch_tanh, gelu_new and gelu_fast");
}

// Which layers attend through the window: layer_types when the config has it, else
// `fallback` (the family's rule for older configs).
void parse_layer_types(const ConfigFields& f, ModelConfig& c, const std::function<bool(int64_t)>& fallback) {
  c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (f.has("layer_types")) {
    const auto& types = f.array("layer_types");
    if (static_cast<int64_t>(types.size()) != c.num_hidden_layers)
      f.fail("layer_types", "has " + std::to_string(types.size()) +
                                " entries for num_hidden_layers=" + std::to_string(c.num_hidden_layers));
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string where = "layer_types[" + std::to_string(i) + "]";
      if (!types[i].is_string()) f.fail(where, "must be a string");
      const auto& t = types[i].as_string(f.path(where));
      if (t == "sliding_attention")
        c.sliding_layers[i] = true;
      else if (t != "full_attention")
        f.fail(where, "= \"" + t + "\" is not a layer type tp reads (full_attention, sliding_attention)");
    }
  } else {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers[static_cast<size_t>(i)] = fallback(i);
  }
  const bool any = std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) != c.sliding_layers.end();
  if (any && c.sliding_window <= 0)
    f.fail("sliding_window", "must be a positive integer: the config has sliding_attention layers");
}

// `fallback` when absent: the family config class's default (Gemma's 4096; none elsewhere).
void read_sliding_window(const ConfigFields& f, ModelConfig& c, int64_t fallback = 0) {
  c.sliding_window = f.has("sliding_window") ? f.required_positive("sliding_window") : fallback;
}

void read_softcap(const ConfigFields& f, const char* key, double& out) {
  out = f.number_or_null(key, 0.0);
  if (out < 0 || (f.has(key) && out == 0)) f.fail(key, "must be > 0 (or null for none)");
}

// Qwen2 / Qwen3 folders with sliding windows have not been checked against transformers:
// refuse rather than compute full attention.
void refuse_sliding(const ConfigFields& f) {
  if (f.boolean("use_sliding_window", false))
    f.fail("use_sliding_window", "true is not supported for this family (tp builds full attention)");
  if (f.has("layer_types")) {
    const auto& types = f.array("layer_types");
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string where = "layer_types[" + std::to_string(i) + "]";
      const std::string t = types[i].is_string() ? types[i].as_string(f.path(where)) : types[i].dump();
      if (t != "full_attention")
        f.fail(where, "= \"" + t + "\" is not supported for this family (tp builds full_attention)");
    }
  }
}

void read_llama_like(const ConfigFields& f, ModelConfig& c) {
  c.norm_eps = f.number("rms_norm_eps", 1e-6);
  c.hidden_act = parse_activation(f, "hidden_act", "silu");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  parse_partial_rotary(f, c);
}

void read_llama(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
  c.mlp_bias = f.boolean("mlp_bias", false);
  if (f.integer("pretraining_tp", 1) < 1) f.fail("pretraining_tp", "must be >= 1");
  parse_rope(f, c);
}

void read_qwen(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  if (c.model_type == ModelType::kQwen2) {
    // The architecture fixes them: q/k/v biased, o and the MLP not.
    c.qkv_bias = true;
  } else {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.qk_norm = true;
  }
  refuse_sliding(f);
  parse_rope(f, c);
}

// Mistral: Llama's layers, every layer through the sliding window when one is set.
void read_mistral(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  read_sliding_window(f, c);
  parse_layer_types(f, c, [&](int64_t) { return c.sliding_window > 0; });
  parse_rope(f, c);
}

// Phi-3 / Phi-3.5 / Phi-4-mini: fused qkv_proj [q | k | v] and gate_up_proj [gate | up],
// partial rotary, LongRoPE, a sliding window on every layer.
void read_phi3(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.qkv_bias = c.o_bias = false;
  c.names.qkv.layout(QKVLayout::kFused).fused_name("qkv_proj");
  c.names.gate_up.layout(GateUpLayout::kFused).fused_name("gate_up_proj");
  read_sliding_window(f, c);
  parse_layer_types(f, c, [&](int64_t) { return c.sliding_window > 0; });
  parse_rope(f, c);
}

// GPT-NeoX / Pythia: LayerNorms with biases, an ungated MLP (dense_h_to_4h, dense_4h_to_h,
// biased), query_key_value interleaved per head ([q_h | k_h | v_h] for each head: the
// grouped layout with one query head per group), partial rotary, the parallel residual.
void read_gpt_neox(const ConfigFields& f, ModelConfig& c) {
  if (c.num_key_value_heads != c.num_attention_heads)
    f.fail("num_key_value_heads", "must equal num_attention_heads: GPT-NeoX attention has one k and v per head");
  c.norm = NormKind::kLayerNorm;
  c.norm_eps = f.number("layer_norm_eps", 1e-5);
  c.hidden_act = parse_activation(f, "hidden_act", "gelu");
  c.gated_mlp = false;
  c.parallel_residual = f.boolean("use_parallel_residual", true);
  c.qkv_bias = c.o_bias = f.boolean("attention_bias", true);
  c.mlp_bias = true;
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  auto& n = c.names;
  n.embed = "gpt_neox.embed_in";
  n.final_norm = "gpt_neox.final_layer_norm";
  n.lm_head = "embed_out";
  n.layers = "gpt_neox.layers";
  n.attention = "attention";
  n.o_proj = "dense";
  n.up_proj = "dense_h_to_4h";
  n.down_proj = "dense_4h_to_h";
  n.qkv.layout(QKVLayout::kInterleavedGroups).fused_name("query_key_value");
  parse_partial_rotary(f, c, 0.25);
  parse_rope(f, c);
}

// Gemma 2 and Gemma 3 (text): (1 + w) RMSNorms before and after attention and MLP, GeGLU
// with the tanh GELU, embeddings scaled by sqrt(hidden), query_pre_attn_scalar, tied
// embeddings; Gemma 2's soft caps; alternating sliding / global layers (Gemma 3 with its
// own RoPE base on the sliding ones, and q / k norms).
void read_gemma(const ConfigFields& f, ModelConfig& c) {
  const bool gemma3 = c.model_type == ModelType::kGemma3;
  c.norm = NormKind::kRMSUnitOffset;
  c.norm_eps = f.number("rms_norm_eps", 1e-6);
  // hidden_activation is the one Gemma's MLP reads; hidden_act a leftover of Gemma 1.
  c.hidden_act =
      parse_activation(f, f.has("hidden_activation") ? "hidden_activation" : "hidden_act", "gelu_pytorch_tanh");
  c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  c.sandwich_norms = true;
  c.scale_embeddings = true;
  c.qk_norm = gemma3;
  const double scalar = f.number("query_pre_attn_scalar", static_cast<double>(c.head_dim));
  if (!(scalar > 0)) f.fail("query_pre_attn_scalar", "must be > 0");
  c.attention_scale = std::pow(scalar, -0.5);
  // Gemma 3's attention never applies attn_logit_softcapping (transformers passes no cap):
  // nor does tp's.
  if (!gemma3) read_softcap(f, "attn_logit_softcapping", c.attn_logit_softcapping);
  read_softcap(f, "final_logit_softcapping", c.final_logit_softcapping);
  read_sliding_window(f, c, 4096);
  // Older configs: Gemma 2 slides on even layers; Gemma 3 on all but every
  // sliding_window_pattern-th.
  const int64_t pattern = f.integer("sliding_window_pattern", 6);
  if (gemma3 && pattern < 1) f.fail("sliding_window_pattern", "must be >= 1");
  parse_layer_types(f, c, [&](int64_t i) { return gemma3 ? (i + 1) % pattern != 0 : i % 2 == 0; });
  parse_partial_rotary(f, c);
  parse_rope(f, c);
  if (gemma3 && !c.has_local_rope) {
    // 4.x: rope_local_base_freq beside rope_theta / rope_scaling; the local RoPE is plain.
    c.local_rope.theta = f.number("rope_local_base_freq", 10000.0);
    if (!(c.local_rope.theta > 0)) f.fail("rope_local_base_freq", "must be > 0");
    c.has_local_rope = true;
  }
  if (f.boolean("use_bidirectional_attention", false))
    f.fail("use_bidirectional_attention", "true is not supported (tp builds causal decoders)");
}

// The expert count (under the family's key) and num_experts_per_tok, top-k never above it.
void read_expert_count(const ConfigFields& f, const char* experts_key, MoEParameters& m) {
  m.num_experts = f.required_positive(experts_key);
  m.top_k = f.required_positive("num_experts_per_tok");
  if (m.top_k > m.num_experts) f.fail("num_experts_per_tok", std::string("exceeds ") + experts_key);
}

// Mixtral: Mistral's attention, every layer's MLP a mixture of experts (w1 = gate,
// w3 = up, w2 = down under block_sparse_moe), top-k of a float32 softmax, renormalised.
void read_mixtral(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  read_sliding_window(f, c);
  parse_layer_types(f, c, [&](int64_t) { return c.sliding_window > 0; });
  parse_rope(f, c);
  auto& m = c.moe;
  read_expert_count(f, "num_local_experts", m);
  m.intermediate_size = c.intermediate_size;
  m.router.normalize_top_k(true);
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), true);
  c.names.moe = "block_sparse_moe";
  c.names.moe_layout.gate_name("w1").up_name("w3").down_name("w2");
}

// The Qwen-MoE experts (Qwen2-MoE, Qwen3-MoE): num_experts (transformers 5:
// num_local_experts), top-k of a float32 softmax renormalised by norm_topk_prob and cast
// to the model's dtype; layer i's MLP is a mixture of experts unless it is in
// mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step.
void read_qwen_moe_experts(const ConfigFields& f, ModelConfig& c) {
  auto& m = c.moe;
  const char* experts = f.has("num_local_experts") ? "num_local_experts" : "num_experts";
  read_expert_count(f, experts, m);
  m.intermediate_size = f.required_positive("moe_intermediate_size");
  m.router.normalize_top_k(f.boolean("norm_topk_prob", false)).weights_in_input_dtype(true);
  const int64_t step = f.integer("decoder_sparse_step", 1);
  if (step < 1) f.fail("decoder_sparse_step", "must be >= 1");
  std::vector<int64_t> dense;
  if (f.has("mlp_only_layers")) {
    const auto& items = f.array("mlp_only_layers");
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_number()) f.fail("mlp_only_layers", "must be a list of layer indices");
      dense.push_back(items[i].as_int(f.path("mlp_only_layers[" + std::to_string(i) + "]")));
    }
  }
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m.layers[static_cast<size_t>(i)] = std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0;
}

// Qwen2-MoE: Qwen2's attention (q/k/v biased by qkv_bias), the Qwen-MoE experts, and a
// shared expert every token goes through (shared_expert_intermediate_size), scaled by a
// sigmoid gate (shared_expert_gate [1, hidden]).
void read_qwen2_moe(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.qkv_bias = f.boolean("qkv_bias", true);
  refuse_sliding(f);
  parse_rope(f, c);
  read_qwen_moe_experts(f, c);
  c.moe.shared_expert_intermediate_size = f.required_positive("shared_expert_intermediate_size");
  c.moe.shared_expert_gate = true;
}

// Qwen3-MoE: Qwen3's attention (q/k norms) and the Qwen-MoE experts.
void read_qwen3_moe(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
  c.qk_norm = true;
  refuse_sliding(f);
  parse_rope(f, c);
  read_qwen_moe_experts(f, c);
}

// GLM-4.5 / GLM-4.6 (glm4_moe): q/k/v biased by attention_bias, optional q/k norms
// (use_qk_norm), partial rotary; the first first_k_dense_replace layers dense, the rest a
// mixture of n_routed_experts with DeepSeek-V3's routing (sigmoid scores, a correction
// bias to choose, n_group groups of which topk_group, routed_scaling_factor; logits in
// float32) and n_shared_experts shared experts as one MLP of n_shared_experts x
// moe_intermediate_size (shared_experts, no gate).
void read_glm4_moe(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.qkv_bias = f.boolean("attention_bias", false);
  c.qk_norm = f.boolean("use_qk_norm", false);
  refuse_sliding(f);
  parse_rope(f, c);
  auto& m = c.moe;
  read_expert_count(f, "n_routed_experts", m);
  m.intermediate_size = f.required_positive("moe_intermediate_size");
  const int64_t groups = f.integer("n_group", 1), top_groups = f.integer("topk_group", 1);
  if (groups < 1 || m.num_experts % groups != 0) f.fail("n_group", "must be >= 1 and divide n_routed_experts");
  if (top_groups < 1 || top_groups > groups) f.fail("topk_group", "must be in [1, n_group]");
  m.router.scoring(MoEScoring::kSigmoid)
      .logits_in_float32(true)
      .score_correction_bias(true)
      .num_groups(groups)
      .top_k_groups(top_groups)
      .normalize_top_k(f.boolean("norm_topk_prob", true))
      .scaling_factor(f.number("routed_scaling_factor", 1.0));
  if (!(m.router.scaling_factor() > 0)) f.fail("routed_scaling_factor", "must be > 0");
  const int64_t shared = f.integer("n_shared_experts", 0);
  if (shared < 0) f.fail("n_shared_experts", "must be >= 0");
  m.shared_expert_intermediate_size = shared * m.intermediate_size;
  c.names.moe_layout.shared_expert_name("shared_experts");
  const int64_t first_moe = f.integer("first_k_dense_replace", 0);
  if (first_moe < 0) f.fail("first_k_dense_replace", "must be >= 0");
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (int64_t i = first_moe; i < c.num_hidden_layers; ++i) m.layers[static_cast<size_t>(i)] = true;
  // The multi-token-prediction layers GLM checkpoints store after the decoder (layers
  // num_hidden_layers, ...) are not part of it: CausalLM::from_pretrained allows them unread.
  c.extra_layers = f.integer("num_nextn_predict_layers", 0);
  if (c.extra_layers < 0) f.fail("num_nextn_predict_layers", "must be >= 0");
}

// GPT-OSS: q/k/v/o biased, attention sinks, sliding and full layers alternating (layer
// 0 slides in older configs), YaRN; every MLP a mixture of experts: the router's bias,
// softmax over the top-k logits, experts with biases and GPT-OSS's clamped swiglu, stored
// fused as transformers writes them (mlp.experts.gate_up_proj [experts, hidden,
// 2 * intermediate] with gate and up columns alternating, down_proj [experts,
// intermediate, hidden]; MXFP4 _blocks / _scales in [experts, out, ...]).
void read_gpt_oss(const ConfigFields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.norm = NormKind::kRMSScaleFirst;
  c.qkv_bias = c.o_bias = f.boolean("attention_bias", true);
  c.attention_sinks = true;
  read_sliding_window(f, c);
  parse_layer_types(f, c, [&](int64_t i) { return i % 2 == 0; });
  parse_rope(f, c);
  auto& m = c.moe;
  read_expert_count(f, "num_local_experts", m);
  m.intermediate_size = c.intermediate_size;
  m.router.scoring(MoEScoring::kSoftmaxOfTopK).bias(true);
  m.expert_bias = true;
  m.activation = "swiglu_oai";
  m.swiglu_alpha = f.number("swiglu_alpha", 1.702);
  m.swiglu_limit = f.number("swiglu_limit", 7.0);
  if (!(m.swiglu_limit > 0)) f.fail("swiglu_limit", "must be > 0");
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), true);
  c.names.moe = "mlp";
  c.names.moe_layout.router_name("router").experts(ExpertLayout::kFused).interleaved_gate_up(true).transposed(true);
}

// The registry of families: each model_type tp reads, its ModelType and its reader, in
// ModelType order. Every other list of families reads this one: to_string(ModelType),
// parsing model_type, tp::model_families() and through it the Python ModelType enum.
struct FamilyRow {
  ModelFamily family;
  void (*read)(const ConfigFields&, ModelConfig&);
};
// clang-format off
const FamilyRow kFamilies[] = {
    // model_type      type                   mixture of experts  reader
    {{"llama",         ModelType::kLlama,     false},             read_llama},
    {{"qwen2",         ModelType::kQwen2,     false},             read_qwen},
    {{"qwen3",         ModelType::kQwen3,     false},             read_qwen},
    {{"mistral",       ModelType::kMistral,   false},             read_mistral},
    {{"phi3",          ModelType::kPhi3,      false},             read_phi3},
    {{"gpt_neox",      ModelType::kGptNeoX,   false},             read_gpt_neox},
    {{"gemma2",        ModelType::kGemma2,    false},             read_gemma},
    {{"gemma3_text",   ModelType::kGemma3,    false},             read_gemma},
    {{"mixtral",       ModelType::kMixtral,   true},              read_mixtral},
    {{"qwen2_moe",     ModelType::kQwen2Moe,  true},              read_qwen2_moe},
    {{"qwen3_moe",     ModelType::kQwen3Moe,  true},              read_qwen3_moe},
    {{"glm4_moe",      ModelType::kGlm4Moe,   true},              read_glm4_moe},
    {{"gpt_oss",       ModelType::kGptOss,    true},              read_gpt_oss},
};
// clang-format on

const FamilyRow& family_row(ModelType type) {
  const FamilyRow* found = nullptr;
  for (const auto& row : kFamilies)
    if (row.family.type == type) found = &row;
  TORCH_CHECK_VALUE(found != nullptr, "unknown ModelType ", static_cast<int>(type), " (tp reads ", std::size(kFamilies),
                    " families)");
  return *found;
}

}  // namespace

const ModelFamily* find_family(const std::string& model_type) {
  for (const auto& row : kFamilies)
    if (model_type == row.family.model_type) return &row.family;
  return nullptr;
}

void read_family(const ConfigFields& f, ModelConfig& c) {
  c.rotary_dim = c.head_dim;
  family_row(c.model_type).read(f, c);
  if (c.sliding_layers.empty()) c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
}

}  // namespace tp::detail

namespace tp {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = [] {
    std::vector<ModelFamily> out;
    for (const auto& row : detail::kFamilies) out.push_back(row.family);
    return out;
  }();
  return families;
}

const char* to_string(ModelType type) { return detail::family_row(type).family.model_type; }

void ModelConfig::use_expert_layout_of(const Checkpoint& checkpoint) {
  if (moe.num_experts == 0 || names.moe_layout.experts() == ExpertLayout::kFused) return;
  const auto it = std::find(moe.layers.begin(), moe.layers.end(), true);
  if (it == moe.layers.end()) return;
  const std::string layer = layer_prefix(it - moe.layers.begin());
  const std::string per_expert = layer + "." + names.moe + ".experts.0.";
  // transformers 5's own names, whatever the family's block was called before (Mixtral's
  // block_sparse_moe is mlp there).
  const std::string fused = layer + ".mlp.experts.gate_up_proj";
  const bool has_per_expert = !checkpoint.names_with_prefix(per_expert).empty();
  const bool has_fused = checkpoint.contains(fused);
  TORCH_CHECK_VALUE(!(has_per_expert && has_fused), source, ": the checkpoint stores the experts of ", layer,
                    " twice, per expert ('", per_expert, "*') and fused ('", fused, "'); keep one");
  if (!has_fused) return;
  names.moe = "mlp";
  names.moe_layout.experts(ExpertLayout::kFused).gate_up_name("gate_up_proj").down_name("down_proj");
}

}  // namespace tp
