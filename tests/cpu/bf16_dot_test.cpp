// The GEMMs on AVX-512 bf16 dot products (cpu/bf16_dot.h): the panel loop through INT4's
// decoder (with zero points), the row-decoded loop through INT8 weight-only's and FP8's
// (per row and per 128-block scales, with the activations' own), against each format's
// float64 model: x times the codes (minus zero) times the scales, unrounded, at every M (the
// crossover forced to 1, as tp-cpu-gemm-bench --tune times them). Edge shapes:
// N off the 16-column panels, the 4-panel step and the 24-row block, K off the 32-k decode
// step, odd K, K below one chunk, M off the 16-token vectors and the 6-row tile, M past
// the 512-token pass. On a CPU without avx512_bf16 the layers must not take them (the
// kernel counter says which ran).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/amx.h"
#include "cpu/bf16_dot.h"
#include "cpu/crossovers.h"
#include "cpu/kernel_counts.h"
#include "quant/fp8/cpu_kernels.h"
#include "quant/int4/cpu_kernels.h"
#include "quant/int8/weight_only_cpu_kernels.h"
#include "quant/mxfp4/mxfp4.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"

using namespace tp;

namespace {

// The first M of the bf16 dot products in these tests (cpu/crossovers.h's built-in value).
constexpr int64_t kDotFrom = 5;

bool bf16_dot_here() {
  return cpu::features().avx512bf16 && cpu::isa() == cpu::Isa::kAvx512 && !cpu::amx_status().usable;
}

// max |y - ref| / bound over y, with ref and bound float64; y rounded to bf16 adds 2^-8 |ref|.
double worst(const at::Tensor& y, const at::Tensor& ref, const at::Tensor& bound) {
  const at::Tensor b = bound * (1 + std::ldexp(1.0, -8)) + ref.abs() * std::ldexp(1.0, -8);
  return ((y.to(at::kDouble) - ref).abs() / b).max().item<double>();
}

template <class F>
std::string counted(const F& f, at::Tensor& y) {
  const auto before = cpu::kernel_counts();
  y = f();
  return cpu::kernels_between(before, cpu::kernel_counts());
}

}  // namespace

TEST_CASE("bf16 dot products: INT4 codes minus zero points times group scales", "[cpu_kernels][quant]") {
  const cpu::ScopedCrossover from(cpu::Crossover::kBf16Dot, 1);  // every M takes them (as --tune times them)
  if (!bf16_dot_here()) WARN("no avx512_bf16 here (or AMX goes first): only the fallback is checked");
  for (const auto& [n, k, g] : {std::tuple<int64_t, int64_t, int64_t>{16, 128, 128},
                                {37, 256, 32},
                                {100, 384, 128},
                                {70, 1024, 1024},
                                {1, 64, 64},
                                {200, 2048, 64}}) {
    const at::Tensor q = at::randint(0, 16, {n, k}, at::kInt);
    const at::Tensor scale = (at::rand({k / g, n}, at::kFloat) + 0.5) * 0.01;
    const at::Tensor zero = at::randint(0, 17, {k / g, n}, at::kInt);  // GPTQ v1 reaches 16
    const tp::detail::Int4CpuWeight w = tp::detail::int4_cpu_pack(q, scale.to(at::kHalf), zero, g);
    const at::Tensor s = scale.to(at::kHalf).to(at::kDouble).t().repeat_interleave(g, 1);  // [n, k]
    const at::Tensor z = zero.to(at::kDouble).t().repeat_interleave(g, 1);
    const at::Tensor model = (q.to(at::kDouble) - z) * s;
    for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{4}, kDotFrom, int64_t{6}, int64_t{13}, int64_t{64}}) {
      INFO("N=" << n << " K=" << k << " g=" << g << " M=" << m);
      const at::Tensor x = test::randn({m, k}, static_cast<uint64_t>(n * m + k)).to(at::kBFloat16);
      at::Tensor y;
      const std::string ran = counted([&] { return tp::detail::int4_cpu_linear(x, w); }, y);
      CHECK((ran == "int4 panel/avx512_bf16") == bf16_dot_here());
      const at::Tensor ref = at::matmul(x.to(at::kDouble), model.t());
      // P - z X_G: the bound of x . (|q| + z) s, and the sum X_G, the product and the scale rounding.
      const at::Tensor bound = test::float32_dot_bound(x, (q.to(at::kDouble).abs() + z) * s, 4);
      CHECK(worst(y, ref, bound) <= 1.0);
    }
  }
}

TEST_CASE("bf16 dot products: INT8 weight-only codes times row scales", "[cpu_kernels][quant]") {
  const cpu::ScopedCrossover from(cpu::Crossover::kBf16Dot, 1);  // every M takes them (as --tune times them)
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{16, 32}, {37, 301}, {17, 7}, {65, 4100}, {129, 96}, {3, 1}}) {
    const at::Tensor q = at::randint(-128, 128, {n, k}, at::kChar);
    const at::Tensor scale = (at::rand({n}, at::kFloat) + 0.5) * 0.01;
    const tp::detail::Int8WoCpuWeight w = tp::detail::int8_wo_cpu_pack(q, scale);
    const at::Tensor model = q.to(at::kDouble) * scale.to(at::kDouble).unsqueeze(1);
    for (const int64_t m : {int64_t{1}, int64_t{3}, kDotFrom, int64_t{7}, int64_t{33}, int64_t{530}}) {
      INFO("N=" << n << " K=" << k << " M=" << m);
      const at::Tensor x = test::randn({m, k}, static_cast<uint64_t>(n * m + k)).to(at::kBFloat16);
      at::Tensor y;
      const std::string ran = counted([&] { return tp::detail::int8_wo_cpu_linear(x, w); }, y);
      CHECK((ran == "int8wo rows/avx512_bf16") == bf16_dot_here());
      const at::Tensor ref = at::matmul(x.to(at::kDouble), model.t());
      // Products below float32's normal range (the smallest scales) round to multiples of 2^-149.
      CHECK(worst(y, ref, test::float32_dot_bound(x, model, 2) + static_cast<double>(k) * std::ldexp(1.0, -149)) <=
            1.0);
    }
  }
}

TEST_CASE("bf16 dot products: FP8 codes times row or 128-block scales and the activations' scales",
          "[cpu_kernels][quant]") {
  const cpu::ScopedCrossover from(cpu::Crossover::kBf16Dot, 1);  // every M takes them (as --tune times them)
  if (!bf16_dot_here()) {
    WARN("no avx512_bf16 here (or AMX goes first): fp8_linear_bf16dot is not run");
    return;
  }
  for (const auto& [n, k, block] : {std::tuple<int64_t, int64_t, bool>{16, 128, false},
                                    {37, 300, true},
                                    {65, 1024, true},
                                    {40, 31, false},
                                    {100, 640, false},
                                    {3, 130, true}}) {
    // Random E4M3 codes without the NaN codes 0x7f / 0xff.
    at::Tensor codes = at::randint(0, 255, {n, k}, at::kByte);
    codes = at::where(codes.bitwise_and(0x7f).eq(0x7f), codes - 1, codes);
    const at::Tensor w = codes.view(at::kFloat8_e4m3fn);
    const int64_t groups = block ? (k + 127) / 128 : 1;
    const at::Tensor scale = (at::rand({n, groups}, at::kFloat) + 0.5) * 0.01;
    const auto kind = block ? tp::detail::Fp8Activation::kGroup128 : tp::detail::Fp8Activation::kPerToken;
    for (const int64_t m : {int64_t{1}, int64_t{2}, kDotFrom, int64_t{6}, int64_t{40}, int64_t{70}}) {
      INFO("N=" << n << " K=" << k << " block=" << block << " M=" << m);
      const at::Tensor x = test::randn({m, k}, static_cast<uint64_t>(n * m + k)).to(at::kBFloat16);
      const auto [xq, x_scale] = tp::detail::fp8_quantize_codes_cpu(x, kind);
      at::Tensor y;
      const std::string ran = counted(
          [&, &xq = xq, &x_scale = x_scale] {
            return tp::detail::fp8_linear_bf16dot(xq, x_scale, w, scale, block ? 128 : k);
          },
          y);
      CHECK(ran == "fp8 gemm/avx512_bf16");
      // The model: (q t) . (c s) in float64, t and s per 128-k group (or per row).
      const at::Tensor t = x_scale.narrow(1, 0, m).t().to(at::kDouble).repeat_interleave(block ? 128 : k, 1);
      const at::Tensor xd = xq.view(at::kBFloat16).to(at::kDouble) * t.narrow(1, 0, k);
      const at::Tensor wd =
          w.to(at::kDouble) * scale.to(at::kDouble).repeat_interleave(block ? 128 : k, 1).narrow(1, 0, k);
      const at::Tensor ref = at::matmul(xd, wd.t());
      const double err = worst(y, ref, test::float32_dot_bound(xd, wd, 3));
      INFO("worst |y - ref| / bound = " << err);
      CHECK(err <= 1.0);
    }
  }
}

TEST_CASE("bf16 dot products: float32 layers and small M never take them", "[cpu_kernels][quant]") {
  const cpu::ScopedCrossover from(cpu::Crossover::kBf16Dot, kDotFrom);  // the built-in crossover, whatever the table
  const at::Tensor q = at::randint(-128, 128, {48, 256}, at::kChar);
  const tp::detail::Int8WoCpuWeight w = tp::detail::int8_wo_cpu_pack(q, at::ones({48}));
  at::Tensor y;
  CHECK(counted(
            [&] {
              return tp::detail::int8_wo_cpu_linear(test::randn({16, 256}, 1).to(at::kFloat), w);
            },
            y)
            .find("bf16") == std::string::npos);
  CHECK(counted(
            [&] {
              return tp::detail::int8_wo_cpu_linear(test::randn({kDotFrom - 1, 256}, 1).to(at::kBFloat16), w);
            },
            y)
            .find("bf16") == std::string::npos);
  // TP_CPU_ISA below AVX-512 (here: the isa argument) turns it off.
  CHECK(counted(
            [&] {
              return tp::detail::int8_wo_cpu_linear(test::randn({16, 256}, 1).to(at::kBFloat16), w, cpu::Isa::kAvx2);
            },
            y)
            .find("bf16") == std::string::npos);
}

TEST_CASE("bf16 dot products: MXFP4's dequantized weight, exact where the scales allow", "[cpu_kernels][quant]") {
  const cpu::ScopedCrossover from(cpu::Crossover::kBf16Dot, 1);  // every M takes them (as --tune times them)
  for (const auto& [n, k, lo, hi] : {std::tuple<int64_t, int64_t, int, int>{16, 32, 120, 130},
                                     {37, 288, 100, 140},
                                     {100, 1024, 2, 252},
                                     {25, 256, 0, 130},       // a scale below the range: the float path
                                     {25, 256, 120, 253}}) {  // one above it: the float path
    // Codes up to 3 in magnitude where the scales reach 253 (6 x 2^126 is no float32).
    const auto nibbles = [&, hi = hi] {
      const at::Tensor mag = at::randint(0, hi > 252 ? 6 : 8, {n, k / 32, 16}, at::kByte);
      return mag + at::randint(0, 2, {n, k / 32, 16}, at::kByte) * 8;
    };
    const at::Tensor blocks = nibbles() + nibbles() * 16;
    const at::Tensor scales = at::randint(lo, hi + 1, {n, k / 32}, at::kByte);
    scales[n / 2][0] = lo;  // the ends of the range drawn for sure
    scales[n / 3][k / 32 - 1] = hi;
    const tp::detail::Mxfp4CpuWeight w{blocks.const_data_ptr<uint8_t>(), scales.const_data_ptr<uint8_t>(), n, k};
    const at::Tensor model = tp::detail::mxfp4_cpu_decode_all(w).to(at::kDouble);
    const bool in_range = lo >= tp::detail::kMxfp4Bf16ScaleMin && hi <= tp::detail::kMxfp4Bf16ScaleMax;
    for (const int64_t m : {int64_t{1}, int64_t{4}, kDotFrom, int64_t{16}, int64_t{70}}) {
      INFO("N=" << n << " K=" << k << " scales " << lo << ".." << hi << " M=" << m);
      // x scaled so that x W stays finite at the largest scales (and x stays a normal bf16).
      const double x_scale = hi > 200 ? std::ldexp(1.0, -100) : 1.0;
      const at::Tensor x = (test::randn({m, k}, static_cast<uint64_t>(n * m + k)) * x_scale).to(at::kBFloat16);
      at::Tensor y;
      const std::string ran = counted([&] { return tp::detail::mxfp4_cpu_linear(x, w); }, y);
      CHECK((ran == "mxfp4 gemm/avx512_bf16") == (bf16_dot_here() && in_range));
      const at::Tensor ref = at::matmul(x.to(at::kDouble), model.t());
      REQUIRE(at::isfinite(ref).all().item<bool>());
      // Products below float32's normal range (the smallest scales) round to multiples of 2^-149.
      CHECK(worst(y, ref, test::float32_dot_bound(x, model, 2) + static_cast<double>(k) * std::ldexp(1.0, -149)) <=
            1.0);
    }
  }
}

TEST_CASE("bf16 dot products: FP8's byte-table row decoder writes the other's bits, every code and tail",
          "[cpu_kernels][quant]") {
  if (!cpu::features().avx512bf16 || !cpu::features().avx512vbmi) {
    WARN("no avx512_bf16 / avx512_vbmi here: the decoders are not run");
    return;
  }
  // Every non-NaN code, in a row long enough for full blocks and every tail length.
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) codes.push_back(static_cast<uint8_t>(c));
  const at::Tensor w = at::from_blob(codes.data(), {1, static_cast<int64_t>(codes.size())}, at::kByte).clone();
  const at::Tensor scale = at::ones({1, 1});
  tp::detail::Fp8WeightView view;
  view.codes = w.const_data_ptr<uint8_t>();
  view.n = 1;
  view.k = w.size(1);
  view.ld = w.size(1);
  view.scale = scale.const_data_ptr<float>();
  view.scale_ld = 1;
  view.group = view.k;
  for (int64_t k0 : {int64_t{0}, int64_t{64}}) {
    for (int64_t kc = 1; k0 + kc <= view.k; kc += 7) {
      INFO("k0=" << k0 << " kc=" << kc);
      std::vector<uint16_t> a(static_cast<size_t>(kc + 64), 0xFFFF), b(a);
      tp::detail::fp8_decode_row_bf16(&view, 0, k0, kc, a.data());
      tp::detail::fp8_decode_row_bf16_vbmi(&view, 0, k0, kc, b.data());
      const int64_t padded = (kc + 31) / 32 * 32;
      CHECK(std::equal(a.begin(), a.begin() + padded, b.begin()));
    }
  }
}
