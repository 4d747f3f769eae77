// tp::split, split_for_rank, combine_granularity, round_up: golden cases, errors and
// property tests over random (total, world, granularity, weights, rotation).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tp/shard/split.h"

namespace {

using tp::Range;
using tp::SplitPolicy;

constexpr uint64_t kSeed = 0x5eed5a1d;

template <class T>
std::string str(const std::vector<T>& v) {
  std::ostringstream os;
  os << '{';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << '}';
  return os.str();
}

std::vector<int64_t> sizes(const std::vector<Range>& ranges) {
  std::vector<int64_t> out;
  for (const Range& r : ranges) out.push_back(r.size());
  return out;
}

// Every element of [0, total) owned exactly once, ranges contiguous in rank order,
// every boundary on the granularity.
void check_partition(const std::vector<Range>& ranges, int64_t total, int64_t world, int64_t granularity) {
  REQUIRE(static_cast<int64_t>(ranges.size()) == world);
  int64_t expected_begin = 0;
  for (const Range& r : ranges) {
    REQUIRE(r.begin == expected_begin);
    REQUIRE(r.end >= r.begin);
    REQUIRE(r.begin % granularity == 0);
    REQUIRE(r.end % granularity == 0);
    expected_begin = r.end;
  }
  REQUIRE(expected_begin == total);
}

struct Case {
  int64_t total, world, granularity, rotation;
};

Case random_case(std::mt19937_64& rng) {
  static const int64_t kGranularities[] = {1, 1, 2, 3, 8, 16, 32, 64, 128, 256};
  const int64_t g = kGranularities[std::uniform_int_distribution<int>(0, 9)(rng)];
  const int64_t world = std::uniform_int_distribution<int64_t>(1, 33)(rng);
  // Mostly a few units per rank, sometimes fewer units than ranks.
  const int64_t units = std::uniform_int_distribution<int64_t>(0, 4 * world + 40)(rng);
  const int64_t rotation = std::uniform_int_distribution<int64_t>(-50, 200)(rng);
  return {units * g, world, g, rotation};
}

}  // namespace

TEST_CASE("split: 10 units over 4 ranks gives 3,3,2,2", "[shard]") {
  CHECK(sizes(tp::split(10, 4)) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(tp::split(10, 4) == std::vector<Range>{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
  // The same in units of a 128-element quant block.
  CHECK(sizes(tp::split(1280, 4, SplitPolicy{}.with_granularity(128))) == std::vector<int64_t>{384, 384, 256, 256});
  CHECK(tp::split(12, 4) == std::vector<Range>{{0, 3}, {3, 6}, {6, 9}, {9, 12}});
  CHECK(tp::split(7, 1) == std::vector<Range>{{0, 7}});
}

TEST_CASE("split: rotation moves the remainder", "[shard]") {
  auto with = [](int64_t rotation) { return sizes(tp::split(10, 4, SplitPolicy{}.with_rotation(rotation))); };
  CHECK(with(0) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(with(1) == std::vector<int64_t>{2, 3, 3, 2});
  CHECK(with(2) == std::vector<int64_t>{2, 2, 3, 3});
  CHECK(with(3) == std::vector<int64_t>{3, 2, 2, 3});
  CHECK(with(4) == with(0));
  CHECK(with(-1) == with(3));  // negative rotations count back from the last rank
  CHECK(tp::split(10, 4, SplitPolicy{}.with_rotation(1)) == std::vector<Range>{{0, 2}, {2, 5}, {5, 8}, {8, 10}});
}

TEST_CASE("split: more ranks than units gives zero-size shards", "[shard]") {
  CHECK(sizes(tp::split(3, 5)) == std::vector<int64_t>{1, 1, 1, 0, 0});
  CHECK(sizes(tp::split(3, 5, SplitPolicy{}.with_rotation(4))) == std::vector<int64_t>{1, 1, 0, 0, 1});
  CHECK(tp::split(256, 4, SplitPolicy{}.with_granularity(128)) ==
        std::vector<Range>{{0, 128}, {128, 256}, {256, 256}, {256, 256}});
  CHECK(tp::split(0, 3) == std::vector<Range>{{0, 0}, {0, 0}, {0, 0}});
  CHECK(tp::split_for_rank(3, 5, 4).empty());
}

TEST_CASE("split: weighted examples", "[shard]") {
  auto weighted = [](int64_t total, std::vector<double> w, int64_t rotation = 0) {
    const auto world = static_cast<int64_t>(w.size());
    return sizes(tp::split(total, world, SplitPolicy{}.with_weights(w).with_rotation(rotation)));
  };
  CHECK(weighted(8, {1, 1, 2}) == std::vector<int64_t>{2, 2, 4});
  CHECK(weighted(10, {1, 3}) == std::vector<int64_t>{3, 7});     // 2.5, 7.5: tie, rank 0 first
  CHECK(weighted(10, {1, 3}, 1) == std::vector<int64_t>{2, 8});  // the tie goes to rank 1
  CHECK(weighted(5, {1, 0, 1}) == std::vector<int64_t>{3, 0, 2});
  CHECK(weighted(7, {0, 1}) == std::vector<int64_t>{0, 7});
  CHECK(weighted(10, {0.7, 0.2, 0.1}) == std::vector<int64_t>{7, 2, 1});
  CHECK(weighted(100, {2, 1, 1}) == std::vector<int64_t>{50, 25, 25});
  // Largest remainder: ideal 4.2, 2.8, 3.0 (weights 42:28:30).
  CHECK(weighted(10, {42, 28, 30}) == std::vector<int64_t>{4, 3, 3});
  // Equal weights are the even split, remainder and rotation included.
  CHECK(weighted(10, {1, 1, 1, 1}) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(weighted(10, {5, 5, 5, 5}, 1) == std::vector<int64_t>{2, 3, 3, 2});
  // Granularity applies to weighted splits too.
  CHECK(tp::split(1024, 2, SplitPolicy{}.with_granularity(128).with_weights({3, 1})) ==
        std::vector<Range>{{0, 768}, {768, 1024}});
}

TEST_CASE("split: exact ties in weighted splits go in rotation order", "[shard]") {
  // 2 units at weights 1:4:1 are ideal shares 1/3, 4/3, 1/3: floors 0, 1, 0 and three
  // fractions of exactly 1/3. The spare unit goes to the rotation's first rank - in
  // floating point 4/3's fraction could round above 1/3 and win for every rotation.
  for (int64_t rotation = 0; rotation < 3; ++rotation) {
    INFO("rotation " << rotation);
    std::vector<int64_t> expected{0, 1, 0};
    ++expected[static_cast<size_t>(rotation)];
    CHECK(sizes(tp::split(2, 3, SplitPolicy{}.with_weights({1, 4, 1}).with_rotation(rotation))) == expected);
  }
  // The same ties with the weights scaled by a power of two, and shares that divide
  // exactly (no leftover to place).
  CHECK(sizes(tp::split(2, 3, SplitPolicy{}.with_weights({0.25, 1.0, 0.25}).with_rotation(2))) ==
        std::vector<int64_t>{0, 1, 1});
  CHECK(sizes(tp::split(4, 3, SplitPolicy{}.with_weights({3, 3, 6}).with_rotation(1))) ==
        std::vector<int64_t>{1, 1, 2});
  // Exact however far apart the weights are: 1e-300 against 1e300 (2000 bits apart)
  // still ties exactly when scaled copies meet.
  CHECK(sizes(tp::split(3, 3, SplitPolicy{}.with_weights({1e-300, 1e300, 1e300}).with_rotation(0))) ==
        std::vector<int64_t>{0, 2, 1});
  CHECK(sizes(tp::split(3, 3, SplitPolicy{}.with_weights({1e-300, 1e300, 1e300}).with_rotation(2))) ==
        std::vector<int64_t>{0, 1, 2});
}

TEST_CASE("split_for_rank returns that rank's range of the split", "[shard]") {
  const SplitPolicy p = SplitPolicy{}.with_granularity(16).with_rotation(2);
  const std::vector<Range> all = tp::split(16 * 11, 3, p);
  for (int64_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(tp::split_for_rank(16 * 11, 3, r, p) == all[static_cast<size_t>(r)]);
  }
}

TEST_CASE("split: a total off the granularity names the dimension and the padding", "[shard]") {
  const SplitPolicy p = SplitPolicy{}.with_granularity(128);
  REQUIRE_THROWS_AS(tp::split(11000, 4, p, "out_features"), tp::ShardError);
  REQUIRE_THROWS_WITH(tp::split(11000, 4, p, "out_features"),
                      Catch::Contains("out_features=11000 is not a multiple of the granularity 128") &&
                          Catch::Contains("pad out_features to 11008"));
  // Even at world 1: a whole tensor of partial blocks cannot be loaded either.
  REQUIRE_THROWS_WITH(tp::split(100, 1, SplitPolicy{}.with_granularity(64), "in_features"),
                      Catch::Contains("pad in_features to 128"));
  REQUIRE_THROWS_WITH(tp::split_for_rank(11000, 4, 0, p, "out_features"), Catch::Contains("pad out_features to 11008"));
}

TEST_CASE("split: bad arguments are refused with the valid range", "[shard]") {
  using Catch::Contains;
  REQUIRE_THROWS_WITH(tp::split_for_rank(10, 4, 5), Contains("invalid rank 5 (rank should be in the 0..3 range)"));
  REQUIRE_THROWS_WITH(tp::split_for_rank(10, 4, -1), Contains("invalid rank -1 (rank should be in the 0..3 range)"));
  REQUIRE_THROWS_WITH(tp::split(10, 0), Contains("invalid world_size 0 (world_size should be >= 1)"));
  REQUIRE_THROWS_WITH(tp::split_for_rank(10, 0, 0), Contains("invalid world_size 0"));
  REQUIRE_THROWS_WITH(tp::split(10, 2, SplitPolicy{}.with_granularity(0)),
                      Contains("invalid granularity 0 (granularity should be >= 1)"));
  REQUIRE_THROWS_WITH(tp::split(-4, 2, {}, "rows"), Contains("split(rows): invalid size -4"));
  REQUIRE_THROWS_WITH(tp::split(10, 4, SplitPolicy{}.with_weights({1, 2, 3})),
                      Contains("got 3 weights for world_size 4"));
  REQUIRE_THROWS_WITH(tp::split(10, 2, SplitPolicy{}.with_weights({1, -1})), Contains("invalid weight -1 for rank 1"));
  REQUIRE_THROWS_WITH(tp::split(10, 2, SplitPolicy{}.with_weights({std::nan(""), 1})),
                      Contains("invalid weight nan for rank 0"));
  REQUIRE_THROWS_WITH(tp::split(10, 2, SplitPolicy{}.with_weights({std::numeric_limits<double>::infinity(), 1})),
                      Contains("invalid weight inf for rank 0"));
  REQUIRE_THROWS_WITH(tp::split(10, 3, SplitPolicy{}.with_weights({0, 0, 0})), Contains("all 3 weights are 0"));
}

TEST_CASE("combine_granularity and round_up", "[shard]") {
  CHECK(tp::combine_granularity(4, 6) == 12);
  CHECK(tp::combine_granularity(128, 64) == 128);
  CHECK(tp::combine_granularity(1, 7) == 7);
  CHECK(tp::combine_granularity(96, 128) == 384);
  CHECK(tp::round_up(11000, 128) == 11008);
  CHECK(tp::round_up(0, 5) == 0);
  CHECK(tp::round_up(10, 5) == 10);
  CHECK(tp::round_up(11, 1) == 11);
  REQUIRE_THROWS_WITH(tp::combine_granularity(0, 4), Catch::Contains("invalid granularity 0"));
  REQUIRE_THROWS_WITH(tp::combine_granularity(int64_t{1} << 40, (int64_t{1} << 40) - 1), Catch::Contains("overflows"));
  REQUIRE_THROWS_WITH(tp::round_up(10, 0), Catch::Contains("invalid granularity 0"));
  REQUIRE_THROWS_WITH(tp::round_up(std::numeric_limits<int64_t>::max(), 2), Catch::Contains("overflows"));
}

TEST_CASE("split property: even splits partition the dimension on the granularity", "[shard]") {
  std::mt19937_64 rng(kSeed);
  for (int i = 0; i < 4000; ++i) {
    const Case c = random_case(rng);
    INFO("case " << i << " seed " << kSeed << ": total=" << c.total << " world=" << c.world
                 << " granularity=" << c.granularity << " rotation=" << c.rotation);
    const auto ranges =
        tp::split(c.total, c.world, SplitPolicy{}.with_granularity(c.granularity).with_rotation(c.rotation));
    check_partition(ranges, c.total, c.world, c.granularity);
    int64_t lo = c.total, hi = 0;
    for (const Range& r : ranges) {
      lo = std::min(lo, r.size());
      hi = std::max(hi, r.size());
    }
    REQUIRE(hi - lo <= c.granularity);  // at most one unit apart
  }
}

TEST_CASE("split property: the remainder goes to ranks rotation..rotation+rem-1", "[shard]") {
  std::mt19937_64 rng(kSeed + 1);
  for (int i = 0; i < 4000; ++i) {
    const Case c = random_case(rng);
    INFO("case " << i << " seed " << kSeed + 1 << ": total=" << c.total << " world=" << c.world
                 << " granularity=" << c.granularity << " rotation=" << c.rotation);
    const auto ranges =
        tp::split(c.total, c.world, SplitPolicy{}.with_granularity(c.granularity).with_rotation(c.rotation));
    const int64_t units = c.total / c.granularity;
    const int64_t base = units / c.world, rem = units % c.world;
    const int64_t start = ((c.rotation % c.world) + c.world) % c.world;
    for (int64_t k = 0; k < c.world; ++k) {
      const int64_t r = (start + k) % c.world;  // k-th rank in rotation order
      INFO("rank " << r);
      REQUIRE(ranges[static_cast<size_t>(r)].size() == (base + (k < rem ? 1 : 0)) * c.granularity);
    }
  }
}

TEST_CASE("split property: weighted shares are within one unit of the ideal", "[shard]") {
  std::mt19937_64 rng(kSeed + 2);
  std::uniform_real_distribution<double> real(0.05, 10.0);
  std::uniform_int_distribution<int> small(0, 4);
  for (int i = 0; i < 4000; ++i) {
    const Case c = random_case(rng);
    // A mix of zero weights, small integers (many exact ties) and arbitrary reals.
    std::vector<double> w(static_cast<size_t>(c.world));
    const bool integers = i % 2 == 0;
    for (double& x : w) x = small(rng) == 0 ? 0.0 : (integers ? small(rng) + 1.0 : real(rng));
    w[static_cast<size_t>(i % c.world)] = 1.0;  // never all zero
    const SplitPolicy p = SplitPolicy{}.with_granularity(c.granularity).with_rotation(c.rotation).with_weights(w);
    INFO("case " << i << " seed " << kSeed + 2 << ": total=" << c.total << " world=" << c.world
                 << " granularity=" << c.granularity << " rotation=" << c.rotation << " weights=" << str(w));

    const auto ranges = tp::split(c.total, c.world, p);
    check_partition(ranges, c.total, c.world, c.granularity);
    REQUIRE(tp::split(c.total, c.world, p) == ranges);  // deterministic
    double sum = 0;
    for (double x : w) sum += x;
    const int64_t units = c.total / c.granularity;
    for (int64_t r = 0; r < c.world; ++r) {
      const size_t ri = static_cast<size_t>(r);
      INFO("rank " << r);
      const double ideal = static_cast<double>(units) * w[ri] / sum;
      const int64_t got = ranges[ri].size() / c.granularity;
      REQUIRE(std::abs(static_cast<double>(got) - ideal) < 1.0 + 1e-9);
      if (w[ri] == 0) REQUIRE(got == 0);
    }
  }
}

TEST_CASE("split property: equal weights give exactly the even split, rotation included", "[shard]") {
  std::mt19937_64 rng(kSeed + 3);
  std::uniform_real_distribution<double> real(0.01, 100.0);
  for (int i = 0; i < 2000; ++i) {
    const Case c = random_case(rng);
    const double weight = real(rng);
    INFO("case " << i << " seed " << kSeed + 3 << ": total=" << c.total << " world=" << c.world
                 << " granularity=" << c.granularity << " rotation=" << c.rotation << " weight=" << weight);
    const SplitPolicy even = SplitPolicy{}.with_granularity(c.granularity).with_rotation(c.rotation);
    const SplitPolicy weighted = even.with_weights(std::vector<double>(static_cast<size_t>(c.world), weight));
    REQUIRE(tp::split(c.total, c.world, weighted) == tp::split(c.total, c.world, even));
  }
}

TEST_CASE("split: partial_tail lets the last unit be short", "[shard]") {
  const SplitPolicy p = SplitPolicy{}.with_granularity(128).with_partial_tail(true);
  // 1000 = 7 full 128-blocks and one of 104: 8 units, 4 each; the last rank owns the tail.
  CHECK(tp::split(1000, 2, p, "out_features") == std::vector<Range>{{0, 512}, {512, 1000}});
  CHECK(tp::split(1000, 1, p) == std::vector<Range>{{0, 1000}});
  // 8 units over 3 ranks: 3,3,2 units; the short unit is always the last element range.
  CHECK(tp::split(1000, 3, p) == std::vector<Range>{{0, 384}, {384, 768}, {768, 1000}});
  // Rotation moves the extra units, not the tail: the tail stays at the end.
  CHECK(tp::split(1000, 3, p.with_rotation(1)) == std::vector<Range>{{0, 256}, {256, 640}, {640, 1000}});
  // More ranks than units: the ranks after the tail own nothing, starting at total.
  CHECK(tp::split(300, 4, p) == std::vector<Range>{{0, 128}, {128, 256}, {256, 300}, {300, 300}});
  // A total below one unit: one short unit.
  CHECK(tp::split(100, 2, p) == std::vector<Range>{{0, 100}, {100, 100}});
  // A multiple of the granularity splits exactly as without the flag.
  CHECK(tp::split(1280, 4, p) == tp::split(1280, 4, SplitPolicy{}.with_granularity(128)));
  // Weighted: 8 units at 1:3 -> 2 and 6 units.
  CHECK(tp::split(1000, 2, p.with_weights({1, 3})) == std::vector<Range>{{0, 256}, {256, 1000}});
  // Without the flag the same total is still refused.
  REQUIRE_THROWS_WITH(tp::split(1000, 2, SplitPolicy{}.with_granularity(128), "out_features"),
                      Catch::Contains("pad out_features to 1024"));
}

TEST_CASE("split property: partial_tail partitions the dimension, boundaries on the granularity except at total",
          "[shard]") {
  std::mt19937_64 rng(kSeed + 7);
  for (int i = 0; i < 4000; ++i) {
    Case c = random_case(rng);
    // Make the total ragged: drop up to granularity-1 elements off a non-zero total.
    if (c.total > 0) c.total -= std::uniform_int_distribution<int64_t>(0, c.granularity - 1)(rng);
    const bool weighted = i % 2 == 1;
    std::vector<double> w;
    if (weighted) {
      for (int64_t r = 0; r < c.world; ++r) w.push_back(std::uniform_real_distribution<double>(0.0, 4.0)(rng));
      w[static_cast<size_t>(i) % w.size()] += 1.0;  // at least one positive weight
    }
    INFO("case " << i << " seed " << kSeed + 7 << ": total=" << c.total << " world=" << c.world
                 << " granularity=" << c.granularity << " rotation=" << c.rotation << " weights=" << str(w));
    const SplitPolicy p =
        SplitPolicy{}.with_granularity(c.granularity).with_rotation(c.rotation).with_weights(w).with_partial_tail(true);
    const auto ranges = tp::split(c.total, c.world, p);
    REQUIRE(static_cast<int64_t>(ranges.size()) == c.world);
    int64_t expected_begin = 0;
    for (const Range& r : ranges) {
      REQUIRE(r.begin == expected_begin);
      REQUIRE(r.end >= r.begin);
      REQUIRE((r.begin % c.granularity == 0 || r.begin == c.total));
      REQUIRE((r.end % c.granularity == 0 || r.end == c.total));
      expected_begin = r.end;
    }
    REQUIRE(expected_begin == c.total);
    // Padding the total to whole units gives the same boundaries, clamped to total.
    const auto padded = tp::split(tp::round_up(c.total, c.granularity), c.world, p.with_partial_tail(false));
    for (size_t r = 0; r < ranges.size(); ++r) {
      REQUIRE(ranges[r].begin == std::min(padded[r].begin, c.total));
      REQUIRE(ranges[r].end == std::min(padded[r].end, c.total));
    }
  }
}
