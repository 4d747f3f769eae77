#pragma once
// Private: when a bf16 layer's quantized GEMM runs on AVX-512 bf16 dot products
// (VDPBF16PS): on CPUs with avx512_bf16 whose AMX tiles are not usable (AMD Zen 4 / 5,
// Cooper Lake), from crossover_min_m(Crossover::kBf16Dot) rows of x (cpu/crossovers.h). Two loops use it: cpu/bf16_panel_gemm.h (the
// formats packed in 16-column panels: INT4) and cpu/row_decoded_gemm.h's kAvx512Bf16 loop
// (the formats stored row by row: INT8 weight-only, FP8). Where AMX is usable the tiles go
// first; float32 layers never come here (they keep float32 arithmetic). Only portable
// translation units include this header (the inline function below must not be compiled
// with an ISA's flags).

#include <ATen/core/Tensor.h>

#include <algorithm>

#include "cpu/amx.h"
#include "cpu/crossovers.h"
#include "cpu/features.h"

namespace tp::cpu {

/// Whether a layer's forward on x (or on `rows` rows of `dtype` activations) takes them: x bfloat16 on the CPU with at least
/// crossover_min_m(Crossover::kBf16Dot) rows (below it the formats' rows / GEMV kernels, which
/// stream the weight once at the memory limit), `isa` (the level the caller dispatches at: cpu::isa(), so TP_CPU_ISA
/// can turn it off) AVX-512, the CPU has avx512_bf16 and the AMX tiles are not usable.
inline bool bf16_dot_applies(at::ScalarType dtype, int64_t rows, Isa isa) {
  return dtype == at::kBFloat16 && isa == Isa::kAvx512 && features().avx512bf16 &&
         rows >= crossover_min_m(Crossover::kBf16Dot) && !amx_status().usable;
}
inline bool bf16_dot_applies(const at::Tensor& x, Isa isa) {
  return x.device().is_cpu() && x.dim() >= 1 &&
         bf16_dot_applies(x.scalar_type(), x.numel() / std::max<int64_t>(x.size(-1), 1), isa);
}

}  // namespace tp::cpu
