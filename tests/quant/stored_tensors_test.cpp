// The format table's declaration of each format's stored tensors (tp/quant/stored_tensors.h):
// it names exactly the tensors each QuantMethod registers, and each declared axis is where
// the registered shapes carry the output / input features.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/stored_tensors.h"

using namespace tp;

namespace {

// Every variant of every format that changes what it stores (symmetry, the FP8 block
// scale's name, NVFP4's dialect), and one group size other than the default.
std::vector<QuantConfig> every_variant() {
  std::vector<QuantConfig> out;
  for (const QuantFormat f : all_quant_formats()) {
    const std::string name = to_string(f);
    if (name.rfind("int4_", 0) == 0) {
      for (const char* variant : {":g64:sym", ":g128:asym"}) out.push_back(parse_quant_config(name + variant));
    } else if (f == QuantFormat::kFp8Block) {
      out.push_back(parse_quant_config("fp8_block:weight_scale_inv"));
      out.push_back(parse_quant_config("fp8_block:weight_scale"));
    } else if (f == QuantFormat::kNvfp4) {
      out.push_back(parse_quant_config("nvfp4:compressed_tensors"));
      out.push_back(parse_quant_config("nvfp4:modelopt"));
    } else {
      out.push_back(parse_quant_config(name));
    }
  }
  return out;
}

// {name: shape} of what `config`'s method registers for a local weight [n, k], in order.
std::vector<std::pair<std::string, std::vector<int64_t>>> registered(const QuantConfig& config, int64_t n, int64_t k) {
  torch::nn::Module layer;
  make_quant_method(config)->create_weights(layer, n, k, at::TensorOptions().dtype(at::kFloat));
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : layer.named_parameters(/*recurse=*/false)) out.emplace_back(p.key(), p.value().sizes().vec());
  return out;
}

// `base` with the features along `dim` (each index covering `per_index`) halved.
std::vector<int64_t> halved(std::vector<int64_t> base, int64_t dim, int64_t features, int64_t per_index) {
  if (dim >= 0) base[dim] = features / 2 / per_index;
  return base;
}

}  // namespace

TEST_CASE("every format's declared stored tensors are exactly what its method registers, on the declared axes",
          "[quant]") {
  constexpr int64_t n = 256, k = 512;
  for (const auto& config : every_variant()) {
    const auto declared = stored_tensors(config);
    const auto full = registered(config, n, k);
    const auto half_n = registered(config, n / 2, k);
    const auto half_k = registered(config, n, k / 2);
    INFO("format " << to_string(config));
    std::vector<std::string> declared_names, registered_names;
    for (const auto& t : declared) declared_names.push_back(t.name);
    for (const auto& [name, shape] : full) registered_names.push_back(name);
    REQUIRE(declared_names == registered_names);
    for (size_t i = 0; i < declared.size(); ++i) {
      const auto& t = declared[i];
      const auto& shape = full[i].second;
      INFO("tensor " << t.name << " of shape " << c10::IntArrayRef(shape));
      CHECK(t.out_per_index > 0);
      CHECK(t.in_per_index > 0);
      if (t.out_dim >= 0) CHECK(shape.at(t.out_dim) == n / t.out_per_index);
      if (t.in_dim >= 0) CHECK(shape.at(t.in_dim) == (k + t.in_per_index - 1) / t.in_per_index);
      // Halving N changes only the N dimension (none if there is none); halving K only K's.
      CHECK(half_n[i].second == halved(shape, t.out_dim, n, t.out_per_index));
      CHECK(half_k[i].second == halved(shape, t.in_dim, k, t.in_per_index));
    }
  }
}

TEST_CASE("the quantized-only tensor names derive from the format table", "[quant]") {
  // What strict loading named before the table declared it: every quantized format's
  // stored and read tensors, and the formats tp does not read.
  const std::vector<std::string> expected = {"activation_scale",
                                             "blocks",
                                             "g_idx",
                                             "input_global_scale",
                                             "input_scale",
                                             "input_zero_point",
                                             "k_scale",
                                             "output_scale",
                                             "qweight",
                                             "qzeros",
                                             "scales",
                                             "v_scale",
                                             "weight_g_idx",
                                             "weight_global_scale",
                                             "weight_packed",
                                             "weight_scale",
                                             "weight_scale_2",
                                             "weight_scale_inv",
                                             "weight_shape",
                                             "weight_zero_point"};
  CHECK(quantized_tensor_names() == expected);
  // The unquantized format's own tensor is never a quantized one.
  for (const auto& name : quantized_tensor_names()) CHECK(name != "weight");
}
