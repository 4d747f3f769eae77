// The W8A8 kernels (w8a8_kernels_body.h) built for AVX-512 (F + BW; VNNI in the flags,
// its path entered only where the CPU has AVX512_VNNI): a zmm holds a chunk of 64 bytes
// of a row. The tables are this ISA's register budget: 32 zmm take 8 weight rows at
// M = 1, 4 x 4 tiles otherwise (the table also holds 4 x 6, which GCC 12 spills).

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "quant/int8/w8a8_kernels_body.h"

namespace tp::detail {
namespace {

constexpr cpu::Isa kIsa = cpu::Isa::kAvx512;

// The microkernel of each (mr, nr) a path uses: 1 x 1..8 (M = 1), 2..4 x 1..6.
template <template <int, int> class K>
constexpr MicroFn kTiles[4][8] = {
    {K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn, K<1, 4>::fn, K<1, 5>::fn, K<1, 6>::fn, K<1, 7>::fn, K<1, 8>::fn},
    {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn, K<2, 4>::fn, K<2, 5>::fn, K<2, 6>::fn, nullptr, nullptr},
    {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn, K<3, 4>::fn, K<3, 5>::fn, K<3, 6>::fn, nullptr, nullptr},
    {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn, K<4, 4>::fn, K<4, 5>::fn, K<4, 6>::fn, nullptr, nullptr},
};
// M = 1: eight weight rows per pass over x; otherwise 4 x rows x 4 weight rows
// (16 accumulators, 4 |w|, 4 sign masks).
constexpr Shape kSignShape = {8, 4, 4};
// 4 x 4: 16 accumulators (GCC 12 compiles 4 x 6 with a store per vpdpbusd, which is
// slower: benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes").
constexpr Shape kVnniShape = {8, 4, 4};

}  // namespace

void w8a8_gemm_avx512(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  gemm<kIsa>(kTiles<Sign<kIsa>::At>, kSignShape, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1);
}

void w8a8_gemm_avx512_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                           float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  gemm<kIsa>(kTiles<Vnni<kIsa>::At>, kVnniShape, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1);
}

}  // namespace tp::detail
