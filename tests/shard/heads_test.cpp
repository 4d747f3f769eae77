// tp::plan_heads and HeadPlan::qkv_plan: MHA, GQA (even and uneven), replicated KV
// heads, granularity in elements, weights/rotation, errors, and a property test.

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tp/shard/heads.h"

namespace {

using tp::HeadPlan;
using tp::Range;
using tp::SplitPolicy;

constexpr uint64_t kSeed = 0x4ead5;

std::vector<HeadPlan> all_ranks(int64_t heads, int64_t kv, int64_t head_dim, int64_t world,
                                const SplitPolicy& policy = {}, int64_t q_granularity = 1) {
  std::vector<HeadPlan> plans;
  for (int64_t r = 0; r < world; ++r)
    plans.push_back(tp::plan_heads(heads, kv, head_dim, world, r, policy, q_granularity));
  return plans;
}

std::vector<Range> q_of(const std::vector<HeadPlan>& plans) {
  std::vector<Range> out;
  for (const HeadPlan& p : plans) out.push_back(p.q_heads);
  return out;
}

std::vector<Range> kv_of(const std::vector<HeadPlan>& plans) {
  std::vector<Range> out;
  for (const HeadPlan& p : plans) out.push_back(p.kv_heads);
  return out;
}

}  // namespace

TEST_CASE("plan_heads: MHA gives each rank whole heads", "[shard]") {
  const auto plans = all_ranks(8, 8, 64, 4);
  CHECK(q_of(plans) == std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 8}});
  CHECK(kv_of(plans) == q_of(plans));
  for (const HeadPlan& p : plans) {
    CHECK(p.kv_replicas == 1);
    CHECK(p.group_size() == 1);
    CHECK(p.num_heads == 8);
    CHECK(p.head_dim == 64);
    CHECK(p.world == 4);
  }
  CHECK(plans[3].rank == 3);
}

TEST_CASE("plan_heads: GQA 16 heads / 4 KV heads at world 1, 2, 3, 4", "[shard]") {
  CHECK(q_of(all_ranks(16, 4, 128, 1)) == std::vector<Range>{{0, 16}});
  CHECK(kv_of(all_ranks(16, 4, 128, 1)) == std::vector<Range>{{0, 4}});
  CHECK(q_of(all_ranks(16, 4, 128, 2)) == std::vector<Range>{{0, 8}, {8, 16}});
  CHECK(kv_of(all_ranks(16, 4, 128, 2)) == std::vector<Range>{{0, 2}, {2, 4}});
  // World 3 is uneven: KV heads 2,1,1, so query heads 8,4,4.
  CHECK(kv_of(all_ranks(16, 4, 128, 3)) == std::vector<Range>{{0, 2}, {2, 3}, {3, 4}});
  CHECK(q_of(all_ranks(16, 4, 128, 3)) == std::vector<Range>{{0, 8}, {8, 12}, {12, 16}});
  CHECK(kv_of(all_ranks(16, 4, 128, 4)) == std::vector<Range>{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
  CHECK(q_of(all_ranks(16, 4, 128, 4)) == std::vector<Range>{{0, 4}, {4, 8}, {8, 12}, {12, 16}});
}

TEST_CASE("plan_heads: world > num_kv_heads replicates KV heads and splits their query heads", "[shard]") {
  // 16 heads / 4 KV heads at world 8: each KV head on 2 ranks, its 4 query heads 2+2.
  const auto plans = all_ranks(16, 4, 128, 8);
  for (int64_t r = 0; r < 8; ++r) {
    INFO("rank " << r);
    const HeadPlan& p = plans[static_cast<size_t>(r)];
    CHECK(p.kv_replicas == 2);
    CHECK(p.kv_heads == Range{r / 2, r / 2 + 1});
    CHECK(p.q_heads == Range{2 * r, 2 * r + 2});
  }
  // World 12 with 4 KV heads: 3 replicas sharing 4 query heads, 2,1,1.
  CHECK(q_of(all_ranks(16, 4, 128, 12))[0] == Range{0, 2});
  CHECK(q_of(all_ranks(16, 4, 128, 12))[2] == Range{3, 4});
  // One KV head (MQA) at world 4: all ranks hold it, 8 query heads 2 each.
  CHECK(kv_of(all_ranks(8, 1, 64, 4)) == std::vector<Range>(4, Range{0, 1}));
  CHECK(q_of(all_ranks(8, 1, 64, 4)) == std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 8}});
}

TEST_CASE("plan_heads: replicas beyond the group size own zero query heads", "[shard]") {
  // 4 heads / 2 KV heads at world 8: group 2 over 4 replicas -> 1,1,0,0 query heads.
  const auto plans = all_ranks(4, 2, 64, 8);
  CHECK(q_of(plans) == std::vector<Range>{{0, 1}, {1, 2}, {2, 2}, {2, 2}, {2, 3}, {3, 4}, {4, 4}, {4, 4}});
  CHECK(plans[3].kv_heads == Range{0, 1});  // still a replica of its KV head
  CHECK(plans[3].qkv_plan().piece("q").size() == 0);
}

TEST_CASE("plan_heads: an element granularity becomes a whole number of heads", "[shard]") {
  // head_dim 64, block 128: boundaries every 2 KV heads. 4 KV heads = 2 units over 4 ranks.
  const SplitPolicy block = SplitPolicy{}.with_granularity(128);
  CHECK(kv_of(all_ranks(16, 4, 64, 4, block)) == std::vector<Range>{{0, 2}, {2, 4}, {4, 4}, {4, 4}});
  CHECK(q_of(all_ranks(16, 4, 64, 4, block)) == std::vector<Range>{{0, 8}, {8, 16}, {16, 16}, {16, 16}});
  // head_dim 80, block 128: lcm 640 = 8 heads, so all 8 KV heads form one unit.
  CHECK(kv_of(all_ranks(32, 8, 80, 2, block)) == std::vector<Range>{{0, 8}, {8, 8}});
  // A granularity that divides head_dim changes nothing.
  CHECK(q_of(all_ranks(16, 4, 128, 3, SplitPolicy{}.with_granularity(32))) == q_of(all_ranks(16, 4, 128, 3)));
}

TEST_CASE("plan_heads: a query granularity cuts the query heads on O's groups, K and V left free", "[shard]") {
  // 8 heads of 32 over 4 KV heads, O in 128-groups: query heads in runs of 4 (2 KV heads).
  CHECK(q_of(all_ranks(8, 4, 32, 2, {}, 128)) == std::vector<Range>{{0, 4}, {4, 8}});
  CHECK(q_of(all_ranks(8, 4, 32, 4, {}, 128)) == std::vector<Range>{{0, 4}, {4, 8}, {8, 8}, {8, 8}});
  CHECK(q_of(all_ranks(8, 4, 32, 4)) == std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 8}});
  // Replicated KV heads (1 over 2 ranks): the group's 4 query heads in runs of 2.
  CHECK(q_of(all_ranks(4, 1, 32, 2, {}, 64)) == std::vector<Range>{{0, 2}, {2, 4}});
  CHECK_THROWS_WITH(tp::plan_heads(4, 1, 32, 2, 0, {}, 96), Catch::Contains("with the query heads on multiples of 96"));
  CHECK_THROWS_WITH(tp::plan_heads(12, 2, 32, 4, 0, {}, 128), Catch::Contains("cannot be cut on the granularity 128"));
}

TEST_CASE("plan_heads: weights and rotation apply to KV heads, or to query heads within a group", "[shard]") {
  CHECK(kv_of(all_ranks(16, 4, 64, 3, SplitPolicy{}.with_rotation(1))) == std::vector<Range>{{0, 1}, {1, 3}, {3, 4}});
  CHECK(kv_of(all_ranks(16, 4, 64, 2, SplitPolicy{}.with_weights({3, 1}))) == std::vector<Range>{{0, 3}, {3, 4}});
  // Replicated: rank r's weight is used within the ranks sharing its KV head.
  const auto plans = all_ranks(16, 4, 64, 8, SplitPolicy{}.with_weights({3, 1, 1, 1, 0, 1, 1, 3}));
  CHECK(q_of(plans) == std::vector<Range>{{0, 3}, {3, 4}, {4, 6}, {6, 8}, {8, 8}, {8, 12}, {12, 13}, {13, 16}});
  // Rotation inside a group: 3 query heads over 2 replicas, the extra one to replica 1.
  CHECK(q_of(all_ranks(6, 2, 64, 4, SplitPolicy{}.with_rotation(1))) ==
        std::vector<Range>{{0, 1}, {1, 3}, {3, 4}, {4, 6}});
}

TEST_CASE("HeadPlan::qkv_plan gives q, k, v pieces in elements", "[shard]") {
  // 16 heads / 4 KV heads, head_dim 64, rank 1 of 3: q heads [8,12), KV head [2,3).
  const tp::SegmentPlan plan = tp::plan_heads(16, 4, 64, 3, 1).qkv_plan();
  CHECK(plan.global_size == (16 + 4 + 4) * 64);
  CHECK(plan.local_size == (4 + 1 + 1) * 64);
  CHECK(plan.local_sizes() == std::vector<int64_t>{256, 64, 64});
  CHECK(plan.piece("q").source == Range{512, 768});
  CHECK(plan.piece("q").fused_offset == 0);
  CHECK(plan.piece("q").local_offset == 0);
  CHECK(plan.piece("k").source == Range{128, 192});
  CHECK(plan.piece("k").fused_offset == 1024);
  CHECK(plan.piece("k").fused_source() == Range{1152, 1216});
  CHECK(plan.piece("k").local_offset == 256);
  CHECK(plan.piece("v").source == Range{128, 192});
  CHECK(plan.piece("v").fused_offset == 1280);
  CHECK(plan.piece("v").local_offset == 320);
}

TEST_CASE("plan_heads: errors name the numbers and what works", "[shard]") {
  using Catch::Contains;
  REQUIRE_THROWS_AS(tp::plan_heads(10, 4, 64, 2, 0), tp::ShardError);
  REQUIRE_THROWS_WITH(tp::plan_heads(10, 4, 64, 2, 0), Contains("num_heads=10 is not a multiple of num_kv_heads=4"));
  REQUIRE_THROWS_WITH(tp::plan_heads(8, 2, 64, 3, 0), Contains("world_size=3") && Contains("multiple of 2") &&
                                                          Contains("world sizes that work: 1, 2, 4, 6, 8"));
  REQUIRE_THROWS_WITH(tp::plan_heads(32, 8, 64, 12, 0), Contains("world sizes that work: 1..8, 16, 24, 32"));
  // 3 KV heads of 64 elements cannot be cut on 128-element blocks.
  REQUIRE_THROWS_WITH(tp::plan_heads(12, 3, 64, 1, 0, SplitPolicy{}.with_granularity(128)),
                      Contains("every 2 KV heads") && Contains("pad num_kv_heads to 4"));
  // Replication puts one 64-element KV head on a rank: not on a 128 block.
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 8, 0, SplitPolicy{}.with_granularity(128)),
                      Contains("not a multiple of the granularity 128") &&
                          Contains("world sizes that work: 1..4 (KV heads cannot be replicated"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 4, 5), Contains("invalid rank 5 (rank should be in the 0..3 range)"));
  REQUIRE_THROWS_WITH(tp::plan_heads(0, 4, 64, 4, 0), Contains("invalid num_heads 0"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 0, 64, 4, 0), Contains("invalid num_kv_heads 0"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 0, 4, 0), Contains("invalid head_dim 0"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 0, 0), Contains("invalid world_size 0"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 8, 0, SplitPolicy{}.with_weights({1, 1})),
                      Contains("got 2 weights for world_size 8"));
  // Every rank refuses, not just the one whose own weight is bad.
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 8, 0, SplitPolicy{}.with_weights({1, 1, 1, 1, 1, 1, 1, -1})),
                      Contains("invalid weight -1 for rank 7"));
  REQUIRE_THROWS_WITH(tp::plan_heads(16, 4, 64, 8, 0, SplitPolicy{}.with_weights({1, 1, 0, 0, 1, 1, 1, 1})),
                      Contains("ranks 2..3 share KV head 1 and all have weight 0"));
}

TEST_CASE("plan_heads property: every head owned once, KV heads replicated as declared", "[shard]") {
  std::mt19937_64 rng(kSeed);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  static const int64_t kHeadDims[] = {8, 16, 32, 64, 80, 96, 128};
  static const int64_t kGranularities[] = {1, 1, 16, 32, 64, 128, 256};
  int valid = 0, replicated = 0;
  for (int i = 0; i < 3000; ++i) {
    const int64_t kv = uni(1, 8), group = uni(1, 6), heads = kv * group;
    const int64_t head_dim = kHeadDims[uni(0, 6)], g = kGranularities[uni(0, 6)];
    // Half arbitrary (many refused), half of the shapes that work: split or replicated.
    const int64_t world = i % 2 ? uni(1, 20) : (uni(0, 1) ? uni(1, kv) : kv * uni(2, 4));
    SplitPolicy policy = SplitPolicy{}.with_granularity(g).with_rotation(uni(0, 30));
    std::vector<double> w;
    if (i % 3 == 0) {
      // Zeros allowed, but the first rank of every would-be replica group is
      // nonzero so no KV head is left without an owner of its query heads.
      const int64_t replicas = world > kv && world % kv == 0 ? world / kv : world;
      for (int64_t r = 0; r < world; ++r) w.push_back(static_cast<double>(uni(r % replicas == 0 ? 1 : 0, 3)));
      policy = policy.with_weights(w);
    }
    std::ostringstream ws;
    for (double x : w) ws << x << ' ';
    INFO("case " << i << " seed " << kSeed << ": heads=" << heads << " kv_heads=" << kv << " head_dim=" << head_dim
                 << " world=" << world << " granularity=" << g << " rotation=" << policy.rotation
                 << " weights=" << ws.str());

    const bool ok = (kv * head_dim) % g == 0 && (world <= kv || (world % kv == 0 && head_dim % g == 0));
    if (!ok) {
      for (int64_t r = 0; r < world; ++r)
        REQUIRE_THROWS_AS(tp::plan_heads(heads, kv, head_dim, world, r, policy), tp::ShardError);
      continue;
    }
    ++valid;
    const auto plans = all_ranks(heads, kv, head_dim, world, policy);
    const int64_t replicas = world > kv ? world / kv : 1;
    if (replicas > 1) ++replicated;
    std::vector<int64_t> holders(static_cast<size_t>(kv), 0);
    int64_t next_q = 0;
    for (const HeadPlan& p : plans) {
      INFO("rank " << p.rank);
      REQUIRE(p.kv_replicas == replicas);
      REQUIRE(p.q_heads.begin == next_q);  // query heads tile [0, heads) in rank order
      REQUIRE(p.q_heads.end >= p.q_heads.begin);
      next_q = p.q_heads.end;
      for (int64_t k = p.kv_heads.begin; k < p.kv_heads.end; ++k) ++holders[static_cast<size_t>(k)];
      for (int64_t q = p.q_heads.begin; q < p.q_heads.end; ++q) {
        REQUIRE(q / group >= p.kv_heads.begin);  // reads only KV heads it holds
        REQUIRE(q / group < p.kv_heads.end);
      }
      if (replicas == 1) REQUIRE(p.q_heads == Range{p.kv_heads.begin * group, p.kv_heads.end * group});
      if (!w.empty() && w[static_cast<size_t>(p.rank)] == 0) REQUIRE(p.q_heads.empty());
      // Every boundary in elements lies on the granularity.
      for (int64_t b : {p.q_heads.begin, p.q_heads.end, p.kv_heads.begin, p.kv_heads.end}) {
        REQUIRE((b * head_dim) % g == 0);
      }
      const tp::SegmentPlan qkv = p.qkv_plan();
      REQUIRE(qkv.local_size == (p.q_heads.size() + 2 * p.kv_heads.size()) * head_dim);
      REQUIRE(qkv.global_size == (heads + 2 * kv) * head_dim);
    }
    REQUIRE(next_q == heads);
    for (int64_t k = 0; k < kv; ++k) {
      INFO("kv head " << k);
      REQUIRE(holders[static_cast<size_t>(k)] == replicas);
    }
  }
  // The refusals must not crowd out the checks, in either regime.
  REQUIRE(valid > 1000);
  REQUIRE(replicated > 200);
}
