#pragma once
// The shared-memory strategies' vector kernels as plain calls: the sum over the ranks'
// buffers (ShmAllReduce::sum_ranks) and the fused boundary's row epilogue (FusionRows::
// finish, which the composed path calls too). Nothing here includes c10 or the standard
// library's templates, so the AVX-512 translation unit (shm_kernels_avx512.cpp) shares no
// inline function with the rest of libtp (the linker could otherwise keep its AVX-512
// copy for every caller). The callers choose the kernel at run time (cpu::isa()); their
// portable loops are the reference these kernels equal bit for bit.
// Private to the comm area.

#include <cstdint>

namespace tp::detail {

/// The element types the kernels read and write.
enum class RowType : int32_t { kFloat, kBFloat16 };
/// AllReduceFusionNorm / AllReduceFusionQuant, spelled without the public header.
enum class RowNorm : int32_t { kNone, kRMS, kRMSUnitOffset, kRMSScaleFirst, kLayerNorm };
enum class RowQuant : int32_t { kNone, kFp8PerToken, kInt8PerToken };

/// One row: its sum over ranks is parts[0] + ... + parts[count - 1], added in fp32 in
/// that order (the shared-memory strategies' order); every pointer is already at the row.
struct RowKernelArgs {
  int64_t hidden = 0;
  RowType type = RowType::kFloat;       // T: residual, norm weight / bias, outputs
  RowType part_type = RowType::kFloat;  // the parts (bf16 on a bf16 wire of float32 inputs)
  RowNorm norm = RowNorm::kNone;
  RowQuant quant = RowQuant::kNone;
  float eps = 0;
  const void* const* parts = nullptr;
  int64_t count = 0;
  const void* residual_in = nullptr;  // or null
  const void* norm_weight = nullptr;
  const void* norm_bias = nullptr;  // or null
  void* residual_out = nullptr;
  void* norm_out = nullptr;
  void* quant_out = nullptr;
  float* scale_out = nullptr;
  /// The CPU has avx512_bf16 (VCVTNEPS2BF16 rounds the bf16 rows).
  bool avx512_bf16 = false;
  /// Two fp32 scratch rows of `hidden` elements (the caller's thread-local buffers).
  float* scratch_h = nullptr;
  float* scratch_y = nullptr;
};

/// The AVX-512 (F, BW, VL, DQ) row epilogue; entered only where cpu::isa() says so.
void finish_row_avx512(const RowKernelArgs& a);

/// out[i] = parts[0][lo + i] + ... + parts[count - 1][lo + i] for i < n, added in fp32 in
/// that order and rounded to out_type (bfloat16: to nearest even, NaN -> 0x7fc0, as
/// c10::BFloat16(float)); AVX-512, with VCVTNEPS2BF16 where `avx512_bf16`.
void sum_parts_avx512(const void* const* parts, int64_t count, int64_t lo, int64_t n, RowType part_type, void* out,
                      RowType out_type, bool avx512_bf16);

}  // namespace tp::detail
