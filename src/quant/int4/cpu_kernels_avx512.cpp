// The INT4 kernels (cpu_kernels_body.h) built for AVX-512: a zmm holds one panel's 16
// columns, so 32 zmm leave room for 4 panels at every M the rows kernel takes.

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/bf16_panel_gemm.h"
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

// ---- The bf16 dot-product GEMM's decoder (cpu/bf16_panel_gemm.h) --------------------
// A word holds 8 k of one column; byte i of it is the pair (k 2i, 2i + 1) as its low and
// high nibble. One byte shuffle puts byte i into both 16-bit halves of its lane, a
// variable shift moves the high half's nibble down (the low half keeps its byte, whose
// bit 4 the table ignores), and a 32-entry table of the bf16 values of 0..15 (twice) does
// the rest: 3 instructions per 32 codes. The zero point stays out of the codes (the GEMM
// subtracts zero x the group sum of x, as the rows kernel does).

namespace tp::detail {

namespace {

// bf16 bits of i & 15 at lane i of 32.
__m512i int4_bf16_table() {
  alignas(64) static const uint16_t kTable[32] = {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                  0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
                                                  0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                  0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  return _mm512_load_si512(kTable);
}

// Byte shuffle putting byte i of each dword into the low bytes of both its 16-bit halves.
__m512i int4_byte_select(int i) {
  const int d0 = i | (0x80 << 8) | (i << 16) | (0x80 << 24);
  return _mm512_setr_epi32(d0, d0 + 0x00040004, d0 + 0x00080008, d0 + 0x000C000C, d0, d0 + 0x00040004, d0 + 0x00080008,
                           d0 + 0x000C000C, d0, d0 + 0x00040004, d0 + 0x00080008, d0 + 0x000C000C, d0, d0 + 0x00040004,
                           d0 + 0x00080008, d0 + 0x000C000C);
}

}  // namespace

void int4_bf16_decode_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, uint32_t* pairs,
                             float* scale, float* zero) {
  const auto& w = *static_cast<const Int4CpuView*>(view);
  const __m512i table = int4_bf16_table();
  const __m512i shift = _mm512_set1_epi32(4 << 16);
  const __m512i select[4] = {int4_byte_select(0), int4_byte_select(1), int4_byte_select(2), int4_byte_select(3)};
  const int64_t words = w.k / 8, groups = w.k / w.group, g = k0 / w.group;
  for (int64_t j = 0; j < np; ++j) {
    const uint32_t* src = w.codes + ((p + j) * words + k0 / 8) * 16;
    for (int64_t b = 0; b < kc / 8; ++b) {
      const __m512i word = _mm512_loadu_si512(src + 16 * b);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i idx = _mm512_srlv_epi16(_mm512_shuffle_epi8(word, select[i]), shift);
        _mm512_store_si512(pairs + (4 * b + i) * cpu::kBf16PairLd + 16 * j, _mm512_permutexvar_epi16(idx, table));
      }
    }
    const int64_t at = ((p + j) * groups + g) * 16;
    _mm512_storeu_ps(scale + 16 * j,
                     w.scales_f16 != nullptr
                         ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales_f16 + at)))
                         : _mm512_loadu_ps(w.scales_f32 + at));
    _mm512_storeu_ps(
        zero + 16 * j,
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + at)))));
  }
}

}  // namespace tp::detail
