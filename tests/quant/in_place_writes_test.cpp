// A quantized layer's tensors written in place after finalize() (load_state_dict, a
// copy_ from another layer, an adapter merge) must be what the next forward and the
// next dequantized_weight() use. finalize() derives kernel-side copies from them (INT4
// panels, INT8 float scales and row sums); a copy made from the old values would give
// a silently wrong output. Each format is checked against a second method that holds
// the new values from the start: same kernels, so the outputs must be equal.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <tuple>
#include <utility>

#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "support/quant_formats.h"
#include "support/test_util.h"
#include "tp/quant/quant_method.h"

using namespace tp;

namespace {

struct Layer {
  torch::nn::Module module;
  std::shared_ptr<QuantMethod> method;
};

void make(Layer& l, const QuantConfig& config, int64_t n, int64_t k, at::ScalarType dtype) {
  l.method = make_quant_method(config);
  l.method->create_weights(l.module, n, k, at::TensorOptions().dtype(dtype));
  l.method->reset_parameters(k);  // random weights from the global generator: each layer its own
  l.method->finalize();
}

}  // namespace

TEST_CASE("quantized tensors written in place after finalize() are what the next forward uses",
          "[quant][cpu_kernels]") {
  const int64_t n = 64, k = 256;
  for (const std::string& name : test::quantized_format_variants()) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      INFO(name << " " << c10::toString(dtype));
      const QuantConfig config = parse_quant_config(name);
      for (int64_t m : {1, 5, 40}) {
        Layer target, source;
        make(target, config, n, k, dtype);
        make(source, config, n, k, dtype);
        const at::Tensor x = test::randn({m, k}, 700 + m).to(dtype);
        const at::Tensor before = target.method->apply(x, std::nullopt);  // kernels warmed on the old values
        {
          at::NoGradGuard no_grad;
          auto dst = target.module.named_parameters();
          for (const auto& p : source.module.named_parameters()) dst[p.key()].copy_(p.value());
        }
        const at::Tensor after = target.method->apply(x, std::nullopt);
        const at::Tensor want = source.method->apply(x, std::nullopt);
        REQUIRE(!at::equal(before, want));  // the write changed the layer
        CHECK(at::equal(after, want));
        CHECK(at::equal(target.method->dequantized_weight(), source.method->dequantized_weight()));
      }
    }
  }
}

TEST_CASE("each quantized CPU forward names the kernel it ran (the benchmarks' kernel column)",
          "[quant][cpu_kernels]") {
  const int64_t n = 64, k = 256;
  const bool simd = tp::cpu::isa() != tp::cpu::Isa::kScalar;
  const std::string isa = tp::cpu::to_string(tp::cpu::isa());
  // (format, kernel at M = 1, kernel at M = 40); the rows kernels need SIMD.
  const std::tuple<std::string, std::string, std::string> cases[] = {
      {"int4_gptq:g64", simd ? "int4 rows/" : "int4 panel/", "int4 panel/"},
      {"int4_pack_quantized:g32", simd ? "int4 rows/" : "int4 panel/", "int4 panel/"},
      {"int8_weight_only", simd ? "int8wo rows/" : "int8wo panel/", "int8wo panel/"},
      {"int8_w8a8", "w8a8/", "w8a8/"},
      {"fp8_channel", "fp8 gemv/", "fp8 gemm/"},
      {"fp8_block", "fp8 gemv/", "fp8 gemm/"},
      {"mxfp4", simd ? "mxfp4 rows/" : "mxfp4 panel/", "mxfp4 panel/"},
  };
  for (const auto& [name, small, large] : cases) {
    Layer layer;
    make(layer, parse_quant_config(name), n, k, at::kFloat);
    for (const auto& [m, want] : {std::pair<int64_t, std::string>{1, small}, {40, large}}) {
      INFO(name << " M " << m);
      const auto before = tp::cpu::kernel_counts();
      (void)layer.method->apply(test::randn({m, k}, 800 + m).to(at::kFloat), std::nullopt);
      const std::string ran = tp::cpu::kernels_between(before, tp::cpu::kernel_counts());
      CHECK_THAT(ran, Catch::Contains(want));
      if (want != "w8a8/") CHECK_THAT(ran, Catch::Contains(want + isa));
    }
  }
}
