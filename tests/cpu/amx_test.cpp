// AMX tiles (src/cpu/amx.h): the permission decision, and one TDPBF16PS tile against
// float64 on random bf16 data. Where the tiles are not usable the test says why and
// checks only that the decision names a reason.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <limits>

#include "cpu/amx.h"
#include "cpu/features.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"

TEST_CASE("cpu amx: tiles are usable exactly where the CPU has them and nothing capped them", "[cpu]") {
  const auto& s = tp::cpu::amx_status();
  const auto& f = tp::cpu::features();
  INFO("amx: " << (s.usable ? "usable" : "not usable") << " (" << s.why << "); features " << f.describe());
  REQUIRE(!s.why.empty());
  if (!(f.amx_tile && f.amx_bf16 && f.amx_int8)) REQUIRE_FALSE(s.usable);
  if (tp::cpu::isa() != tp::cpu::Isa::kAvx512) REQUIRE_FALSE(s.usable);
  if (s.usable) REQUIRE(s.why == "granted");
}

TEST_CASE("cpu amx: one bf16 tile (16 x 16 x 32) matches float64 on strided operands", "[cpu][cpu_kernels]") {
  const auto& s = tp::cpu::amx_status();
  if (!s.usable) {
    WARN("AMX not usable here (" << s.why << "): the tile is not run");
    return;
  }
  const int64_t lda = 40, ldb = 36, ldc = 20;  // strides past each row, left untouched
  const at::Tensor a = tp::test::randn({16, 32}, 1).to(at::kBFloat16);
  const at::Tensor b = tp::test::randn({32, 16}, 2).to(at::kBFloat16);
  at::Tensor a_mem = at::zeros({16, lda}, at::kBFloat16);
  a_mem.narrow(1, 0, 32).copy_(a);
  // VNNI pairs: bp[r, 2 j + q] = b[2 r + q, j].
  const at::Tensor pairs = b.reshape({16, 2, 16}).permute({0, 2, 1}).reshape({16, 32});
  at::Tensor b_mem = at::zeros({16, ldb}, at::kBFloat16);
  b_mem.narrow(1, 0, 32).copy_(pairs);
  at::Tensor c_mem = at::full({16, ldc}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
  tp::cpu::amx_bf16_tile_16x16x32(reinterpret_cast<const uint16_t*>(a_mem.const_data_ptr<at::BFloat16>()), lda,
                                  reinterpret_cast<const uint16_t*>(b_mem.const_data_ptr<at::BFloat16>()), ldb,
                                  c_mem.data_ptr<float>(), ldc);
  const at::Tensor c = c_mem.narrow(1, 0, 16);
  const at::Tensor ref = at::matmul(a.to(at::kDouble), b.to(at::kDouble));
  // bf16 x bf16 products are exact in float32; only the float32 sums round.
  const at::Tensor bound = tp::test::float32_dot_bound(a, b.t());
  const double worst = ((c.to(at::kDouble) - ref).abs() / bound).max().item<double>();
  INFO("worst |c - ref| / bound = " << worst);
  REQUIRE(worst <= 1.0);
  REQUIRE(at::isnan(c_mem.narrow(1, 16, ldc - 16)).all().item<bool>());
}
