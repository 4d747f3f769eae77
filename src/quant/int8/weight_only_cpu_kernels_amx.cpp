// The INT8 weight-only row decoder for the AMX row-decoded GEMM (cpu/amx_rows_gemm.h;
// weight_only_cpu_kernels.h), compiled with the AMX flags and entered only when
// cpu::amx_status().usable. An int8 code is a bf16 value exactly (at most 8 significant
// bits), so the tiles multiply x by the codes exactly and the per-row scale multiplies
// each output once: y[t, n] = P[n, t] * scale[n].

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>

#include "quant/int8/weight_only_cpu_kernels.h"

// No templates or inline functions shared with other translation units here: the
// linker could keep this file's AMX copy of one for every caller.

namespace tp::detail {

namespace {

// bf16 bit patterns of 16 int8 codes: widened to int32, converted to float32 (exact),
// the high halves kept (exact: the low halves are zero).
__m256i decode16(const int8_t* codes) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

}  // namespace

void int8_wo_amx_decode_row(const void* view, int64_t row, int64_t k0, int64_t kc, uint16_t* out) {
  const auto& w = *static_cast<const Int8WoCpuView*>(view);
  const int8_t* src = w.codes + row * w.k + k0;
  // Each row of 4 KiB starts a new page, where the hardware prefetcher starts cold: fetch
  // the row two ahead while this one decodes.
  const int8_t* ahead = row + 2 < w.n ? src + 2 * w.k : nullptr;
  const int64_t full = kc / 16 * 16;
  for (int64_t kk = 0; kk < full; kk += 16) {
    if (ahead != nullptr && kk % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead + kk), _MM_HINT_T0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kk), decode16(src + kk));
  }
  alignas(16) int8_t tail[16] = {};
  for (int64_t kk = full; kk < kc; ++kk) tail[kk - full] = src[kk];
  const int64_t padded = (kc + 31) / 32 * 32;
  if (full < padded) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + full), decode16(tail));
  if (full + 16 < padded) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + full + 16), _mm256_setzero_si256());
}

}  // namespace tp::detail
