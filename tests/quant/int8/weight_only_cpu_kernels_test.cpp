// tp's int8_weight_only CPU kernels (src/quant/int8/weight_only_cpu_kernels.h), every
// code path this CPU can run (scalar always; AVX2 and AVX-512 when present), each
// called directly through the dispatcher's `isa` argument, so the test does not
// depend on TP_CPU_ISA.
//
// Reference model: tp::dequantize_weight (the decoded weight, compared bit for bit)
// and float64 x @ W^T. Tolerances:
// - "exact" data (x in quarters up to +-1, power-of-two scales 2^-4..1, |q| <= qmax
//   with qmax * K < 2^18): every product and every partial sum of every kernel is a
//   multiple of 2^-6 below 2^18, so float32 holds it exactly and any order of
//   accumulation gives the float64 result: compared with ==. This is the tight check.
// - random normal data: test::tolerance(float32) = 2e-5 of max |y|, the project's
//   float32 GEMM bound (rounding x to bfloat16, which these kernels must not do,
//   would cost ~4e-3).
// - bfloat16 and float16 activations: the exact float32 result rounded once to the
//   16-bit type: compared with ==.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "cpu/features.h"
#include "quant/int8/weight_only_cpu_kernels.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"
#include "tp/quant/quantize.h"

using namespace tp;
using namespace tp::detail;
using Catch::Contains;

using tp::test::isas_here;
using tp::test::same_bits;

namespace {

const QuantConfig kWeightOnly{QuantFormat::kInt8WeightOnly};

at::Tensor reference(const at::Tensor& x, const at::Tensor& w) {
  return at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
}

// A float weight [n, k] whose rows differ in magnitude over ~2 decades (per-channel
// scales must keep them apart).
at::Tensor float_weight(int64_t n, int64_t k, uint64_t seed) {
  return test::randn({n, k}, seed) * at::exp(test::randn({n, 1}, seed + 1)) / std::sqrt(static_cast<double>(k));
}

// Exact data (see the header): codes in -qmax..qmax, scales 2^-4..1.
struct Exact {
  at::Tensor q;      // i8 [n, k]
  at::Tensor scale;  // f32 [n, 1]
  at::Tensor w;      // f64 [n, k], q * scale
};
Exact exact_weights(int64_t n, int64_t k, int64_t qmax, uint64_t seed) {
  auto gen = test::generator(seed);
  Exact e;
  e.q = at::randint(-qmax, qmax + 1, {n, k}, gen, at::kInt).to(at::kChar);
  e.scale = at::pow(2.0, -at::randint(0, 5, {n, 1}, gen, at::kFloat)).to(at::kFloat);
  e.w = e.q.to(at::kDouble) * e.scale.to(at::kDouble);
  return e;
}

at::Tensor exact_x(int64_t m, int64_t k, uint64_t seed) {
  auto gen = test::generator(seed);
  return at::randint(-4, 5, {m, k}, gen, at::kFloat) / 4;
}

// Edge shapes (N, K): K of one element, odd K, N below / not a multiple of the
// 16-column panel and of the 2- and 4-panel groups the kernels take at once.
const std::pair<int64_t, int64_t> kEdgeShapes[] = {{1, 1},     {8, 3},    {24, 33},  {40, 40},
                                                   {200, 255}, {16, 256}, {72, 520}, {136, 1000}};
const int64_t kRows[] = {1, 2, 3, 4, 5, 17};

}  // namespace

TEST_CASE("int8_weight_only CPU decoders reproduce dequantize_weight bit for bit", "[quant][cpu_kernels]") {
  int64_t seed = 10;
  for (const auto& [n, k] : kEdgeShapes) {
    const auto tensors = quantize_weight(float_weight(n, k, ++seed), kWeightOnly);
    const auto expected = dequantize_weight(tensors, kWeightOnly);
    const auto packed = int8_wo_cpu_pack(tensors.at("weight"), tensors.at("weight_scale"));
    for (tp::cpu::Isa isa : isas_here()) {
      INFO("[" << n << ", " << k << "] " << to_string(isa));
      CHECK(same_bits(int8_wo_cpu_decode(packed, isa), expected));
    }
  }
}

TEST_CASE("int8_weight_only CPU kernels are exact on exactly representable data at edge shapes (M = 1..5, 17)",
          "[quant][cpu_kernels]") {
  int64_t seed = 100;
  for (const auto& [n, k] : kEdgeShapes) {
    const auto e = exact_weights(n, k, 127, ++seed);
    const auto packed = int8_wo_cpu_pack(e.q, e.scale);
    for (int64_t m : kRows) {
      const auto x = exact_x(m, k, ++seed);
      const auto expected = reference(x, e.w).to(at::kFloat);
      for (tp::cpu::Isa isa : isas_here()) {
        INFO("[" << n << ", " << k << "] M " << m << " " << to_string(isa));
        CHECK(at::equal(int8_wo_cpu_linear(x, packed, isa), expected));
        CHECK(at::equal(int8_wo_cpu_linear(x.to(at::kBFloat16), packed, isa), expected.to(at::kBFloat16)));
        CHECK(at::equal(int8_wo_cpu_linear(x.to(at::kHalf), packed, isa), expected.to(at::kHalf)));
      }
    }
  }
}

TEST_CASE("int8_weight_only CPU kernels match the float64 reference on random data", "[quant][cpu_kernels]") {
  int64_t seed = 200;
  for (const auto& [n, k] : kEdgeShapes) {
    const auto tensors = quantize_weight(float_weight(n, k, ++seed), kWeightOnly);
    const auto w = dequantize_weight(tensors, kWeightOnly);
    const auto packed = int8_wo_cpu_pack(tensors.at("weight"), tensors.at("weight_scale"));
    for (int64_t m : kRows) {
      const auto x = test::randn({m, k}, ++seed).to(at::kFloat);
      const auto expected = reference(x, w);
      for (tp::cpu::Isa isa : isas_here()) {
        INFO("[" << n << ", " << k << "] M " << m << " " << to_string(isa));
        CHECK(test::relative_error(int8_wo_cpu_linear(x, packed, isa), expected) < test::tolerance(at::kFloat));
      }
    }
  }
}

TEST_CASE("int8_weight_only CPU kernels are exact at the Llama-3-8B shapes (float32 and bfloat16, M = 1, 3, 17)",
          "[quant][cpu_kernels]") {
  // gate/up (4096 -> 14336) and down (14336 -> 4096); |q| <= 8 keeps 8 K < 2^18.
  int64_t seed = 300;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{14336, 4096}, {4096, 14336}}) {
    const auto e = exact_weights(n, k, 8, ++seed);
    const auto packed = int8_wo_cpu_pack(e.q, e.scale);
    const auto x = exact_x(17, k, ++seed);
    const auto expected = reference(x, e.w).to(at::kFloat);
    for (int64_t m : {1, 3, 17}) {
      const auto xm = x.narrow(0, 0, m);
      for (tp::cpu::Isa isa : isas_here()) {
        if (isa == tp::cpu::Isa::kScalar && m > 1) continue;  // the portable path: one size is enough here
        INFO("[" << n << ", " << k << "] M " << m << " " << to_string(isa));
        CHECK(at::equal(int8_wo_cpu_linear(xm, packed, isa), expected.narrow(0, 0, m)));
        CHECK(at::equal(int8_wo_cpu_linear(xm.to(at::kBFloat16), packed, isa),
                        expected.narrow(0, 0, m).to(at::kBFloat16)));
      }
    }
  }
}

TEST_CASE("int8_weight_only CPU kernels give the same bits on 1 and 2 threads", "[quant][cpu_kernels]") {
  const auto e = exact_weights(1000, 520, 127, 400);
  const auto packed = int8_wo_cpu_pack(e.q, e.scale);
  const int threads = at::get_num_threads();
  for (int64_t m : {1, 4, 17}) {
    const auto x = test::randn({m, 520}, 401 + m).to(at::kFloat);
    for (tp::cpu::Isa isa : isas_here()) {
      INFO("M " << m << " " << to_string(isa));
      at::set_num_threads(1);
      const auto one = int8_wo_cpu_linear(x, packed, isa);
      at::set_num_threads(2);
      const auto two = int8_wo_cpu_linear(x, packed, isa);
      at::set_num_threads(threads);
      CHECK(same_bits(one, two));
    }
  }
}

TEST_CASE(
    "int8_weight_only CPU kernels: no copy of the weight, scale dtypes and shapes, empty inputs, [..., K], errors",
    "[quant][cpu_kernels]") {
  const auto e = exact_weights(24, 40, 127, 500);
  // float16 / bfloat16 scales and a 1-D [N] scale pack to the same float32 scales.
  for (auto dtype : {at::kHalf, at::kBFloat16}) {
    CHECK(same_bits(int8_wo_cpu_pack(e.q, e.scale.to(dtype).reshape({-1})).scales.narrow(0, 0, 24),
                    e.scale.reshape({-1})));
  }
  const auto packed = int8_wo_cpu_pack(e.q, e.scale);
  // The kernels read the layer's own weight: no copy.
  CHECK(packed.codes.const_data_ptr() == e.q.const_data_ptr());
  for (tp::cpu::Isa isa : isas_here()) {
    INFO(to_string(isa));
    CHECK(int8_wo_cpu_linear(at::empty({0, 40}), packed, isa).sizes() == at::IntArrayRef({0, 24}));
    const auto x = exact_x(6, 40, 501).view({3, 2, 40});
    const auto y = int8_wo_cpu_linear(x, packed, isa);
    CHECK(y.sizes() == at::IntArrayRef({3, 2, 24}));
    CHECK(at::equal(y, reference(x, e.w).to(at::kFloat)));
  }
  REQUIRE_THROWS_WITH(int8_wo_cpu_linear(at::ones({2, 41}), packed), Contains("expected [..., 40]"));
  REQUIRE_THROWS_WITH(int8_wo_cpu_linear(at::ones({2, 40}, at::kDouble), packed),
                      Contains("float32, bfloat16 or float16"));
  REQUIRE_THROWS_WITH(int8_wo_cpu_pack(e.q.to(at::kInt), e.scale), Contains("int8 [N, K]"));
  REQUIRE_THROWS_WITH(int8_wo_cpu_pack(e.q, e.scale.narrow(0, 0, 23)), Contains("[N] or [N, 1]"));
  if (tp::cpu::max_isa() != tp::cpu::Isa::kAvx512) {
    REQUIRE_THROWS_WITH(int8_wo_cpu_linear(exact_x(1, 40, 1), packed, tp::cpu::Isa::kAvx512),
                        Contains("cannot run on this CPU"));
  }
}
