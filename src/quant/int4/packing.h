#pragma once
// Private: the three INT4 checkpoint packings and their zero-point conventions
// (docs/checkpoint_formats.md, sections 3-5, has the producers' own description).
//
// A weight W [N, K] = [out_features, in_features] is stored as 4-bit codes q in
// 0..15, one scale and one zero point per group of g consecutive in_features
// (g = QuantConfig::group_size) and output column:
//     W[n, k] = (q[n, k] - zero[k / g, n]) * scale[k / g, n]
// Eight codes share one int32 ("word"); nibble i occupies bits 4i..4i+3.
//
// GPTQ (AutoGPTQ / GPTQModel / vLLM "gptq"):
//   qweight i32 [K/8, N]    packed along K: nibble i of qweight[j, n] is q[n, 8j + i]
//   qzeros  i32 [K/g, N/8]  packed along N: nibble i of qzeros[G, c] is zero[G, 8c + i] - 1 (v1)
//                           or zero[G, 8c + i] (v2)
//   scales  f16 [K/g, N]
//   g_idx   i32 [K]         optional; only the trivial k / g is accepted (act-order
//                           checkpoints reorder K and are refused)
//   checkpoint_format "gptq" (v1, GptqFormat::kV1) stores zero - 1 (a historical
//   off-by-one): symmetric checkpoints store 7 for the zero point 8. Reading adds 1
//   back, so a stored nibble 15 reads as 16; writing clamps the zero point to 1..15
//   (a zero point of 0 is not representable in v1). "gptq_v2" (GptqFormat::kV2)
//   stores the zero point as is (symmetric: 8); nothing else differs.
//
// AWQ (AutoAWQ "gemm" / vLLM "awq"):
//   qweight i32 [K, N/8]    packed along N in AWQ nibble order: nibble i of
//                           qweight[k, c] is q[8c + kAwqOrder[i], k], with
//                           kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7}
//   qzeros  i32 [K/g, N/8]  packed along N in the same order, zero stored as is
//                           (symmetric: 8)
//   scales  f16 [K/g, N]
//
// Both store [K, N]-oriented tensors (the transpose of the [out, in] convention),
// so every tensor loads with flip_tp (docs/DESIGN.md §3 Loading).
//
// compressed-tensors pack-quantized (llm-compressor W4A16 / W4A16_ASYM):
//   weight_packed     i32 [N, K/8]    packed along K: nibble i of weight_packed[n, j] is
//                                     u[n, 8j + i], offset binary: the signed code is u - 8
//   weight_scale      float [N, K/g]  (the model's dtype: bfloat16, float16 or float32)
//   weight_zero_point i32 [N/8, K/g]  asymmetric only; packed along N: nibble i of
//                                     [r, G] is uz[8r + i, G], offset binary (zp = uz - 8)
//   weight_shape      i64 [2]         [N, K]
//   W = ((u - 8) - (uz - 8)) * s = (u - uz) * s: the codes are u, the zero point uz
//   (8 when symmetric), which is GPTQ v2 transposed. [N, K]-oriented: no flip_tp.
//   compressed-tensors allows K not a multiple of 8 (the last word padded, the true K
//   in weight_shape); the groups tp takes (32, 64, 128) make K a multiple of 8.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tp/quant/quant_config.h"

namespace tp::detail {

/// Nibble i of an AWQ word holds column kAwqOrder[i] of its group of eight.
inline constexpr int64_t kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/// Packs codes (any integer dtype, values 0..15) along `dim` (its size a multiple of
/// 8) into int32 words, nibble i = element 8j + i (or, with `awq_order`, element
/// 8j + kAwqOrder[i]). The result has size/8 along `dim`.
at::Tensor pack_int4(const at::Tensor& codes, int64_t dim, bool awq_order = false);

/// The inverse of pack_int4: int32 words -> int32 codes 0..15, 8x longer along `dim`.
at::Tensor unpack_int4(const at::Tensor& words, int64_t dim, bool awq_order = false);

/// What a checkpoint stores, unpacked to the logical [N, K] view.
struct Int4Unpacked {
  at::Tensor codes;  // i32 [N, K], 0..15
  at::Tensor scale;  // f32 [K/g, N]
  at::Tensor zero;   // f32 [K/g, N], the zero point in code units (GPTQ v1: stored + 1)
};

/// Unpacks GPTQ or AWQ tensors; shapes must be consistent (checked, naming the tensor).
Int4Unpacked unpack_gptq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                         GptqFormat format);
Int4Unpacked unpack_awq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales);
/// Unpacks compressed-tensors pack-quantized tensors; `weight_zero_point` undefined
/// for a symmetric checkpoint (zero point 8). The scale is converted to float32.
Int4Unpacked unpack_pack_quantized(const at::Tensor& weight_packed, const at::Tensor& weight_zero_point,
                                   const at::Tensor& weight_scale);

/// Dequantized float32 [N, K] weight of an unpacked checkpoint with group size g.
at::Tensor dequantize_unpacked(const Int4Unpacked& u, int64_t group_size);

}  // namespace tp::detail
