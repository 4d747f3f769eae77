// The FP8 weight's row decoder for the AMX row-decoded GEMM (cpu/amx_rows_gemm.h;
// cpu_kernels.h: fp8_linear_amx), compiled with the AMX flags and entered only when
// cpu::amx_status().usable. Every E4M3 value is a bf16 value, so the tiles get the codes
// exactly (and the activations' E4M3 values, fp8_quantize_codes_cpu): the products are
// exact in float32 and only the sums round; the scales multiply each scale group's
// partial sums:
//   y[t, n] = sum_g (P_g[n, t] * x_scale[g, t]) * w_scale[n, g]   (fp8_block, g = 128 k)
//   y[t, n] = (P[n, t] * x_scale[t]) * w_scale[n]                 (one group per row)

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

#include "quant/fp8/cpu_kernels.h"

// No templates or inline functions shared with other translation units here: the
// linker could keep this file's AMX copy of one for every caller.

namespace tp::detail {

namespace {

// bf16 bits of e4m3(code) for 32 codes (NaN codes excluded by the caller), on 16-bit
// lanes: a normal code's exponent and mantissa move up 4 bits and the exponent bias
// grows by 120 (127 - 7); the 8 codes of exponent 0 (zero and the subnormals m 2^-9)
// come from a table; the sign moves up 8 bits.
void decode32(const uint8_t* codes, uint16_t* out) {
  const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi16(0x7F));
  __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
  // 0, 2^-9, 2^-8, 3 2^-9, 2^-7, 5 2^-9, 6 2^-9, 7 2^-9 as bf16.
  const __m512i table =
      _mm512_setr_epi32(0x3B000000, 0x3BC03B80, 0x3C203C00, 0x3C603C40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), mag, table);
  v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x80)), 8));
  _mm512_storeu_si512(out, v);
}

// The same for count < 32 codes, then zeros to 32.
void decode_tail(const uint8_t* codes, int64_t count, uint16_t* out) {
  alignas(32) uint8_t padded[32] = {};
  for (int64_t i = 0; i < count; ++i) padded[i] = codes[i];
  decode32(padded, out);  // code 0 decodes to +0
}

}  // namespace

void fp8_amx_decode_row(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out) {
  const auto& w = *static_cast<const Fp8WeightView*>(view);
  const uint8_t* src = w.codes + row * w.ld + k0;
  // Each row starts a new page, where the hardware prefetcher starts cold: fetch the row
  // two ahead while this one decodes.
  const uint8_t* ahead = row + 2 < w.n ? src + 2 * w.ld : nullptr;
  const int64_t full = kc / 32 * 32;
  for (int64_t kk = 0; kk < full; kk += 32) {
    if (ahead != nullptr && kk % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead + kk), _MM_HINT_T0);
    decode32(src + kk, out + kk);
  }
  if (full < kc) decode_tail(src + full, kc - full, out + full);
}

}  // namespace tp::detail
