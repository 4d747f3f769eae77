// The int8_weight_only kernels (weight_only_cpu_kernels_body.h) built for AVX-512: a
// zmm holds 16 k of a weight row (the K tail by masked loads) or a panel's 16 columns.
// The table is this ISA's register budget: 32 zmm hold twice AVX2's accumulators, so
// 8 weight rows up to M = 2, then 4.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "quant/int8/weight_only_cpu_kernels_body.h"

namespace tp::detail {
namespace {

constexpr cpu::Isa kIsa = cpu::Isa::kAvx512;
// Weight rows per block for M rows of x (M * R accumulators) and the kernels for a
// full block.
constexpr int kBlock[kInt8WoSmallM + 1] = {0, 8, 8, 4, 4};
constexpr RowsFn kFull[kInt8WoSmallM + 1] = {nullptr, rows<kIsa, 1, 8>, rows<kIsa, 2, 8>, rows<kIsa, 3, 4>,
                                             rows<kIsa, 4, 4>};

}  // namespace

void int8_wo_rows_avx512(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                         int64_t p0, int64_t p1) {
  rows_over_panels<kIsa>(kBlock, kFull, x, m, ld_x, w, y, ld_y, p0, p1);
}

void int8_wo_decode_panels_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                  int64_t ld_buf) {
  decode_panels<kIsa>(view, p, np, k0, kc, buf, ld_buf);
}

}  // namespace tp::detail
