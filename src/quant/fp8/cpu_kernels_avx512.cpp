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
