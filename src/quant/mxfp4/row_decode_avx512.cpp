// MXFP4's row decoder for the row-decoded GEMM's AVX-512 bf16 loop (cpu/row_decoded_gemm.h),
// compiled with the AVX-512 flags. Every E2M1 value times 2^(scale - 127) is a bf16 value
// exactly while the scale byte is in [kMxfp4Bf16ScaleMin, kMxfp4Bf16ScaleMax] (2 significant
// bits, a normal exponent): so the scale is folded into the decoded weight and the GEMM
// multiplies x by the dequantized weight itself, the products exact.
//
// Per block of 32 k (16 bytes, one scale): the bytes widened to 32-bit lanes, each lane's
// low nibble put in its low half and high nibble in its high half (one shift, one ternary
// logic op), a 16-entry table of the E2M1 values' bf16 bits looked up per 16-bit half, and
// the scale's exponent added to the nonzero ones: 7 instructions per 32 codes.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

#include "quant/mxfp4/mxfp4.h"

// No templates or inline functions shared with other translation units here.

namespace tp::detail {

namespace {

// bf16 bits of E2M1 code i & 15 (sign in bit 3) at 16-bit lane i.
__m512i e2m1_bf16_table() {
  alignas(64) static const uint16_t kTable[32] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                                  0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
                                                  0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                                  0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
  return _mm512_load_si512(kTable);
}

}  // namespace

void mxfp4_decode_row_bf16(const void* weight, int64_t row, int64_t k0, int64_t kc, uint16_t* out) {
  const auto& w = *static_cast<const Mxfp4CpuWeight*>(weight);
  const __m512i table = e2m1_bf16_table();
  const __m512i nibbles = _mm512_set1_epi32(0x000F000F);
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  const uint8_t* codes = w.blocks + row * (w.k / 2) + k0 / 2;
  const uint8_t* scales = w.scales + row * (w.k / kMxfp4Block) + k0 / kMxfp4Block;
  // The row's next chunk (16 bytes of codes per 32 k), fetched while this one decodes: rows
  // are pages apart and the hardware prefetcher does not follow 24 of them.
  const bool more = k0 + kc < w.k;
  for (int64_t b = 0; b < kc / kMxfp4Block; ++b) {
    if (more && b % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + kc / 2 + 16 * b), _MM_HINT_T0);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b)));
    // (v | v << 12) & 0x000F000F: the low nibble in the low half, the high one in the high half.
    const __m512i idx = _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), nibbles, 0xA8);
    const __m512i value = _mm512_permutexvar_epi16(idx, table);
    const __m512i exponent = _mm512_set1_epi16(static_cast<int16_t>((static_cast<int>(scales[b]) - 127) * 128));
    _mm512_storeu_si512(out + 32 * b,
                        _mm512_mask_add_epi16(value, _mm512_test_epi16_mask(value, magnitude), value, exponent));
  }
}

}  // namespace tp::detail
