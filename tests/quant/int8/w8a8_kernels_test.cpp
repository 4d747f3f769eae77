// tp's W8A8 CPU kernels (src/quant/int8/w8a8_kernels.h), every code path this CPU
// supports forced in turn: the int32 sums exact (so y equals the reference epilogue
// (float(acc) * x_scale) * w_scale bit for bit) at edge shapes, at Llama shapes and at
// the extreme values and K where int32 could overflow; the format's float64 reference
// (dequantize_weight, quantize_activation) within a stated bound; threads; errors.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/crossovers.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "quant/int8/w8a8_kernels.h"
#include "support/test_util.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

using namespace tp;
using tp::detail::W8a8Kernel;
namespace td = tp::detail;
using Catch::Contains;

namespace {

std::vector<W8a8Kernel> kernels() {
  std::vector<W8a8Kernel> out;
  for (W8a8Kernel k : {W8a8Kernel::kScalar, W8a8Kernel::kAvx2, W8a8Kernel::kAvx2Vnni, W8a8Kernel::kAvx512,
                       W8a8Kernel::kAvx512Vnni, W8a8Kernel::kAmx})
    if (td::w8a8_kernel_supported(k)) out.push_back(k);
  return out;
}

at::Tensor int8_uniform(at::IntArrayRef shape, int64_t lo, int64_t hi, uint64_t seed) {
  auto g = test::generator(seed);
  return at::randint(lo, hi + 1, shape, g, at::TensorOptions().dtype(at::kLong)).to(at::kChar);
}

at::Tensor positive_scales(int64_t n, uint64_t seed) {
  auto g = test::generator(seed);
  return (at::rand({n}, g, at::TensorOptions().dtype(at::kFloat)) * 0.02 + 1e-3).contiguous();
}

// The reference epilogue on exact sums: acc in float64 (exact: |acc| < 2^53), rounded
// to float32 as an int32 -> float conversion rounds, then (acc * x_scale) * w_scale in
// float32, as the INT8 method computes it after at::_int_mm.
at::Tensor reference(const at::Tensor& q, const at::Tensor& xs, const at::Tensor& w, const at::Tensor& ws) {
  const at::Tensor acc = at::matmul(q.to(at::kDouble), w.to(at::kDouble).t()).to(at::kFloat);
  return acc * xs.reshape({-1, 1}) * ws.reshape({1, -1});
}

std::string label(W8a8Kernel kernel, int64_t m, int64_t n, int64_t k) {
  return std::string(td::to_string(kernel)) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
         " K=" + std::to_string(k);
}

void check_exact(const at::Tensor& q, const at::Tensor& xs, const at::Tensor& w, const at::Tensor& ws) {
  const at::Tensor ref = reference(q, xs, w, ws);
  const at::Tensor sums = td::w8a8_row_sums(w);
  for (W8a8Kernel kernel : kernels()) {
    INFO(label(kernel, q.size(0), w.size(0), w.size(1)));
    const at::Tensor y = td::w8a8_linear_cpu(q, xs, w, ws, sums, kernel);
    REQUIRE(y.sizes() == ref.sizes());
    const int64_t differ = y.ne(ref).sum().item<int64_t>();
    INFO(differ << " of " << y.numel() << " outputs differ; max |y - ref| = " << (y - ref).abs().max().item<float>());
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("w8a8 kernels equal the exact int32 reference bit for bit at edge shapes", "[quant][cpu_kernels]") {
  // N not a multiple of any row tile; K around the 32- and 64-byte vectors (tails of
  // every length class), one element, and several vectors with a tail. Weights span
  // the whole int8 range, -128 included; activations the quantizer's -127..127.
  uint64_t seed = 1;
  for (int64_t n : {1, 5, 23, 25, 49, 130}) {
    for (int64_t k : {1, 7, 31, 32, 33, 63, 64, 65, 128, 300, 1000}) {
      const at::Tensor w = int8_uniform({n, k}, -128, 127, ++seed);
      const at::Tensor ws = positive_scales(n, ++seed);
      for (int64_t m : {1, 2, 3, 5, 17}) {
        const at::Tensor q = int8_uniform({m, k}, -127, 127, ++seed);
        check_exact(q, positive_scales(m, ++seed), w, ws);
      }
    }
  }
}

TEST_CASE("w8a8 kernels equal the exact int32 reference at Llama shapes", "[quant][cpu_kernels]") {
  uint64_t seed = 300;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{200, 4096}, {48, 14336}}) {
    const at::Tensor w = int8_uniform({n, k}, -128, 127, ++seed);
    const at::Tensor ws = positive_scales(n, ++seed);
    for (int64_t m : {1, 16, 67}) {
      const at::Tensor q = int8_uniform({m, k}, -127, 127, ++seed);
      check_exact(q, positive_scales(m, ++seed), w, ws);
    }
  }
}

TEST_CASE("w8a8 AMX kernel is exact across its tiles, blocks, K chunks and token passes", "[quant][cpu_kernels]") {
  // The AMX kernel's own boundaries: 16-row weight tiles and 32-row blocks (N = 1, 17,
  // 33, 50 leave partial tiles of every kind), 16-token tiles and 32-token blocks,
  // 256-token passes over the weight (M = 257, 300), K in 64-byte steps with a partial
  // last step and in 4096-byte chunks (K = 4100, 8259). -128 in x too: the signed x
  // signed tiles need no restricted range.
  if (!td::w8a8_kernel_supported(W8a8Kernel::kAmx)) {
    WARN("AMX not usable here (" << tp::cpu::amx_status().why << "): the AMX kernel is not run");
    return;
  }
  uint64_t seed = 900;
  for (int64_t k : {4, 70, 4100, 8259}) {
    for (int64_t n : {1, 17, 33, 50}) {
      const at::Tensor w = int8_uniform({n, k}, -128, 127, ++seed);
      const at::Tensor ws = positive_scales(n, ++seed);
      for (int64_t m : {4, 16, 31, 33, 70, 257, 300}) {
        if (k > 4096 && m > 70 && n > 17) continue;  // the big passes once per K is enough
        const at::Tensor q = int8_uniform({m, k}, -128, 127, ++seed);
        const at::Tensor xs = positive_scales(m, ++seed);
        const at::Tensor ref = reference(q, xs, w, ws);
        INFO(label(W8a8Kernel::kAmx, m, n, k));
        const at::Tensor y = td::w8a8_linear_cpu(q, xs, w, ws, at::Tensor(), W8a8Kernel::kAmx);
        CHECK(y.ne(ref).sum().item<int64_t>() == 0);
      }
    }
  }
}

TEST_CASE("w8a8 takes the AMX kernel from kW8a8AmxMinM rows where AMX is usable", "[quant][cpu_kernels]") {
  const bool amx = tp::cpu::amx_status().usable;
  INFO("amx: " << tp::cpu::amx_status().why);
  CHECK(td::w8a8_best_kernel(td::kW8a8AmxMinM - 1) == td::w8a8_best_kernel());
  CHECK((td::w8a8_best_kernel(td::kW8a8AmxMinM) == W8a8Kernel::kAmx) == amx);
  // Through the INT8 method, as a bf16 layer runs it: the kernel counter says which ran.
  auto method = make_quant_method(QuantConfig{QuantFormat::kInt8W8A8});
  torch::nn::Module layer;
  method->create_weights(layer, 48, 256, at::TensorOptions().dtype(at::kBFloat16));
  method->reset_parameters(256);
  const auto before = tp::cpu::kernel_counts();
  method->apply(test::randn({16, 256}, 3).to(at::kBFloat16), std::nullopt);
  const std::string ran = tp::cpu::kernels_between(before, tp::cpu::kernel_counts());
  const W8a8Kernel best = amx ? W8a8Kernel::kAmx : td::w8a8_best_kernel();
  const bool panels =
      best == W8a8Kernel::kAvx512Vnni && 16 >= tp::cpu::crossover_min_m(tp::cpu::Crossover::kW8a8Panels);
  CHECK(ran == std::string("w8a8/") + td::to_string(best) + (panels ? "_panels" : ""));
  if (!amx) WARN("AMX not usable here (" << tp::cpu::amx_status().why << "): the vector kernel ran");
}

TEST_CASE("w8a8 kernels stay exact at the extreme values and the largest K", "[quant][cpu_kernels]") {
  // Every product at its largest magnitude and of one sign, so the sums reach the
  // int32 bounds the kernels are built for: |x w| = 127 * 128 per product, and for the
  // VNNI kernels (x + 128) w = 255 * -128. K = 65536 is the VNNI kernels' limit (past it
  // they hand over to the sign kernels), 100000 the sign kernels' range.
  for (int64_t k : {4096, 65536, 100000}) {
    const int64_t n = 7;
    at::Tensor w = at::full({n, k}, -128, at::kChar);
    w[1].fill_(127);
    w[2].fill_(-127);
    w[3] = int8_uniform({k}, -128, 127, 5);
    const at::Tensor ws = positive_scales(n, 6);
    at::Tensor q = at::full({3, k}, 127, at::kChar);
    q[1].fill_(-127);
    q[2] = int8_uniform({k}, -127, 127, 7);
    INFO("K=" << k);
    check_exact(q, positive_scales(3, 8), w, ws);
  }
}

TEST_CASE("w8a8 VNNI panel kernel is exact across its tiles, panel pairs, K steps and token blocks",
          "[quant][cpu_kernels]") {
  // The panel kernel's own boundaries (kAvx512Vnni from the w8a8_panels crossover, forced
  // to 1 here so that M below the built-in 12 runs it too): 12-row weight tiles (N = 1, 11,
  // 12, 13, 25, 50: a partial last tile of every kind), panels of 16 tokens taken in pairs
  // (M = 1, 2, 5, 12, off and on 16 and 32), steps of
  // 4 bytes of K (K = 1, 3, 4, 5, 67: a partial last step of each length), and at
  // K = 65536 (one panel 1 MiB) several token blocks. Every kernel runs these shapes.
  const tp::cpu::ScopedCrossover panels_from_1(tp::cpu::Crossover::kW8a8Panels, 1);
  uint64_t seed = 900;
  for (int64_t n : {1, 11, 12, 13, 25, 50}) {
    for (int64_t k : {1, 3, 4, 5, 64, 67, 301}) {
      const at::Tensor w = int8_uniform({n, k}, -128, 127, ++seed);
      const at::Tensor ws = positive_scales(n, ++seed);
      for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{12}, int64_t{15}, int64_t{16}, int64_t{17},
                        int64_t{32}, int64_t{33}, int64_t{48}, int64_t{70}}) {
        const at::Tensor q = int8_uniform({m, k}, -127, 127, ++seed);
        check_exact(q, positive_scales(m, ++seed), w, ws);
      }
    }
  }
  // Extremes at the VNNI limit, over token blocks: (x + 128) w = 255 * -128 per product.
  const int64_t k = 65536, n = 13, m = 90;
  at::Tensor w = at::full({n, k}, -128, at::kChar);
  w[1].fill_(127);
  w[12] = int8_uniform({k}, -128, 127, 5);
  at::Tensor q = at::full({m, k}, 127, at::kChar);
  q[1].fill_(-127);
  q[m - 1] = int8_uniform({k}, -127, 127, 7);
  INFO("extremes K=" << k << " M=" << m);
  check_exact(q, positive_scales(m, 8), w, positive_scales(n, 6));
}

TEST_CASE("w8a8 kernels match the format's float64 reference", "[quant][cpu_kernels]") {
  // The model the tests of the INT8 method use: quantize_weight / dequantize_weight and
  // quantize_activation (per-token int8, dequantized), multiplied in float64. The
  // kernel's y = (float(acc) x_scale) w_scale has three float32 roundings of the exact
  // sum x_scale w_scale acc; the reference rounds each dequantized x and w once. So each
  // output is within 5u sum |x_deq w_deq| (u = 2^-24) of the reference, plus the
  // int -> float rounding of acc (exact below 2^24, which random sums here stay under).
  const QuantConfig config{QuantFormat::kInt8W8A8};
  uint64_t seed = 700;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{37, 300}, {130, 4096}}) {
    const auto tensors = quantize_weight(test::randn({n, k}, ++seed).to(at::kFloat), config);
    const at::Tensor w_deq = dequantize_weight(tensors, config).to(at::kDouble);
    const at::Tensor w = tensors.at("weight");
    const at::Tensor ws = tensors.at("weight_scale").reshape({-1}).to(at::kFloat).contiguous();
    for (int64_t m : {1, 3, 17}) {
      const at::Tensor x = test::randn({m, k}, ++seed).to(at::kFloat);
      const at::Tensor x_deq = quantize_activation(x, tensors, config).to(at::kDouble);
      // The per-token quantization the INT8 method and quantize_activation share.
      const at::Tensor amax = x.abs().amax(-1, true);
      const at::Tensor xs = at::where(amax > 0, amax / 127, at::ones_like(amax));
      const at::Tensor q = at::round(x / xs).clamp(-127, 127).to(at::kChar);
      const at::Tensor ref = at::linear(x_deq, w_deq);
      const at::Tensor bound = at::linear(x_deq.abs(), w_deq.abs()) * (5 * std::ldexp(1.0, -24)) + 1e-300;
      for (W8a8Kernel kernel : kernels()) {
        INFO(label(kernel, m, n, k));
        const at::Tensor y = td::w8a8_linear_cpu(q, xs, w, ws, td::w8a8_row_sums(w), kernel);
        const double worst = ((y.to(at::kDouble) - ref).abs() / bound).max().item<double>();
        INFO("worst |y - ref| / bound = " << worst);
        CHECK(worst <= 1.0);
      }
    }
  }
}

TEST_CASE("w8a8_quantize_per_token equals the INT8 method's quantization bit for bit", "[quant][cpu_kernels]") {
  // Rows at several magnitudes, and the special rows: all zeros, values on the .5
  // rounding ties, a NaN, an inf, float32 subnormals.
  const QuantConfig config{QuantFormat::kInt8W8A8};
  for (int64_t k : {1, 7, 300, 4096}) {
    at::Tensor x = test::randn({8, k}, 40 + k).to(at::kFloat);
    x[1] *= 1e-3;
    x[2] *= 1e5;
    x[3].zero_();
    // amax 127, so scale 1 and x / scale = n + 0.5: every element a rounding tie.
    x[4] = at::remainder(at::arange(k, at::kFloat), 254) - 126.5;
    x[4][0] = 127;
    x[5][k / 2] = std::numeric_limits<float>::quiet_NaN();
    x[6][0] = std::numeric_limits<float>::infinity();
    x[7] *= 1e-40;
    INFO("K=" << k);
    // quant/int8/method.cpp's quantize_per_token.
    const at::Tensor amax = x.abs().amax(-1, true);
    const at::Tensor scale = at::where(amax > 0, amax / 127, at::ones_like(amax));
    const at::Tensor q = at::round(x / scale).clamp(-127, 127).to(at::kChar);
    const auto [got_q, got_scale] = td::w8a8_quantize_per_token(x);
    CHECK(at::equal(got_q, q));
    CHECK(at::equal(got_scale.view(at::kInt), scale.view(at::kInt)));
    // And quantize_activation's dequantized view of the same.
    const auto tensors = quantize_weight(test::randn({2, k}, 3).to(at::kFloat), config);
    CHECK(at::equal((got_q.to(at::kFloat) * got_scale).view(at::kInt),
                    quantize_activation(x, tensors, config).view(at::kInt)));
    // bfloat16 / float16 activations: widened as the method's x.to(float) does.
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      INFO(c10::toString(dtype));
      const at::Tensor xr = x.to(dtype), xw = xr.to(at::kFloat);
      const at::Tensor amax_r = xw.abs().amax(-1, true);
      const at::Tensor scale_r = at::where(amax_r > 0, amax_r / 127, at::ones_like(amax_r));
      const auto [qr, sr] = td::w8a8_quantize_per_token(xr);
      CHECK(at::equal(qr, at::round(xw / scale_r).clamp(-127, 127).to(at::kChar)));
      CHECK(at::equal(sr.view(at::kInt), scale_r.view(at::kInt)));
    }
  }
}

TEST_CASE("w8a8 kernels give the same bits at 1 and 2 threads, with or without row sums", "[quant][cpu_kernels]") {
  const at::Tensor w = int8_uniform({100, 520}, -128, 127, 11), ws = positive_scales(100, 12);
  const at::Tensor q = int8_uniform({9, 520}, -127, 127, 13), xs = positive_scales(9, 14);
  const int threads = at::get_num_threads();
  for (W8a8Kernel kernel : kernels()) {
    INFO(td::to_string(kernel));
    at::set_num_threads(1);
    const at::Tensor one = td::w8a8_linear_cpu(q, xs, w, ws, td::w8a8_row_sums(w), kernel);
    at::set_num_threads(2);
    const at::Tensor two = td::w8a8_linear_cpu(q, xs, w, ws, at::Tensor(), kernel);  // sums computed inside
    CHECK(at::equal(one, two));
  }
  at::set_num_threads(threads);
}

TEST_CASE("w8a8 kernel choice follows the CPU and the TP_CPU_ISA cap", "[quant][cpu_kernels]") {
  const W8a8Kernel best = td::w8a8_best_kernel();
  CHECK(td::w8a8_kernel_supported(best));
  CHECK(td::w8a8_kernel_supported(W8a8Kernel::kScalar));
  const bool avx2 = tp::cpu::isa() >= tp::cpu::Isa::kAvx2, avx512 = tp::cpu::isa() >= tp::cpu::Isa::kAvx512;
  CHECK(td::w8a8_kernel_supported(W8a8Kernel::kAvx2) == avx2);
  CHECK(td::w8a8_kernel_supported(W8a8Kernel::kAvx512) == avx512);
  CHECK(td::w8a8_kernel_supported(W8a8Kernel::kAvx512Vnni) == (avx512 && tp::cpu::features().avx512vnni));
  CHECK(td::w8a8_kernel_supported(W8a8Kernel::kAvx2Vnni) == (avx2 && tp::cpu::features().avx_vnni));
  if (avx512 && tp::cpu::features().avx512vnni) CHECK(best == W8a8Kernel::kAvx512Vnni);
  CHECK(std::string(td::to_string(W8a8Kernel::kAvx2Vnni)) == "avx2_vnni");
}

TEST_CASE("w8a8_linear_cpu rejects what the kernels cannot compute exactly", "[quant][cpu_kernels]") {
  const at::Tensor w = int8_uniform({8, 64}, -128, 127, 21), ws = positive_scales(8, 22);
  const at::Tensor xs = positive_scales(2, 23);
  at::Tensor q = int8_uniform({2, 64}, -127, 127, 24);
  q[1][10] = -128;
  for (W8a8Kernel kernel : kernels()) {
    // The scalar and AMX kernels (signed x signed products) are exact for -128 too; only
    // the vector kernels' unsigned-times-signed tricks need the quantizer's range.
    if (kernel == W8a8Kernel::kScalar || kernel == W8a8Kernel::kAmx) continue;
    INFO(td::to_string(kernel));
    REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(q, xs, w, ws, at::Tensor(), kernel), Contains("holds -128"));
  }
  const at::Tensor ok = int8_uniform({2, 64}, -127, 127, 25);
  REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(ok, xs, w.narrow(1, 0, 63), ws, at::Tensor()), Contains("K = 64"));
  REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(ok.to(at::kFloat), xs, w, ws, at::Tensor()), Contains("int8 [M, K]"));
  REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(ok, xs.narrow(0, 0, 1), w, ws, at::Tensor()), Contains("x_scale"));
  REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(ok, xs, w, ws.to(at::kDouble), at::Tensor()), Contains("w_scale"));
  for (W8a8Kernel kernel : {W8a8Kernel::kAvx2Vnni, W8a8Kernel::kAvx512Vnni}) {
    if (!td::w8a8_kernel_supported(kernel)) continue;
    INFO(td::to_string(kernel));
    REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(ok, xs, w, ws, at::zeros({8}, at::kLong), kernel), Contains("row_sums"));
  }
  const int64_t big = 131073;
  REQUIRE_THROWS_WITH(td::w8a8_linear_cpu(at::zeros({1, big}, at::kChar), at::ones({1}), at::zeros({2, big}, at::kChar),
                                          at::ones({2}), at::Tensor()),
                      Contains("overflow"));
}

TEST_CASE("w8a8_linear_cpu handles empty operands", "[quant][cpu_kernels]") {
  for (W8a8Kernel kernel : kernels()) {
    INFO(td::to_string(kernel));
    const at::Tensor y = td::w8a8_linear_cpu(at::zeros({3, 0}, at::kChar), at::ones({3}), at::zeros({4, 0}, at::kChar),
                                             at::ones({4}), at::Tensor(), kernel);
    CHECK(y.sizes() == at::IntArrayRef({3, 4}));
    CHECK(y.abs().max().item<float>() == 0.0f);
    CHECK(td::w8a8_linear_cpu(at::zeros({0, 8}, at::kChar), at::ones({0}), at::zeros({4, 8}, at::kChar), at::ones({4}),
                              at::Tensor(), kernel)
              .sizes() == at::IntArrayRef({0, 4}));
  }
}

TEST_CASE("w8a8 method: a weight written in place after finalize() gets fresh row sums", "[quant][cpu_kernels]") {
  // The VNNI kernels subtract 128 * sum_k w[n, k], computed by finalize(); a weight
  // changed since (its version counter moved) must not be multiplied with stale sums.
  const QuantConfig config{QuantFormat::kInt8W8A8};
  torch::nn::Module layer;
  const auto method = make_quant_method(config);
  method->create_weights(layer, 30, 200, at::TensorOptions().dtype(at::kFloat));
  method->reset_parameters(200);
  const at::Tensor x = test::randn({4, 200}, 71).to(at::kFloat);
  {
    at::NoGradGuard no_grad;
    method->weight().copy_(int8_uniform({30, 200}, -128, 127, 72));
  }
  const at::Tensor w = method->weight();
  const at::Tensor ws = layer.named_parameters()["weight_scale"].reshape({-1}).contiguous();
  const auto [q, xs] = td::w8a8_quantize_per_token(x);
  const at::Tensor want = reference(q, xs, w, ws);
  CHECK(at::equal(method->apply(x, std::nullopt), want));
  method->finalize();
  CHECK(at::equal(method->apply(x, std::nullopt), want));
}
