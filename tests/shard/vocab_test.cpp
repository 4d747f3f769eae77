// partition_vocab: padding, uneven and empty slices, owners, errors.

#include <catch2/catch.hpp>

#include "tp/shard/split.h"
#include "tp/shard/vocab.h"

using namespace tp;

TEST_CASE("partition_vocab pads to the multiple and splits in whole units", "[shard]") {
  const auto p = partition_vocab(500, 3, 64);
  CHECK(p.padded_size == 512);
  REQUIRE(p.ranges.size() == 3);
  CHECK(p.range(0) == Range{0, 192});
  CHECK(p.range(1) == Range{192, 384});
  CHECK(p.range(2) == Range{384, 512});
  CHECK(p.real(2) == Range{384, 500});
  CHECK(p.owner(0) == 0);
  CHECK(p.owner(383) == 1);
  CHECK(p.owner(499) == 2);
  CHECK_THROWS_WITH(p.owner(500), Catch::Contains("token id 500 is outside the vocabulary [0, 500)"));
}

TEST_CASE("partition_vocab without padding splits element by element, unevenly", "[shard]") {
  const auto p = partition_vocab(512, 3);
  CHECK(p.padded_size == 512);
  CHECK(p.range(0) == Range{0, 171});
  CHECK(p.range(1) == Range{171, 342});
  CHECK(p.range(2) == Range{342, 512});
  for (int64_t r = 0; r < 3; ++r) CHECK(p.real(r) == p.range(r));
}

TEST_CASE("partition_vocab gives empty slices when the units run out", "[shard]") {
  const auto p = partition_vocab(5, 4, 4);  // padded 8: two units of 4
  CHECK(p.range(0) == Range{0, 4});
  CHECK(p.range(1) == Range{4, 8});
  CHECK(p.real(1) == Range{4, 5});
  CHECK(p.range(2).empty());
  CHECK(p.real(3).empty());
  const auto q = partition_vocab(3, 4);
  CHECK(q.range(3).empty());
  CHECK(q.owner(2) == 2);
}

TEST_CASE("partition_vocab refuses non-positive arguments", "[shard]") {
  CHECK_THROWS_AS(partition_vocab(0, 2), ShardError);
  CHECK_THROWS_WITH(partition_vocab(10, 0), Catch::Contains("world_size must be positive"));
  CHECK_THROWS_WITH(partition_vocab(10, 2, 0), Catch::Contains("pad_to_multiple_of must be positive"));
}
