#pragma once
// How a layer orders its floating-point sums.
//
// kDefault: the fastest order the kernels and the all-reduce choose. Its bits depend on
// the TP size (a row layer sums K in rank pieces) and on M (the CPU GEMM backend and
// its blocking change with the number of rows), like every peer's.
//
// kInvariant: every sum over a reduced dimension follows one canonical order fixed by
// the global shape: the dimension is cut into chunks of kInvariantChunk elements, the
// last one short where the size is not a multiple of it (1000: 15 chunks of 64 and one
// of 40); a dimension whose split keeps its own granularity (by heads: O's input, QKV's
// outputs; a weighted split) in chunks of the largest power of two that divides both it
// and kInvariantChunk (16 for head_dim 48). Each chunk's products are fused-multiply-
// added in index order from zero, on every CPU ISA, and the chunks are added in a dyadic
// tree over chunk index (src/cpu/invariant_gemm.h). An even split puts every rank
// boundary on that grid at every world size (the last rank's slice may end short), so
// the chunking never follows the per-rank split; ranks exchange whole subtrees, never
// partial sums. The elementwise functions whose rounding ATen's vector loops make depend
// on where a slice ends (the MLP's activation, the loss's exponentials) go through one
// scalar path per element. So TP 1, 2, 3, 4 and a row alone or inside any batch give the
// same bits, forward and backward, for every shape the layers accept. What it covers and
// costs: docs/numerics.md; the costs measured in benchmarks/RESULTS.md (2026-12-06,
// "invariant numerics' cost").

#include <cstdint>
#include <string>

namespace tp {

enum class Numerics {
  kAuto,       ///< TP_NUMERICS (default | invariant), else kDefault
  kDefault,    ///< fastest order
  kInvariant,  ///< one canonical order: bitwise the same at every TP size and batch
};

/// The chunk of the canonical order (and the grid an even split cuts on) under kInvariant.
inline constexpr int64_t kInvariantChunk = 64;

const char* to_string(Numerics n);
/// "auto", "default", "invariant" (case-insensitive); throws c10::ValueError otherwise.
Numerics parse_numerics(const std::string& name);
/// kAuto resolved through TP_NUMERICS (an unknown value is an error naming it).
Numerics resolve_numerics(Numerics n);

}  // namespace tp
