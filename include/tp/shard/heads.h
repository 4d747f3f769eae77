#pragma once
// Attention heads over ranks: shards are whole heads; with GQA a rank owns whole KV
// heads plus the query heads that read them; when world > num_kv_heads the KV heads
// are replicated (world % num_kv_heads == 0), never split.

#include <cstdint>
#include <string>

#include "tp/shard/range.h"
#include "tp/shard/segments.h"
#include "tp/shard/split.h"

namespace tp {

/// Which heads one rank owns.
struct HeadPlan {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t world = 1;
  int64_t rank = 0;
  Range q_heads;            // query heads owned
  Range kv_heads;           // KV heads held (owned, or a replica)
  int64_t kv_replicas = 1;  // ranks holding each KV head (1: no replication)

  /// Query heads per KV head (the GQA group size).
  int64_t group_size() const { return num_heads / num_kv_heads; }
  /// The fused [Q|K|V] output dimension as segments "q", "k", "v" in elements
  /// (heads x head_dim), with this rank's pieces.
  SegmentPlan qkv_plan() const;
};

/// Plans rank `rank`'s heads. `policy.granularity` is in ELEMENTS of the output
/// dimension (a quant block, say): boundaries land on whole heads that are also on
/// that granularity. `policy.weights` / `rotation` apply to the KV-head groups
/// (or, when KV heads are replicated, to the query heads within a group).
/// Throws ShardError when num_heads % num_kv_heads != 0, or world > num_kv_heads
/// and world % num_kv_heads != 0 (listing the world sizes that work).
/// `q_granularity`: the query heads' boundaries also fall on multiples of this many elements
/// of the q dimension (the row alignment of the O projection that reads them: a 128-group of
/// an INT4 O over heads of 32 takes query heads four at a time), without holding K and V to it.
HeadPlan plan_heads(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t world, int64_t rank,
                    const SplitPolicy& policy = {}, int64_t q_granularity = 1);

}  // namespace tp
