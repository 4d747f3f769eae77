#pragma once
// Private: invariant_gemm_pieces (cpu/invariant_gemm.h) on AVX-512, rows 4 at a time: the
// same bits as its panel-microkernel path (invariant_rows_avx512.cpp says how). Plain
// arguments only: the AVX-512 translation unit includes nothing it could share an inline
// function through.

#include <cstdint>

namespace tp::cpu {

struct InvariantRowsArgs {
  const float* a = nullptr;  // [m, r] float32, row stride lda
  int64_t m = 0;             // rows, any number (4 at a time)
  int64_t lda = 0;
  const void* panels = nullptr;  // invariant_pack's [panels, r, 16], float32 or bfloat16
  bool bf16 = false;
  int64_t r = 0;  // the local reduction length
  int64_t n = 0;  // columns
  int64_t first_chunk = 0;
  int64_t chunk = 0;
  float* out = nullptr;  // [pieces, m, n]
};

/// The most panels the kernel takes side by side.
inline constexpr int64_t kMaxRowsGroup = 8;

/// Panels [p0, p1) of the pieces. `scratch`: levels x 4 x kMaxRowsGroup x 16 floats, with
/// levels = 2 + log2(chunks) (the counter's depth); `lo` / `size`: levels entries each.
/// Returns the number of pieces (the counter's final depth).
int64_t invariant_rows_avx512(const InvariantRowsArgs& args, int64_t p0, int64_t p1, float* scratch, int64_t* lo,
                              int64_t* size);

}  // namespace tp::cpu
