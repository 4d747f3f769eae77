// The portable side of the AMX row-decoded GEMM (cpu/row_decoded_gemm.h): x's packing and
// the threading; the tile loop is cpu/row_decoded_gemm_amx.cpp.

#include "cpu/row_decoded_gemm.h"

#include <algorithm>
#include <cstring>

#include "cpu/parallel.h"

namespace tp::cpu {

int64_t pair_tiles_size(int64_t m, int64_t k) { return (m + 15) / 16 * ((k + 31) / 32) * 512; }

void pack_pair_tiles(const uint16_t* x, int64_t m, int64_t k, int64_t ld, uint16_t* xb) {
  const int64_t steps = (k + 31) / 32;
  std::fill(xb, xb + pair_tiles_size(m, k), uint16_t{0});
  parallel_units(m, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* src = x + t * ld;
      uint16_t* dst = xb + (t / 16) * steps * 512 + (t % 16) * 2;
      const int64_t k2 = k / 2 * 2;
      for (int64_t c = 0; c < k2; c += 2) std::memcpy(dst + (c / 32) * 512 + ((c % 32) / 2) * 32, src + c, 4);
      if (k2 < k) dst[(k2 / 32) * 512 + ((k2 % 32) / 2) * 32] = src[k2];
    }
  });
}

void row_decoded_gemm_parallel(RowsLoop loop, const uint16_t* xb, int64_t m, const float* x_scale, int64_t x_scale_ld,
                               const RowDecodedWeight& w, float* y, int64_t ld_y) {
  if (loop == RowsLoop::kAmx) {
    parallel_rows(w.n, 32,
                  [&](int64_t n0, int64_t n1) { amx_rows_gemm(xb, m, x_scale, x_scale_ld, w, y, ld_y, n0, n1); });
    return;
  }
  parallel_rows(w.n, 24,
                [&](int64_t n0, int64_t n1) { bf16_rows_gemm(xb, m, x_scale, x_scale_ld, w, y, ld_y, n0, n1); });
}

}  // namespace tp::cpu
