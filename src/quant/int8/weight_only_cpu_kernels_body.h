#pragma once
// The int8_weight_only kernels' loops (weight_only_cpu_kernels.h) over the [N, K]
// weight, once over cpu::Vec<kIsa>: the rows kernel (dot-product form, kLanes k per
// vector) and the panel decoder (16 rows x 16 k of bytes transposed with SSE2 unpacks,
// then widened to a panel row of kPerPanel float32 vectors per k). Included only by
// weight_only_cpu_kernels_avx2.cpp and weight_only_cpu_kernels_avx512.cpp, each
// compiled with its ISA's flags; everything here is in an anonymous namespace
// (cpu/vec.h says why).

#include "cpu/panel_gemm.h"
#include "cpu/vec.h"
#include "quant/int8/weight_only_cpu_kernels.h"

namespace tp::detail {
namespace {

template <cpu::Isa kIsa>
using V = cpu::Vec<kIsa>;

// Rows kernel: weight rows [n0, n0 + R) against M rows of x, all of K. Cost at M = 1
// (AVX-512, R = 8), per 16 k of a row: VPMOVSXBD + VCVTDQ2PS + FMA, and x's vector shared by
// the 8 rows: ~3.1, ~6.25 instructions per 32 weights for their 32 bytes (a bf16 decode for
// VDPBF16PS, two nibble lookups per byte, costs the same): below a core's ~4 bytes a cycle
// of DRAM (benchmarks/RESULTS.md, 2026-12-07, issue 47 part 3).
// `prefetch`: rows n0 + R .. n0 + 2R - 1 exist, and each 64-byte line of theirs is asked
// for while the same line of these rows is used: a row is its own page (or pages) at the
// usual K, and the hardware prefetchers stop at page boundaries.
template <cpu::Isa kIsa, int M, int R>
void rows(const float* x, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y, int64_t n0, bool prefetch) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  constexpr int L = Vf::kLanes;
  const int64_t k = w.k;
  const int8_t* row[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n0 + r) * k;
  F acc[M][R];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[m][r] = Vf::zero();
  // k in [kk, kk + n), n <= L: the codes sign-extended and converted (exact).
  const auto step = [&](int64_t kk, int n) {
    F xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = n == L ? Vf::load(x + m * ld_x + kk) : Vf::load_first(x + m * ld_x + kk, n);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const F q = n == L ? Vf::widen_i8(row[r] + kk) : Vf::widen_i8_first(row[r] + kk, n);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[m][r] = Vf::fma(q, xv[m], acc[m][r]);
    }
  };
  int64_t kk = 0;
  if (prefetch) {
    for (; kk + 64 <= k; kk += 64) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + R * k + kk), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int s = 0; s < 64; s += L) step(kk + s, L);
    }
  }
  for (; kk + L <= k; kk += L) step(kk, L);
  // The K tail: where loads can be masked (AVX-512), one more step of the lanes (zeros
  // past K); else (AVX2) after the lanes are summed, one k at a time.
  if constexpr (Vf::kMaskedTail) {
    if (kk < k) step(kk, static_cast<int>(k - kk));
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float sum = Vf::reduce(acc[m][r]);
      if constexpr (!Vf::kMaskedTail) {
        for (int64_t t = kk; t < k; ++t) sum += static_cast<float>(row[r][t]) * x[m * ld_x + t];
      }
      y[m * ld_y + n0 + r] = w.scales[n0 + r] * sum;
    }
  }
}

using RowsFn = void (*)(const float*, int64_t, const Int8WoCpuView&, float*, int64_t, int64_t, bool);

// The kernels for single leftover rows.
template <cpu::Isa kIsa>
constexpr RowsFn kOne[kInt8WoSmallM + 1] = {nullptr, rows<kIsa, 1, 1>, rows<kIsa, 2, 1>, rows<kIsa, 3, 1>,
                                            rows<kIsa, 4, 1>};

// The rows kernel over panels [p0, p1): kFull[m] takes kBlock[m] weight rows at once
// (M * R accumulators: the ISA's register budget, its TU's table), kOne the rest.
template <cpu::Isa kIsa>
void rows_over_panels(const int (&kBlock)[kInt8WoSmallM + 1], const RowsFn (&kFull)[kInt8WoSmallM + 1], const float* x,
                      int64_t m, int64_t ld_x, const Int8WoCpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  const int64_t n1 = p1 * cpu::kPanelWidth < w.n ? p1 * cpu::kPanelWidth : w.n;
  const int block = kBlock[m];
  int64_t n = p0 * cpu::kPanelWidth;
  for (; n + block <= n1; n += block) kFull[m](x, ld_x, w, y, ld_y, n, n + 2 * block <= n1);
  for (; n < n1; ++n) kOne<kIsa>[m](x, ld_x, w, y, ld_y, n, false);
}

// The 16 x 16 byte transpose: v[j] holds 16 k of row j; afterwards t[kk] holds k = kk
// of rows 0..15. Four rounds of SSE2 unpacks (bytes, words, dwords, qwords).
void transpose16(const __m128i v[16], __m128i t[16]) {
  __m128i a[16], b[16], c[16];
  for (int i = 0; i < 8; ++i) {  // row pairs: 16-bit units (2i, 2i + 1), k 0..7 | 8..15
    a[i] = _mm_unpacklo_epi8(v[2 * i], v[2 * i + 1]);
    a[i + 8] = _mm_unpackhi_epi8(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {                                     // row quads: 32-bit units, k in groups of 4
    b[4 * i + 0] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);      // k 0..3
    b[4 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);      // k 4..7
    b[4 * i + 2] = _mm_unpacklo_epi16(a[2 * i + 8], a[2 * i + 9]);  // k 8..11
    b[4 * i + 3] = _mm_unpackhi_epi16(a[2 * i + 8], a[2 * i + 9]);  // k 12..15
  }
  for (int i = 0; i < 2; ++i) {  // row octets: 64-bit units, k in pairs
    for (int g = 0; g < 4; ++g) {
      c[8 * i + 2 * g] = _mm_unpacklo_epi32(b[8 * i + g], b[8 * i + 4 + g]);      // k 4g, 4g + 1
      c[8 * i + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * i + g], b[8 * i + 4 + g]);  // k 4g + 2, 4g + 3
    }
  }
  for (int d = 0; d < 8; ++d) {  // all 16 rows, one k each
    t[2 * d] = _mm_unpacklo_epi64(c[d], c[8 + d]);
    t[2 * d + 1] = _mm_unpackhi_epi64(c[d], c[8 + d]);
  }
}

// The panel decoder (cpu::PanelDecodeFn): panels [p, p + np), k in [k0, k0 + kc).
template <cpu::Isa kIsa>
void decode_panels(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  constexpr int L = Vf::kLanes, PV = Vf::kPerPanel;
  static_assert(PV <= 2, "a panel row of codes is one __m128i: vector h widens its bytes 8 h..");
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  const int64_t k16 = kc / 16 * 16;
  for (int64_t j = 0; j < np; ++j) {
    const int64_t first = (p + j) * cpu::kPanelWidth;
    // Rows past N read row `first` again: their scale is 0 and the GEMM never stores
    // their columns.
    const int8_t* row[cpu::kPanelWidth];
    for (int64_t r = 0; r < cpu::kPanelWidth; ++r) row[r] = w.codes + (first + r < w.n ? first + r : first) * w.k + k0;
    F s[PV];
#pragma GCC unroll 2
    for (int h = 0; h < PV; ++h) s[h] = Vf::load(w.scales + first + L * h);
    float* col = buf + cpu::kPanelWidth * j;
    for (int64_t kk = 0; kk < k16; kk += 16) {
      __m128i v[16], t[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + kk));
      transpose16(v, t);
      for (int i = 0; i < 16; ++i) {
        // float32(q) * scale, as tp::dequantize_weight computes it.
        float* out = col + (kk + i) * ld_buf;
#pragma GCC unroll 2
        for (int h = 0; h < PV; ++h)
          Vf::store(out + L * h, Vf::mul(Vf::widen_i8(h == 0 ? t[i] : _mm_srli_si128(t[i], 8)), s[h]));
      }
    }
    for (int64_t kk = k16; kk < kc; ++kk) {
      for (int r = 0; r < 16; ++r) col[kk * ld_buf + r] = static_cast<float>(row[r][kk]) * w.scales[first + r];
    }
  }
}

}  // namespace
}  // namespace tp::detail
