// MXFP4's float32 rows kernel (rows_body.h) built for AVX2 + FMA: 8 lanes, so a chunk is
// 32 code bytes (64 weights, 2 blocks) and a scale group 8 blocks. VPERMPS reads only the
// low 3 bits of an index, so the 8 magnitudes come from it and the sign (the code's bit 3)
// is moved to bit 31 and xor-ed in. 16 ymm: 2 rows at once up to M = 2, 1 above.

#include "quant/mxfp4/rows_body.h"

namespace tp::detail {
namespace {

struct Decode {
  static constexpr cpu::Isa kIsa = cpu::Isa::kAvx2;
  static constexpr int kR1 = 2, kR2 = 2, kR4 = 1;
  static __m256i codes(const uint8_t* p, int bytes) { return cpu::Vec<kIsa>::load_i_first(p, bytes < 32 ? bytes : 32); }
  static __m256 decode(__m256i v, int i) {
    const __m256 magnitude = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i idx = i == 0 ? v : _mm256_srli_epi32(v, 4 * i);
    const __m256i sign = _mm256_and_si256(i == 7 ? v : _mm256_slli_epi32(v, 28 - 4 * i),
                                          _mm256_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(magnitude, idx), _mm256_castsi256_ps(sign));
  }
  // 2^(s - 127) as float32 bits: s << 23, and 2^-127 (a subnormal, 1 << 22) for s = 0.
  static __m256 group_scales(const uint8_t* s, int n) {
    __m128i bytes;
    if (n == 8) {
      bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
    } else {
      alignas(16) uint8_t part[16] = {};
      for (int b = 0; b < n; ++b) part[b] = s[b];
      bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(part));
    }
    const __m256i e = _mm256_slli_epi32(_mm256_cvtepu8_epi32(bytes), 23);
    return _mm256_castsi256_ps(_mm256_max_epu32(e, _mm256_set1_epi32(1 << 22)));
  }
  static __m256 chunk_scales(__m256 g, int q) {
    return _mm256_permutevar8x32_ps(
        g, _mm256_setr_epi32(2 * q, 2 * q, 2 * q, 2 * q, 2 * q + 1, 2 * q + 1, 2 * q + 1, 2 * q + 1));
  }
};

}  // namespace

void mxfp4_rows_f32_avx2(const float* xp, int64_t m, int64_t ld_xp, const Mxfp4CpuWeight& w, float* y, int64_t ld_y,
                         int64_t n0, int64_t n1) {
  rows_f32_by_m<Decode>(xp, m, ld_xp, w, y, ld_y, n0, n1);
}

}  // namespace tp::detail
