#pragma once
// One row of all_reduce_fusion's CPU epilogue as a plain call, for the per-ISA kernels
// (fusion_row_kernel_avx512.cpp): nothing here includes c10 or the standard library's
// templates, so the AVX-512 translation unit shares no inline function with the rest
// of libtp (the linker could otherwise keep its AVX-512 copy for every caller).
// FusionRows (fusion_rows.h) fills it in and chooses the kernel; the portable loops in
// fusion_rows.cpp are the reference these kernels equal bit for bit.
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

}  // namespace tp::detail
