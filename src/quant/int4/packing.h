#pragma once
// Private: the two INT4 checkpoint packings and the zero-point conventions.
//
// A weight W [N, K] = [out_features, in_features] is stored as 4-bit codes q in
// 0..15, one scale and one zero point per group of g consecutive in_features
// (g = QuantConfig::group_size) and output column:
//     W[n, k] = (q[n, k] - zero[k / g, n]) * scale[k / g, n]
// Eight codes share one int32 ("word"); nibble i occupies bits 4i..4i+3.
//
// GPTQ (AutoGPTQ / vLLM "gptq", checkpoint format v1):
//   qweight i32 [K/8, N]    packed along K: nibble i of qweight[j, n] is q[n, 8j + i]
//   qzeros  i32 [K/g, N/8]  packed along N: nibble i of qzeros[G, c] is zero[G, 8c + i] - 1
//   scales  f16 [K/g, N]
//   g_idx   i32 [K]         optional; only the trivial k / g is accepted (act-order
//                           checkpoints reorder K and are refused)
//   The v1 convention stores zero - 1 (a historical off-by-one kept by every GPTQ
//   checkpoint): symmetric checkpoints store 7 for the zero point 8. Reading adds 1
//   back, so a stored nibble 15 reads as 16; writing clamps the zero point to 1..15
//   (a zero point of 0 is not representable in v1).
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

#include <cstdint>

#include <ATen/core/Tensor.h>

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
  at::Tensor zero;   // f32 [K/g, N], the zero point in code units (GPTQ: stored + 1)
};

/// Unpacks GPTQ (awq = false) or AWQ (awq = true) tensors; shapes must be consistent
/// (checked, naming the tensor).
Int4Unpacked unpack_gptq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales);
Int4Unpacked unpack_awq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales);

/// Dequantized float32 [N, K] weight of an unpacked checkpoint with group size g.
at::Tensor dequantize_unpacked(const Int4Unpacked& u, int64_t group_size);

}  // namespace tp::detail
