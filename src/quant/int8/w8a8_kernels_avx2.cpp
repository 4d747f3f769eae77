// The W8A8 kernels (w8a8_kernels_body.h) built for AVX2 + FMA + F16C: a ymm holds a
// chunk of 32 bytes of a row; the VNNI path (AVX-VNNI) carries its own target and runs
// only where the CPU has it. The tables are this ISA's register budget: 16 ymm take 4
// weight rows at M = 1, 3 x 2 (sign) or 4 x 3 (VNNI) tiles otherwise.

#include "quant/int8/w8a8_kernels_body.h"

namespace tp::detail {
namespace {

constexpr cpu::Isa kIsa = cpu::Isa::kAvx2;

// The microkernel of each (mr, nr) a path uses: mr 1..4, nr 1..4.
template <template <int, int> class K>
constexpr MicroFn kTiles[4][4] = {
    {K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn, K<1, 4>::fn},
    {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn, K<2, 4>::fn},
    {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn, K<3, 4>::fn},
    {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn, K<4, 4>::fn},
};
// M = 1: four weight rows per pass over x; otherwise 3 x rows x 2 weight rows (6
// accumulators, the |w| and w of each row, ones and temporaries: 4 x 2 spills).
constexpr Shape kSignShape = {4, 3, 2};
// 4 x 3: 12 accumulators, 3 weight vectors, one x vector.
constexpr Shape kVnniShape = {4, 4, 3};

}  // namespace

void w8a8_gemm_avx2(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                    float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  gemm<kIsa>(kTiles<Sign<kIsa>::At>, kSignShape, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1);
}

void w8a8_gemm_avx2_vnni(const uint8_t* xp, int64_t m, int64_t ld_xp, const float* x_scale, const W8a8WeightView& w,
                         float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  gemm<kIsa>(kTiles<Vnni<kIsa>::At>, kVnniShape, xp, m, ld_xp, x_scale, w, y, ld_y, n0, n1);
}

}  // namespace tp::detail
