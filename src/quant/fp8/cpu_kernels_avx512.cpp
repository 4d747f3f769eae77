// The FP8 kernels (cpu_kernels_body.h) built for AVX-512 (F, BW, VL, DQ) + F16C: a zmm
// holds 16 floats, so a chunk is 64 codes. Tables by 32 zmm: a 4 x 6 dot-product block
// (24 accumulators) and a 12 x 32 large-M tile (24 accumulators, 2 sliver vectors, 6
// broadcasts), the tile hand-written in outer_tile_avx512.cpp (fp8_outer_tile_avx512).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "quant/fp8/cpu_kernels_body.h"

namespace tp::detail {
namespace {

// This ISA's blocking (cpu_kernels_body.h).
struct Blocking {
  static constexpr cpu::Isa kIsa = cpu::Isa::kAvx512;
  static constexpr int kNr = 6;
  static constexpr int64_t kLargeM = 80;  // from this many x rows on, the outer-product kernel (measured crossover)
  static constexpr int kLMr = kFp8TileRows;
  static constexpr int kLNr = kFp8TileCols;
  static constexpr int64_t kLKc = 128;
  static constexpr int64_t kLNc = 64;
  static void tile(const float* x, int64_t ldx, const float* b, int64_t kl, int mr, float* t) {
    fp8_outer_tile_avx512(x, ldx, b, kl, mr, t);
  }
};
static_assert(kChunkOf<Blocking::kIsa> == kFp8ChunkAvx512);

}  // namespace

void fp8_gemm_avx512(const float* xp, int64_t m, int64_t ld_xp, const Fp8WeightView& w, float* y, int64_t ld_y,
                     int64_t n0, int64_t n1) {
  gemm_by_m<Blocking>(xp, m, ld_xp, w, y, ld_y, n0, n1);
}

void fp8_decode_avx512(const uint8_t* codes, int64_t count, float scale, bool nan_codes, float* out) {
  decode<Blocking::kIsa>(codes, count, scale, nan_codes, out);
}

}  // namespace tp::detail

// ---- The row decoder of the row-decoded GEMMs (cpu/row_decoded_gemm.h) ---------------
// 32 codes at a time to their bf16 bits on 16-bit lanes (no NaN codes: the callers check):
// a normal code's exponent and mantissa move up 4 bits and the bias grows by 120 (127 -
// 7), the 8 codes of exponent 0 (zero and the subnormals m 2^-9) come from a table, the
// sign moves up 8 bits (8 instructions per 32 codes). Every E4M3 value is a bf16 value, so
// the codes are exact.

namespace tp::detail {

namespace {

__m512i e4m3_to_bf16(__m256i codes) {
  const __m512i b = _mm512_cvtepu8_epi16(codes);
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi16(0x7F));
  __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
  // 0, 2^-9, 2^-8, 3 2^-9, 2^-7, 5 2^-9, 6 2^-9, 7 2^-9 as bf16.
  const __m512i table =
      _mm512_setr_epi32(0x3B000000, 0x3BC03B80, 0x3C203C00, 0x3C603C40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), mag, table);
  // v | (b << 8 & 0x8000): the sign.
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(b, 8), _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
}

}  // namespace

void fp8_decode_row_bf16(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out) {
  const auto& w = *static_cast<const Fp8WeightView*>(view);
  const uint8_t* src = w.codes + row * w.ld + k0;
  // Each row starts a new page, where the hardware prefetcher starts cold: fetch the row
  // two ahead while this one decodes.
  const uint8_t* ahead = row + 2 < w.n ? src + 2 * w.ld : nullptr;
  const int64_t full = kc / 32 * 32;
  for (int64_t kk = 0; kk < full; kk += 32) {
    if (ahead != nullptr && kk % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead + kk), _MM_HINT_T0);
    _mm512_storeu_si512(out + kk, e4m3_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + kk))));
  }
  if (full < kc) {
    alignas(32) uint8_t tail[32] = {};
    for (int64_t kk = full; kk < kc; ++kk) tail[kk - full] = src[kk];
    _mm512_storeu_si512(out + full, e4m3_to_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(tail))));
  }
}

}  // namespace tp::detail
