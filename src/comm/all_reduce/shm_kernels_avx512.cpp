// The shared-memory strategies' AVX-512 kernels (shm_kernels.h), bit for bit their
// portable loops: no FMA (this file is compiled with -ffp-contract=off, src/CMakeLists.txt),
// every sum in the portable loops' order, the same bfloat16 rounding and float8 / int8
// conversions.
//  - sum_parts_avx512: the ranks' buffers summed element by element in rank order.
//  - finish_row_avx512: all_reduce_fusion's row epilogue (fusion_rows.cpp's loops) in three
//    passes over the row instead of eight - (1) sum the ranks' parts, round, add the
//    residual, store residual_out and square-sum; (2) normalize, round, store norm_out,
//    take |max|; (3) quantize - with the variance summed in the portable loops' lane order
//    (16 lanes, then the tail, then the lanes in order).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "comm/all_reduce/shm_kernels.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no <cmath>): the linker could keep this file's AVX-512 copy for every caller.

namespace tp::detail {
namespace {

constexpr int64_t kLanes = 16;
constexpr float kE4m3Max = 448.0f;
constexpr float kInt8Max = 127.0f;

__mmask16 tail_mask(int64_t left) {
  return left >= kLanes ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

__m512 load(const void* p, int64_t i, RowType t, __mmask16 m) {
  if (t == RowType::kFloat) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// bfloat16 round to nearest even, NaN -> 0x7fc0 (c10::BFloat16(float)), as a float.
__m512 bf16_round_int(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(r);
}

// The bfloat16 bits of v rounded as above, 16 words. With kCvt (the CPU has
// avx512_bf16) one VCVTNEPS2BF16, which rounds as c10 does except that it reads a
// subnormal input as zero and keeps a NaN's sign and payload: a vector holding either
// (VFPCLASSPS: QNaN, SNaN, denormal) takes the integer rounding instead.
template <bool kCvt>
__m256i bf16_bits(__m512 v) {
  if constexpr (kCvt) {
    if (_mm512_fpclass_ps_mask(v, 0x01 | 0x80 | 0x20) == 0) return (__m256i)_mm512_cvtneps_pbh(v);
  }
  // The high halves gathered by VPERMW (not VPMOVDW, whose memory form - GCC folds a
  // register VPMOVDW and its store into it - is microcoded on Zen 4).
  const __m512i odd_words = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25,
                                             23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i hi = _mm512_permutexvar_epi16(odd_words, _mm512_castps_si512(bf16_round_int(v)));
  return _mm512_castsi512_si256(hi);
}

__m512 widen(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

// v rounded to T, as a float.
template <RowType T, bool kCvt>
__m512 rounded(__m512 v) {
  if constexpr (T == RowType::kFloat) {
    return v;
  } else if constexpr (kCvt) {
    return widen(bf16_bits<kCvt>(v));
  } else {
    return bf16_round_int(v);
  }
}

// Masked stores only for a row's last, partial vector: Zen 4 retires a masked store
// several times slower than a plain one.
void store_f32(float* p, __m512 v, __mmask16 m) {
  if (m == 0xffff) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}

// Rounds v to T, stores it at p[i] and returns it as a float.
template <RowType T, bool kCvt>
__m512 round_store(void* p, int64_t i, __m512 v, __mmask16 m) {
  if constexpr (T == RowType::kFloat) {
    store_f32(static_cast<float*>(p) + i, v, m);
    return v;
  } else {
    const __m256i bits = bf16_bits<kCvt>(v);
    auto* dst = static_cast<uint16_t*>(p) + i;
    if (m == 0xffff) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bits);
    } else {
      _mm256_mask_storeu_epi16(dst, m, bits);
    }
    return widen(bits);
  }
}

// The portable loops' sum of (x - shift)^2 (or of x, `square` false): 16 lane sums in
// element order, then the tail from zero, then the lanes added to it in order.
float lane_sum(const float* x, int64_t n, float shift, bool square) {
  __m512 part = _mm512_setzero_ps();
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (square) {
      const __m512 d = _mm512_sub_ps(v, s);
      part = _mm512_add_ps(part, _mm512_mul_ps(d, d));
    } else {
      part = _mm512_add_ps(part, v);
    }
  }
  float total = 0;
  for (; i < n; ++i) total += square ? (x[i] - shift) * (x[i] - shift) : x[i];
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, part);
  for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}

// c10's float -> float8_e4m3fn (fusion_rows.cpp's e4m3_bits), 16 at a time, as int32.
__m512i e4m3_bits(__m512 f) {
  const __m512i all = _mm512_castps_si512(f);
  const __m512i sign = _mm512_and_si512(all, _mm512_set1_epi32(static_cast<int32_t>(0x80000000u)));
  const __m512i bits = _mm512_xor_si512(all, sign);
  const __m512 denorm_f = _mm512_add_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(16384.0f));
  const __m512i subnormal = _mm512_sub_epi32(_mm512_castps_si512(denorm_f), _mm512_set1_epi32(141 << 23));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
  __m512i normal =
      _mm512_add_epi32(bits, _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(7 - 127) << 23)));
  normal = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(normal, _mm512_set1_epi32(0x7ffff)), odd), 20);
  __m512i r = _mm512_mask_mov_epi32(normal, _mm512_cmplt_epu32_mask(bits, _mm512_set1_epi32(121 << 23)), subnormal);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(bits, _mm512_set1_epi32(1087 << 20)), _mm512_set1_epi32(0x7f));
  return _mm512_or_si512(_mm512_and_si512(r, _mm512_set1_epi32(0xff)), _mm512_srli_epi32(sign, 24));
}

// v < -bound ? -bound : v, then v > bound ? bound : v (NaN passes through), as the portable clamp.
__m512 clamp(__m512 v, float bound) {
  v = _mm512_max_ps(_mm512_set1_ps(-bound), v);    // -bound > v ? -bound : v
  return _mm512_min_ps(_mm512_set1_ps(bound), v);  // bound < v ? bound : v
}

float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void quantize(const float* x, int64_t n, RowQuant quant, void* codes, float* scale_out) {
  // |max| on the magnitudes' bits (non-NaN magnitudes order as their bits): NaN when a
  // lane is NaN, as at::amax and quant's abs_max, so a NaN row takes scale 1.
  __m512i part = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(tail_mask(n - i), x + i), abs_mask);
    part = _mm512_max_epu32(v, part);
  }
  const uint32_t top = static_cast<uint32_t>(_mm512_reduce_max_epu32(part));
  const float amax = float_of_bits(top > 0x7f800000u ? 0x7fc00000u : top);
  const bool fp8 = quant == RowQuant::kFp8PerToken;
  const float qmax = fp8 ? kE4m3Max : kInt8Max;
  const float scale = amax > 0.0f ? amax / qmax : 1.0f;
  const __m512 s = _mm512_set1_ps(scale);
  auto* q = static_cast<int8_t*>(codes);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = clamp(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), s), qmax);
    __m512i c;
    if (fp8) {
      c = e4m3_bits(v);
    } else {
      // Round half to even by adding and subtracting 1.5 * 2^23, then truncate (exact).
      const __m512 magic = _mm512_set1_ps(12582912.0f);
      // A NaN lane's code is 0 (as quant's int8 conversion), not the conversion's 0x80000000.
      const __mmask16 ordered = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
      c = _mm512_maskz_cvttps_epi32(ordered, _mm512_sub_ps(_mm512_add_ps(v, magic), magic));
    }
    // Each dword's low byte: to the front of its 128-bit lane, then the lanes' first
    // dwords together (not VPMOVDB's memory form, as in `store`).
    const __m512i low_bytes = _mm512_set4_epi32(-1, -1, -1, 0x0c080400);
    const __m512i lanes = _mm512_shuffle_epi8(c, low_bytes);
    const __m512i first =
        _mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), lanes);
    if (m == 0xffff) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_castsi512_si128(first));
    } else {
      _mm_mask_storeu_epi8(q + i, m, _mm512_castsi512_si128(first));
    }
  }
  *scale_out = scale;
}

// One row with T and the parts' type fixed (every field read once into a local, so
// that the loops keep them in registers instead of rereading `a` after each store).
template <RowType T, RowType P, bool kCvt>
void finish_row(const RowKernelArgs& a) {
  const int64_t n = a.hidden, count = a.count;
  const void* const* parts = a.parts;
  const void* residual_in = a.residual_in;
  void* residual_out = a.residual_out;
  float* __restrict h = a.scratch_h;
  const RowNorm norm = a.norm;
  // (1) The sum over ranks in T, the residual added and rounded to T, residual_out.
  __m512 sq = _mm512_setzero_ps();
  const bool rms = norm != RowNorm::kNone && norm != RowNorm::kLayerNorm;
  const void* p0 = parts[0];
  const void* p1 = count > 1 ? parts[1] : nullptr;
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = tail_mask(n - i);
    __m512 v = load(p0, i, P, m);
    if (count > 1) {
      v = _mm512_add_ps(v, load(p1, i, P, m));
      for (int64_t r = 2; r < count; ++r) v = _mm512_add_ps(v, load(parts[r], i, P, m));
    }
    if (residual_in != nullptr) v = _mm512_add_ps(rounded<T, kCvt>(v), load(residual_in, i, T, m));
    v = round_store<T, kCvt>(residual_out, i, v, m);
    store_f32(h + i, v, m);
    if (rms && m == 0xffff) sq = _mm512_add_ps(sq, _mm512_mul_ps(v, v));
  }
  if (norm == RowNorm::kNone) return;
  const float count_f = static_cast<float>(n);
  float mean = 0, r = 0;
  if (norm == RowNorm::kLayerNorm) {
    mean = lane_sum(h, n, 0.0f, /*square=*/false) / count_f;
    r = 1.0f / __builtin_sqrtf(lane_sum(h, n, mean, /*square=*/true) / count_f + a.eps);
  } else {
    float total = 0;
    const int64_t full = n / kLanes * kLanes;
    for (int64_t i = full; i < n; ++i) total += h[i] * h[i];
    alignas(64) float lanes[kLanes];
    _mm512_store_ps(lanes, sq);
    for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
    r = 1.0f / __builtin_sqrtf(total / count_f + a.eps);
  }
  // (2) The norm in fp32, rounded to T: norm_out (and the quantizer's input).
  const void* weight = a.norm_weight;
  const void* bias = a.norm_bias;
  void* norm_out = a.norm_out;
  float* __restrict y_keep = a.quant != RowQuant::kNone ? a.scratch_y : nullptr;
  const __m512 vr = _mm512_set1_ps(r), vmean = _mm512_set1_ps(mean), one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, h + i);
    const __m512 w = load(weight, i, T, m);
    __m512 y;
    switch (norm) {
      case RowNorm::kRMS: y = _mm512_mul_ps(w, rounded<T, kCvt>(_mm512_mul_ps(x, vr))); break;
      case RowNorm::kRMSUnitOffset: y = _mm512_mul_ps(_mm512_mul_ps(x, vr), _mm512_add_ps(w, one)); break;
      case RowNorm::kRMSScaleFirst: y = _mm512_mul_ps(w, _mm512_mul_ps(x, vr)); break;
      default:  // kLayerNorm
        y = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(x, vmean), vr), w);
        if (bias != nullptr) y = _mm512_add_ps(y, load(bias, i, T, m));
        break;
    }
    y = round_store<T, kCvt>(norm_out, i, y, m);
    if (y_keep != nullptr) store_f32(y_keep + i, y, m);
  }
  // (3) Per-token quantization of norm_out.
  if (y_keep != nullptr) quantize(y_keep, n, a.quant, a.quant_out, a.scale_out);
}

}  // namespace

void sum_parts_avx512(const void* const* parts, int64_t count, int64_t lo, int64_t n, RowType part_type, void* out,
                      RowType out_type, bool avx512_bf16) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = tail_mask(n - i);
    __m512 v = load(parts[0], lo + i, part_type, m);
    for (int64_t r = 1; r < count; ++r) v = _mm512_add_ps(v, load(parts[r], lo + i, part_type, m));
    if (out_type == RowType::kFloat) {
      store_f32(static_cast<float*>(out) + i, v, m);
    } else if (avx512_bf16) {
      (void)round_store<RowType::kBFloat16, true>(out, i, v, m);
    } else {
      (void)round_store<RowType::kBFloat16, false>(out, i, v, m);
    }
  }
}

void finish_row_avx512(const RowKernelArgs& a) {
  const bool bf16 = a.type == RowType::kBFloat16, bf16_parts = a.part_type == RowType::kBFloat16;
  if (bf16 && a.avx512_bf16) {
    finish_row<RowType::kBFloat16, RowType::kBFloat16, true>(a);  // bf16 rows travel as they are
  } else if (bf16) {
    finish_row<RowType::kBFloat16, RowType::kBFloat16, false>(a);
  } else if (bf16_parts) {
    finish_row<RowType::kFloat, RowType::kBFloat16, false>(a);  // float32 rows on a bf16 wire
  } else {
    finish_row<RowType::kFloat, RowType::kFloat, false>(a);
  }
}

}  // namespace tp::detail
