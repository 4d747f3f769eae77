// The fused layer boundary (Communicator::all_reduce_fusion) where comm cannot look:
// its norms are tp::Norm's and its per-token quantizer is quant's quantize_activation,
// bit for bit; and DecoderLayer's fused path gives the logits of its unfused one in
// every family variant (sequential, sandwich norms, parallel residual, MoE) at TP 1-4.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/launch.h"
#include "tp/models/causal_lm.h"
#include "tp/models/norm.h"
#include "tp/quant/quantize.h"

using namespace tp;

namespace {

at::Tensor randn(uint64_t seed, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

AllReduceFusionNorm fusion_norm(NormKind k) {
  switch (k) {
    case NormKind::kRMS: return AllReduceFusionNorm::kRMS;
    case NormKind::kRMSUnitOffset: return AllReduceFusionNorm::kRMSUnitOffset;
    case NormKind::kRMSScaleFirst: return AllReduceFusionNorm::kRMSScaleFirst;
    case NormKind::kLayerNorm: return AllReduceFusionNorm::kLayerNorm;
  }
  return AllReduceFusionNorm::kNone;
}

}  // namespace

TEST_CASE("the fused boundary's norm is tp::Norm's and its quantizer is quantize_activation, bit for bit",
          "[models][fusion]") {
  Communicator comm;  // TP 1: the epilogue alone, on exactly the values given
  const int64_t hidden = 200;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t m : {1, 5, 300}) {
      for (auto kind : {NormKind::kRMS, NormKind::kRMSUnitOffset, NormKind::kRMSScaleFirst, NormKind::kLayerNorm}) {
        // Rows of every magnitude (1e-6 .. 1e4), and a row of zeros (scale 1, codes 0).
        at::Tensor x = randn(m * 7 + 1, {m, hidden}, at::kDouble);
        x = x * at::pow(10.0, at::arange(m, at::kDouble).remainder(11).sub(6)).unsqueeze(1);
        if (m > 1) x[1].zero_();
        x = x.to(dtype);
        const at::Tensor bias = randn(2, {hidden}, dtype), w = randn(3, {hidden}, dtype),
                         nb = randn(4, {hidden}, dtype);
        Norm norm(NormOptions(hidden).kind(kind).eps(1e-5).dtype(dtype));
        {
          at::NoGradGuard no_grad;
          norm->weight.copy_(w);
          if (norm->bias.defined()) norm->bias.copy_(nb);
        }
        for (auto [quant, format] : {std::pair{AllReduceFusionQuant::kFp8PerToken, QuantFormat::kFp8PerChannel},
                                     std::pair{AllReduceFusionQuant::kInt8PerToken, QuantFormat::kInt8W8A8}}) {
          INFO("dtype " << dtype << " M " << m << " norm " << to_string(kind) << " quant " << quant);
          AllReduceFusionParams p;
          p.bias = bias;
          p.norm = fusion_norm(kind);
          p.norm_weight = w;
          if (kind == NormKind::kLayerNorm) p.norm_bias = nb;
          p.eps = 1e-5;
          p.quant_out = quant;
          const auto r = comm.all_reduce_fusion(x, p);
          at::Tensor y;
          {
            at::NoGradGuard no_grad;
            y = norm->forward(x + bias);
          }
          CHECK(same_bits(r.residual_out, x + bias));
          const double tol = dtype == at::kFloat ? 2e-5 : 1.6e-2;
          CHECK(at::allclose(r.norm_out.to(at::kDouble), y.to(at::kDouble), tol, tol));
          // The quantizer: codes and scales are quantize_activation's for the same input,
          // and its per-token scale is quant's amax / qmax.
          const QuantConfig config{format};
          const at::Tensor model = quantize_activation(r.norm_out, {}, config);
          CHECK(same_bits(r.quant_out.to(at::kFloat) * r.scale_out, model));
          const at::Tensor amax = r.norm_out.to(at::kFloat).abs().amax(-1, true);
          const double qmax = quant == AllReduceFusionQuant::kFp8PerToken ? 448.0 : 127.0;
          CHECK(same_bits(r.scale_out, at::where(amax > 0, amax / qmax, at::ones_like(amax))));
          // And wherever the fused norm has the unfused norm's bits (the variance summed in
          // another order can move a row by one rounding), the codes are the unfused path's.
          const at::Tensor unfused = quantize_activation(y, {}, config);
          int64_t equal_rows = 0;
          for (int64_t i = 0; i < m; ++i) {
            if (!same_bits(r.norm_out[i], y[i])) continue;
            ++equal_rows;
            CHECK(same_bits((r.quant_out[i].to(at::kFloat) * r.scale_out[i]), unfused[i]));
          }
          // bfloat16's rounding hides the order of the RMS kinds' variance sum in most rows;
          // float32's does not, nor LayerNorm's (ATen's kernel, another formula): there the
          // comparison is through quantize_activation of the fused norm alone (above).
          INFO(equal_rows << " of " << m << " rows have the unfused norm's bits");
          if (dtype == at::kBFloat16 && kind != NormKind::kLayerNorm) CHECK(equal_rows > 0);
        }
      }
    }
  }
}

namespace {

// A tiny Llama whose linear layers (not the LM head) are compressed-tensors' W8A8:
// per-channel weights and dynamic per-token activations of `type` "int" (INT8) or "float" (FP8).
std::string quantized_llama(const std::string& type) {
  const std::string scheme = R"({"num_bits": 8, "type": ")" + type + R"(", "symmetric": true, "strategy": ")";
  const std::string format = type == "int" ? "int-quantized" : "float-quantized";
  return R"({"model_type": "llama", "hidden_size": 192, "intermediate_size": 320, "num_hidden_layers": 2,
    "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 96, "rms_norm_eps": 1e-05,
    "hidden_act": "silu", "tie_word_embeddings": false,
    "quantization_config": {"quant_method": "compressed-tensors", "format": ")" +
         format + R"(", "quantization_status": "compressed",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" +
         scheme + R"(channel", "dynamic": false}, "input_activations": )" + scheme +
         R"(token", "dynamic": true}, "output_activations": null, "format": ")" + format + R"("}},
      "ignore": ["lm_head"]}})";
}

// Tiny configs of each family variant: hidden 192 (not a power of two), 12 heads (even
// at TP 3 and 4), biases where the family has them.
std::vector<std::pair<std::string, std::string>> family_configs() {
  return {
      {"llama (sequential, o/down biases)",
       R"({"model_type": "llama", "hidden_size": 192, "intermediate_size": 320, "num_hidden_layers": 2,
         "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 96, "rms_norm_eps": 1e-05,
         "attention_bias": true, "mlp_bias": true, "hidden_act": "silu", "tie_word_embeddings": false})"},
      {"gemma2 (sandwich norms, unit offset)",
       R"({"model_type": "gemma2", "hidden_size": 192, "intermediate_size": 320, "num_hidden_layers": 2,
         "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 16, "vocab_size": 96,
         "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": true})"},
      {"gpt_neox (parallel residual, LayerNorm, biases)",
       R"({"model_type": "gpt_neox", "hidden_size": 192, "intermediate_size": 320, "num_hidden_layers": 2,
         "num_attention_heads": 12, "vocab_size": 96, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
         "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"},
         "use_parallel_residual": true, "attention_bias": true, "tie_word_embeddings": false})"},
      {"gpt_neox (sequential, LayerNorm)",
       R"({"model_type": "gpt_neox", "hidden_size": 192, "intermediate_size": 320, "num_hidden_layers": 2,
         "num_attention_heads": 12, "vocab_size": 96, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
         "use_parallel_residual": false, "attention_bias": true, "tie_word_embeddings": false})"},
      // The boundaries hand their norm to the next GEMM quantized (W8A8's int8 codes, fp8_channel's E4M3).
      {"llama int8_w8a8 (compressed-tensors; quantized handoff)", quantized_llama("int")},
      {"llama fp8_channel (compressed-tensors; quantized handoff)", quantized_llama("float")},
      {"mixtral (MoE blocks)",
       R"({"model_type": "mixtral", "hidden_size": 192, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 16, "vocab_size": 96,
         "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": null, "router_jitter_noise": 0.0,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})"},
  };
}

}  // namespace

TEST_CASE("DecoderLayer's fused boundary gives the unfused path's logits in every family at TP 1-4",
          "[models][fusion]") {
  for (const auto& [family, json] : family_configs()) {
    const ModelConfig config = ModelConfig::from_json(json);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t world = 1; world <= 4; ++world) {
        std::vector<at::Tensor> fused(world), unfused(world), graded(world);
        run_ranks_in_threads(world, [&](Communicator& comm) {
          CausalLM model(config, CausalLMOptions().dtype(dtype), comm);
          {
            // Norms that are not the identity (mirrored: the same seed on every rank).
            at::NoGradGuard no_grad;
            uint64_t seed = 11;
            for (auto& item : model->named_parameters()) {
              if (item.key().find("norm") == std::string::npos) continue;
              item.value().copy_(randn(seed++, item.value().sizes(), at::kDouble).mul(0.2).add(1.0).to(dtype));
            }
          }
          // 2 x 7 tokens: not a multiple of 3 or 4.
          const at::Tensor ids = at::arange(14, at::kLong).remainder(config.vocab_size).reshape({2, 7});
          const auto logits = [&] { return model->gather_logits(model->forward(ids)); };
          {
            at::NoGradGuard no_grad;
            fused[comm.rank()] = logits();
            for (auto& layer : model->layers) layer->fuse_boundary = false;
            unfused[comm.rank()] = logits();
            for (auto& layer : model->layers) layer->fuse_boundary = true;
          }
          // With autograd recording, the layers keep the unfused path (it has a backward).
          graded[comm.rank()] = logits().detach();
        });
        INFO(family << ", " << dtype << ", TP " << world);
        const at::Tensor ref = unfused[0].to(at::kDouble);
        const double scale = ref.abs().max().item<double>();
        // Per-token activation quantization (the quantized families) turns a one-ulp
        // difference of a norm (its variance summed in another order, fused or not) into a
        // whole code step of that element, an FP8 step being 1/8 of its value: there the
        // bound is bfloat16's at either dtype. (The handoff itself is bitwise: the codes
        // are forward's, tests/layers/quantized_input_test.cpp and the block test below.)
        const bool quantized = config.quantization.quantized();
        const double tol = (dtype == at::kFloat && !quantized ? 1e-5 : 4e-2) * std::max(1.0, scale);
        const double diff = (fused[0].to(at::kDouble) - ref).abs().max().item<double>();
        INFO("max |fused - unfused| = " << diff << ", tolerance " << tol);
        CHECK(diff <= tol);
        CHECK(same_bits(graded[0], unfused[0]));
        for (int64_t r = 1; r < world; ++r) CHECK(same_bits(fused[r], fused[0]));
      }
    }
  }
}

TEST_CASE("a block takes the stream's norm and codes as its own input norm, bit for bit, at TP 1-4",
          "[models][fusion]") {
  // The W8A8 Llama: a stream carrying input_layernorm(x) and its int8 codes gives the block's
  // output of x alone bit for bit, so the codes were the ones its QKV would have made; and
  // the codes are what it reads (other codes, another output).
  const ModelConfig config = ModelConfig::from_json(quantized_llama("int"));
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t world = 1; world <= 4; ++world) {
      std::vector<int> equal(world), normed_equal(world), codes_read(world), quant(world);
      run_ranks_in_threads(world, [&](Communicator& comm) {
        at::NoGradGuard no_grad;
        CausalLM model(config, CausalLMOptions().dtype(dtype), comm);
        auto& block = model->layers[1];
        const at::Tensor x = randn(5, {1, 7, config.hidden_size}, dtype);
        const auto positions = at::arange(7, at::kLong).unsqueeze(0);
        const auto [cos, sin] = model->rotary_tables(positions)[0];
        const at::Tensor normed = block->input_layernorm->forward(x);
        AllReduceFusionParams p;
        p.norm = fusion_norm(block->input_layernorm->options.kind());
        p.norm_weight = block->input_layernorm->weight;
        p.eps = block->input_layernorm->options.eps();
        p.quant_out = AllReduceFusionQuant::kInt8PerToken;
        const auto r = comm.all_reduce_fusion(comm.rank() == 0 ? x : at::zeros_like(x), p);
        quant[comm.rank()] = block->input_quant(x) == TokenQuant::kInt8;
        const at::Tensor streamed =
            block->forward(LayerStream(x, r.norm_out, r.quant_out, r.scale_out), {}, cos, sin).hidden;
        const at::Tensor by_norm = block->forward(LayerStream(x, r.norm_out), {}, cos, sin).hidden;
        equal[comm.rank()] = same_bits(streamed, by_norm);
        // Where the fused norm has input_layernorm's bits, the stream is x alone.
        normed_equal[comm.rank()] = !same_bits(r.norm_out, normed) || same_bits(by_norm, block->forward(x, cos, sin));
        const at::Tensor other =
            block->forward(LayerStream(x, r.norm_out, at::zeros_like(r.quant_out), r.scale_out), {}, cos, sin).hidden;
        codes_read[comm.rank()] = !same_bits(other, by_norm);
      });
      INFO(dtype << ", TP " << world);
      for (int64_t r = 0; r < world; ++r) {
        CHECK(quant[r]);
        CHECK(equal[r]);
        CHECK(codes_read[r]);
        CHECK(normed_equal[r]);
      }
    }
  }
}
