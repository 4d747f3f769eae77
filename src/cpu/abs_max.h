#pragma once
// at::amax(x.abs()) over one span of float32, as the activation quantizations of several
// formats (FP8's per-token and per-group scales, W8A8's per-token one) and the fused
// boundary's quant_out need it, bit for bit: NaN if any element is NaN. Computed on the
// magnitudes' bits (non-NaN magnitudes order as their bit patterns) so that the loop
// vectorizes: under the default -ftrapping-math GCC does not if-convert a float comparison.

#include <c10/util/bit_cast.h>

#include <cstdint>
#include <limits>

namespace tp::cpu {

inline float abs_max(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = c10::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : c10::bit_cast<float>(m);
}

}  // namespace tp::cpu
