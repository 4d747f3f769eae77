#pragma once
// Private: the canonical sums of invariant numerics (tp/layers/numerics/numerics.h) across ranks.
//
// A canonical sum over `leaves` chunk partials is the dyadic tree cpu/invariant_gemm.h
// describes. Each rank holds the tree's whole subtrees over the chunks it computed
// (cpu::dyadic_pieces of its chunk range). canonical_sums all-gathers every rank's
// pieces (rank-major slots of one all-reduce over their bits as integers: exact whatever
// the backend adds in which order) and every rank evaluates the same tree from them, so
// the result is bitwise what one device computes, on every rank, whichever transport
// (shared memory, Gloo's ring, NCCL) moved the bytes: they move pieces, never add them.
// The cost over a plain all-reduce: a buffer of world x the largest rank's pieces.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cpu/invariant_gemm.h"
#include "tp/comm/communicator.h"

namespace tp::detail {

/// One canonical sum: its chunk count and the pieces each rank contributes (in rank
/// order; every rank passes the same lists). The pieces of all ranks are disjoint and
/// cover [0, leaves).
struct CanonicalSum {
  int64_t leaves = 0;
  std::vector<std::vector<cpu::ChunkSpan>> pieces_by_rank;
};

/// The tree over `leaves` chunks evaluated from `pieces` (whole subtrees, disjoint,
/// covering [0, leaves)) with their values: T(lo, s) = T(lo, s/2) + T(lo + s/2, s/2).
/// Undefined when leaves is 0.
at::Tensor evaluate_tree(int64_t leaves, const std::vector<cpu::ChunkSpan>& pieces,
                         const std::vector<at::Tensor>& values);

/// The tree over `leaves` chunks from the pieces of one rank that holds all of them,
/// pieces [dyadic_pieces(0, leaves).size(), ...] (undefined when leaves is 0).
at::Tensor evaluate_whole(int64_t leaves, const at::Tensor& pieces);

/// Every sum of `sums`, from this rank's values: mine[i] is [pieces of sums[i] on this
/// rank, shape...] float32 (shape the same for every sum and rank). Collective: every
/// rank calls it with the same `sums`. Returns one tensor of `shape` per sum
/// (undefined where a sum has no leaves).
std::vector<at::Tensor> canonical_sums(const Communicator& comm, const std::vector<CanonicalSum>& sums,
                                       const std::vector<at::Tensor>& mine, at::IntArrayRef shape);

/// The chunk of an invariant reduction over a dimension split at multiples of
/// `granularity`: the largest power of two that divides both it and kInvariantChunk.
int64_t invariant_chunk(int64_t granularity);

/// Chunks of `total` elements at `chunk` (the last one may be short).
inline int64_t chunks_of(int64_t total, int64_t chunk) { return (total + chunk - 1) / chunk; }

/// The canonical sum over a dimension of `total` elements in chunks of `chunk`, split
/// over the ranks as `ranges` (chunk-aligned: checked, naming `what`).
CanonicalSum split_sum(int64_t total, int64_t chunk, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                       const char* what);

}  // namespace tp::detail
