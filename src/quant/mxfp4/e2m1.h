#pragma once
// E2M1, the 4-bit float both FP4 formats store (MXFP4 here, NVFP4 in quant/nvfp4/): one
// sign bit (bit 3), two exponent bits, one mantissa bit; codes 0..7 are 0, 0.5, 1, 1.5,
// 2, 3, 4, 6 and 8..15 their negatives. Two codes a byte, element 2i in the low nibble.

#include <ATen/core/Tensor.h>

namespace tp::detail {

/// The value of each code, for the CPU decoders.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/// The same table as a float32 tensor [16] (the ATen models index it).
at::Tensor e2m1_table();

/// The code of the E2M1 value nearest each element of `v` (any float tensor; |v| above 6
/// saturates to 6), ties to the even code, the sign bit set for negative values; int32.
at::Tensor e2m1_round(const at::Tensor& v);

/// int codes [..., 2j] -> uint8 bytes [..., j], element 2i in the low nibble.
at::Tensor e2m1_pack(const at::Tensor& codes);

/// uint8 bytes [..., j] -> int64 codes [..., 2j] (e2m1_pack's inverse).
at::Tensor e2m1_unpack(const at::Tensor& bytes);

}  // namespace tp::detail
