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
  // What the row's next call reads, fetched while this one decodes: rows are pages apart and
  // the hardware prefetcher does not follow 24 of them. Its next chunk where the caller
  // decodes a row in chunks (the bf16 loop: 128 k, a chunk of 24 rows ahead of the tiles
  // that use it), else the row two ahead (the AMX loop decodes whole rows).
  const uint8_t* ahead = k0 + kc < w.k ? src + kc : row + 2 < w.n ? src + 2 * w.ld : nullptr;
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

// ---- The same with byte tables (AVX-512 VBMI) -----------------------------------------
// VPERMI2B looks a byte up in a 128-entry table by its 7 low bits, which for an E4M3 code
// are its magnitude: one lookup gives the high bytes of 64 codes' bf16 bits, one the low
// bytes; the sign joins the high byte; two byte unpacks and two 64-bit permutes put the
// pairs back in k order. 9 instructions per 64 codes (4.5 per 32, against the 8 above).
// Compiled for VBMI by its attribute, called only where cpu::features().avx512vbmi.

namespace tp::detail {

namespace {

// bf16 bits of the E4M3 magnitude m (exponent m >> 3, mantissa m & 7; m < 127).
uint16_t e4m3_magnitude_bf16(int m) {
  const int e = m >> 3, f = m & 7;
  if (e > 0) return static_cast<uint16_t>(((e + 120) << 7) | (f << 4));
  // f 2^-9: the subnormals, normal in bf16.
  static const uint16_t kSub[8] = {0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60};
  return kSub[f];
}

struct ByteTables {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
  ByteTables() {
    for (int m = 0; m < 128; ++m) {
      const uint16_t v = e4m3_magnitude_bf16(m);
      hi[m] = static_cast<uint8_t>(v >> 8);
      lo[m] = static_cast<uint8_t>(v & 0xFF);
    }
  }
};

__attribute__((target("avx512vbmi"))) void e4m3_to_bf16x64(const uint8_t* codes, const __m512i t[4], uint16_t* out) {
  const __m512i b = _mm512_loadu_si512(codes);
  __m512i hi = _mm512_permutex2var_epi8(t[0], b, t[1]);
  const __m512i lo = _mm512_permutex2var_epi8(t[2], b, t[3]);
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (b & 0x80)
  // Per 128-bit lane l: codes 16 l .. 16 l + 7 (u0) and 16 l + 8 .. 16 l + 15 (u1).
  const __m512i u0 = _mm512_unpacklo_epi8(lo, hi), u1 = _mm512_unpackhi_epi8(lo, hi);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi64(u0, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), u1));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi64(u0, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), u1));
}

}  // namespace

__attribute__((target("avx512vbmi"))) void fp8_decode_row_bf16_vbmi(const void* view, int64_t row, int64_t k0,
                                                                    int64_t kc, uint16_t* out) {
  static const ByteTables kTables;
  const __m512i t[4] = {_mm512_load_si512(kTables.hi), _mm512_load_si512(kTables.hi + 64),
                        _mm512_load_si512(kTables.lo), _mm512_load_si512(kTables.lo + 64)};
  const auto& w = *static_cast<const Fp8WeightView*>(view);
  const uint8_t* src = w.codes + row * w.ld + k0;
  // as fp8_decode_row_bf16
  const uint8_t* ahead = k0 + kc < w.k ? src + kc : row + 2 < w.n ? src + 2 * w.ld : nullptr;
  const int64_t full = kc / 64 * 64;
  for (int64_t kk = 0; kk < full; kk += 64) {
    if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + kk), _MM_HINT_T0);
    e4m3_to_bf16x64(src + kk, t, out + kk);
  }
  if (full < kc) {  // the tail, zero padded to 64 (the caller's buffer holds round_up(kc, 32))
    alignas(64) uint8_t tail[64] = {};
    alignas(64) uint16_t decoded[64];
    for (int64_t kk = full; kk < kc; ++kk) tail[kk - full] = src[kk];
    e4m3_to_bf16x64(tail, t, decoded);
    const int64_t padded = (kc + 31) / 32 * 32;
    for (int64_t kk = full; kk < padded; ++kk) out[kk] = decoded[kk - full];
  }
}

}  // namespace tp::detail
