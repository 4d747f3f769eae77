// The int8_weight_only kernels (weight_only_cpu_kernels_body.h) built for AVX2 + FMA:
// a ymm holds 8 k of a weight row (rows kernel) or 8 of a panel's 16 columns (decoder).
// The table is this ISA's register budget: 16 ymm hold M * R accumulators beside the
// x vectors, so 8 weight rows at M = 1, then 4 and 2.

#include "quant/int8/weight_only_cpu_kernels_body.h"

namespace tp::detail {
namespace {

constexpr cpu::Isa kIsa = cpu::Isa::kAvx2;
// Weight rows per block for M rows of x (M * R accumulators) and the kernels for a
// full block.
constexpr int kBlock[kInt8WoSmallM + 1] = {0, 8, 4, 4, 2};
constexpr RowsFn kFull[kInt8WoSmallM + 1] = {nullptr, rows<kIsa, 1, 8>, rows<kIsa, 2, 4>, rows<kIsa, 3, 4>,
                                             rows<kIsa, 4, 2>};

}  // namespace

void int8_wo_rows_avx2(const float* x, int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y,
                       int64_t p0, int64_t p1) {
  rows_over_panels<kIsa>(kBlock, kFull, x, m, ld_x, w, y, ld_y, p0, p1);
}

void int8_wo_decode_panels_avx2(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                                int64_t ld_buf) {
  decode_panels<kIsa>(view, p, np, k0, kc, buf, ld_buf);
}

}  // namespace tp::detail
