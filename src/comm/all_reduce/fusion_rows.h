#pragma once
// The epilogue of all_reduce_fusion on CPU, one row (token) at a time: from the ranks'
// partial sums to residual_out, norm_out, quant_out and scale_out. The shared-memory
// strategies call it in the pass that sums the peers' buffers; the composed fallback
// calls it after its all-reduce, so both give the same bits for the same sum.
// Private to the comm area.

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "tp/comm/all_reduce_fusion.h"

namespace tp::detail {

/// One fused call's rows, over raw CPU pointers (all contiguous, row-major, `hidden`
/// elements a row; T is `dtype`: float32, bfloat16 or float16).
struct FusionRows {
  int64_t rows = 0;
  int64_t hidden = 0;
  c10::ScalarType dtype = c10::kFloat;
  AllReduceFusionNorm norm = AllReduceFusionNorm::kNone;
  AllReduceFusionQuant quant = AllReduceFusionQuant::kNone;
  float eps = 0;
  const void* residual_in = nullptr;  // [rows, hidden] T, or null
  const void* norm_weight = nullptr;  // [hidden] T (a norm only)
  const void* norm_bias = nullptr;    // [hidden] T, or null (kLayerNorm only)
  void* residual_out = nullptr;       // [rows, hidden] T
  void* norm_out = nullptr;           // [rows, hidden] T (a norm only)
  void* quant_out = nullptr;          // [rows, hidden] 1-byte codes (a quant only)
  float* scale_out = nullptr;         // [rows] (a quant only)

  /// Finishes row `row` from its sum over ranks, parts[0] + ... + parts[count - 1] added
  /// in fp32 in that order (each part that row's [hidden] elements of `part_dtype`:
  /// `dtype`, or bfloat16 on a bf16 wire): rounds the sum to T, adds residual_in (the sum
  /// rounded to T), normalizes and quantizes. (The bias has joined rank 0's partial sum
  /// before the reduction: fusion.cpp.) On AVX-512 (cpu::isa()) float32 and bfloat16 rows
  /// take shm_kernels_avx512.cpp, bit for bit finish_portable.
  void finish(int64_t row, const void* const* parts, int64_t count, c10::ScalarType part_dtype) const;
  /// The same in the portable loops, whatever the CPU (the reference the kernels equal).
  void finish_portable(int64_t row, const void* const* parts, int64_t count, c10::ScalarType part_dtype) const;

  /// Bytes a finished row's outputs take packed (residual_out, norm_out, codes, scale),
  /// a multiple of 64 so rows finished by different ranks never share a cache line.
  int64_t packed_row_bytes() const;
  /// Copies row `row`'s finished outputs into `dst` (packed_row_bytes() bytes) ...
  void pack(int64_t row, void* dst) const;
  /// ... and back, into this rank's outputs.
  void unpack(int64_t row, const void* src) const;
};

}  // namespace tp::detail
