#pragma once
// The attention's sums over heads under invariant numerics (tp/layers/numerics/numerics.h):
// what an attention composed from tp's layers calls so that its backward keeps TP 1's bits
// (tp::DecoderLayer's does, src/models/decoder_layer.cpp).
//
// Two gradients are sums over query heads that the ranks split:
//   - a KV head's (GQA): the sum over its group's query heads. By default each replica of a
//     replicated KV head gets its own query heads' part and the QKV layer adds the replicas'
//     weight gradients; here every rank exchanges whole subtrees of the canonical tree over
//     the group's query-head index (one leaf per head), so every replica gets the whole
//     gradient with TP 1's bits (and the QKV layer checks that it did);
//   - a per-head norm weight's (Qwen3's q_norm / k_norm, one [head_dim] weight for all
//     heads): per head, the canonical sum over tokens; then the canonical tree over the
//     global head index across ranks, each KV head counted once (its first holder).
// A hidden-size norm's weight (heads = 1, replicated) takes the same path with no exchange,
// so its gradient, a sum over tokens, is canonical too.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/shard/range.h"

namespace tp {

/// The heads of one kind (query or KV) that every rank holds, in global head indices.
struct HeadsByRank {
  Communicator comm;
  /// Rank r's heads; a head may be held by several ranks (KV replicas). One entry: the
  /// heads are local, summed on each rank alone (a hidden-size norm: {{0, 1}}, total 1).
  std::vector<Range> ranges;
  int64_t total = 0;  ///< heads in the model
};

/// k [b, nkv_local, L, d] -> [b, nq_local, L, d], local query head h reading local KV head
/// (q_begin + h) / group - kv_begin: an exact copy forward; backward, each KV head's gradient
/// is the canonical sum over its group's query heads across ranks (above). Collective in the
/// backward.
at::Tensor expand_kv_invariant(const at::Tensor& k, const HeadsByRank& q_heads, const HeadsByRank& kv_heads,
                               int64_t group);

/// w [d] times x [..., heads_local, d] (or x [..., d] with heads.total == 1): an exact
/// elementwise product forward; backward, w's gradient is the canonical sum over tokens per
/// head, then over heads in the canonical tree across ranks (each head counted at its
/// first holder). Collective in the backward when heads.ranges has several ranks.
at::Tensor scale_by_weight_invariant(const at::Tensor& w, const at::Tensor& x, const HeadsByRank& heads);

}  // namespace tp
