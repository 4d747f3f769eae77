// Bindings: ModelConfig (config.json of a Hugging Face folder), its quantization, and
// the options of a decoder layer's projections.

#include <optional>
#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/models/layer_options.h"
#include "tp/models/model_config.h"

namespace py = pybind11;

namespace tp::python {

void init_models(py::module_& m) {
  // The values come from the library's registry of families, so a new family needs no binding.
  py::enum_<ModelType> types(m, "ModelType", "The decoder families tp reads (config.json's model_type).");
  for (const auto& family : model_families()) types.value(family.model_type, family.type);
  py::class_<ModelFamily>(m, "ModelFamily", "One decoder family tp reads (tp.model_families()).")
      .def_property_readonly("model_type", [](const ModelFamily& f) { return std::string(f.model_type); })
      .def_readonly("type", &ModelFamily::type)
      .def_readonly("mixture_of_experts", &ModelFamily::mixture_of_experts)
      .def("__repr__", [](const ModelFamily& f) {
        return std::string("tp.ModelFamily('") + f.model_type +
               "', mixture_of_experts=" + (f.mixture_of_experts ? "True" : "False") + ")";
      });
  m.def("model_families", &model_families, py::return_value_policy::copy,
        "Every family tp reads, in ModelType order (the registry in src/models/model_families.cpp).");
  py::enum_<RopeType>(m, "RopeType",
                      "RoPE variants: default, llama3 (Llama 3.1's frequency-band scaling), linear, longrope.")
      .value("default", RopeType::kDefault)
      .value("llama3", RopeType::kLlama3)
      .value("linear", RopeType::kLinear)
      .value("longrope", RopeType::kLongRope)
      .value("yarn", RopeType::kYarn);

  py::class_<RopeParameters>(m, "RopeParameters",
                             "RoPE parameters (transformers 5's rope_parameters, or 4's rope_theta + rope_scaling).")
      .def_readonly("type", &RopeParameters::type)
      .def_readonly("theta", &RopeParameters::theta)
      .def_readonly("factor", &RopeParameters::factor)
      .def_readonly("low_freq_factor", &RopeParameters::low_freq_factor)
      .def_readonly("high_freq_factor", &RopeParameters::high_freq_factor)
      .def_readonly("original_max_position_embeddings", &RopeParameters::original_max_position_embeddings)
      .def("__repr__", [](const RopeParameters& r) {
        return to_repr([&](std::ostream& o) {
          o << "tp.RopeParameters(type=" << to_string(r.type) << ", theta=" << r.theta;
          if (r.type == RopeType::kLlama3)
            o << ", factor=" << r.factor << ", low_freq_factor=" << r.low_freq_factor
              << ", high_freq_factor=" << r.high_freq_factor
              << ", original_max_position_embeddings=" << r.original_max_position_embeddings;
          o << ")";
        });
      });

  py::class_<CheckpointQuantization>(
      m, "CheckpointQuantization", "Which linear layers of a checkpoint are quantized, and how (quantization_config).")
      .def_property_readonly("method", &CheckpointQuantization::method)
      .def_property_readonly("quantized", &CheckpointQuantization::quantized)
      .def("for_module", &CheckpointQuantization::for_module, py::arg("module"),
           "The QuantConfig of a linear layer by checkpoint name ('model.layers.0.mlp.down_proj').")
      .def("describe", &CheckpointQuantization::describe)
      .def("__repr__",
           [](const CheckpointQuantization& q) { return "<tp.CheckpointQuantization " + q.describe() + ">"; });

  py::class_<DecoderLayerOptions>(m, "DecoderLayerOptions",
                                  "The options of layer i's projections and the checkpoint prefixes they load from. "
                                  "Build O with o_proj(qkv) so that it owns exactly qkv's query heads.")
      .def_readonly("layer", &DecoderLayerOptions::layer)
      .def_readonly("qkv_prefix", &DecoderLayerOptions::qkv_prefix)
      .def_readonly("o_prefix", &DecoderLayerOptions::o_prefix)
      .def_readonly("gate_up_prefix", &DecoderLayerOptions::gate_up_prefix)
      .def_readonly("down_prefix", &DecoderLayerOptions::down_prefix)
      .def_readonly("qkv", &DecoderLayerOptions::qkv)
      .def_readonly("o", &DecoderLayerOptions::o)
      .def_readonly("gate_up", &DecoderLayerOptions::gate_up)
      .def_readonly("down", &DecoderLayerOptions::down)
      .def(
          "o_proj",
          [](const DecoderLayerOptions& o, py::object qkv) {
            // tp.QKVParallelLinear (the torch.nn.Module) holds the C++ layer as _impl.
            if (py::hasattr(qkv, "_impl")) qkv = qkv.attr("_impl");
            const auto impl = qkv.cast<std::shared_ptr<QKVParallelLinearImpl>>();
            TORCH_CHECK_VALUE(impl != nullptr, "o_proj: expected a tp.QKVParallelLinear");
            return o.o_proj(*impl);
          },
          py::arg("qkv"),
          "o's options with the split that gives it exactly qkv's query heads (a tp.QKVParallelLinear).");

  py::class_<ModelConfig>(m, "ModelConfig", "config.json of a Llama / Qwen2 / Qwen3 Hugging Face folder.")
      .def_static("from_pretrained", &ModelConfig::from_pretrained, py::arg("folder"),
                  "Reads folder/config.json (and quantize_config.json for GPTQ folders without quantization_config).")
      .def_static("from_json", &ModelConfig::from_json, py::arg("text"), py::arg("where") = "config.json")
      .def_readonly("model_type", &ModelConfig::model_type)
      .def_readonly("hidden_size", &ModelConfig::hidden_size)
      .def_readonly("intermediate_size", &ModelConfig::intermediate_size)
      .def_readonly("num_hidden_layers", &ModelConfig::num_hidden_layers)
      .def_readonly("num_attention_heads", &ModelConfig::num_attention_heads)
      .def_readonly("num_key_value_heads", &ModelConfig::num_key_value_heads)
      .def_readonly("head_dim", &ModelConfig::head_dim)
      .def_readonly("vocab_size", &ModelConfig::vocab_size)
      .def_readonly("max_position_embeddings", &ModelConfig::max_position_embeddings)
      .def_readonly("qkv_bias", &ModelConfig::qkv_bias)
      .def_readonly("o_bias", &ModelConfig::o_bias)
      .def_readonly("mlp_bias", &ModelConfig::mlp_bias)
      .def_readonly("tie_word_embeddings", &ModelConfig::tie_word_embeddings)
      .def_readonly("norm_eps", &ModelConfig::norm_eps)
      .def_readonly("rope", &ModelConfig::rope)
      .def_readonly("dtype", &ModelConfig::dtype)
      .def_readonly("quantization", &ModelConfig::quantization)
      .def_readonly("source", &ModelConfig::source)
      .def_property_readonly("q_size", &ModelConfig::q_size)
      .def_property_readonly("kv_size", &ModelConfig::kv_size)
      .def("quant_config", &ModelConfig::quant_config, py::arg("module"),
           "The QuantConfig of a linear layer by checkpoint name.")
      .def(
          "decoder_layer_options",
          [](const ModelConfig& c, int64_t layer, std::optional<at::ScalarType> dtype,
             std::optional<at::Device> device) {
            return decoder_layer_options(c, layer, dtype.value_or(c.dtype), device.value_or(at::Device(at::kCPU)));
          },
          py::arg("layer"), py::arg("dtype") = std::nullopt, py::arg("device") = std::nullopt,
          "Options of layer `layer`'s projections (default dtype: the checkpoint's).")
      .def("__repr__", [](const ModelConfig& c) {
        return to_repr([&](std::ostream& o) {
          o << "tp.ModelConfig(" << to_string(c.model_type) << ", hidden_size=" << c.hidden_size
            << ", intermediate_size=" << c.intermediate_size << ", layers=" << c.num_hidden_layers
            << ", heads=" << c.num_attention_heads << ", kv_heads=" << c.num_key_value_heads
            << ", head_dim=" << c.head_dim << ", vocab_size=" << c.vocab_size << ", dtype=" << c.dtype
            << ", quantization=" << c.quantization.describe() << ")";
        });
      });
}

}  // namespace tp::python
