#pragma once
// The INT4 kernels' loops (cpu_kernels.h), once over cpu::Vec<kIsa>: the rows kernel
// and the panel decoder. Included only by cpu_kernels_avx2.cpp and
// cpu_kernels_avx512.cpp, each compiled with its ISA's flags; everything here is in an
// anonymous namespace (cpu/vec.h says why). A panel's 16 columns are kPerPanel vectors.

#include "cpu/panel_gemm.h"
#include "cpu/vec.h"
#include "quant/int4/cpu_kernels.h"

namespace tp::detail {
namespace {

template <cpu::Isa kIsa>
using V = cpu::Vec<kIsa>;

// Scales and zero points of one vector of columns (at `meta`) in one group, as float32.
template <cpu::Isa kIsa>
typename V<kIsa>::F load_scale(const Int4CpuView& w, int64_t meta) {
  return w.scales_f16 ? V<kIsa>::widen_f16(w.scales_f16 + meta) : V<kIsa>::load(w.scales_f32 + meta);
}
template <cpu::Isa kIsa>
typename V<kIsa>::F load_zero(const Int4CpuView& w, int64_t meta) {
  return V<kIsa>::widen_u8(w.zeros + meta);
}

// Rows kernel over NP panels (NP * kPerPanel vectors of columns) for M rows. SPLIT
// accumulator sets alternate over the 8 k of a code line, to hide FMA latency when
// M * NP is small.
template <cpu::Isa kIsa, int M, int NP, int SPLIT>
void rows(const float* xs, int64_t ld_xs, const float* sum_x, int64_t ld_sum, const Int4CpuView& w, float* y,
          int64_t ld_y, int64_t p, int64_t ncols, bool prefetch) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  constexpr int L = Vf::kLanes, PV = Vf::kPerPanel, NV = NP * PV;
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const uint32_t* panel[NP];
#pragma GCC unroll 16
  for (int j = 0; j < NP; ++j) panel[j] = w.codes + (p + j) * lines * cpu::kPanelWidth;
  F out[M][NV];
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) out[r][v] = Vf::zero();
  for (int64_t g = 0; g < groups; ++g) {
    F acc[SPLIT][M][NV];
#pragma GCC unroll 16
    for (int s = 0; s < SPLIT; ++s)
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[s][r][v] = Vf::zero();
    for (int64_t b = g * lines_per_group; b < (g + 1) * lines_per_group; ++b) {
      typename Vf::I raw[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) raw[v] = Vf::load_i(panel[v / PV] + b * cpu::kPanelWidth + L * (v % PV));
      if (prefetch) {
#pragma GCC unroll 16
        for (int j = 0; j < NP; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (NP * lines + b) * cpu::kPanelWidth), _MM_HINT_T0);
      }
      const float* xk = xs + 8 * b;
#pragma GCC unroll 7
      for (int i = 0; i < 7; ++i) {
        // Nibble i, left in place: q * 16^i, exact in float32; xs carries the 16^-i.
        const auto mask = Vf::set1_i(0xF << (4 * i));
        F q[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) q[v] = Vf::to_float(Vf::and_i(raw[v], mask));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const F a = Vf::set1(xk[r * ld_xs + i]);
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) acc[i % SPLIT][r][v] = Vf::fma(q[v], a, acc[i % SPLIT][r][v]);
        }
      }
      {
        F q[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) q[v] = Vf::to_float(Vf::shift_right_i(raw[v], 28));
#pragma GCC unroll 16
        for (int r = 0; r < M; ++r) {
          const F a = Vf::set1(xk[r * ld_xs + 7]);
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) acc[7 % SPLIT][r][v] = Vf::fma(q[v], a, acc[7 % SPLIT][r][v]);
        }
      }
    }
// y += scale * (sum q x - zero * sum x).
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const int64_t meta = ((p + v / PV) * groups + g) * cpu::kPanelWidth + L * (v % PV);
      const F scale = load_scale<kIsa>(w, meta), zero = load_zero<kIsa>(w, meta);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        F a = acc[0][r][v];
#pragma GCC unroll 16
        for (int s = 1; s < SPLIT; ++s) a = Vf::add(a, acc[s][r][v]);
        a = Vf::fnma(zero, Vf::set1(sum_x[r * ld_sum + g]), a);
        out[r][v] = Vf::fma(scale, a, out[r][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const int64_t left = ncols - L * v;
      if (left >= L) {
        Vf::store(y + r * ld_y + L * v, out[r][v]);
      } else if (left > 0) {
        Vf::store_first(y + r * ld_y + L * v, out[r][v], static_cast<int>(left));
      }
    }
  }
}

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, const Int4CpuView&, float*, int64_t, int64_t,
                        int64_t, bool);

// The rows kernel over panels [p0, p1): kRows[m][np - 1] takes np panels at once, np
// up to wide[m] (the ISA's register budget: its TU's table).
template <int kMaxWide>
void rows_over_panels(const RowsFn (&kRows)[kInt4SmallM + 1][kMaxWide], const int (&wide)[kInt4SmallM + 1],
                      const float* xs, int64_t m, int64_t ld_xs, const float* sum_x, int64_t ld_sum,
                      const Int4CpuView& w, float* y, int64_t ld_y, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1;) {
    const int np = p1 - p >= wide[m] ? wide[m] : static_cast<int>(p1 - p);
    const int64_t first = cpu::kPanelWidth * p, left = w.n - first;
    const int64_t ncols = left < cpu::kPanelWidth * np ? left : cpu::kPanelWidth * np;
    kRows[m][np - 1](xs, ld_xs, sum_x, ld_sum, w, y + first, ld_y, p, ncols, p + 2 * np <= p1);
    p += np;
  }
}

// The panel decoder (cpu::PanelDecodeFn): panels [p, p + np), k in [k0, k0 + kc).
template <cpu::Isa kIsa>
void decode_panels(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf, int64_t ld_buf) {
  using Vf = V<kIsa>;
  using F = typename Vf::F;
  constexpr int L = Vf::kLanes;
  const auto& w = *static_cast<const Int4CpuView*>(view);
  const int64_t lines = w.k / 8, groups = w.k / w.group, lines_per_group = w.group / 8;
  const int64_t b_end = (k0 + kc) / 8;
  for (int64_t j = 0; j < np; ++j) {
    const uint32_t* panel = w.codes + (p + j) * lines * cpu::kPanelWidth;
    for (int64_t h = 0; h < Vf::kPerPanel; ++h) {
      float* col = buf + cpu::kPanelWidth * j + L * h;
      for (int64_t b0 = k0 / 8; b0 < b_end;) {
        const int64_t g = b0 / lines_per_group,
                      b1 = (g + 1) * lines_per_group < b_end ? (g + 1) * lines_per_group : b_end;
        const int64_t meta = ((p + j) * groups + g) * cpu::kPanelWidth + L * h;
        const F scale = load_scale<kIsa>(w, meta), zero = load_zero<kIsa>(w, meta);
        if (w.scales_f16) {
          // Finite float16 scales (int4_cpu_pack checks): (q - zero) * scale is exact in
          // float32 (at most 8 + 11 significant bits), and so is every term of
          //   q 16^i * (scale 16^-i) - zero * scale
          // which one FMA computes from the nibble masked in place: the same value as
          // tp::dequantize_weight's, in 4 instructions instead of 6.
          F s[8];
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i)
            s[i] = Vf::mul(scale, Vf::set1(i == 7 ? 1.0f : 1.0f / static_cast<float>(1 << (4 * i))));
          const F minus_zs = Vf::sub(Vf::zero(), Vf::mul(zero, scale));
          for (int64_t b = b0; b < b1; ++b) {
            const auto raw = Vf::load_i(panel + b * cpu::kPanelWidth + L * h);
            float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 7
            for (int i = 0; i < 7; ++i) {
              const F q = Vf::to_float(Vf::and_i(raw, Vf::set1_i(0xF << (4 * i))));
              Vf::store(out + i * ld_buf, Vf::fma(q, s[i], minus_zs));
            }
            const F q = Vf::to_float(Vf::shift_right_i(raw, 28));
            Vf::store(out + 7 * ld_buf, Vf::fma(q, s[7], minus_zs));
          }
        } else {
          const auto low4 = Vf::set1_i(15);
          for (int64_t b = b0; b < b1; ++b) {
            const auto raw = Vf::load_i(panel + b * cpu::kPanelWidth + L * h);
            float* out = col + (8 * b - k0) * ld_buf;
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
              const F q = Vf::to_float(Vf::and_i(Vf::shift_right_i(raw, 4 * i), low4));
              // (q - zero) * scale, as tp::dequantize_weight computes it.
              Vf::store(out + i * ld_buf, Vf::mul(Vf::sub(q, zero), scale));
            }
          }
        }
        b0 = b1;
      }
    }
  }
}

}  // namespace
}  // namespace tp::detail
