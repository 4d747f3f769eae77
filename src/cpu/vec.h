#pragma once
// Vec<Isa>: the few SIMD operations the CPU kernels are written in, so each kernel's
// loops are one template body (a family's *_body.h) built once per ISA by a short
// translation unit compiled with that ISA's flags (*_avx2.cpp, *_avx512.cpp) — one
// source, several builds, as ATen's CPU_CAPABILITY kernels and ggml-cpu's variants.
//
// A translation unit sees only the Vec of the ISA it is compiled for: Vec<kAvx512>
// where __AVX512F__ is defined, else Vec<kAvx2> where __AVX2__ is. Everything here
// and in the bodies is in an anonymous namespace, so no inline function compiled with
// one ISA's flags can be the copy the linker keeps for another ISA's caller.
//
// F is a vector of kLanes float32 lanes, I of as many int32 lanes. A panel of the
// panel GEMM (kPanelWidth = 16 columns) is kPerPanel vectors.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/features.h"

namespace tp::cpu {
namespace {

template <Isa kIsa>
struct Vec;

#if defined(__AVX512F__)

template <>
struct Vec<Isa::kAvx512> {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static constexpr int kPerPanel = 1;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  /// The first n (0..kLanes) floats at p, zeros above; reads nothing past p + n.
  static F load_first(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  /// Writes the first n (0..kLanes) lanes; nothing past p + n.
  static void store_first(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  /// a * b + c, one rounding.
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  /// c - a * b, one rounding.
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  /// The lanes' sum, in _mm512_reduce_add_ps's order (halves, then pairs), spelled out:
  /// GCC 12's own trips -Wuninitialized in its header.
  static float reduce(F v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  /// Whether a loop's tail is one masked vector step (else scalar code finishes it).
  static constexpr bool kMaskedTail = true;

  /// kLanes bfloat16 at p, exactly (a bf16 is a float's high half).
  static F widen_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  /// The first n (0..kLanes) bfloat16 at p, zeros above; reads nothing past p + n.
  static F widen_bf16_first(const uint16_t* p, int n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask(n), p)), 16));
  }
  /// kLanes IEEE halves at p, exactly.
  static F widen_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  /// kLanes unsigned bytes at p as floats.
  static F widen_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  /// kLanes signed bytes at p as floats.
  static F widen_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }

  static I load_i(const void* p) { return _mm512_loadu_si512(p); }
  static I set1_i(int32_t v) { return _mm512_set1_epi32(v); }
  static I and_i(I a, I b) { return _mm512_and_si512(a, b); }
  /// Each int32 lane shifted right by `bits`, zeros in.
  static I shift_right_i(I v, int bits) { return _mm512_srli_epi32(v, bits); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }

  // fp8:
  /// The first n (1..4 kLanes) bytes at p, zeros above; reads nothing past p + n.
  static I load_i_first(const uint8_t* p, int n) {
    return _mm512_maskz_loadu_epi8(static_cast<__mmask64>((~0ULL) >> (64 - n)), p);
  }
  /// v's 4 kLanes bytes at p (any alignment).
  static void store_i(void* p, I v) { _mm512_storeu_si512(p, v); }
  /// v in every int16 lane.
  static I set1_i16(int16_t v) { return _mm512_set1_epi16(v); }
  /// Each int16 lane shifted left by `bits`, zeros in.
  static I shift_left_i16(I v, int bits) { return _mm512_slli_epi16(v, bits); }
  /// Each int16 lane shifted right by `bits`, copies of its sign bit in.
  static I shift_right_arith_i16(I v, int bits) { return _mm512_srai_epi16(v, bits); }
  /// The sums of a, b, c, d in lanes 0..3: each folded to 256 bits (low + high half), then as AVX2's.
  static __m128 reduce4(F a, F b, F c, F d) {
    const auto fold = [](F v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a), fold(b)), _mm256_hadd_ps(fold(c), fold(d)));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }
  // int8:
  /// The low kLanes signed bytes of v as floats.
  static F widen_i8(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
  /// The first n (0..kLanes) signed bytes at p as floats, zeros above; reads nothing past p + n.
  static F widen_i8_first(const int8_t* p, int n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask(n), p)));
  }
  static I zero_i() { return _mm512_setzero_si512(); }
  /// Each int32 lane of a plus b's (wrapping).
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  /// The sum of the int32 lanes (wrapping).
  static int32_t reduce_i(I v) { return _mm512_reduce_add_epi32(v); }
  /// Each int8 lane's magnitude as a uint8 (-128 gives 128).
  static I abs_i8(I v) { return _mm512_abs_epi8(v); }
  /// What apply_sign_i8 keeps of w: the sign bits of its int8 lanes.
  using SignI8 = __mmask64;
  static SignI8 sign_i8(I w) { return _mm512_movepi8_mask(w); }
  /// x's int8 lanes negated where w's are negative; where w is 0 x as is (no vpsignb: a masked 0 - x).
  static I apply_sign_i8(I x, SignI8 w) { return _mm512_mask_sub_epi8(x, w, _mm512_setzero_si512(), x); }
  /// uint8 lanes of u times int8 lanes of s, adjacent pairs summed into int16 lanes, saturating.
  static I maddubs_i16(I u, I s) { return _mm512_maddubs_epi16(u, s); }
  /// int16 lanes of a times b's, adjacent pairs summed into int32 lanes.
  static I madd_i16(I a, I b) { return _mm512_madd_epi16(a, b); }

 private:
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
};

#elif defined(__AVX2__)

template <>
struct Vec<Isa::kAvx2> {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static constexpr int kPerPanel = 2;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  /// The first n (0..kLanes) floats at p, zeros above; reads nothing past p + n.
  static F load_first(const float* p, int n) {
    alignas(32) float part[kLanes] = {};
    for (int i = 0; i < n; ++i) part[i] = p[i];
    return _mm256_load_ps(part);
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  /// Writes the first n (0..kLanes) lanes; nothing past p + n.
  static void store_first(float* p, F v, int n) {
    alignas(32) float part[kLanes];
    _mm256_store_ps(part, v);
    for (int i = 0; i < n; ++i) p[i] = part[i];
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  /// a * b + c, one rounding.
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  /// c - a * b, one rounding.
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static float reduce(F v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  /// Whether a loop's tail is one masked vector step (else scalar code finishes it).
  static constexpr bool kMaskedTail = false;

  /// kLanes bfloat16 at p, exactly (a bf16 is a float's high half).
  static F widen_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  /// The first n (0..kLanes) bfloat16 at p, zeros above; reads nothing past p + n.
  static F widen_bf16_first(const uint16_t* p, int n) {
    alignas(16) uint16_t part[kLanes] = {};
    for (int i = 0; i < n; ++i) part[i] = p[i];
    return widen_bf16(part);
  }
  /// kLanes IEEE halves at p, exactly.
  static F widen_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  /// kLanes unsigned bytes at p as floats.
  static F widen_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  /// kLanes signed bytes at p as floats.
  static F widen_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  static I load_i(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I set1_i(int32_t v) { return _mm256_set1_epi32(v); }
  static I and_i(I a, I b) { return _mm256_and_si256(a, b); }
  /// Each int32 lane shifted right by `bits`, zeros in.
  static I shift_right_i(I v, int bits) { return _mm256_srli_epi32(v, bits); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }

  // fp8:
  /// The first n (1..4 kLanes) bytes at p, zeros above; reads nothing past p + n.
  static I load_i_first(const uint8_t* p, int n) {
    alignas(32) uint8_t part[4 * kLanes] = {};
    std::memcpy(part, p, static_cast<size_t>(n));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(part));
  }
  /// v's 4 kLanes bytes at p (any alignment).
  static void store_i(void* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  /// v in every int16 lane.
  static I set1_i16(int16_t v) { return _mm256_set1_epi16(v); }
  /// Each int16 lane shifted left by `bits`, zeros in.
  static I shift_left_i16(I v, int bits) { return _mm256_slli_epi16(v, bits); }
  /// Each int16 lane shifted right by `bits`, copies of its sign bit in.
  static I shift_right_arith_i16(I v, int bits) { return _mm256_srai_epi16(v, bits); }
  /// The sums of a, b, c, d in lanes 0..3: two rounds of pairwise adds, then the 128-bit halves added.
  static __m128 reduce4(F a, F b, F c, F d) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }
  // int8:
  /// The low kLanes signed bytes of v as floats.
  static F widen_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
  /// The first n (0..kLanes) signed bytes at p as floats, zeros above; reads nothing past p + n.
  static F widen_i8_first(const int8_t* p, int n) {
    alignas(16) int8_t part[16] = {};
    for (int i = 0; i < n; ++i) part[i] = p[i];
    return widen_i8(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
  }
  static I zero_i() { return _mm256_setzero_si256(); }
  /// Each int32 lane of a plus b's (wrapping).
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  /// The sum of the int32 lanes (wrapping).
  static int32_t reduce_i(I v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  }
  /// Each int8 lane's magnitude as a uint8 (-128 gives 128).
  static I abs_i8(I v) { return _mm256_abs_epi8(v); }
  /// What apply_sign_i8 keeps of w: w itself (vpsignb reads its signs).
  using SignI8 = I;
  static SignI8 sign_i8(I w) { return w; }
  /// x's int8 lanes negated where w's are negative; where w is 0, 0 (vpsignb).
  static I apply_sign_i8(I x, SignI8 w) { return _mm256_sign_epi8(x, w); }
  /// uint8 lanes of u times int8 lanes of s, adjacent pairs summed into int16 lanes, saturating.
  static I maddubs_i16(I u, I s) { return _mm256_maddubs_epi16(u, s); }
  /// int16 lanes of a times b's, adjacent pairs summed into int32 lanes.
  static I madd_i16(I a, I b) { return _mm256_madd_epi16(a, b); }
};

#endif

}  // namespace
}  // namespace tp::cpu
