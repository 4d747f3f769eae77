// The FP8 kernels (cpu_kernels_body.h) built for AVX-512 (F, BW, VL, DQ) + F16C: a zmm
// holds 16 floats, so a chunk is 64 codes. Tables by 32 zmm: a 4 x 6 dot-product block
// (24 accumulators) and a 12 x 32 large-M tile (24 accumulators, 2 sliver vectors, 6
// broadcasts), the tile hand-written in outer_tile_avx512.cpp (fp8_outer_tile_avx512).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/bf16_panel_gemm.h"
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

// ---- The bf16 dot-product GEMM's decoder (cpu/bf16_panel_gemm.h) --------------------
// 16 weight rows' codes transposed into pair rows (cpu::bf16_pair_bytes_avx512), then 32
// codes at a time to their bf16 bits on 16-bit lanes (no NaN codes: the caller checks): a
// normal code's exponent and mantissa move up 4 bits and the bias grows by 120 (127 - 7),
// the 8 codes of exponent 0 (zero and the subnormals m 2^-9) come from a table, the sign
// moves up 8 bits. Every E4M3 value is a bf16 value, so the codes are exact.

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

void fp8_bf16_decode_avx512(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, uint32_t* pairs,
                            float* scale, float* /*zero*/) {
  const auto& w = *static_cast<const Fp8WeightView*>(view);
  alignas(64) uint8_t bytes[cpu::kBf16ChunkK * 16];
  const int64_t g = w.group >= w.k ? 0 : k0 / w.group;
  for (int64_t j = 0; j < np; ++j) {
    const uint8_t* rows[16];
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t n = (p + j) * 16 + l;
      rows[l] = n < w.n ? w.codes + n * w.ld + k0 : nullptr;
      scale[16 * j + l] = n < w.n ? w.scale[n * w.scale_ld + g] : 0.0f;
    }
    cpu::bf16_pair_bytes_avx512(rows, kc, bytes);
    for (int64_t q = 0; q < (kc + 1) / 2; ++q)
      _mm512_store_si512(pairs + q * cpu::kBf16PairLd + 16 * j,
                         e4m3_to_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + 32 * q))));
  }
}

}  // namespace tp::detail
