// tp's INT4 CPU kernels (src/quant/int4/cpu_kernels.h), every code path this CPU can
// run (scalar always; AVX2 and AVX-512 when present), each called directly through
// the dispatcher's `isa` argument, so the test does not depend on TP_CPU_ISA.
//
// Reference model: tp::dequantize_weight (the decoded weight, compared bit for bit)
// and float64 x @ W^T. Tolerances:
// - "exact" data (x in quarters up to +-1, scales 2^-4..1, codes and zero points up
//   to 16, K < 16384): every product and every partial sum of every kernel is a
//   multiple of 2^-6 below 16 K <= 2^18, so float32 holds it exactly and any order of
//   accumulation gives the float64 result: compared with ==. This is the tight check (a wrong nibble, zero point,
//   group or column moves the result by at least 2^-6).
// - random normal data: test::tolerance(float32) = 2e-5 of max |y|, the project's
//   float32 GEMM bound (float32 accumulation over K; rounding x to bfloat16, which
//   this kernel must not do, would cost ~4e-3).
// - bfloat16 and float16 activations: the float32 result of the same (exactly
//   converted) x, rounded once to the 16-bit type: compared with ==.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "cpu/features.h"
#include "quant/int4/cpu_kernels.h"
#include "quant/int4/packing.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"
#include "tp/quant/quantize.h"

using namespace tp;
using namespace tp::detail;
using Catch::Contains;

using tp::test::isas_here;
using tp::test::same_bits;

namespace {

// A float weight [n, k] whose rows differ in magnitude over ~2 decades, as
// quantize_weight sees real layers.
at::Tensor float_weight(int64_t n, int64_t k, uint64_t seed) {
  return test::randn({n, k}, seed) * at::exp(test::randn({n, 1}, seed + 1)) / std::sqrt(static_cast<double>(k));
}

at::Tensor reference(const at::Tensor& x, const at::Tensor& w) {
  return at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
}

// Codes, zero points and scales for which every product and partial sum is exact
// in float32 (see the header): zeros 0..16 (GPTQ v1 reaches 16), scales 2^-4..1.
Int4Unpacked exact_weights(int64_t n, int64_t k, int64_t g, uint64_t seed) {
  auto gen = test::generator(seed);
  Int4Unpacked u;
  u.codes = at::randint(0, 16, {n, k}, gen, at::kInt);
  u.zero = at::randint(0, 17, {k / g, n}, gen, at::kFloat);
  u.scale = at::pow(2.0, -at::randint(0, 5, {k / g, n}, gen, at::kFloat)).to(at::kFloat);
  return u;
}

at::Tensor exact_x(int64_t m, int64_t k, uint64_t seed) {
  auto gen = test::generator(seed);
  return at::randint(-4, 5, {m, k}, gen, at::kFloat) / 4;
}

struct Shape {
  int64_t n, k, g;
};

// Edge shapes: one group, N below / not a multiple of the 16-column panel (and of
// the 2- and 4-panel groups the kernels take at once), several groups.
const Shape kEdgeShapes[] = {{8, 32, 32},    {40, 64, 64},  {24, 128, 128}, {200, 96, 32},
                             {16, 256, 128}, {72, 192, 64}, {136, 384, 128}};
const int64_t kRows[] = {1, 2, 3, 4, 5, 17};

}  // namespace

TEST_CASE("int4 CPU decoders reproduce dequantize_weight bit for bit (GPTQ and AWQ, g32/64/128, sym and asym)",
          "[quant][cpu_kernels]") {
  for (auto format : {QuantFormat::kInt4Gptq, QuantFormat::kInt4Awq}) {
    for (int64_t g : {32, 64, 128}) {
      for (bool symmetric : {true, false}) {
        const QuantConfig config{format, g, symmetric};
        for (const auto& [n, k] : {std::pair<int64_t, int64_t>{8, g}, {40, 2 * g}, {200, 3 * g}}) {
          const auto tensors = quantize_weight(float_weight(n, k, 7 + n + g), config);
          const auto expected = dequantize_weight(tensors, config);
          const auto u =
              format == QuantFormat::kInt4Awq
                  ? unpack_awq(tensors.at("qweight"), tensors.at("qzeros"), tensors.at("scales"))
                  : unpack_gptq(tensors.at("qweight"), tensors.at("qzeros"), tensors.at("scales"), GptqFormat::kV1);
          const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, g);
          CHECK(packed.scales.scalar_type() == at::kHalf);
          for (tp::cpu::Isa isa : isas_here()) {
            INFO(to_string(config) << " [" << n << ", " << k << "] " << to_string(isa));
            CHECK(same_bits(int4_cpu_decode(packed, isa), expected));
          }
        }
      }
    }
  }
}

TEST_CASE("int4 CPU decoders with float32 scales (not float16 values) reproduce (q - zero) * scale bit for bit",
          "[quant][cpu_kernels]") {
  const int64_t n = 56, k = 256, g = 64;
  auto gen = test::generator(3);
  Int4Unpacked u = exact_weights(n, k, g, 3);
  u.scale = at::rand({k / g, n}, gen, at::kDouble).to(at::kFloat) * 0.01 + 1e-3;  // 24-bit mantissas
  const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, g);
  REQUIRE(packed.scales.scalar_type() == at::kFloat);
  const auto expected = dequantize_unpacked(u, g);
  const auto x = at::randn({5, k}, gen, at::kDouble).to(at::kFloat);
  for (tp::cpu::Isa isa : isas_here()) {
    INFO(to_string(isa));
    CHECK(same_bits(int4_cpu_decode(packed, isa), expected));
    for (int64_t m : {1, 5}) {
      INFO("M " << m);
      CHECK(test::relative_error(int4_cpu_linear(x.narrow(0, 0, m), packed, isa),
                                 reference(x.narrow(0, 0, m), expected)) < test::tolerance(at::kFloat));
    }
  }
}

TEST_CASE("int4 CPU kernels are exact on exactly representable data at edge shapes (M = 1..5, 17)",
          "[quant][cpu_kernels]") {
  int64_t seed = 100;
  for (const auto& s : kEdgeShapes) {
    const auto u = exact_weights(s.n, s.k, s.g, ++seed);
    const auto w = dequantize_unpacked(u, s.g);
    const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, s.g);
    for (int64_t m : kRows) {
      const auto x = exact_x(m, s.k, ++seed);
      const auto expected = reference(x, w).to(at::kFloat);
      for (tp::cpu::Isa isa : isas_here()) {
        INFO("[" << s.n << ", " << s.k << "] g" << s.g << " M " << m << " " << to_string(isa));
        CHECK(at::equal(int4_cpu_linear(x, packed, isa), expected));
        // 16-bit activations (these x are bfloat16 and float16 values): the exact result,
        // rounded once.
        CHECK(at::equal(int4_cpu_linear(x.to(at::kBFloat16), packed, isa), expected.to(at::kBFloat16)));
        CHECK(at::equal(int4_cpu_linear(x.to(at::kHalf), packed, isa), expected.to(at::kHalf)));
      }
    }
  }
}

TEST_CASE("int4 CPU kernels match the float64 reference on random data (edge shapes, GPTQ and AWQ)",
          "[quant][cpu_kernels]") {
  int64_t seed = 200;
  for (auto format : {QuantFormat::kInt4Gptq, QuantFormat::kInt4Awq}) {
    for (const auto& s : kEdgeShapes) {
      const QuantConfig config{format, s.g, seed % 2 == 0};
      const auto tensors = quantize_weight(float_weight(s.n, s.k, ++seed), config);
      const auto w = dequantize_weight(tensors, config);
      const auto u =
          format == QuantFormat::kInt4Awq
              ? unpack_awq(tensors.at("qweight"), tensors.at("qzeros"), tensors.at("scales"))
              : unpack_gptq(tensors.at("qweight"), tensors.at("qzeros"), tensors.at("scales"), GptqFormat::kV1);
      const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, s.g);
      for (int64_t m : kRows) {
        const auto x = test::randn({m, s.k}, ++seed).to(at::kFloat);
        const auto expected = reference(x, w);
        for (tp::cpu::Isa isa : isas_here()) {
          INFO(to_string(config) << " [" << s.n << ", " << s.k << "] M " << m << " " << to_string(isa));
          CHECK(test::relative_error(int4_cpu_linear(x, packed, isa), expected) < test::tolerance(at::kFloat));
        }
      }
    }
  }
}

TEST_CASE("int4 CPU kernels are exact at the Llama-3-8B shapes (float32 and bfloat16, M = 1, 3, 17)",
          "[quant][cpu_kernels]") {
  // gate/up (4096 -> 14336) and down (14336 -> 4096), g128, on the exact data (K <=
  // 14336 keeps every partial sum below 2^18 in steps of 2^-6: still exact).
  int64_t seed = 300;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{14336, 4096}, {4096, 14336}}) {
    const auto u = exact_weights(n, k, 128, ++seed);
    const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, 128);
    const auto x = exact_x(17, k, ++seed);
    // W in float64 straight from its definition ((q - zero) * scale; dequantize_unpacked
    // is the same but slow at this size), checked against it on the small shapes above.
    const auto w = ((u.codes.to(at::kDouble).view({n, k / 128, 128}) - u.zero.t().to(at::kDouble).unsqueeze(-1)) *
                    u.scale.t().to(at::kDouble).unsqueeze(-1))
                       .view({n, k});
    const auto expected = at::matmul(x.to(at::kDouble), w.t()).to(at::kFloat);
    for (int64_t m : {1, 3, 17}) {
      const auto xm = x.narrow(0, 0, m);
      for (tp::cpu::Isa isa : isas_here()) {
        if (isa == tp::cpu::Isa::kScalar && m > 1) continue;  // the portable path: one size is enough here
        INFO("[" << n << ", " << k << "] M " << m << " " << to_string(isa));
        CHECK(at::equal(int4_cpu_linear(xm, packed, isa), expected.narrow(0, 0, m)));
        CHECK(
            at::equal(int4_cpu_linear(xm.to(at::kBFloat16), packed, isa), expected.narrow(0, 0, m).to(at::kBFloat16)));
      }
    }
  }
}

TEST_CASE("int4 CPU kernels give the same bits on 1 and 2 threads", "[quant][cpu_kernels]") {
  const auto u = exact_weights(1000, 512, 64, 400);
  const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, 64);
  const int threads = at::get_num_threads();
  for (int64_t m : {1, 4, 17}) {
    const auto x = test::randn({m, 512}, 401 + m).to(at::kFloat);
    for (tp::cpu::Isa isa : isas_here()) {
      INFO("M " << m << " " << to_string(isa));
      at::set_num_threads(1);
      const auto one = int4_cpu_linear(x, packed, isa);
      at::set_num_threads(2);
      const auto two = int4_cpu_linear(x, packed, isa);
      at::set_num_threads(threads);
      CHECK(same_bits(one, two));
    }
  }
}

TEST_CASE("int4 CPU kernels: empty inputs, shapes [..., K], and errors", "[quant][cpu_kernels]") {
  const auto u = exact_weights(24, 64, 32, 500);
  const auto packed = int4_cpu_pack(u.codes, u.scale, u.zero, 32);
  const auto w = dequantize_unpacked(u, 32);
  for (tp::cpu::Isa isa : isas_here()) {
    INFO(to_string(isa));
    CHECK(int4_cpu_linear(at::empty({0, 64}), packed, isa).sizes() == at::IntArrayRef({0, 24}));
    const auto x = exact_x(6, 64, 501).view({2, 3, 64});
    const auto y = int4_cpu_linear(x, packed, isa);
    CHECK(y.sizes() == at::IntArrayRef({2, 3, 24}));
    CHECK(at::equal(y, reference(x, w).to(at::kFloat)));
  }
  REQUIRE_THROWS_WITH(int4_cpu_linear(at::ones({2, 63}), packed), Contains("expected [..., 64]"));
  REQUIRE_THROWS_WITH(int4_cpu_linear(at::ones({2, 64}, at::kDouble), packed),
                      Contains("float32, bfloat16 or float16"));
  REQUIRE_THROWS_WITH(int4_cpu_pack(u.codes + 1, u.scale, u.zero, 32), Contains("0..15"));
  REQUIRE_THROWS_WITH(int4_cpu_pack(u.codes, u.scale, u.zero, 48), Contains("multiple of 8 that divides K"));
  REQUIRE_THROWS_WITH(int4_cpu_pack(u.codes, u.scale, u.zero + 0.5, 32), Contains("integers in 0..255"));
  REQUIRE_THROWS_WITH(int4_cpu_pack(u.codes, u.scale.t(), u.zero, 32), Contains("[K/g, N]"));
  if (tp::cpu::max_isa() != tp::cpu::Isa::kAvx512) {
    REQUIRE_THROWS_WITH(int4_cpu_linear(exact_x(1, 64, 1), packed, tp::cpu::Isa::kAvx512),
                        Contains("cannot run on this CPU"));
  }
}
