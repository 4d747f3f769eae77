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

// ---- The row decoder of the row-decoded GEMMs (cpu/row_decoded_gemm.h) ---------------
// An int8 code is a bf16 value exactly (at most 8 significant bits): 32 codes widened to
// int32, converted (exact) and narrowed to bf16 (exact) in order, 5 instructions. Uses
// avx512_bf16 (VCVTNE2PS2BF16): called only by the AMX and bf16 dot-product GEMMs, whose
// CPUs have it.

namespace tp::detail {

namespace {

__m512i int8_to_bf16x32(const int8_t* codes) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
  const __m512 hi =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16))));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

}  // namespace

void int8_wo_decode_row_bf16(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  const int8_t* src = w.codes + row * w.k + k0;
  // What the row's next call reads, fetched while this one decodes (as fp8_decode_row_bf16):
  // its next chunk where the caller decodes in chunks, else the row two ahead.
  const int8_t* ahead = k0 + kc < w.k ? src + kc : row + 2 < w.n ? src + 2 * w.k : nullptr;
  const int64_t full = kc / 32 * 32;
  for (int64_t kk = 0; kk < full; kk += 32) {
    if (ahead != nullptr && kk % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead + kk), _MM_HINT_T0);
    _mm512_storeu_si512(out + kk, int8_to_bf16x32(src + kk));
  }
  if (full < kc) {
    alignas(32) int8_t tail[32] = {};
    for (int64_t kk = full; kk < kc; ++kk) tail[kk - full] = src[kk];
    _mm512_storeu_si512(out + full, int8_to_bf16x32(tail));
  }
}

}  // namespace tp::detail
