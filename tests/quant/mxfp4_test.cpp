// MXFP4 (OCP Microscaling FP4, GPT-OSS's experts): the quantizer's rule (the block scale
// 2^(floor(log2 amax) - 2), the nearest E2M1 value with ties to the even code, saturation
// at 6), the stored layout (two codes a byte, element 2i in the low nibble), the CPU
// decoder bit for bit against dequantize_weight over every scale byte, the layers at
// TP 1-4 against the float64 reference (K split in whole blocks of 32), and the refusals.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "quant/mxfp4/mxfp4.h"
#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

const QuantConfig kMxfp4{QuantFormat::kMxfp4};

// The E2M1 code of element k of row n.
int code_at(const QuantizedTensors& q, int64_t n, int64_t k) {
  const int byte = q.at("blocks")[n][k / 32][(k % 32) / 2].item<int>();
  return k % 2 ? byte >> 4 : byte & 0x0F;
}

}  // namespace

TEST_CASE("mxfp4 quantizes to the nearest E2M1 value of its block's power-of-two scale, ties to even",
          "[quant][mxfp4]") {
  // Row 0: amax 6 gives the scale 2^(2 - 2) = 1 (byte 127), so the values are codes
  // themselves: the grid, the ties between neighbours, saturation and signs.
  const std::vector<float> values{0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,   4.0f, 6.0f,  // the grid: codes 0..7
                                  0.25f, 0.75f, 1.25f, 1.75f, 2.5f,  3.5f,   5.0f,        // ties: to the even code
                                  0.3f,  0.7f,  5.1f,  -1.0f, -6.0f, -0.25f, -2.9f};      // nearest; signs (-0 kept)
  const std::vector<int> codes{0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 2, 4, 4, 6, 6, 1, 1, 7, 10, 15, 8, 13};
  at::Tensor w = at::zeros({3, 64}, at::kFloat);
  for (size_t i = 0; i < values.size(); ++i) w[0][static_cast<int64_t>(i)] = values[i];
  w[1] = test::randn({64}, 1).to(at::kFloat) * 1e-3;  // small: scales well below 1
  w[1][40] = 96.0f;                                   // second block: amax 96 -> 2^(6 - 2)
  // row 2: all zeros (scale byte 0, every code 0)
  const auto q = quantize_weight(w, kMxfp4);
  REQUIRE(q.at("blocks").sizes() == c10::IntArrayRef({3, 2, 16}));
  REQUIRE(q.at("scales").sizes() == c10::IntArrayRef({3, 2}));
  CHECK(q.at("scales")[0][0].item<int>() == 127);
  for (size_t i = 0; i < codes.size(); ++i) {
    INFO("value " << values[i]);
    CHECK(code_at(q, 0, static_cast<int64_t>(i)) == codes[i]);
  }
  CHECK(q.at("scales")[1][1].item<int>() == 127 + 4);
  CHECK(code_at(q, 1, 40) == 7);  // 96 / 16 = 6, code 7
  CHECK(q.at("scales")[2].eq(0).all().item<bool>());
  CHECK(q.at("blocks")[2].eq(0).all().item<bool>());
  // Dequantized: each element within half a step of its block's grid.
  const auto d = dequantize_weight(q, kMxfp4);
  CHECK(at::equal(d[0].narrow(0, 0, 8), w[0].narrow(0, 0, 8)));  // grid values exactly
  CHECK(d[1][40].item<float>() == 96.0f);
}

TEST_CASE("mxfp4's CPU decoder writes dequantize_weight's float32 weights bit for bit, every scale byte",
          "[quant][mxfp4][cpu_kernels]") {
  // Random codes, and every scale byte 0..254 (2^-127 .. 2^127: float32 subnormals included).
  const int64_t n = 255, k = 96;
  auto gen = test::generator(5);
  QuantizedTensors q{{"blocks", at::randint(0, 256, {n, k / 32, 16}, gen, at::kByte)},
                     {"scales", at::arange(0, n, at::kByte).unsqueeze(1).repeat({1, k / 32}).contiguous()}};
  q["scales"][7][2] = 254;
  const tp::detail::Mxfp4CpuWeight w{q.at("blocks").const_data_ptr<uint8_t>(), q.at("scales").const_data_ptr<uint8_t>(),
                                     n, k};
  const at::Tensor want = dequantize_weight(q, kMxfp4);
  const at::Tensor got = tp::detail::mxfp4_cpu_decode_all(w);
  CHECK(at::equal(got.view(at::kInt), want.view(at::kInt)));  // the bits, signed zeros too
  // And the GEMM on them, on the rows whose scales keep every product finite: float32
  // products and sums of the exact weights.
  const auto x = test::randn({5, k}, 6).to(at::kFloat);
  const auto y = tp::detail::mxfp4_cpu_linear(x, w).narrow(1, 100, 50);
  const auto ref = at::matmul(x.to(at::kDouble), want.narrow(0, 100, 50).to(at::kDouble).t());
  CHECK(test::relative_error(y, ref) <= test::tolerance(at::kFloat));
}

TEST_CASE("mxfp4 layers match the float64 reference at TP 1-4", "[quant][mxfp4]") {
  test::check_quant_layers({kMxfp4, at::kFloat, test::tolerance(at::kFloat)});
  test::check_quant_layers({kMxfp4, at::kBFloat16, test::tolerance(at::kBFloat16)});
  test::QuantCheck file{kMxfp4, at::kFloat, test::tolerance(at::kFloat)};
  file.from_file = true;
  file.worlds = {3};
  file.seed = 7;
  test::check_quant_layers(file);
}

TEST_CASE("mxfp4 refuses K outside whole blocks, bad tensors and NaN scales, by name", "[quant][mxfp4][errors]") {
  CHECK_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(48, 16).quant(kMxfp4)),
                    Contains("not a multiple of the MXFP4 block of 32"));
  // A K split inside a block is refused at construction (alignment 32 at TP 3 of K = 96: 32 each; of 80: none).
  std::vector<std::string> errors(3);
  run_ranks_in_threads(3, [&](Communicator& comm) {
    try {
      RowParallelLinear(RowParallelLinearOptions(80, 16).quant(kMxfp4), comm);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Contains("80") && Contains("32"));
  auto q = quantize_weight(test::randn({16, 64}, 3).to(at::kFloat), kMxfp4);
  const auto load = [&](const QuantizedTensors& tensors) {
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", tensors);
    ColumnParallelLinear fc(ColumnParallelLinearOptions(64, 16).bias(false).quant(kMxfp4));
    fc->load_weights(ckpt, "fc");
  };
  auto nan = q;
  nan["scales"] = q.at("scales").clone();
  nan["scales"][3][1] = 255;
  CHECK_THROWS_WITH(load(nan), Contains("fc.scales") && Contains("255") && Contains("NaN"));
  auto wide = q;
  wide["blocks"] = at::zeros({16, 2, 32}, at::kByte);
  CHECK_THROWS_WITH(load(wide), Contains("fc.blocks") && Contains("[16, 2, 16]"));
  auto typed = q;
  typed["scales"] = q.at("scales").to(at::kFloat);
  CHECK_THROWS_WITH(load(typed), Contains("fc.scales") && Contains("uint8"));
  CHECK_NOTHROW(load(q));
}
