// Attention heads over ranks (docs/DESIGN.md §3, "Attention heads").
//
// Shards are whole heads, and a rank's query heads are exactly the ones that read
// its KV heads, so attention needs no communication. Two regimes:
//   world <= num_kv_heads: the KV heads are split (KV head k serves query heads
//     [k*group, (k+1)*group)), so a rank's q range is its kv range times group;
//   world >  num_kv_heads: each KV head is replicated on world/num_kv_heads
//     consecutive ranks, which split that KV head's query heads among themselves.

#include "tp/shard/heads.h"

#include "shard/shard_fail.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>

namespace tp {
namespace {

using detail::shard_fail;

void check_positive(const char* name, int64_t value) {
  if (value < 1) shard_fail("plan_heads: invalid ", name, " ", value, " (", name, " should be >= 1)");
}

// The world sizes plan_heads accepts: every size up to num_kv_heads, and, when a
// single KV head may sit on a rank by itself, every multiple of num_kv_heads (a few
// are listed; the rule is spelled out).
std::string working_worlds(int64_t num_kv_heads, int64_t num_heads, bool replication_ok) {
  std::ostringstream os;
  if (num_kv_heads <= 2) {
    for (int64_t w = 1; w <= num_kv_heads; ++w) os << (w > 1 ? ", " : "") << w;
  } else {
    os << "1.." << num_kv_heads;
  }
  if (!replication_ok) {
    os << " (KV heads cannot be replicated at this granularity)";
    return os.str();
  }
  const int64_t bound = std::max(2 * num_kv_heads, num_heads);
  int listed = 0;
  int64_t w = 2 * num_kv_heads;
  for (; w <= bound && listed < 8; w += num_kv_heads, ++listed) os << ", " << w;
  os << ", ... (1..num_kv_heads, or a multiple of num_kv_heads=" << num_kv_heads << ")";
  return os.str();
}

// All weights, not just this rank's: every rank must accept or refuse the same
// policy, or the ranks of one job would disagree about the plan.
void check_weights(const std::vector<double>& weights, int64_t world) {
  if (weights.empty()) return;
  if (static_cast<int64_t>(weights.size()) != world) {
    shard_fail("plan_heads: got ", weights.size(), " weights for world_size ", world,
               " (weights should have one entry per rank, or none for an even split)");
  }
  for (size_t r = 0; r < weights.size(); ++r) {
    if (!(weights[r] >= 0) || !std::isfinite(weights[r])) {
      shard_fail("plan_heads: invalid weight ", weights[r], " for rank ", r, " (weights should be finite and >= 0)");
    }
  }
}

}  // namespace

HeadPlan plan_heads(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t world, int64_t rank,
                    const SplitPolicy& policy, int64_t q_granularity) {
  check_positive("num_heads", num_heads);
  check_positive("num_kv_heads", num_kv_heads);
  check_positive("head_dim", head_dim);
  check_positive("world_size", world);
  check_positive("granularity", policy.granularity);
  if (rank < 0 || rank >= world) {
    shard_fail("plan_heads: invalid rank ", rank, " (rank should be in the 0..", world - 1, " range)");
  }
  if (num_heads % num_kv_heads != 0) {
    shard_fail("plan_heads: num_heads=", num_heads, " is not a multiple of num_kv_heads=", num_kv_heads,
               " (every KV head must serve the same number of query heads)");
  }
  if (num_heads > std::numeric_limits<int64_t>::max() / head_dim) {
    shard_fail("plan_heads: num_heads * head_dim = ", num_heads, " * ", head_dim, " overflows int64");
  }
  check_weights(policy.weights, world);

  HeadPlan plan;
  plan.num_heads = num_heads;
  plan.num_kv_heads = num_kv_heads;
  plan.head_dim = head_dim;
  plan.world = world;
  plan.rank = rank;
  const int64_t group = plan.group_size();
  const int64_t g = policy.granularity;

  // The element granularity as a number of KV heads. A KV boundary at kv heads lies
  // at kv*head_dim in k and v and at kv*group*head_dim in q; both must be multiples
  // of g. The q condition follows from the k one, but both are written out so the
  // reason is visible.
  const int64_t unit_k = combine_granularity(head_dim, g) / head_dim;
  if (q_granularity < 1) shard_fail("plan_heads: q_granularity=", q_granularity, " must be >= 1");
  const int64_t unit_q =
      combine_granularity(group * head_dim, combine_granularity(g, q_granularity)) / (group * head_dim);
  const int64_t unit_kv = combine_granularity(unit_k, unit_q);
  if (num_kv_heads % unit_kv != 0) {
    shard_fail("plan_heads: num_kv_heads=", num_kv_heads, " (head_dim=", head_dim,
               ") cannot be split on the granularity ", g,
               q_granularity > 1 ? " with the query heads on multiples of " + std::to_string(q_granularity) : "",
               ": boundaries must fall on multiples of ", g, " elements, i.e. every ", unit_kv, " KV heads, and ",
               num_kv_heads, " is not a multiple of ", unit_kv, "; pad num_kv_heads to ",
               round_up(num_kv_heads, unit_kv), " or use a granularity that divides head_dim");
  }

  if (world <= num_kv_heads) {
    plan.kv_replicas = 1;
    plan.kv_heads = split_for_rank(num_kv_heads, world, rank, policy.with_granularity(unit_kv), "num_kv_heads");
    plan.q_heads = {plan.kv_heads.begin * group, plan.kv_heads.end * group};
    return plan;
  }

  // Replicated KV heads: every rank holds one whole KV head, so head_dim itself must
  // be on the granularity (otherwise a quant block would straddle two ranks' heads).
  const bool replication_ok = unit_k == 1;
  if (world % num_kv_heads != 0) {
    shard_fail("plan_heads: world_size=", world, " is larger than num_kv_heads=", num_kv_heads,
               ", so each KV head is replicated, which needs world_size to be a multiple of ", num_kv_heads,
               "; world sizes that work: ", working_worlds(num_kv_heads, num_heads, replication_ok));
  }
  if (!replication_ok) {
    shard_fail("plan_heads: world_size=", world, " replicates each of the num_kv_heads=", num_kv_heads,
               " KV heads, so a rank holds a single KV head of head_dim=", head_dim,
               " elements, which is not a multiple of the granularity ", g,
               "; world sizes that work: ", working_worlds(num_kv_heads, num_heads, replication_ok));
  }

  const int64_t replicas = world / num_kv_heads;
  const int64_t kv = rank / replicas;  // consecutive ranks share a KV head
  plan.kv_replicas = replicas;
  plan.kv_heads = {kv, kv + 1};

  // This KV head's query heads over the ranks sharing it. head_dim is a multiple
  // of g here, so every whole head is a valid boundary: granularity 1 head.
  // Whole heads, in runs that keep the query boundaries on q_granularity.
  const int64_t unit_within = combine_granularity(head_dim, q_granularity) / head_dim;
  if (group % unit_within != 0) {
    shard_fail("plan_heads: world_size=", world, " replicates each of the num_kv_heads=", num_kv_heads,
               " KV heads, and its ", group, " query heads of ", head_dim, " cannot be cut on the granularity ",
               q_granularity, " (runs of ", unit_within,
               " heads); world sizes that work: ", working_worlds(num_kv_heads, num_heads, replication_ok));
  }
  SplitPolicy within = policy.with_granularity(unit_within);
  if (!policy.weights.empty()) {
    const auto first = policy.weights.begin() + static_cast<std::ptrdiff_t>(kv * replicas);
    within.weights.assign(first, first + static_cast<std::ptrdiff_t>(replicas));
    // Checked for every KV head, not just this rank's, so all ranks agree.
    for (int64_t k = 0; k < num_kv_heads; ++k) {
      double sum = 0;
      for (int64_t j = 0; j < replicas; ++j) sum += policy.weights[static_cast<size_t>(k * replicas + j)];
      if (sum == 0) {
        shard_fail("plan_heads: ranks ", k * replicas, "..", (k + 1) * replicas - 1, " share KV head ", k,
                   " and all have weight 0, so nobody would own its query heads");
      }
    }
  }
  const Range local = split_for_rank(group, replicas, rank % replicas, within, "query heads per KV head");
  plan.q_heads = local.shifted(kv * group);
  return plan;
}

SegmentPlan HeadPlan::qkv_plan() const {
  const int64_t kv_size = num_kv_heads * head_dim;
  const Range kv_elems{kv_heads.begin * head_dim, kv_heads.end * head_dim};
  return make_segment_plan({{"q", num_heads * head_dim}, {"k", kv_size}, {"v", kv_size}},
                           {{q_heads.begin * head_dim, q_heads.end * head_dim}, kv_elems, kv_elems});
}

}  // namespace tp
