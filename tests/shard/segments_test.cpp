// tp::SegmentPlan, make_segment_plan, plan_segments, plan_single: source ranges vs
// local offsets, lookups by name, coverage over all ranks, and errors.

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tp/shard/segments.h"

namespace {

using tp::Range;
using tp::Segment;
using tp::SegmentPlan;
using tp::SplitPolicy;

constexpr uint64_t kSeed = 0x5e65;

}  // namespace

TEST_CASE("plan_segments: fused_offset and local_offset are different numbers, both right", "[shard]") {
  // gate||up, 12 each, rank 1 of 4: 3 of gate and 3 of up.
  const SegmentPlan plan = tp::plan_segments({{"gate", 12}, {"up", 12}}, 4, 1);
  REQUIRE(plan.pieces.size() == 2);
  CHECK(plan.global_size == 24);
  CHECK(plan.local_size == 6);

  const tp::SegmentPiece& gate = plan.piece("gate");
  CHECK(gate.segment_size == 12);
  CHECK(gate.source == Range{3, 6});
  CHECK(gate.fused_offset == 0);
  CHECK(gate.fused_source() == Range{3, 6});
  CHECK(gate.local_offset == 0);
  CHECK(gate.local() == Range{0, 3});

  const tp::SegmentPiece& up = plan.piece("up");
  CHECK(up.source == Range{3, 6});  // segment coordinates
  CHECK(up.fused_offset == 12);     // after all of gate, all ranks
  CHECK(up.fused_source() == Range{15, 18});
  CHECK(up.local_offset == 3);  // after this rank's gate piece only
  CHECK(up.local() == Range{3, 6});
}

TEST_CASE("plan_segments: uneven QKV-shaped segments", "[shard]") {
  // q 8, k 4, v 4 over 3 ranks: q 3,3,2; k and v 2,1,1.
  const std::vector<Segment> segs = {{"q", 8}, {"k", 4}, {"v", 4}};
  const SegmentPlan p2 = tp::plan_segments(segs, 3, 2);
  CHECK(p2.piece("q").source == Range{6, 8});
  CHECK(p2.piece("k").source == Range{3, 4});
  CHECK(p2.piece("k").fused_source() == Range{11, 12});
  CHECK(p2.piece("k").local_offset == 2);
  CHECK(p2.piece("v").source == Range{3, 4});
  CHECK(p2.piece("v").fused_source() == Range{15, 16});
  CHECK(p2.piece("v").local_offset == 3);
  CHECK(p2.local_size == 4);
  CHECK(p2.local_sizes() == std::vector<int64_t>{2, 1, 1});
  CHECK(tp::plan_segments(segs, 3, 0).local_sizes() == std::vector<int64_t>{3, 2, 2});
}

TEST_CASE("plan_segments: a segment's granularity combines with the policy's", "[shard]") {
  // lcm(32, 64) = 64: 256 is 4 units, 2 per rank.
  const SplitPolicy p = SplitPolicy{}.with_granularity(32);
  CHECK(tp::plan_segments({{"a", 256, 64}}, 2, 1, p).piece("a").source == Range{128, 256});
  // lcm(2, 3) = 6: 96 is 16 units over 3 ranks -> 6,5,5 units.
  const std::vector<Segment> segs = {{"b", 96, 3}};
  CHECK(tp::plan_segments(segs, 3, 0, SplitPolicy{}.with_granularity(2)).piece("b").source == Range{0, 36});
  CHECK(tp::plan_segments(segs, 3, 2, SplitPolicy{}.with_granularity(2)).piece("b").source == Range{66, 96});
  // The segment name is the dimension an error names.
  REQUIRE_THROWS_WITH(tp::plan_segments({{"gate", 11000}, {"up", 11000}}, 4, 0, SplitPolicy{}.with_granularity(128)),
                      Catch::Contains("gate=11000 is not a multiple of the granularity 128; pad gate to 11008"));
}

TEST_CASE("plan_segments: a rank may own zero elements of every segment", "[shard]") {
  const SegmentPlan plan = tp::plan_segments({{"q", 2}, {"k", 1}}, 4, 3);
  CHECK(plan.local_size == 0);
  CHECK(plan.global_size == 3);
  CHECK(plan.local_sizes() == std::vector<int64_t>{0, 0});
  CHECK(plan.piece("k").fused_offset == 2);
  CHECK(plan.piece("k").local_offset == 0);
}

TEST_CASE("plan_single is split_for_rank as a one-segment plan", "[shard]") {
  const SplitPolicy p = SplitPolicy{}.with_granularity(8).with_rotation(3);
  for (int64_t rank = 0; rank < 5; ++rank) {
    INFO("rank " << rank);
    const SegmentPlan plan = tp::plan_single("out_features", 8 * 13, 5, rank, p);
    REQUIRE(plan.pieces.size() == 1);
    CHECK(plan.piece("out_features").source == tp::split_for_rank(8 * 13, 5, rank, p));
    CHECK(plan.piece("out_features").local_offset == 0);
    CHECK(plan.piece("out_features").fused_offset == 0);
    CHECK(plan.global_size == 8 * 13);
    CHECK(plan.local_size == plan.piece("out_features").size());
  }
  REQUIRE_THROWS_WITH(tp::plan_single("out_features", 100, 2, 0, SplitPolicy{}.with_granularity(64)),
                      Catch::Contains("pad out_features to 128"));
  REQUIRE_THROWS_WITH(tp::plan_single("x", 10, 2, 2),
                      Catch::Contains("invalid rank 2 (rank should be in the 0..1 range)"));
}

TEST_CASE("SegmentPlan::piece lists the segment names when one is missing", "[shard]") {
  const SegmentPlan plan = tp::plan_segments({{"q", 8}, {"k", 4}, {"v", 4}}, 2, 0);
  CHECK(plan.piece("v").name == "v");
  REQUIRE_THROWS_AS(plan.piece("o"), tp::ShardError);
  REQUIRE_THROWS_WITH(plan.piece("o"),
                      Catch::Contains("no segment named \"o\"") && Catch::Contains("segments: \"q\", \"k\", \"v\""));
  REQUIRE_THROWS_WITH(SegmentPlan{}.piece("q"), Catch::Contains("segments: none"));
}

TEST_CASE("make_segment_plan keeps explicit ranges and checks them", "[shard]") {
  const SegmentPlan plan = tp::make_segment_plan({{"q", 16}, {"k", 8}}, {{4, 12}, {2, 4}});
  CHECK(plan.piece("q").local() == Range{0, 8});
  CHECK(plan.piece("k").fused_source() == Range{18, 20});
  CHECK(plan.piece("k").local() == Range{8, 10});
  CHECK(plan.local_size == 10);
  CHECK(plan.global_size == 24);
  CHECK(tp::make_segment_plan({}, {}).pieces.empty());

  using Catch::Contains;
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", 16}, {"k", 8}}, {{0, 16}}), Contains("2 segments but 1 ranges"));
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", 16}}, {{8, 20}}),
                      Contains("range [8,20) for segment \"q\" is not inside [0,16)"));
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", 16}}, {{-1, 4}}), Contains("is not inside"));
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", 16}}, {{6, 4}}), Contains("is not inside"));
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", 16}, {"q", 8}}, {{0, 1}, {0, 1}}), Contains("appears twice"));
  REQUIRE_THROWS_WITH(tp::make_segment_plan({{"q", -16}}, {{0, 0}}), Contains("invalid size -16"));
}

TEST_CASE("plan_segments: bad arguments are refused", "[shard]") {
  using Catch::Contains;
  const std::vector<Segment> segs = {{"q", 8}};
  REQUIRE_THROWS_WITH(tp::plan_segments(segs, 4, 5), Contains("invalid rank 5 (rank should be in the 0..3 range)"));
  REQUIRE_THROWS_WITH(tp::plan_segments(segs, 0, 0), Contains("invalid world_size 0"));
  REQUIRE_THROWS_WITH(tp::plan_segments({{"q", 8, 0}}, 2, 0), Contains("invalid granularity 0 for segment \"q\""));
  REQUIRE_THROWS_WITH(tp::plan_segments(segs, 2, 0, SplitPolicy{}.with_granularity(-2)),
                      Contains("invalid granularity -2"));
  REQUIRE_THROWS_WITH(tp::plan_segments(segs, 2, 0, SplitPolicy{}.with_weights({1})), Contains("got 1 weights"));
}

TEST_CASE("plan_segments property: every segment is covered exactly once over all ranks", "[shard]") {
  std::mt19937_64 rng(kSeed);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  static const int64_t kGranularities[] = {1, 2, 4, 16, 64, 128};
  for (int i = 0; i < 1500; ++i) {
    const int64_t world = uni(1, 12);
    const int64_t g = kGranularities[uni(0, 5)];
    SplitPolicy policy = SplitPolicy{}.with_granularity(g).with_rotation(uni(0, 20));
    if (i % 3 == 0) {
      std::vector<double> w(static_cast<size_t>(world));
      for (double& x : w) x = static_cast<double>(uni(0, 4));
      w[0] = 1;
      policy = policy.with_weights(w);
    }
    std::vector<Segment> segs;
    const int64_t nseg = uni(1, 4);
    for (int64_t s = 0; s < nseg; ++s) {
      const int64_t sg = kGranularities[uni(0, 5)];
      const int64_t unit = tp::combine_granularity(g, sg);
      segs.push_back({"s" + std::to_string(s), unit * uni(0, 3 * world), sg});
    }
    INFO("case " << i << " seed " << kSeed << ": world=" << world << " granularity=" << g << " rotation="
                 << policy.rotation << " weighted=" << !policy.weights.empty() << " segments=" << segs.size());

    std::vector<int64_t> next(segs.size(), 0);  // per segment: where the next rank's piece must begin
    int64_t global = 0;
    for (const Segment& s : segs) global += s.size;
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("rank " << rank);
      const SegmentPlan plan = tp::plan_segments(segs, world, rank, policy);
      REQUIRE(plan.pieces.size() == segs.size());
      REQUIRE(plan.global_size == global);
      int64_t fused = 0, local = 0;
      for (size_t s = 0; s < segs.size(); ++s) {
        const tp::SegmentPiece& p = plan.pieces[s];
        INFO("segment " << p.name);
        REQUIRE(p.name == segs[s].name);
        REQUIRE(p.segment_size == segs[s].size);
        REQUIRE(p.fused_offset == fused);
        REQUIRE(p.local_offset == local);
        REQUIRE(p.source.begin == next[s]);  // ranks tile the segment in order
        REQUIRE(p.source.begin % tp::combine_granularity(g, segs[s].granularity) == 0);
        REQUIRE(p.source.end <= segs[s].size);
        REQUIRE(&plan.piece(p.name) == &p);
        next[s] = p.source.end;
        fused += segs[s].size;
        local += p.size();
      }
      REQUIRE(plan.local_size == local);
    }
    for (size_t s = 0; s < segs.size(); ++s) REQUIRE(next[s] == segs[s].size);
  }
}
