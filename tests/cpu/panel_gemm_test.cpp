// The float32 panel GEMM the weight-only formats share (src/cpu/panel_gemm.h), called
// directly under every ISA this CPU has, with a decoder that reads a plain float
// weight: against float64 at edge shapes (N off the 16-column panel and AVX-512's
// panel pairs, M off every row tile, K off the 256-deep chunks and the vector width),
// strided x and y, and only the asked-for panels' columns written; and its AMX bf16
// tile path (cpu/panel_gemm_amx.cpp) where this CPU may use AMX.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/amx.h"
#include "cpu/panel_gemm.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"

using tp::cpu::Isa;
using tp::cpu::kPanelWidth;
using tp::cpu::PanelWeight;
using tp::test::isas_here;

namespace {

// The weight as a decoder sees it: W [n, k] float32, contiguous.
struct PlainWeight {
  const float* w;
  int64_t n, k;
};

void decode_plain(const void* weight, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  const auto& pw = *static_cast<const PlainWeight*>(weight);
  for (int64_t kk = 0; kk < kc; ++kk)
    for (int64_t j = 0; j < kPanelWidth * np; ++j) {
      const int64_t col = p * kPanelWidth + j;
      buf[kk * ld_buf + j] = col < pw.n ? pw.w[col * pw.k + k0 + kk] : 0.0f;  // past N: zeros, as promised
    }
}

int64_t panels_of(int64_t n) { return (n + kPanelWidth - 1) / kPanelWidth; }

}  // namespace

TEST_CASE("cpu panel_gemm: each ISA's tiles match float64 on strided operands at edge shapes", "[cpu][cpu_kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Isa isa : isas_here()) {
    for (const int64_t n : {1, 15, 16, 17, 33, 48}) {
      for (const int64_t k : {1, 7, 8, 255, 256, 257, 520}) {
        for (const int64_t m : {1, 2, 5, 6, 7, 8, 9, 17}) {
          INFO(tp::cpu::to_string(isa) << " M=" << m << " N=" << n << " K=" << k);
          const uint64_t seed = static_cast<uint64_t>(m * 7919 + n * 104729 + k);
          const at::Tensor w = tp::test::randn({n, k}, seed).to(at::kFloat).contiguous();
          // x and y strided: three columns past each row that the GEMM must neither read
          // (NaN in x) nor write (NaN in y stays NaN).
          at::Tensor x_mem = at::full({m, k + 3}, nan, at::kFloat);
          x_mem.narrow(1, 0, k).copy_(tp::test::randn({m, k}, seed + 1).to(at::kFloat));
          const at::Tensor x = x_mem.narrow(1, 0, k);
          at::Tensor y_mem = at::full({m, n + 3}, nan, at::kFloat);
          const PlainWeight plain{w.const_data_ptr<float>(), n, k};
          const PanelWeight pw{n, k, decode_plain, &plain};
          tp::cpu::panel_gemm_parallel(x_mem.const_data_ptr<float>(), m, k + 3, pw, y_mem.data_ptr<float>(), n + 3,
                                       panels_of(n), isa);
          const at::Tensor y = y_mem.narrow(1, 0, n);
          const at::Tensor ref = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
          const double worst =
              ((y.to(at::kDouble) - ref).abs() / tp::test::float32_dot_bound(x, w)).max().item<double>();
          INFO("worst |y - ref| / bound = " << worst);
          REQUIRE(worst <= 1.0);
          REQUIRE(at::isnan(y_mem.narrow(1, n, 3)).all().item<bool>());
        }
      }
    }
  }
}

TEST_CASE("cpu panel_gemm: a panel range writes only its own columns, and decode_all is the weight",
          "[cpu][cpu_kernels]") {
  const int64_t m = 7, n = 70, k = 300;  // 5 panels, the last of 6 columns
  const at::Tensor w = tp::test::randn({n, k}, 11).to(at::kFloat).contiguous();
  const at::Tensor x = tp::test::randn({m, k}, 12).to(at::kFloat).contiguous();
  const PlainWeight plain{w.const_data_ptr<float>(), n, k};
  const PanelWeight pw{n, k, decode_plain, &plain};
  for (const Isa isa : isas_here()) {
    INFO(tp::cpu::to_string(isa));
    REQUIRE(tp::test::same_bits(tp::cpu::panel_decode_all(pw, panels_of(n), isa).narrow(0, 0, n), w));
    const auto xp = tp::cpu::panel_pack_x(x.const_data_ptr<float>(), m, k, k, isa);
    for (const auto& [p0, p1] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 3}, {3, 5}, {4, 5}}) {
      INFO("panels [" << p0 << ", " << p1 << ")");
      at::Tensor y = at::full({m, n}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
      tp::cpu::panel_gemm(xp.data(), m, pw, y.data_ptr<float>(), n, p0, p1, isa);
      const int64_t c0 = p0 * kPanelWidth, c1 = std::min(n, p1 * kPanelWidth);
      const at::Tensor mine = y.narrow(1, c0, c1 - c0);
      const at::Tensor ref = at::matmul(x.to(at::kDouble), w.narrow(0, c0, c1 - c0).to(at::kDouble).t());
      const at::Tensor bound = tp::test::float32_dot_bound(x, w.narrow(0, c0, c1 - c0));
      REQUIRE(((mine.to(at::kDouble) - ref).abs() <= bound).all().item<bool>());
      // Every other column untouched.
      REQUIRE(at::isnan(y).sum().item<int64_t>() == m * (n - (c1 - c0)));
    }
  }
}

TEST_CASE("cpu panel_gemm: the AMX bf16 tiles match float64 of bf16 x times the bf16-rounded weight",
          "[cpu][cpu_kernels]") {
  // The tiles' own boundaries: N off the 16-column tiles and 32-column pairs, M off the
  // 16-row tiles and 32-row blocks, K off the 32-k tile step, the 256-k decode and the
  // 4096-k chunk. The model: x (bf16) times W rounded to bf16 (to nearest even), exact
  // products summed in float32, then y rounded to bf16 once.
  const auto& amx = tp::cpu::amx_status();
  if (!amx.usable) {
    WARN("AMX not usable here (" << amx.why << "): the tiles are not run");
    return;
  }
  for (const int64_t n : {1, 15, 17, 33, 48, 70}) {
    for (const int64_t k : {1, 31, 32, 33, 257, 520, 4097}) {
      for (const int64_t m : {5, 16, 17, 31, 33, 70}) {
        if (k > 520 && m > 17 && n > 17) continue;  // the 4096-k chunk once per shape class is enough
        INFO("amx M=" << m << " N=" << n << " K=" << k);
        const uint64_t seed = static_cast<uint64_t>(m * 7919 + n * 104729 + k);
        const at::Tensor w = tp::test::randn({n, k}, seed).to(at::kFloat).contiguous();
        const at::Tensor x = tp::test::randn({m, k}, seed + 1).to(at::kBFloat16);
        REQUIRE(tp::cpu::panel_amx_bf16_applies(x, Isa::kAvx512));
        const PlainWeight plain{w.const_data_ptr<float>(), n, k};
        const at::Tensor y =
            tp::cpu::panel_linear_amx_bf16(x, PanelWeight{n, k, decode_plain, &plain}, panels_of(n), "test");
        REQUIRE(y.scalar_type() == at::kBFloat16);
        const at::Tensor wb = w.to(at::kBFloat16);
        const at::Tensor ref = at::matmul(x.to(at::kDouble), wb.to(at::kDouble).t());
        const at::Tensor bound =
            tp::test::float32_dot_bound(x, wb) * (1 + std::ldexp(1.0, -8)) + ref.abs() * std::ldexp(1.0, -8);
        const double worst = ((y.to(at::kDouble) - ref).abs() / bound).max().item<double>();
        INFO("worst |y - ref| / bound = " << worst);
        REQUIRE(worst <= 1.0);
      }
    }
  }
  // Below kPanelAmxMinM rows, or in float32, the float32 kernels run instead.
  CHECK_FALSE(tp::cpu::panel_amx_bf16_applies(at::zeros({tp::cpu::kPanelAmxMinM - 1, 8}, at::kBFloat16), Isa::kAvx512));
  CHECK_FALSE(tp::cpu::panel_amx_bf16_applies(at::zeros({16, 8}, at::kFloat), Isa::kAvx512));
  CHECK_FALSE(tp::cpu::panel_amx_bf16_applies(at::zeros({16, 8}, at::kBFloat16), Isa::kAvx2));
}
