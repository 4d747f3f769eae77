// The INT4 kernels (cpu_kernels_body.h) built for AVX-512: a zmm holds one panel's 16
// columns, so 32 zmm leave room for 4 panels at every M the rows kernel takes.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "quant/int4/cpu_kernels_body.h"

namespace tp::detail {
namespace {

constexpr cpu::Isa kIsa = cpu::Isa::kAvx512;
constexpr RowsFn kRows[kInt4SmallM + 1][4] = {
    {nullptr, nullptr, nullptr, nullptr},
    {rows<kIsa, 1, 1, 2>, rows<kIsa, 1, 2, 2>, rows<kIsa, 1, 3, 2>, rows<kIsa, 1, 4, 2>},
    {rows<kIsa, 2, 1, 1>, rows<kIsa, 2, 2, 1>, rows<kIsa, 2, 3, 1>, rows<kIsa, 2, 4, 1>},
    {rows<kIsa, 3, 1, 1>, rows<kIsa, 3, 2, 1>, rows<kIsa, 3, 3, 1>, rows<kIsa, 3, 4, 1>},
    {rows<kIsa, 4, 1, 1>, rows<kIsa, 4, 2, 1>, rows<kIsa, 4, 3, 1>, rows<kIsa, 4, 4, 1>},
};
constexpr int kWidePanels[kInt4SmallM + 1] = {1, 4, 4, 4, 4};

}  // namespace

void int4_rows_avx512(const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum,
                      const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  rows_over_panels(kRows, kWidePanels, xs, m, ld_xs, sum_x, ld_sum, w, y, ld_y, p0, p1);
}

void int4_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf) {
  decode_panels<kIsa>(view, p, np, k0, kc, buf, ld_buf);
}

}  // namespace tp::detail
