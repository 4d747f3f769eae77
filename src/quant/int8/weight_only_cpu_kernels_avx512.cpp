// The int8_weight_only kernels (weight_only_cpu_kernels_body.h) built for AVX-512: a
// zmm holds 16 k of a weight row (the K tail by masked loads) or a panel's 16 columns.
// The table is this ISA's register budget: 32 zmm hold twice AVX2's accumulators, so
// 8 weight rows up to M = 2, then 4.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/bf16_panel_gemm.h"
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

// ---- The bf16 dot-product GEMM's decoder (cpu/bf16_panel_gemm.h) --------------------
// 16 weight rows' bytes transposed into pair rows (cpu::bf16_pair_bytes_avx512), then per
// pair row 32 codes widened to int32, converted (exact) and narrowed to bf16 (exact: at
// most 8 significant bits) in order: 5 instructions per 32 codes after the transpose.

namespace tp::detail {

void int8_wo_bf16_decode_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, uint32_t* pairs,
                                float* scale, float* /*zero*/) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  alignas(64) uint8_t bytes[cpu::kBf16ChunkK * 16];
  for (int64_t j = 0; j < np; ++j) {
    const uint8_t* rows[16];
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t n = (p + j) * 16 + l;
      rows[l] = n < w.n ? reinterpret_cast<const uint8_t*>(w.codes + n * w.k + k0) : nullptr;
    }
    cpu::bf16_pair_bytes_avx512(rows, kc, bytes);
    for (int64_t q = 0; q < (kc + 1) / 2; ++q) {
      const __m512 lo =
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 32 * q))));
      const __m512 hi = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 32 * q + 16))));
      _mm512_store_si512(pairs + q * cpu::kBf16PairLd + 16 * j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    _mm512_storeu_ps(scale + 16 * j, _mm512_loadu_ps(w.scales + (p + j) * 16));
  }
}

}  // namespace tp::detail
