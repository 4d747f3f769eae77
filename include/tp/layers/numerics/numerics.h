#pragma once
// How a layer orders its floating-point sums.
//
// kDefault: the fastest order the kernels and the all-reduce choose. Its bits depend on
// the TP size (a row layer sums K in rank pieces) and on M (the CPU GEMM backend and
// its blocking change with the number of rows), like every peer's.
//
// kInvariant: every sum over a reduced dimension follows one canonical order fixed by
// the global shape: the dimension is cut into chunks of kInvariantChunk elements (fewer
// where the split granularity is not a multiple of it: the largest power of two that
// divides both; the last chunk may be short), each chunk's products are fused-multiply-
// added in index order from zero, and the chunks are added in a dyadic tree over chunk
// index (src/cpu/invariant_gemm.h). Ranks exchange whole subtrees, never partial sums,
// so TP 1, 2, 3, 4 and a row alone or inside any batch give the same bits, forward and
// backward. What it covers and costs: docs/numerics.md; the costs measured
// in benchmarks/RESULTS.md (2026-12-06, "invariant numerics' cost").

#include <cstdint>
#include <string>

namespace tp {

enum class Numerics {
  kAuto,       ///< TP_NUMERICS (default | invariant), else kDefault
  kDefault,    ///< fastest order
  kInvariant,  ///< one canonical order: bitwise the same at every TP size and batch
};

/// The chunk of the canonical order where the split granularity allows it.
inline constexpr int64_t kInvariantChunk = 64;

const char* to_string(Numerics n);
/// "auto", "default", "invariant" (case-insensitive); throws c10::ValueError otherwise.
Numerics parse_numerics(const std::string& name);
/// kAuto resolved through TP_NUMERICS (an unknown value is an error naming it).
Numerics resolve_numerics(Numerics n);

}  // namespace tp
