#include "layers/numerics/canonical_sum.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>

#include "tp/layers/numerics/numerics.h"

namespace tp::detail {
namespace {

struct Tree {
  int64_t leaves;
  std::map<int64_t, std::pair<int64_t, at::Tensor>> by_lo;  // lo -> (size, value)

  at::Tensor at_node(int64_t lo, int64_t size) const {
    if (lo >= leaves) return {};
    const auto it = by_lo.find(lo);
    if (it != by_lo.end() && it->second.first == size) return it->second.second;
    TORCH_INTERNAL_ASSERT(size > 1, "canonical sum: chunk ", lo, " of ", leaves, " has no piece");
    const at::Tensor left = at_node(lo, size / 2), right = at_node(lo + size / 2, size / 2);
    return right.defined() ? left + right : left;
  }
};

int64_t tree_size(int64_t leaves) {
  int64_t s = 1;
  while (s < leaves) s *= 2;
  return s;
}

}  // namespace

at::Tensor evaluate_tree(int64_t leaves, const std::vector<cpu::ChunkSpan>& pieces,
                         const std::vector<at::Tensor>& values) {
  TORCH_INTERNAL_ASSERT(pieces.size() == values.size());
  if (leaves == 0) return {};
  Tree tree{leaves, {}};
  for (size_t i = 0; i < pieces.size(); ++i) tree.by_lo[pieces[i].lo] = {pieces[i].size, values[i]};
  return tree.at_node(0, tree_size(leaves));
}

at::Tensor evaluate_whole(int64_t leaves, const at::Tensor& pieces) {
  if (leaves == 0) return {};
  return evaluate_tree(leaves, cpu::dyadic_pieces(0, leaves), pieces.unbind(0));
}

std::vector<at::Tensor> canonical_sums(const Communicator& comm, const std::vector<CanonicalSum>& sums,
                                       const std::vector<at::Tensor>& mine, at::IntArrayRef shape) {
  TORCH_INTERNAL_ASSERT(sums.size() == mine.size());
  const int64_t world = comm.world_size(), rank = comm.rank();
  int64_t numel = 1;
  for (const auto d : shape) numel *= d;
  // Every rank's buffer: its pieces of sum 0, then of sum 1, ..., each numel floats.
  std::vector<int64_t> sizes(world, 0);
  for (const auto& s : sums) {
    TORCH_INTERNAL_ASSERT(static_cast<int64_t>(s.pieces_by_rank.size()) == world);
    for (int64_t r = 0; r < world; ++r) sizes[r] += static_cast<int64_t>(s.pieces_by_rank[r].size()) * numel;
  }
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < sums.size(); ++i) {
    TORCH_INTERNAL_ASSERT(mine[i].size(0) == static_cast<int64_t>(sums[i].pieces_by_rank[rank].size()));
    parts.push_back(mine[i].reshape({-1}));
  }
  const at::Tensor local = parts.empty() ? at::empty({0}, at::kFloat) : at::cat(parts).to(at::kFloat).contiguous();
  at::Tensor all = local;
  std::vector<int64_t> offset(world, 0);
  if (world > 1) {
    // The exchange: an all-reduce of the float32 bits as int32, every rank's pieces in its
    // own slot and zeros elsewhere. An integer sum with one nonzero term is exact in any
    // order, so every transport (shared memory, Gloo's ring, NCCL) delivers each piece
    // bit for bit (-0.0 and NaN payloads included), at the all-reduce's latency (the
    // shared-memory strategies on one host) rather than an all-gather's.
    const int64_t width = *std::max_element(sizes.begin(), sizes.end());
    at::Tensor bits = at::zeros({world * width}, at::kInt);
    bits.narrow(0, rank * width, sizes[rank]).copy_(local.view(at::kInt));
    comm.all_reduce(bits);
    all = bits.view(at::kFloat);
    for (int64_t r = 0; r < world; ++r) offset[r] = r * width;
  }

  std::vector<at::Tensor> out;
  for (const auto& s : sums) {
    std::vector<cpu::ChunkSpan> pieces;
    std::vector<at::Tensor> values;
    for (int64_t r = 0; r < world; ++r) {
      for (const auto& p : s.pieces_by_rank[r]) {
        pieces.push_back(p);
        values.push_back(all.narrow(0, offset[r], numel).view(shape));
        offset[r] += numel;
      }
    }
    out.push_back(evaluate_tree(s.leaves, pieces, values));
  }
  return out;
}

int64_t invariant_chunk(int64_t granularity) {
  int64_t c = 1;
  while (c < kInvariantChunk && granularity % (2 * c) == 0) c *= 2;
  return c;
}

CanonicalSum split_sum(int64_t total, int64_t chunk, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                       const char* what) {
  CanonicalSum s;
  s.leaves = chunks_of(total, chunk);
  for (const auto& [begin, end] : ranges) {
    TORCH_CHECK_VALUE(begin == end || (begin % chunk == 0 && (end % chunk == 0 || end == total)), what,
                      ": invariant numerics needs every rank's range on the chunk grid of ", chunk, "; a rank holds [",
                      begin, ", ", end, ") of ", total);
    s.pieces_by_rank.push_back(begin == end ? std::vector<cpu::ChunkSpan>{}
                                            : cpu::dyadic_pieces(begin / chunk, chunks_of(end, chunk)));
  }
  return s;
}

}  // namespace tp::detail
