// Invariant numerics' canonical GEMM on AVX-512 (cpu/invariant_rows.h): the steps of the
// panel microkernel path - per chunk, one accumulator per (row, column) that starts at zero
// and takes each k's product as one fused multiply-add in k order, then the chunks merged
// in the dyadic tree by the same binary counter - so the same bits, with the work arranged
// around those FMA chains: rows 4 at a time against G panels side by side (G x 4
// independent chains cover the FMA latency that one 16-column chain per row leaves
// exposed), the G panels' weights reread from L2 by each block of rows, bf16 weights
// widened in registers instead of through a buffer, and the tree's partial sums in a
// small stack of G panels' width instead of vectors moved per chunk. Its cost against the
// default numerics, before and after: benchmarks/RESULTS.md, 2026-12-07, "issue 45".

// GCC 12 warns about _mm512_undefined_ps() inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "cpu/invariant_rows.h"

// No templates or inline functions shared with other translation units here (no
// std::min, no c10 checks): the linker could keep this file's AVX-512 copy of one for
// every caller. Everything local is in the anonymous namespace.

namespace tp::cpu {
namespace {

constexpr int64_t kWidth = 16;  // kPanelWidth

__m512 load_weight(const void* panels, int64_t at, bool bf16) {
  if (!bf16) return _mm512_load_ps(static_cast<const float*>(panels) + at);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(panels) + at));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One chunk of G panels for M rows: acc[row][g] over k in [k0, k0 + kc), stored to dst
// ([M][G * 16]).
template <int M, int G>
void chunk_tile(const float* a, int64_t lda, const void* panels, bool bf16, int64_t r, int64_t p0, int64_t k0,
                int64_t kc, float* dst) {
  __m512 acc[M][G];
#pragma GCC unroll 8
  for (int row = 0; row < M; ++row)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[row][g] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const int64_t k = k0 + kk;
    __m512 w[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) w[g] = load_weight(panels, ((p0 + g) * r + k) * kWidth, bf16);
#pragma GCC unroll 8
    for (int row = 0; row < M; ++row) {
      const __m512 x = _mm512_set1_ps(a[row * lda + k]);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[row][g] = _mm512_fmadd_ps(x, w[g], acc[row][g]);
    }
  }
#pragma GCC unroll 8
  for (int row = 0; row < M; ++row)
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(dst + (row * G + g) * kWidth, acc[row][g]);
}

using ChunkFn = void (*)(const float*, int64_t, const void*, bool, int64_t, int64_t, int64_t, int64_t, float*);

// Panels at a time per row count: M x G accumulators, at most 16 of the 32 registers
// (invariant_rows.h's scratch is sized for G <= kMaxRowsGroup).
constexpr int64_t kGroup[5] = {0, 8, 8, 4, 4};

ChunkFn chunk_fn(int64_t m, int64_t g) {
  static constexpr ChunkFn k1[9] = {nullptr,          chunk_tile<1, 1>, chunk_tile<1, 2>,
                                    chunk_tile<1, 3>, chunk_tile<1, 4>, chunk_tile<1, 5>,
                                    chunk_tile<1, 6>, chunk_tile<1, 7>, chunk_tile<1, 8>};
  static constexpr ChunkFn k2[9] = {nullptr,          chunk_tile<2, 1>, chunk_tile<2, 2>,
                                    chunk_tile<2, 3>, chunk_tile<2, 4>, chunk_tile<2, 5>,
                                    chunk_tile<2, 6>, chunk_tile<2, 7>, chunk_tile<2, 8>};
  static constexpr ChunkFn k3[5] = {nullptr, chunk_tile<3, 1>, chunk_tile<3, 2>, chunk_tile<3, 3>, chunk_tile<3, 4>};
  static constexpr ChunkFn k4[5] = {nullptr, chunk_tile<4, 1>, chunk_tile<4, 2>, chunk_tile<4, 3>, chunk_tile<4, 4>};
  switch (m) {
    case 1: return k1[g];
    case 2: return k2[g];
    case 3: return k3[g];
    default: return k4[g];
  }
}

}  // namespace

int64_t invariant_rows_avx512(const InvariantRowsArgs& args, int64_t p0, int64_t p1, float* scratch, int64_t* lo,
                              int64_t* size) {
  const int64_t m = args.m, n = args.n, r = args.r, chunk = args.chunk;
  // Rows in blocks of up to 4, each block over the same G panels while they are still in
  // L2 (G x r weights: 512 KiB of bf16 at r = 4096, G = 8); a row's value never depends on
  // the other rows, so the blocks give the bits of one pass.
  const int64_t group = kGroup[m < 4 ? m : 4];
  const int64_t chunks = (r + chunk - 1) / chunk;
  int64_t depth = 0;
  for (int64_t q0 = p0; q0 < p1; q0 += group) {
    const int64_t g = p1 - q0 < group ? p1 - q0 : group;
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
      const int64_t mb = m - r0 < 4 ? m - r0 : 4;
      const int64_t tile = mb * g * kWidth;  // floats of one stack entry: [mb][g * 16]
      const ChunkFn fn = chunk_fn(mb, g);
      const float* a = args.a + r0 * args.lda;
      // The binary counter over chunks (invariant_gemm.cpp's): entry i covers chunks
      // [lo[i], lo[i] + size[i]); a right sibling that completes a pair is added into its
      // left one (left + right, elementwise), so the entries end as dyadic_pieces.
      depth = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t k0 = c * chunk, kc = r - k0 < chunk ? r - k0 : chunk;
        fn(a, args.lda, args.panels, args.bf16, r, q0, k0, kc, scratch + depth * tile);
        lo[depth] = args.first_chunk + c;
        size[depth] = 1;
        ++depth;
        while (depth >= 2 && size[depth - 2] == size[depth - 1] && lo[depth - 2] % (2 * size[depth - 2]) == 0) {
          float* left = scratch + (depth - 2) * tile;
          const float* right = scratch + (depth - 1) * tile;
          for (int64_t i = 0; i < tile; i += kWidth)
            _mm512_storeu_ps(left + i, _mm512_add_ps(_mm512_loadu_ps(left + i), _mm512_loadu_ps(right + i)));
          size[depth - 2] *= 2;
          --depth;
        }
      }
      // Entry i is piece i: out[i][row][the columns of panels q0 .. q0 + g that are below n].
      for (int64_t i = 0; i < depth; ++i) {
        for (int64_t row = 0; row < mb; ++row) {
          for (int64_t j = 0; j < g; ++j) {
            const int64_t col0 = (q0 + j) * kWidth;
            const int64_t cols = n - col0 < kWidth ? n - col0 : kWidth;
            const float* src = scratch + i * tile + (row * g + j) * kWidth;
            float* dst = args.out + (i * m + r0 + row) * n + col0;
            _mm512_mask_storeu_ps(dst, static_cast<__mmask16>((1u << cols) - 1u), _mm512_loadu_ps(src));
          }
        }
      }
    }
  }
  return depth;
}

}  // namespace tp::cpu
