#pragma once
// Private: the canonical-order GEMM of invariant numerics (tp/layers/numerics/numerics.h).
//
//   y[m, n] = sum_r a[m, r] * b[n, r]
//
// summed in one order fixed by the reduction's global length and chunk size alone:
//   - the reduction index r is cut into chunks of C: chunk c is [c C, min((c + 1) C, R));
//   - a chunk's products are fused-multiply-added in r order into one float32
//     accumulator that starts at zero (cpu/panel_gemm.h's microkernels: every row of
//     a, at every M, in every register tile, on every thread takes the same steps);
//   - chunks are added in the dyadic tree over chunk index,
//         T(lo, s) = T(lo, s/2) + T(lo + s/2, s/2),   T(c, 1) = chunk c,
//     from s = the power of two at or above the chunk count; a subtree that starts past
//     the last chunk is absent (T = its left half).
// So a row's result depends on neither M, nor the other rows, nor the threads. A rank
// that holds reduction indices [c0 C, c1 C) computes the tree's largest whole subtrees
// inside [c0, c1) (dyadic_pieces); every rank's pieces then combine into exactly the
// tree one device computes (layers/numerics/canonical_sum.h).

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cpu/features.h"

namespace tp::cpu {

/// Chunks [lo, lo + size) of a canonical sum: size a power of two, lo a multiple of it.
struct ChunkSpan {
  int64_t lo = 0;
  int64_t size = 0;
  bool operator==(const ChunkSpan& o) const { return lo == o.lo && size == o.size; }
};

/// The fewest whole subtrees of the canonical tree that cover chunks [begin, end), in
/// order (chunks 3..11 -> [3,4) [4,8) [8,10) [10,11)).
std::vector<ChunkSpan> dyadic_pieces(int64_t begin, int64_t end);

/// b [N, R] (float32 or bfloat16) as 16-column panels [ceil(N / 16), R, 16] of its dtype,
/// columns past N zero: the weight side of invariant_gemm_pieces, packed once.
at::Tensor invariant_pack(const at::Tensor& b);

/// The canonical pieces of a [M, R_local] (float32, contiguous) times the packed b
/// (invariant_pack of [n, R_local]), where a's column 0 is global reduction index
/// first_chunk * chunk: returns [pieces, M, n] float32, piece i the value of
/// dyadic_pieces(first_chunk, first_chunk + ceil(R_local / chunk))[i]. Only the last
/// local chunk may be short (it must then end the global reduction); chunk <= 64.
/// Threaded over n.
at::Tensor invariant_gemm_pieces(const at::Tensor& a, const at::Tensor& b_packed, int64_t n, int64_t first_chunk,
                                 int64_t chunk);
/// The same on the kernels of `isa` (which this CPU must run): every ISA gives the same
/// bits, each step of a chunk one fused multiply-add (for the tests that check it).
at::Tensor invariant_gemm_pieces(const at::Tensor& a, const at::Tensor& b_packed, int64_t n, int64_t first_chunk,
                                 int64_t chunk, Isa isa);

/// The canonical pieces of each row's sum of a [M, R_local] (the same chunk rules):
/// [pieces, M, 1]. For sums over tokens and over the vocabulary.
at::Tensor invariant_sum_pieces(const at::Tensor& a, int64_t first_chunk, int64_t chunk);

}  // namespace tp::cpu
