// Where AMX is usable, bf16 layers of the integer and FP8 formats really take the tiles (the
// kernel counter names what ran) and match their own float64 model: x times the
// layer's dequantized weight (bf16, as the layer defines it), float32 sums, y rounded to
// bf16 once. Below the formats' row thresholds, in float32, or without AMX the vector
// kernels run and the counter says so. (The TP 1-4 layer checks of each format run
// these paths too: their bf16 cases have 5 tokens.)

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <string>

#include "cpu/amx.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"
#include "quant/fp8/cpu_kernels.h"
#include "quant/int8/w8a8_kernels.h"
#include "quant/int8/weight_only_cpu_kernels.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"
#include "tp/quant/quant_method.h"

using namespace tp;

namespace {

struct Ran {
  at::Tensor y;
  std::string kernel;
};

Ran apply_counted(QuantMethod& method, const at::Tensor& x) {
  const auto before = cpu::kernel_counts();
  at::Tensor y = method.apply(x, std::nullopt);
  return {y, cpu::kernels_between(before, cpu::kernel_counts())};
}

}  // namespace

TEST_CASE("amx: bf16 weight-only integer layers take the bf16 tiles and match their float64 model",
          "[quant][cpu_kernels]") {
  const bool amx = cpu::amx_status().usable;
  if (!amx) WARN("AMX not usable here (" << cpu::amx_status().why << "): only the fallbacks are checked");
  struct Case {
    QuantConfig config;
    const char* family;  // the kernel counter's prefix
  };
  const QuantConfig int4{QuantFormat::kInt4Gptq};
  const QuantConfig int4_asym = [] {
    QuantConfig c{QuantFormat::kInt4Gptq, 64};
    c.symmetric = false;
    return c;
  }();
  for (const Case& c :
       {Case{QuantConfig{QuantFormat::kInt8WeightOnly}, "int8wo"}, Case{int4, "int4"}, Case{int4_asym, "int4"}}) {
    INFO(to_string(c.config));
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{48, 256}, {104, 4224}}) {
      auto method = make_quant_method(c.config);
      torch::nn::Module layer;
      method->create_weights(layer, n, k, at::TensorOptions().dtype(at::kBFloat16));
      method->reset_parameters(k);
      const at::Tensor w = method->dequantized_weight();
      REQUIRE(w.scalar_type() == at::kBFloat16);
      // INT8 weight-only up to kInt8WoAmxRowsMaxM rows: x times the exact codes, the row
      // scale on each output (its model: the codes times the float32 scales, unrounded).
      const bool int8wo = c.config.format == QuantFormat::kInt8WeightOnly;
      const at::Tensor w_exact =
          int8wo ? method->weight().to(at::kDouble) * layer.named_parameters()["weight_scale"].to(at::kDouble)
                 : at::Tensor();
      for (int64_t m : {cpu::kPanelAmxMinM - 1, cpu::kPanelAmxMinM, int64_t{16}, int64_t{70}, int64_t{200}}) {
        INFO("N=" << n << " K=" << k << " M=" << m);
        const at::Tensor x = test::randn({m, k}, static_cast<uint64_t>(m + n)).to(at::kBFloat16);
        const Ran ran = apply_counted(*method, x);
        const bool tiles = amx && m >= cpu::kPanelAmxMinM;
        if (!tiles) {
          CHECK(ran.kernel.find("amx") == std::string::npos);
          continue;
        }
        const bool rows = int8wo && m <= tp::detail::kInt8WoAmxRowsMaxM;
        CHECK(ran.kernel == std::string(c.family) + (rows ? " rows/amx" : " panel/amx"));
        const at::Tensor model = rows ? w_exact : w.to(at::kDouble);
        const at::Tensor ref = at::matmul(x.to(at::kDouble), model.t());
        const at::Tensor bound = test::float32_dot_bound(x, model, rows ? 2 : 0) * (1 + std::ldexp(1.0, -8)) +
                                 ref.abs() * std::ldexp(1.0, -8);
        const double worst = ((ran.y.to(at::kDouble) - ref).abs() / bound).max().item<double>();
        INFO("worst |y - ref| / bound = " << worst);
        CHECK(worst <= 1.0);
      }
      // A float32 layer keeps float32 arithmetic: never the tiles.
      auto f32 = make_quant_method(c.config);
      torch::nn::Module layer32;
      f32->create_weights(layer32, n, k, at::TensorOptions().dtype(at::kFloat));
      f32->reset_parameters(k);
      CHECK(apply_counted(*f32, test::randn({16, k}, 5).to(at::kFloat)).kernel.find("amx") == std::string::npos);
    }
  }
}

TEST_CASE("amx: bf16 FP8 layers take the bf16 tiles from kFp8AmxMinM rows, never with NaN codes or in float32",
          "[quant][cpu_kernels]") {
  const bool amx = cpu::amx_status().usable;
  if (!amx) WARN("AMX not usable here (" << cpu::amx_status().why << "): only the fallbacks are checked");
  for (const auto format : {QuantFormat::kFp8PerTensor, QuantFormat::kFp8PerChannel, QuantFormat::kFp8Block}) {
    INFO(to_string(format));
    auto method = make_quant_method(QuantConfig{format});
    torch::nn::Module layer;
    method->create_weights(layer, 40, 256, at::TensorOptions().dtype(at::kBFloat16));
    method->reset_parameters(256);
    for (int64_t m : {tp::detail::kFp8AmxMinM - 1, tp::detail::kFp8AmxMinM, int64_t{16}}) {
      INFO("M=" << m);
      const std::string ran = apply_counted(*method, test::randn({m, 256}, 9).to(at::kBFloat16)).kernel;
      if (amx && m >= tp::detail::kFp8AmxMinM)
        CHECK(ran == "fp8 gemm/amx");
      else
        CHECK(ran.find("amx") == std::string::npos);
    }
    auto f32 = make_quant_method(QuantConfig{format});
    torch::nn::Module layer32;
    f32->create_weights(layer32, 40, 256, at::TensorOptions().dtype(at::kFloat));
    f32->reset_parameters(256);
    CHECK(apply_counted(*f32, test::randn({16, 256}, 9)).kernel.find("amx") == std::string::npos);
    {
      at::NoGradGuard no_grad;
      method->weight().view(at::kByte)[3][7] = 0x7f;  // a NaN code: the NaN-exact vector kernels
    }
    method->finalize();
    const Ran nan_run = apply_counted(*method, test::randn({16, 256}, 9).to(at::kBFloat16));
    CHECK(nan_run.kernel.find("amx") == std::string::npos);
    CHECK(at::isnan(nan_run.y.select(1, 3)).all().item<bool>());
  }
}

TEST_CASE("amx: INT8 weight-only rows decode odd K and N exactly", "[quant][cpu_kernels]") {
  // K off the 16-code decode step and the 32-k tile step, N off the 16-row tiles: the
  // decoder's tail and the tile loop's partial tiles, against the exact model.
  if (!cpu::amx_status().usable) {
    WARN("AMX not usable here (" << cpu::amx_status().why << "): the AMX kernel is not run");
    return;
  }
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 301}, {17, 7}, {50, 4100}}) {
    auto method = make_quant_method(QuantConfig{QuantFormat::kInt8WeightOnly});
    torch::nn::Module layer;
    method->create_weights(layer, n, k, at::TensorOptions().dtype(at::kBFloat16));
    method->reset_parameters(k);
    const at::Tensor model =
        method->weight().to(at::kDouble) * layer.named_parameters()["weight_scale"].to(at::kDouble);
    for (int64_t m : {int64_t{5}, int64_t{33}}) {
      INFO("N=" << n << " K=" << k << " M=" << m);
      const at::Tensor x = test::randn({m, k}, static_cast<uint64_t>(7 * m + n)).to(at::kBFloat16);
      const Ran ran = apply_counted(*method, x);
      CHECK(ran.kernel == "int8wo rows/amx");
      const at::Tensor ref = at::matmul(x.to(at::kDouble), model.t());
      const at::Tensor bound =
          test::float32_dot_bound(x, model, 2) * (1 + std::ldexp(1.0, -8)) + ref.abs() * std::ldexp(1.0, -8);
      const double worst = ((ran.y.to(at::kDouble) - ref).abs() / bound).max().item<double>();
      INFO("worst |y - ref| / bound = " << worst);
      CHECK(worst <= 1.0);
    }
  }
}
