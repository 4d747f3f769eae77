// ModelConfig from config.json text: the fields of each model type in both spellings
// transformers writes, each quantization_config tp reads (and what it refuses, by
// field and value), and the decoder layer options built from them. The folders
// written by transformers and the quantizers are in hf_folders_test.cpp.

#include "support/tp_catch.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tp/models/layer_options.h"
#include "tp/models/model_config.h"

using namespace tp;
using Catch::Contains;

namespace {

// A config.json: a small Llama's members, those named in `extra` replaced by extra's.
std::string llama(const std::string& extra = "", const std::string& model_type = "llama") {
  const std::vector<std::pair<std::string, std::string>> base = {{"architectures", R"(["LlamaForCausalLM"])"},
                                                                 {"model_type", "\"" + model_type + "\""},
                                                                 {"hidden_size", "256"},
                                                                 {"intermediate_size", "512"},
                                                                 {"num_hidden_layers", "2"},
                                                                 {"num_attention_heads", "8"},
                                                                 {"num_key_value_heads", "2"},
                                                                 {"vocab_size", "1000"},
                                                                 {"rms_norm_eps", "1e-05"},
                                                                 {"max_position_embeddings", "4096"},
                                                                 {"hidden_act", "\"silu\""},
                                                                 {"tie_word_embeddings", "false"}};
  std::string out = "{";
  for (const auto& [key, value] : base) {
    if (extra.find("\"" + key + "\":") != std::string::npos) continue;
    out += "\"" + key + "\": " + value + ", ";
  }
  if (extra.empty()) return out.substr(0, out.size() - 2) + "}";
  return out + extra + "}";
}

std::string with_quant(const std::string& qcfg, const std::string& model_type = "llama") {
  return llama(R"("quantization_config": )" + qcfg, model_type);
}

std::string ct_group(const std::string& weights, const std::string& inputs, const std::string& format,
                     const std::string& ignore = R"(["lm_head"])", const std::string& targets = R"(["Linear"])") {
  return R"({"quant_method": "compressed-tensors", "format": ")" + format +
         R"(", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": )" +
         targets + R"(, "weights": )" + weights + R"(, "input_activations": )" + inputs +
         R"(, "output_activations": null, "format": ")" + format + R"("}},
    "ignore": )" +
         ignore + R"(, "kv_cache_scheme": null, "sparsity_config": {}, "transform_config": {}, "version": "0.20.1"})";
}

const char* kW4 =
    R"({"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group", "group_size": 64, "dynamic": false})";

std::string quant_of(const std::string& json, const std::string& module) {
  return to_string(ModelConfig::from_json(json).quant_config(module));
}

const std::string kDown = "model.layers.1.mlp.down_proj";

// The message ModelConfig::from_json refuses `json` with, or "(no error)".
std::string config_error(const std::string& json) {
  try {
    ModelConfig::from_json(json);
  } catch (const c10::Error& e) {
    return std::string(e.what_without_backtrace());
  }
  return std::string("(no error)");
}

}  // namespace

TEST_CASE("ModelConfig reads Llama, Qwen2 and Qwen3 fields", "[model]") {
  SECTION("llama, transformers 5 spelling, Llama-3 RoPE") {
    const auto c = ModelConfig::from_json(llama(R"("head_dim": 64, "attention_bias": true, "mlp_bias": true,
      "dtype": "bfloat16", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
    CHECK(c.model_type == ModelType::kLlama);
    CHECK(c.hidden_size == 256);
    CHECK(c.intermediate_size == 512);
    CHECK(c.num_hidden_layers == 2);
    CHECK(c.num_attention_heads == 8);
    CHECK(c.num_key_value_heads == 2);
    CHECK(c.head_dim == 64);
    CHECK(c.q_size() == 512);
    CHECK(c.kv_size() == 128);
    CHECK(c.vocab_size == 1000);
    CHECK(c.max_position_embeddings == 4096);
    CHECK(c.qkv_bias);
    CHECK(c.o_bias);
    CHECK(c.mlp_bias);
    CHECK_FALSE(c.tie_word_embeddings);
    CHECK(c.norm_eps == 1e-5);
    CHECK(c.dtype == at::kBFloat16);
    CHECK(c.rope.type == RopeType::kLlama3);
    CHECK(c.rope.theta == 500000.0);
    CHECK(c.rope.factor == 8.0);
    CHECK(c.rope.low_freq_factor == 1.0);
    CHECK(c.rope.high_freq_factor == 4.0);
    CHECK(c.rope.original_max_position_embeddings == 8192);
    CHECK_FALSE(c.quantization.quantized());
    CHECK(quant_of(llama(), kDown) == "none");
  }
  SECTION("llama, transformers 4 spelling: rope_theta + rope_scaling, torch_dtype, no head_dim / KV heads") {
    auto text = llama(R"("rope_theta": 500000.0, "torch_dtype": "float16", "rope_scaling": {"type": "llama3",
      "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
    const std::string kv = R"("num_key_value_heads": 2, )";
    text.replace(text.find(kv), kv.size(), "");
    const auto c = ModelConfig::from_json(text);
    CHECK(c.head_dim == 32);  // hidden / heads
    CHECK(c.num_key_value_heads == 8);
    CHECK(c.dtype == at::kHalf);
    CHECK(c.rope.type == RopeType::kLlama3);
    CHECK(c.rope.theta == 500000.0);
    CHECK(c.rope.factor == 32.0);
    CHECK_FALSE(c.qkv_bias);
    CHECK_FALSE(c.o_bias);
    CHECK_FALSE(c.mlp_bias);
    const auto plain = ModelConfig::from_json(llama(R"("rope_theta": 10000.0, "rope_scaling": null)"));
    CHECK(plain.rope.type == RopeType::kDefault);
    CHECK(plain.rope.theta == 10000.0);
    CHECK(plain.dtype == at::kFloat);
  }
  SECTION("qwen2: no head_dim, q/k/v biases always, o never, tied") {
    const auto c = ModelConfig::from_json(llama(R"("tie_word_embeddings": true, "use_sliding_window": false,
      "sliding_window": null, "layer_types": ["full_attention", "full_attention"], "head_dim": 999,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"})",
                                                "qwen2"));
    CHECK(c.model_type == ModelType::kQwen2);
    CHECK(c.head_dim == 32);  // hidden / heads; Qwen2 has no head_dim (a stray one is not read)
    CHECK(c.qkv_bias);
    CHECK_FALSE(c.o_bias);
    CHECK_FALSE(c.mlp_bias);
    CHECK(c.tie_word_embeddings);
    CHECK(c.rope.theta == 1e6);
  }
  SECTION("qwen3: head_dim != hidden / heads, attention_bias") {
    const auto c = ModelConfig::from_json(llama(R"("head_dim": 128, "attention_bias": false)", "qwen3"));
    CHECK(c.model_type == ModelType::kQwen3);
    CHECK(c.head_dim == 128);
    CHECK(c.q_size() == 1024);
    CHECK_FALSE(c.qkv_bias);
    const auto b = ModelConfig::from_json(llama(R"("head_dim": 128, "attention_bias": true)", "qwen3"));
    CHECK(b.qkv_bias);
    CHECK(b.o_bias);
  }
}

TEST_CASE("ModelConfig reads Mistral, Phi-3, GPT-NeoX, Gemma 2 and Gemma 3 as transformers 5.24 writes them",
          "[model]") {
  // The fields that matter of the config.json files transformers' own classes saved
  // (tests/python/family_fixtures.py), and their older spellings.
  SECTION("mistral: a sliding window on every layer") {
    const auto c = ModelConfig::from_json(R"({"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 128,
      "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 131072,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": 4,
      "tie_word_embeddings": false, "dtype": "float64"})");
    CHECK(c.model_type == ModelType::kMistral);
    CHECK(c.sliding_window == 4);
    CHECK((c.is_sliding(0) && c.is_sliding(1)));
    CHECK(c.rotary_dim == 16);
    CHECK(c.names.qkv.layout() == QKVLayout::kSeparate);
    CHECK(c.attention_scale == 0.25);
    const auto none = ModelConfig::from_json(R"({"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": null, "vocab_size": 128, "sliding_window": null})");
    CHECK((none.head_dim == 16 && !none.is_sliding(0)));
  }
  SECTION("phi3: fused layouts, partial rotary, LongRoPE with the top-level pretrained context") {
    const auto c = ModelConfig::from_json(R"({"model_type": "phi3", "hidden_size": 192, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 128,
      "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 48,
      "original_max_position_embeddings": 12, "partial_rotary_factor": 0.5,
      "rope_parameters": {"long_factor": [1.5, 3.0, 6.0, 12.0], "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "longrope",
        "short_factor": [1.0, 1.25, 1.5, 2.0]}, "sliding_window": 5})");
    CHECK(c.model_type == ModelType::kPhi3);
    CHECK(c.names.qkv.layout() == QKVLayout::kFused);
    CHECK(c.names.qkv.fused_name() == "qkv_proj");
    CHECK(c.names.gate_up.layout() == GateUpLayout::kFused);
    CHECK(c.rotary_dim == 8);
    CHECK(c.rope.type == RopeType::kLongRope);
    CHECK(c.rope.original_max_position_embeddings == 12);
    CHECK(c.rope.long_factor == std::vector<double>{1.5, 3.0, 6.0, 12.0});
    CHECK(c.rope.attention_factor == Approx(std::sqrt(1 + std::log(4.0) / std::log(12.0))).epsilon(1e-15));
    CHECK((c.sliding_window == 5 && c.is_sliding(1)));
  }
  SECTION("gpt_neox: LayerNorm, the ungated MLP, per-head interleaved qkv, parallel residual") {
    const auto c = ModelConfig::from_json(R"({"model_type": "gpt_neox", "hidden_size": 96, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 6, "vocab_size": 128, "hidden_act": "gelu",
      "layer_norm_eps": 1e-05, "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0,
      "rope_type": "default"}, "use_parallel_residual": true, "attention_bias": true, "tie_word_embeddings": false})");
    CHECK(c.model_type == ModelType::kGptNeoX);
    CHECK(c.norm == NormKind::kLayerNorm);
    CHECK(c.norm_eps == 1e-5);
    CHECK((!c.gated_mlp && c.parallel_residual && c.qkv_bias && c.o_bias && c.mlp_bias));
    CHECK(c.hidden_act == Activation::kGelu);
    CHECK(c.names.qkv.layout() == QKVLayout::kInterleavedGroups);
    CHECK(c.names.qkv.fused_name() == "query_key_value");
    CHECK(c.names.embed == "gpt_neox.embed_in");
    CHECK(c.names.lm_head == "embed_out");
    CHECK(c.layer_prefix(1) == "gpt_neox.layers.1");
    CHECK(c.rotary_dim == 4);
    // 4.x: rotary_pct and rotary_emb_base; no rotary field at all is GPT-NeoX's 0.25.
    const auto old = ModelConfig::from_json(R"({"model_type": "gpt_neox", "hidden_size": 96,
      "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 6, "vocab_size": 128,
      "rotary_pct": 0.5, "rotary_emb_base": 20000, "use_parallel_residual": false, "hidden_act": "gelu_fast"})");
    CHECK((old.rotary_dim == 8 && old.rope.theta == 20000 && !old.parallel_residual));
    CHECK(old.hidden_act == Activation::kGeluFast);
    const auto bare = ModelConfig::from_json(R"({"model_type": "gpt_neox", "hidden_size": 96,
      "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 6, "vocab_size": 128})");
    CHECK(bare.rotary_dim == 4);
  }
  SECTION("gemma2: unit-offset norms, sandwich, soft caps, query_pre_attn_scalar, alternating windows") {
    const auto c = ModelConfig::from_json(R"({"model_type": "gemma2", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 128,
      "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0,
      "final_logit_softcapping": 0.3, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rms_norm_eps": 1e-06,
      "attention_bias": false, "tie_word_embeddings": true, "use_bidirectional_attention": null})");
    CHECK(c.norm == NormKind::kRMSUnitOffset);
    CHECK((c.sandwich_norms && c.scale_embeddings && c.tie_word_embeddings && !c.qk_norm));
    CHECK(c.hidden_act == Activation::kGeluTanh);
    CHECK(c.attention_scale == std::pow(24.0, -0.5));
    CHECK((c.attn_logit_softcapping == 2.0 && c.final_logit_softcapping == 0.3));
    CHECK((c.is_sliding(0) && !c.is_sliding(1)));
    // 4.x: no layer_types; even layers slide.
    const auto old = ModelConfig::from_json(R"({"model_type": "gemma2", "hidden_size": 128,
      "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 8, "head_dim": 32,
      "vocab_size": 128, "sliding_window": 4})");
    CHECK((old.is_sliding(0) && !old.is_sliding(1) && old.is_sliding(2)));
  }
  SECTION("gemma3_text: q/k norms, a RoPE per layer type (linear on the global layers)") {
    const auto c = ModelConfig::from_json(R"({"model_type": "gemma3_text", "hidden_size": 128,
      "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
      "head_dim": 32, "vocab_size": 128, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 40,
      "attn_logit_softcapping": null, "final_logit_softcapping": null, "sliding_window": 4,
      "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {"full_attention": {"factor": 8.0,
      "rope_theta": 1000000.0, "rope_type": "linear"}, "sliding_attention": {"rope_theta": 10000.0,
      "rope_type": "default"}}, "rms_norm_eps": 1e-06, "tie_word_embeddings": true})");
    CHECK(c.model_type == ModelType::kGemma3);
    CHECK((c.qk_norm && c.sandwich_norms && c.has_local_rope));
    CHECK((c.rope.type == RopeType::kLinear && c.rope.factor == 8.0 && c.rope.theta == 1e6));
    CHECK((c.local_rope.type == RopeType::kDefault && c.local_rope.theta == 1e4));
    CHECK((c.attn_logit_softcapping == 0 && c.final_logit_softcapping == 0));
    // 4.x: rope_local_base_freq, rope_scaling for the global layers, sliding_window_pattern.
    const auto old = ModelConfig::from_json(R"({"model_type": "gemma3_text", "hidden_size": 128,
      "intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 8, "head_dim": 32,
      "vocab_size": 128, "sliding_window": 4, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 3})");
    CHECK((old.is_sliding(0) && old.is_sliding(1) && !old.is_sliding(2) && !old.is_sliding(5)));
    CHECK((old.local_rope.theta == 1e4 && old.rope.type == RopeType::kLinear));
  }
}

TEST_CASE("ModelConfig reads Mixtral, Qwen2-MoE, Qwen3-MoE and GLM-4.5: experts, routing, shared experts, MoE layers",
          "[model][moe]") {
  const auto mixtral = ModelConfig::from_json(R"({"model_type": "mixtral", "hidden_size": 128,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 16, "vocab_size": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null,
    "router_jitter_noise": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  CHECK(mixtral.model_type == ModelType::kMixtral);
  CHECK((mixtral.moe.num_experts == 8 && mixtral.moe.top_k == 2 && mixtral.moe.intermediate_size == 64));
  CHECK((mixtral.moe.router.normalize_top_k() && !mixtral.moe.router.weights_in_input_dtype()));
  CHECK((mixtral.moe.router.scoring() == MoEScoring::kSoftmax && mixtral.moe.shared_expert_intermediate_size == 0));
  CHECK((mixtral.is_moe(0) && mixtral.is_moe(1) && !mixtral.is_sliding(0)));
  const auto& layout = mixtral.names.moe_layout;
  CHECK((mixtral.names.moe == "block_sparse_moe" && layout.gate_name() == "w1" && layout.up_name() == "w3" &&
         layout.down_name() == "w2" && layout.experts() == ExpertLayout::kPerExpert));
  // transformers 5 writes num_local_experts, 4.x num_experts.
  for (const char* experts : {"num_local_experts", "num_experts"}) {
    const auto q = ModelConfig::from_json(std::string(R"({"model_type": "qwen3_moe", "hidden_size": 128,
      "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 128, ")") +
                                          experts + R"(": 16, "num_experts_per_tok": 4, "norm_topk_prob": true,
      "decoder_sparse_step": 2, "mlp_only_layers": [3]})");
    INFO(experts);
    CHECK((q.moe.num_experts == 16 && q.moe.top_k == 4 && q.moe.intermediate_size == 64));
    CHECK((q.moe.router.normalize_top_k() && q.moe.router.weights_in_input_dtype() && q.qk_norm));
    CHECK((!q.is_moe(0) && q.is_moe(1) && !q.is_moe(2) && !q.is_moe(3)));  // (i + 1) % 2 == 0, but 3 dense
    CHECK(q.names.moe == "mlp");
  }
  // Qwen2-MoE: a shared expert with its sigmoid gate; q/k/v biased.
  const auto q2 = ModelConfig::from_json(R"({"model_type": "qwen2_moe", "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 128,
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false})");
  CHECK((q2.model_type == ModelType::kQwen2Moe && q2.qkv_bias && !q2.o_bias && q2.head_dim == 16));
  CHECK((q2.moe.shared_expert_intermediate_size == 96 && q2.moe.shared_expert_gate));
  CHECK((!q2.moe.router.normalize_top_k() && q2.moe.router.weights_in_input_dtype()));
  CHECK((q2.names.moe_layout.shared_expert_name() == "shared_expert" && q2.is_moe(0) && q2.is_moe(1)));
  // GLM-4.5: DeepSeek-V3's grouped sigmoid routing, shared experts, dense first layers.
  const auto glm = ModelConfig::from_json(R"({"model_type": "glm4_moe", "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 128, "n_routed_experts": 16,
    "num_experts_per_tok": 4, "n_shared_experts": 2, "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "attention_bias": true, "use_qk_norm": true,
    "num_nextn_predict_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}})");
  const auto& r = glm.moe.router;
  CHECK((glm.model_type == ModelType::kGlm4Moe && glm.qkv_bias && !glm.o_bias && glm.qk_norm && glm.rotary_dim == 16));
  CHECK((r.scoring() == MoEScoring::kSigmoid && r.logits_in_float32() && r.score_correction_bias() &&
         r.num_groups() == 4 && r.top_k_groups() == 2 && r.normalize_top_k() && r.scaling_factor() == 2.5));
  CHECK((glm.moe.shared_expert_intermediate_size == 128 && !glm.moe.shared_expert_gate && glm.extra_layers == 1));
  CHECK((glm.names.moe_layout.shared_expert_name() == "shared_experts" && !glm.is_moe(0) && glm.is_moe(1)));
  const auto fails = config_error;
  CHECK_THAT(fails(R"({"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 8, "vocab_size": 128, "num_local_experts": 2, "num_experts_per_tok": 3})"),
             Contains("num_experts_per_tok = 3 exceeds num_local_experts"));
  CHECK_THAT(fails(R"({"model_type": "glm4_moe", "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 8, "vocab_size": 128, "n_routed_experts": 16, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_group": 3})"),
             Contains("n_group") && Contains("divide n_routed_experts"));
}

TEST_CASE("ModelConfig reads GPT-OSS: sinks, YaRN, alternating windows, its experts' router, layout and MXFP4",
          "[model][moe]") {
  const std::string gpt_oss = R"({"model_type": "gpt_oss", "hidden_size": 128, "intermediate_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 128,
    "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128, "swiglu_limit": 7.0,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
      "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": false})";
  const auto c = ModelConfig::from_json(gpt_oss + "}");
  CHECK((c.model_type == ModelType::kGptOss && c.attention_sinks && c.qkv_bias && c.o_bias));
  CHECK((c.norm == NormKind::kRMSScaleFirst && c.sliding_window == 128 && c.is_sliding(0) && !c.is_sliding(1)));
  CHECK((c.rope.type == RopeType::kYarn && c.rope.factor == 32.0 && c.rope.original_max_position_embeddings == 4096 &&
         !c.rope.truncate && c.rope.beta_fast == 32.0 && c.rope.beta_slow == 1.0));
  CHECK(std::abs(c.rope.attention_factor - (0.1 * std::log(32.0) + 1.0)) < 1e-15);  // transformers' default
  const auto& m = c.moe;
  CHECK((m.num_experts == 8 && m.top_k == 2 && m.intermediate_size == 64 && m.expert_bias &&
         m.activation == "swiglu_oai" && m.swiglu_limit == 7.0 && m.swiglu_alpha == 1.702));
  CHECK((m.router.scoring() == MoEScoring::kSoftmaxOfTopK && m.router.bias() && c.is_moe(0) && c.is_moe(3)));
  const auto& l = c.names.moe_layout;
  CHECK((c.names.moe == "mlp" && l.router_name() == "router" && l.experts() == ExpertLayout::kFused &&
         l.interleaved_gate_up() && l.transposed()));
  CHECK(c.quant_config("model.layers.0.mlp.experts").format == QuantFormat::kNone);
  // OpenAI's checkpoints: MXFP4 experts, everything else as it is.
  const auto q = ModelConfig::from_json(gpt_oss + R"(, "quantization_config": {"quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
    "lm_head"]}})");
  CHECK(q.quant_config("model.layers.3.mlp.experts").format == QuantFormat::kMxfp4);
  for (const char* other : {"model.layers.3.mlp.router", "model.layers.3.self_attn.q_proj", "lm_head"})
    CHECK(q.quant_config(other).format == QuantFormat::kNone);
}

TEST_CASE("ModelConfig refuses the families' fields it cannot build, naming the field and the value",
          "[model][errors]") {
  const auto fails = config_error;
  const std::string phi3 = R"({"model_type": "phi3", "hidden_size": 192, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 12, "vocab_size": 128, "partial_rotary_factor": 0.5, )";
  CHECK_THAT(fails(phi3 + R"("rope_parameters": {"rope_type": "longrope", "short_factor": [1, 2],
      "long_factor": [1, 2, 3, 4]}})"),
             Contains("rope_parameters.short_factor") && Contains("2 factors") && Contains("rotary_dim / 2 = 4"));
  CHECK_THAT(fails(phi3 + R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})"),
             Contains("rope_parameters.rope_type = \"dynamic\" is not supported"));
  CHECK_THAT(fails(R"({"model_type": "phi3", "hidden_size": 192, "intermediate_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 12, "vocab_size": 128, "partial_rotary_factor": 1.5})"),
             Contains("partial_rotary_factor = 1.5"));
  const std::string gemma = R"({"model_type": "gemma2", "hidden_size": 128, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 32, "vocab_size": 128, )";
  CHECK_THAT(fails(gemma + R"("sliding_window": 4, "layer_types": ["sliding_attention"]})"),
             Contains("layer_types") && Contains("1 entries for num_hidden_layers=2"));
  CHECK_THAT(fails(gemma + R"("sliding_window": 4, "layer_types": ["sliding_attention", "chunked_attention"]})"),
             Contains("layer_types[1] = \"chunked_attention\""));
  CHECK_THAT(fails(R"({"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 8, "vocab_size": 128, "sliding_window": null,
      "layer_types": ["sliding_attention", "full_attention"]})"),
             Contains("sliding_window") && Contains("sliding_attention layers"));
  CHECK_THAT(fails(gemma + R"("hidden_activation": "geglu"})"), Contains("hidden_activation = \"geglu\""));
  CHECK_THAT(fails(gemma + R"("final_logit_softcapping": 0})"), Contains("final_logit_softcapping = 0"));
  CHECK_THAT(fails(gemma + R"("use_bidirectional_attention": true})"), Contains("use_bidirectional_attention"));
  CHECK_THAT(fails(R"({"model_type": "gpt_neox", "hidden_size": 96, "intermediate_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 128})"),
             Contains("num_key_value_heads = 2") && Contains("one k and v per head"));
}

TEST_CASE("ModelConfig refuses what it cannot build, naming the field and the value", "[model][errors]") {
  const auto fails = config_error;
  const auto unknown = fails(llama("", "falcon"));
  CHECK_THAT(unknown, Contains("model_type = \"falcon\" is not supported; tp reads llama, qwen2, qwen3, mistral, "
                               "phi3, gpt_neox, gemma2, gemma3_text"));
  CHECK_THAT(fails(llama(R"("vision_config": {"hidden_size": 64})", "gemma3")),
             Contains("vision_config") && Contains("multimodal") && Contains("gemma3_text"));
  CHECK_THAT(fails(llama(R"("rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})")),
             Contains("rope_parameters.rope_type = \"dynamic\"") && Contains("yarn"));
  CHECK_THAT(fails(llama(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})")),
             Contains("rope_parameters.original_max_position_embeddings") && Contains("required"));
  CHECK_THAT(fails(llama(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})")),
             Contains("rope_scaling.low_freq_factor") && Contains("required"));
  CHECK_THAT(fails(llama(R"("hidden_act": "relu2")")), Contains("hidden_act = \"relu2\" is not supported"));
  CHECK_THAT(fails(llama(R"("dtype": "int8")")), Contains("dtype = \"int8\""));
  CHECK_THAT(fails(llama(R"("use_sliding_window": true)", "qwen2")), Contains("use_sliding_window = true"));
  CHECK_THAT(fails(llama(R"("layer_types": ["full_attention", "sliding_attention"])", "qwen3")),
             Contains("layer_types[1] = \"sliding_attention\""));
  CHECK_THAT(fails(llama(R"("num_key_value_heads": 3)")), Contains("num_key_value_heads = 3"));
  CHECK_THAT(fails(llama(R"("hidden_size": "256")")), Contains("hidden_size = \"256\"") && Contains("number"));
  CHECK_THAT(fails(R"({"model_type": "llama"})"), Contains("hidden_size") && Contains("absent"));
  CHECK_THAT(fails(R"({"model_type": "llama", "vocab_size": 1000, "vocab_size": 1000})"),
             Contains("duplicate key \"vocab_size\""));
  CHECK_THAT(fails("{\"model_type\": \"llama\","), Contains("config.json"));
  CHECK_THAT(fails(llama(R"("quantization_config": {"quant_method": "bitsandbytes"})")),
             Contains("quantization_config.quant_method = \"bitsandbytes\""));
  CHECK_THROWS_WITH(ModelConfig::from_pretrained("/nonexistent/folder"), Contains("/nonexistent/folder/config.json"));
}

TEST_CASE("ModelConfig refuses a null where a number belongs, naming the field, and a null soft cap is none",
          "[model][errors]") {
  const auto fails = config_error;
  // transformers keeps the None and fails computing with it; tp says which field, before any work.
  CHECK_THAT(fails(llama(R"("rms_norm_eps": null)")),
             Contains("rms_norm_eps = null must be a number") && Contains("config.json"));
  CHECK_THAT(fails(llama(R"("rope_theta": null)")), Contains("rope_theta = null must be a number"));
  CHECK_THAT(fails(llama(R"("num_key_value_heads": 8, "layer_norm_eps": null)", "gpt_neox")),
             Contains("layer_norm_eps = null must be a number"));
  CHECK_THAT(fails(llama(R"("pretraining_tp": null)")), Contains("pretraining_tp = null must be an integer"));
  // Absent: the family's default, as before.
  CHECK(ModelConfig::from_json(llama(R"("tie_word_embeddings": false)")).norm_eps == 1e-05);
  CHECK(ModelConfig::from_json(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100})")
            .norm_eps == 1e-06);
  // Fields whose null transformers resolves stay readable: head_dim (hidden / heads), and
  // Gemma's soft caps (null: none).
  CHECK(ModelConfig::from_json(llama(R"("head_dim": null)")).head_dim == 32);
  const auto gemma = ModelConfig::from_json(
      llama(R"("hidden_act": "gelu_pytorch_tanh", "attn_logit_softcapping": null, "final_logit_softcapping": null,
      "query_pre_attn_scalar": 32, "sliding_window": 64)",
            "gemma2"));
  CHECK(gemma.attn_logit_softcapping == 0);
  CHECK(gemma.final_logit_softcapping == 0);
}

TEST_CASE("GPTQ quantization_config: v1 / v2 from checkpoint_format, desc_act refused", "[model][quant]") {
  const std::string base = R"("quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false)";
  const auto q = [&](const std::string& extra) { return with_quant("{" + base + extra + "}"); };
  // AutoGPTQ writes no checkpoint_format: v1.
  CHECK(quant_of(q(R"(, "sym": true)"), kDown) == "int4_gptq:g128:sym");
  CHECK(quant_of(q(R"(, "sym": false, "checkpoint_format": "gptq")"), kDown) == "int4_gptq:g128:asym");
  CHECK(quant_of(q(R"(, "sym": false, "checkpoint_format": "gptq_v2", "format": "gptq_v2")"), kDown) ==
        "int4_gptq:g128:asym:v2");
  CHECK(quant_of(q(R"(, "format": "gptq_v2")"), kDown) == "int4_gptq:g128:sym:v2");  // GPTQModel's other key
  CHECK(quant_of(q(""), "lm_head") == "none");
  CHECK(quant_of(q(R"(, "lm_head": true)"), "lm_head") == "int4_gptq:g128:sym");
  const auto c = ModelConfig::from_json(q(R"(, "checkpoint_format": "gptq_v2")"));
  CHECK(c.quantization.method() == "gptq");
  CHECK(c.quant_config(kDown).gptq_format == GptqFormat::kV2);
  CHECK_THAT(c.quantization.describe(), Contains("int4_gptq:g128:sym:v2"));

  CHECK_THROWS_WITH(ModelConfig::from_json(q(R"(, "checkpoint_format": "gptq", "format": "gptq_v2")")),
                    Contains("quantization_config.format = \"gptq_v2\"") && Contains("disagrees"));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": true})")),
                    Contains("quantization_config.desc_act = true") && Contains("act-order"));
  CHECK_THROWS_WITH(ModelConfig::from_json(q(R"(, "checkpoint_format": "marlin")")),
                    Contains("checkpoint_format = \"marlin\""));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})")),
                    Contains("quantization_config.bits = 8"));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "gptq", "bits": 4, "group_size": -1})")),
                    Contains("quantization_config.group_size = -1"));
  CHECK_THROWS_WITH(ModelConfig::from_json(q(R"(, "dynamic": {"-:.*mlp.*": {}})")),
                    Contains("quantization_config.dynamic"));
  CHECK_THROWS_WITH(ModelConfig::from_json(q(R"(, "pack_dtype": "int16")")), Contains("pack_dtype = \"int16\""));
  CHECK_THROWS_WITH(ModelConfig::from_json(q(R"(, "is_marlin_format": true)")), Contains("is_marlin_format = true"));
}

TEST_CASE("AWQ and HF FP8 quantization_config", "[model][quant]") {
  const std::string awq = R"({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm",
    "zero_point": true, "sym": true, "modules_to_not_convert": ["mlp.down_proj"]})";
  CHECK(quant_of(with_quant(awq), "model.layers.0.mlp.gate_proj") == "int4_awq:g64:asym");  // "sym" means nothing
  CHECK(quant_of(with_quant(awq), kDown) == "none");
  CHECK(quant_of(with_quant(awq), "lm_head") == "none");
  CHECK_THROWS_WITH(
      ModelConfig::from_json(
          with_quant(R"({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv", "zero_point": true})")),
      Contains("quantization_config.version = \"gemv\""));
  CHECK_THROWS_WITH(
      ModelConfig::from_json(with_quant(
          R"({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm", "zero_point": false})")),
      Contains("quantization_config.zero_point = false"));

  const std::string fp8 = R"({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
    "weight_block_size": [128, 128], "modules_to_not_convert": ["model.layers.1", "o_proj"]})";
  CHECK(quant_of(with_quant(fp8), "model.layers.0.mlp.down_proj") == "fp8_block");
  CHECK(ModelConfig::from_json(with_quant(fp8)).quant_config("model.layers.0.mlp.up_proj").block_scale_name ==
        BlockScaleName::kWeightScaleInv);
  // transformers' matching: a prefix up to a module boundary, or a suffix.
  CHECK(quant_of(with_quant(fp8), kDown) == "none");
  CHECK(quant_of(with_quant(fp8), "model.layers.0.self_attn.o_proj") == "none");
  CHECK(quant_of(with_quant(fp8), "lm_head") == "none");
  CHECK(quant_of(with_quant(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["model.layers.1"]})"),
                 "model.layers.11.mlp.up_proj") == "fp8_block");
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "fp8", "weight_block_size": [64, 64]})")),
                    Contains("weight_block_size = [64, 64]"));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "fp8", "weight_block_size": null})")),
                    Contains("weight_block_size") && Contains("per-tensor"));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "fp8", "activation_scheme": "static",
    "weight_block_size": [128, 128]})")),
                    Contains("activation_scheme = \"static\""));
  CHECK_THROWS_WITH(ModelConfig::from_json(with_quant(R"({"quant_method": "fp8", "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128]})")),
                    Contains("scale_fmt = \"ue8m0\""));
}

TEST_CASE("compressed-tensors quantization_config: every scheme tp reads, ignore and targets", "[model][quant]") {
  const char* fp8_w = R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "%s", "dynamic": false%s})";
  const auto w = [&](const char* strategy, const char* extra = "") {
    char buf[512];
    std::snprintf(buf, sizeof buf, fp8_w, strategy, extra);
    return std::string(buf);
  };
  const std::string token_fp8 =
      R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token", "dynamic": true})";
  const std::string group_fp8 =
      R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": true})";
  const std::string static_fp8 =
      R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor", "dynamic": false})";
  const std::string int8_w =
      R"({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel", "dynamic": false})";
  const std::string int8_a =
      R"({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token", "dynamic": true})";

  CHECK(quant_of(with_quant(ct_group(w("tensor"), static_fp8, "float-quantized")), kDown) == "fp8_tensor");
  CHECK(quant_of(with_quant(ct_group(w("channel"), token_fp8, "float-quantized")), kDown) == "fp8_channel");
  CHECK(quant_of(with_quant(ct_group(w("block", R"(, "block_structure": [128, 128])"), group_fp8, "float-quantized")),
                 kDown) == "fp8_block:weight_scale");
  CHECK(quant_of(with_quant(ct_group(int8_w, int8_a, "int-quantized")), kDown) == "int8_w8a8");
  CHECK(quant_of(with_quant(ct_group(int8_w, "null", "int-quantized")), kDown) == "int8_weight_only");
  CHECK(quant_of(with_quant(ct_group(kW4, "null", "pack-quantized")), kDown) == "int4_pack_quantized:g64:asym");
  CHECK(quant_of(with_quant(ct_group(R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
    "group_size": 128, "actorder": "weight"})",
                                     "null", "pack-quantized")),
                 kDown) == "int4_pack_quantized:g128:sym");

  // ignore: exact names (as compressed-tensors resolves them at save time) and re: patterns.
  const auto ignored =
      with_quant(ct_group(kW4, "null", "pack-quantized",
                          R"(["lm_head", "model.layers.0.self_attn.o_proj", "re:.*layers\\.1\\.mlp\\.up"])"));
  CHECK(quant_of(ignored, "lm_head") == "none");
  CHECK(quant_of(ignored, "model.layers.0.self_attn.o_proj") == "none");
  CHECK(quant_of(ignored, "model.layers.1.self_attn.o_proj") == "int4_pack_quantized:g64:asym");
  CHECK(quant_of(ignored, "model.layers.1.mlp.up_proj") == "none");
  CHECK(quant_of(ignored, "model.layers.11.mlp.up_proj") == "int4_pack_quantized:g64:asym");
  // targets: re: matches from the start (Python's re.match), so ".*" is needed for a suffix.
  const auto targeted = with_quant(ct_group(kW4, "null", "pack-quantized", "[]", R"(["re:.*mlp\\..*_proj$"])"));
  CHECK(quant_of(targeted, kDown) == "int4_pack_quantized:g64:asym");
  CHECK(quant_of(targeted, "model.layers.1.self_attn.q_proj") == "none");
  CHECK(quant_of(with_quant(ct_group(kW4, "null", "pack-quantized", "[]", R"(["re:mlp"])")), kDown) == "none");
  // Two groups, each with its own format (the top-level format is then "mixed-precision").
  const auto mixed = with_quant(R"({"quant_method": "compressed-tensors", "format": "mixed-precision",
    "config_groups": {
      "attn": {"targets": ["re:.*self_attn.*"], "weights": )" +
                                int8_w + R"(, "input_activations": )" + int8_a + R"(, "format": "int-quantized"},
      "mlp": {"targets": ["re:.*mlp.*"], "weights": )" +
                                std::string(kW4) +
                                R"(, "format": "pack-quantized"}},
    "ignore": ["lm_head"]})");
  CHECK(quant_of(mixed, "model.layers.0.self_attn.k_proj") == "int8_w8a8");
  CHECK(quant_of(mixed, kDown) == "int4_pack_quantized:g64:asym");
  CHECK(quant_of(mixed, "lm_head") == "none");
}

TEST_CASE("compressed-tensors quantization_config: what tp refuses", "[model][quant][errors]") {
  const auto fails = [](const std::string& qcfg) {
    try {
      ModelConfig::from_json(with_quant(qcfg)).quant_config(kDown);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  const std::string w4 = kW4;
  CHECK_THAT(fails(ct_group(R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "channel"})", "null",
                            "pack-quantized")),
             Contains("config_groups.group_0.weights.strategy = \"channel\""));
  CHECK_THAT(fails(ct_group(R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
    "group_size": 16})",
                            "null", "pack-quantized")),
             Contains("weights.group_size = 16"));
  CHECK_THAT(fails(ct_group(R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
    "group_size": 128, "actorder": "group"})",
                            "null", "pack-quantized")),
             Contains("weights.actorder = \"group\""));
  CHECK_THAT(fails(ct_group(w4, R"({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token",
    "dynamic": true})",
                            "pack-quantized")),
             Contains("input_activations") && Contains("W4A16"));
  CHECK_THAT(fails(ct_group(w4, "null", "marlin-24")), Contains("format = \"marlin-24\""));
  // NVFP4: weight-only (NVFP4A16) is read; W4A4 (the NVFP4 preset) and other FP4 groupings are not.
  const std::string nvfp4 = R"({"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group",
    "group_size": 16})";
  CHECK(quant_of(with_quant(ct_group(nvfp4, "null", "nvfp4-pack-quantized")), kDown) == "nvfp4");
  CHECK_THAT(fails(ct_group(nvfp4, R"({"num_bits": 4, "type": "float", "symmetric": true,
    "strategy": "tensor_group", "group_size": 16, "dynamic": "local"})",
                            "nvfp4-pack-quantized")),
             Contains("input_activations") && Contains("NVFP4A16"));
  CHECK_THAT(fails(ct_group(R"({"num_bits": 4, "type": "float", "symmetric": true, "strategy": "group",
    "group_size": 32})",
                            "null", "mxfp4-pack-quantized")),
             Contains("weights.strategy = \"group\"") && Contains("NVFP4"));
  CHECK_THAT(fails(ct_group(nvfp4, "null", "pack-quantized")), Contains("nvfp4-pack-quantized"));
  CHECK_THAT(fails(ct_group(R"({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel"})", "null",
                            "float-quantized")),
             Contains("input_activations") && Contains("FP8_DYNAMIC"));
  CHECK_THAT(fails(ct_group(w4, "null", "pack-quantized", R"(["lm_head"])", R"(["LlamaDecoderLayer"])")),
             Contains("targets = [\"LlamaDecoderLayer\"]") && Contains("class name"));
  auto frozen = ct_group(w4, "null", "pack-quantized");
  frozen.replace(frozen.find("\"compressed\""), 12, "\"frozen\"");
  CHECK_THAT(fails(frozen), Contains("quantization_status = \"frozen\""));
  auto kv = ct_group(w4, "null", "pack-quantized");
  kv.replace(kv.find("\"kv_cache_scheme\": null"), 23, R"("kv_cache_scheme": {"num_bits": 8, "type": "float"})");
  CHECK_THAT(fails(kv), Contains("kv_cache_scheme"));
  auto sparse = ct_group(w4, "null", "pack-quantized");
  sparse.replace(sparse.find("\"sparsity_config\": {}"), 21, R"("sparsity_config": {"format": "sparse-24"})");
  CHECK_THAT(fails(sparse), Contains("sparsity_config"));
  CHECK_THAT(fails(ct_group(w4, "null", "pack-quantized", R"(["re:("])")), Contains("ignore") && Contains("re:("));
  // Two groups claiming one layer with different formats.
  const auto two = R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
      "a": {"targets": ["Linear"], "weights": )" +
                   w4 + R"(},
      "b": {"targets": [")" +
                   kDown + R"("], "weights": {"num_bits": 4, "type": "int", "symmetric": true,
            "strategy": "group", "group_size": 128}}}})";
  CHECK_THAT(fails(two), Contains("'a'") && Contains("'b'") && Contains(kDown));
}

TEST_CASE("decoder_layer_options: sizes, biases, quant formats and prefixes of a layer", "[model][layers]") {
  const auto c = ModelConfig::from_json(with_quant(R"({"quant_method": "gptq", "bits": 4, "group_size": 64,
    "sym": false, "checkpoint_format": "gptq_v2"})",
                                                   "qwen2"));
  const auto o = decoder_layer_options(c, 1, at::kDouble);
  CHECK(o.qkv_prefix == "model.layers.1.self_attn");
  CHECK(o.o_prefix == "model.layers.1.self_attn.o_proj");
  CHECK(o.gate_up_prefix == "model.layers.1.mlp");
  CHECK(o.down_prefix == "model.layers.1.mlp.down_proj");
  CHECK(o.qkv.hidden_size() == 256);
  CHECK(o.qkv.head_dim() == 32);
  CHECK(o.qkv.num_heads() == 8);
  CHECK(o.qkv.num_kv_heads() == 2);
  CHECK(o.qkv.bias());
  CHECK_FALSE(o.o.bias());
  CHECK(o.o.in_features() == 256);
  CHECK(o.o.out_features() == 256);
  CHECK(o.gate_up.intermediate_size() == 512);
  CHECK_FALSE(o.gate_up.bias());
  CHECK(o.down.in_features() == 512);
  CHECK(o.down.out_features() == 256);
  CHECK(o.qkv.dtype() == at::kDouble);
  CHECK(to_string(o.qkv.quant()) == "int4_gptq:g64:asym:v2");
  CHECK(to_string(o.down.quant()) == "int4_gptq:g64:asym:v2");
  CHECK(decoder_layer_options(c, 0).qkv.dtype() == at::kFloat);  // the checkpoint's dtype
  CHECK_THROWS_WITH(decoder_layer_options(c, 2), Contains("layer 2 is out of range"));

  // A fused layer needs one format for its parts.
  const auto split = ModelConfig::from_json(
      with_quant(ct_group(kW4, "null", "pack-quantized", R"(["lm_head", "model.layers.0.self_attn.k_proj"])")));
  CHECK_THROWS_WITH(decoder_layer_options(split, 0), Contains("model.layers.0.self_attn.q_proj") &&
                                                         Contains("model.layers.0.self_attn.k_proj") &&
                                                         Contains("one format"));
  CHECK_NOTHROW(decoder_layer_options(split, 1));
}
