// MXFP4's rows kernels (src/quant/mxfp4/rows.h), every ISA this CPU runs (AVX2; AVX-512's
// float32 path; its bf16 VDPBF16PS path where the CPU has avx512_bf16), called directly
// through the `isa` argument, at M = 1..4 and edge shapes: N off the 4- and 2-row blocks,
// K off the vector chunk (64 / 128 k) and off the scale group (8 / 16 blocks).
//
// Reference model: float64 x @ dequantize_weight^T. Tolerances:
// - "exact" data (x in quarters up to +-1, scales 2^-4..1): every product and partial sum
//   is a multiple of 2^-7 below 6 K <= 2^17, exact in float32 in any order: compared with
//   == (bf16 x: against the float64 result rounded to bf16 once).
// - random normal x and scales 2^-27..2^23: the float32 dot-product bound
//   (test::float32_dot_bound, one extra rounding for the scale product), plus half a
//   bf16 ulp where y is bf16.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "cpu/features.h"
#include "quant/mxfp4/rows.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"
#include "tp/quant/quantize.h"

using namespace tp;
using namespace tp::detail;

namespace {

const QuantConfig kMxfp4{QuantFormat::kMxfp4};

struct Stored {
  QuantizedTensors q;
  Mxfp4CpuWeight view() const {
    return Mxfp4CpuWeight{q.at("blocks").const_data_ptr<uint8_t>(), q.at("scales").const_data_ptr<uint8_t>(),
                          q.at("blocks").size(0), q.at("blocks").size(1) * 32};
  }
};

// Random codes and scale bytes in [s_lo, s_hi].
Stored random_weight(int64_t n, int64_t k, int s_lo, int s_hi, uint64_t seed) {
  auto gen = test::generator(seed);
  Stored s;
  s.q["blocks"] = at::randint(0, 256, {n, k / 32, 16}, gen, at::kByte);
  s.q["scales"] = at::randint(s_lo, s_hi + 1, {n, k / 32}, gen, at::kByte);
  return s;
}

std::vector<cpu::Isa> simd_isas() {
  std::vector<cpu::Isa> out;
  for (const cpu::Isa isa : test::isas_here())
    if (isa != cpu::Isa::kScalar) out.push_back(isa);
  return out;
}

}  // namespace

TEST_CASE("mxfp4 rows kernels are exact on exact data at M = 1 to 4 and edge shapes", "[quant][mxfp4][cpu_kernels]") {
  const int64_t ns[] = {1, 3, 5, 18, 37};
  const int64_t ks[] = {32, 96, 160, 544, 1056};
  uint64_t seed = 10;
  for (const cpu::Isa isa : simd_isas()) {
    for (const int64_t n : ns) {
      for (const int64_t k : ks) {
        const Stored w = random_weight(n, k, 123, 127, ++seed);
        const at::Tensor deq = dequantize_weight(w.q, kMxfp4).to(at::kDouble);
        for (int64_t m = 1; m <= kMxfp4RowsMaxM; ++m) {
          auto gen = test::generator(++seed);
          const at::Tensor x = at::randint(-4, 5, {m, k}, gen, at::kDouble) / 4;
          const at::Tensor ref = at::matmul(x, deq.t());
          for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
            INFO("isa " << cpu::to_string(isa) << " n " << n << " k " << k << " m " << m << " dtype " << dtype);
            const at::Tensor y = mxfp4_rows_linear(x.to(dtype), w.view(), isa);
            REQUIRE(y.scalar_type() == dtype);
            CHECK(at::equal(y, ref.to(dtype)));
          }
        }
      }
    }
  }
}

TEST_CASE("mxfp4 rows kernels are within the float32 bound on random data", "[quant][mxfp4][cpu_kernels]") {
  const int64_t n = 45, k = 4096 + 96;
  const Stored w = random_weight(n, k, 100, 150, 3);
  const at::Tensor deq = dequantize_weight(w.q, kMxfp4).to(at::kDouble);
  for (const cpu::Isa isa : simd_isas()) {
    for (int64_t m = 1; m <= kMxfp4RowsMaxM; ++m) {
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        INFO("isa " << cpu::to_string(isa) << " m " << m << " dtype " << dtype);
        const at::Tensor x = test::randn({m, k}, 40 + static_cast<uint64_t>(m)).to(dtype);
        const at::Tensor xd = x.to(at::kDouble);
        const at::Tensor ref = at::matmul(xd, deq.t());
        const at::Tensor bound = test::float32_dot_bound(xd, deq, 1);
        const at::Tensor y = mxfp4_rows_linear(x, w.view(), isa).to(at::kDouble);
        const double ulp = dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : 0.0;
        CHECK(((y - ref).abs() <= bound + (ref.abs() + bound) * ulp).all().item<bool>());
      }
    }
  }
}

TEST_CASE("mxfp4 layers take the rows kernels for M up to 4", "[quant][mxfp4][cpu_kernels]") {
  if (cpu::isa() == cpu::Isa::kScalar) return;  // nothing to check without AVX2
  const Stored w = random_weight(20, 256, 120, 130, 8);
  const at::Tensor x = test::randn({3, 256}, 9).to(at::kBFloat16);
  const at::Tensor via_linear = mxfp4_cpu_linear(x, w.view());
  const at::Tensor via_rows = mxfp4_rows_linear(x, w.view(), cpu::isa());
  CHECK(at::equal(via_linear, via_rows));
}
