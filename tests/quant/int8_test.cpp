// INT8 formats: int8_w8a8 and int8_weight_only at TP 1-4, their loading rules, kernels and errors.
//
// Tolerances (relative_error: max abs error / max(1, max |ref|)) against the float64
// reference quantize_activation(x) @ dequantize_weight(W)^T + b:
// - int8_weight_only: each dtype's GEMM tolerance (test_util.h: float32 2e-5,
//   bfloat16 3e-2, float16 4e-3). Every dtype runs tp's CPU kernels
//   (quant/int8/weight_only_cpu_kernels.h: exact products q * x, float32
//   accumulation, the output rounded once), any K; they are tested bit for bit and at
//   edge shapes in int8/weight_only_cpu_kernels_test.cpp.
// - int8_w8a8: 2e-2 (float32) / 4e-2 (bfloat16). Column layers reproduce the
//   reference's activation rounding exactly (same helper, exact int32 products), but
//   a RowParallelLinear quantizes each rank's slice of x with its own per-token scale,
//   which moves each product by up to half a (smaller) step: at most ~1/254 of
//   amax|x| per element, summed over K with random signs, ~1e-2 of the output scale
//   at K = 384. bfloat16 adds its GEMM tolerance.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

const QuantConfig kW8A8{QuantFormat::kInt8W8A8};
const QuantConfig kWeightOnly{QuantFormat::kInt8WeightOnly};

at::Tensor param(const torch::nn::Module& m, const std::string& name) {
  const auto* p = m.named_parameters().find(name);
  REQUIRE(p != nullptr);
  return *p;
}

}  // namespace

TEST_CASE("int8_weight_only layers match the float64 reference at TP 1-4", "[quant][int8]") {
  test::check_quant_layers({kWeightOnly, at::kFloat, test::tolerance(at::kFloat)});
  test::check_quant_layers({kWeightOnly, at::kBFloat16, test::tolerance(at::kBFloat16)});
  test::QuantCheck file{kWeightOnly, at::kBFloat16, test::tolerance(at::kBFloat16)};
  file.from_file = true;
  file.worlds = {2};
  file.seed = 3;
  test::check_quant_layers(file);
}

TEST_CASE("int8_w8a8 layers match the float64 reference at TP 1-4", "[quant][int8]") {
  test::check_quant_layers({kW8A8, at::kFloat, 2e-2});
  test::check_quant_layers({kW8A8, at::kBFloat16, 4e-2});
  test::QuantCheck file{kW8A8, at::kFloat, 2e-2};
  file.from_file = true;
  file.worlds = {3};
  file.seed = 4;
  test::check_quant_layers(file);
}

TEST_CASE("int8 kernels handle K not a multiple of 16, in float32, bfloat16 and float16", "[quant][int8]") {
  // Small odd shapes, worlds 1-2.
  test::QuantLayerShapes odd;
  odd.in = 40;
  odd.out = 24;
  odd.hidden = 40;
  odd.head_dim = 8;
  odd.heads = 4;
  odd.kv_heads = 2;
  odd.intermediate = 24;
  for (auto config : {kWeightOnly, kW8A8}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const bool w8a8 = config.format == QuantFormat::kInt8W8A8;
      const double tolerance = w8a8 ? (dtype == at::kFloat ? 2e-2 : 4e-2) : test::tolerance(dtype);
      test::QuantCheck check{config, dtype, tolerance, odd};
      check.worlds = {1, 2};
      test::check_quant_layers(check);
    }
  }
}

TEST_CASE("int8 quantize keeps every weight within half a step of its channel scale", "[quant][int8]") {
  const auto w = test::random_weight(48, 96, 11);
  const auto q = quantize_weight(w, kWeightOnly);
  REQUIRE(q.at("weight").scalar_type() == at::kChar);
  REQUIRE(q.at("weight_scale").sizes() == at::IntArrayRef({48, 1}));
  REQUIRE(q.at("weight_scale").scalar_type() == at::kFloat);
  const auto err = (dequantize_weight(q, kWeightOnly) - w).abs();
  CHECK(at::all(err <= q.at("weight_scale") * 0.5001).item<bool>());
  // Per-token activations: each row within half a step of its own amax / 127.
  const auto x = (test::randn({7, 96}, 12) * at::arange(1, 8).unsqueeze(1)).to(at::kFloat);
  const auto xq = quantize_activation(x, q, kW8A8);
  const auto step = x.abs().amax(-1, true) / 127;
  CHECK(at::all((xq - x).abs() <= step * 0.5001).item<bool>());
  CHECK(at::equal(quantize_activation(x, q, kWeightOnly), x));
}

TEST_CASE("int8 shards: COLUMN slices weight and scales, ROW slices the weight and replicates the scales",
          "[quant][int8][loader]") {
  const int64_t out = 32, in = 48;
  // Every row has its own scale and every element its own code, so a wrong slice shows.
  const auto w = test::random_weight(out, in, 21);
  const auto q = quantize_weight(w, kWeightOnly);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "fc", q);
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        ColumnParallelLinear col(ColumnParallelLinearOptions(in, out).bias(false).quant(kWeightOnly), comm);
        col->load_weights(ckpt, "fc");
        const auto rows = Range{comm.rank() * out / 2, (comm.rank() + 1) * out / 2};
        CHECK(at::equal(param(*col, "weight"), q.at("weight").narrow(0, rows.begin, rows.size())));
        CHECK(at::equal(param(*col, "weight_scale"), q.at("weight_scale").narrow(0, rows.begin, rows.size())));

        RowParallelLinear row(RowParallelLinearOptions(in, out).bias(false).quant(kWeightOnly), comm);
        row->load_weights(ckpt, "fc");
        const auto cols = Range{comm.rank() * in / 2, (comm.rank() + 1) * in / 2};
        CHECK(at::equal(param(*row, "weight"), q.at("weight").narrow(1, cols.begin, cols.size())));
        CHECK(at::equal(param(*row, "weight_scale"), q.at("weight_scale")));
      },
      test::test_comm_options());
}

TEST_CASE("int8 load names the tensor with a wrong shape or dtype", "[quant][int8][errors]") {
  const auto q = quantize_weight(test::random_weight(32, 48, 31), kW8A8);
  const auto load = [&](const std::string& suffix, const at::Tensor& replacement) {
    Checkpoint ckpt;
    auto tensors = q;
    tensors[suffix] = replacement;
    add_to_checkpoint(ckpt, "fc", tensors);
    ColumnParallelLinear fc(ColumnParallelLinearOptions(48, 32).bias(false).quant(kW8A8));
    fc->load_weights(ckpt, "fc");
  };
  CHECK_THROWS_WITH(load("weight_scale", at::ones({32, 2})), Contains("ColumnParallelLinear") &&
                                                                 Contains("fc.weight_scale") && Contains("[32, 2]") &&
                                                                 Contains("expected [32, 1]"));
  CHECK_THROWS_WITH(load("weight_scale", at::ones({32, 1}, at::kInt)), Contains("fc.weight_scale") && Contains("Int"));
  CHECK_THROWS_WITH(load("weight", q.at("weight").to(at::kFloat)),
                    Contains("fc.weight") && Contains("Float") && Contains("int8"));
  CHECK_THROWS_WITH(load("weight", q.at("weight").narrow(1, 0, 40)),
                    Contains("fc.weight") && Contains("[32, 40]") && Contains("expected [32, 48]"));
  // A 1-D [N] weight_scale is accepted.
  CHECK_NOTHROW(load("weight_scale", q.at("weight_scale").reshape({32})));
}

TEST_CASE("int8 layers refuse to run after Module::to(dtype) converted the int8 weight", "[quant][int8][errors]") {
  ColumnParallelLinear fc(ColumnParallelLinearOptions(32, 16).quant(kWeightOnly));
  fc->to(at::kBFloat16);
  CHECK_THROWS_WITH(fc->forward(at::randn({2, 32}).to(at::kBFloat16)),
                    Contains("int8_weight_only") && Contains("not int8") && Contains("Options.dtype"));
}
