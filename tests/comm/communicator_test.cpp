// tp::Communicator over Gloo, ranks as threads (run_ranks_in_threads) at world 1..4:
// the collectives' results against a float64 reference, and the strategy bookkeeping.

#include <atomic>
#include <map>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>  // process_group() hands out an intrusive_ptr

#include "support/comm_test_util.h"

using Catch::Contains;
using tp::AllReduceStrategy;
using tp::Communicator;
using tp::CommunicatorOptions;
using namespace tp::comm_test;

TEST_CASE("all_reduce sums every rank's tensor, float32/float64/bfloat16/float16 (and integers)", "[comm]") {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong};
  // Shapes include numel 0 and numel 1 (0-d and 1-d).
  const std::vector<std::vector<int64_t>> shapes = {{}, {1}, {0}, {4, 0}, {7, 5}, {3, 1000}};
  for (int64_t world : {1, 2, 3, 4}) {
    // results[case][rank]
    const size_t cases = dtypes.size() * shapes.size();
    std::vector<std::vector<at::Tensor>> results(cases, std::vector<at::Tensor>(world));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          size_t c = 0;
          for (auto dtype : dtypes) {
            for (const auto& shape : shapes) {
              at::Tensor t = rank_input(kSeed + c, comm.rank(), shape, dtype);
              at::Tensor& out = comm.all_reduce(t);
              results[c][comm.rank()] = out.is_same(t) ? t : at::Tensor();  // returns t itself
              ++c;
            }
          }
        },
        test_options());

    size_t c = 0;
    for (auto dtype : dtypes) {
      for (const auto& shape : shapes) {
        const at::Tensor expected = reference_sum(kSeed + c, world, shape, dtype);
        const auto [rtol, atol] = tolerance(dtype);
        for (int64_t rank = 0; rank < world; ++rank) {
          INFO("world=" << world << " rank=" << rank << " dtype=" << dtype << " shape=" << c10::IntArrayRef(shape)
                        << " seed=" << kSeed + c);
          const at::Tensor& got = results[c][rank];
          REQUIRE(got.defined());
          REQUIRE(got.scalar_type() == dtype);
          REQUIRE(got.sizes() == c10::IntArrayRef(shape));
          CHECK(at::allclose(got.to(at::kDouble), expected, rtol, atol));
          CHECK(at::equal(got, results[c][0]));  // bitwise identical across ranks
        }
        ++c;
      }
    }
  }
}

TEST_CASE("all_reduce leaves every rank bitwise identical", "[comm]") {
  // Large enough that Gloo's ring splits the tensor into one segment per rank, odd
  // so the segments are uneven.
  const std::vector<int64_t> shape = {10007};
  for (int64_t world : {2, 3, 4}) {
    std::vector<std::vector<at::Tensor>> results(kFloatTypes.size(), std::vector<at::Tensor>(world));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          for (size_t i = 0; i < kFloatTypes.size(); ++i) {
            at::Tensor t = rank_input(kSeed + 50 + i, comm.rank(), shape, kFloatTypes[i]) * 1000;
            comm.all_reduce(t);
            results[i][comm.rank()] = t;
          }
        },
        test_options());
    for (size_t i = 0; i < kFloatTypes.size(); ++i) {
      for (int64_t rank = 1; rank < world; ++rank) {
        INFO("world=" << world << " rank=" << rank << " dtype=" << kFloatTypes[i]
                      << " shape=[10007] seed=" << kSeed + 50 + i);
        CHECK(at::equal(results[i][rank], results[i][0]));
      }
    }
  }
}

TEST_CASE("all_reduce of half and bfloat16 accumulates in fp32", "[comm]") {
  // Rank 0 holds 1, the three others a quarter of a unit in the last place at 1. In
  // fp32 the sum is 1 + 0.75 ulp whatever the order, which rounds up to 1 + 1 ulp; a
  // sum in the narrow type that starts from 1 never moves.
  struct Case {
    at::ScalarType dtype;
    double small;
    double expected;
  };
  const std::vector<Case> cases = {{at::kBFloat16, 1.0 / 512, 1.0 + 1.0 / 128},
                                   {at::kHalf, 1.0 / 4096, 1.0 + 1.0 / 1024}};
  std::vector<std::vector<at::Tensor>> results(cases.size(), std::vector<at::Tensor>(4));
  tp::run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        for (size_t i = 0; i < cases.size(); ++i) {
          at::Tensor t = at::full({5}, comm.rank() == 0 ? 1.0 : cases[i].small, cases[i].dtype);
          comm.all_reduce(t);
          results[i][comm.rank()] = t;
        }
      },
      test_options());
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int64_t rank = 0; rank < 4; ++rank) {
      INFO("world=4 rank=" << rank << " dtype=" << cases[i].dtype);
      CHECK(at::equal(results[i][rank], at::full({5}, cases[i].expected, cases[i].dtype)));
    }
  }
}

TEST_CASE("all_reduce writes back into a non-contiguous tensor", "[comm]") {
  for (int64_t world : {1, 2, 3}) {
    std::vector<at::Tensor> transposed(world), strided_base(world);
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          // A transposed view: [5, 6] seen as [6, 5].
          at::Tensor base = rank_input(kSeed + 60, comm.rank(), {5, 6}, at::kFloat);
          at::Tensor view = base.t();
          comm.all_reduce(view);
          transposed[comm.rank()] = base;
          // Every other column of a bfloat16 [4, 8]: the other columns must stay as they were.
          at::Tensor base2 = rank_input(kSeed + 61, comm.rank(), {4, 8}, at::kBFloat16);
          at::Tensor cols = base2.slice(1, 0, 8, 2);
          comm.all_reduce(cols);
          strided_base[comm.rank()] = base2;
        },
        test_options());
    const at::Tensor expected = reference_sum(kSeed + 60, world, {5, 6}, at::kFloat);
    const at::Tensor expected2 = reference_sum(kSeed + 61, world, {4, 8}, at::kBFloat16);
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank << " seed=" << kSeed + 60);
      CHECK(at::allclose(transposed[rank].to(at::kDouble), expected, 1e-5, 1e-5));
      const at::Tensor own = rank_input(kSeed + 61, rank, {4, 8}, at::kBFloat16);
      CHECK(
          at::allclose(strided_base[rank].slice(1, 0, 8, 2).to(at::kDouble), expected2.slice(1, 0, 8, 2), 1e-2, 1e-2));
      CHECK(at::equal(strided_base[rank].slice(1, 1, 8, 2), own.slice(1, 1, 8, 2)));
    }
  }
}

TEST_CASE("all_gather concatenates uneven and zero extents along dim 0 and dim -1", "[comm]") {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kBFloat16, at::kInt, at::kBool};
  for (int64_t world : {1, 2, 3, 4}) {
    std::vector<std::vector<int64_t>> size_cases = {
        std::vector<int64_t>(world, 3),  // even
        {},                              // 1, 2, 3, ...: uneven
        {},                              // 0, 2, 0, 5, ...: zeros mixed in
        std::vector<int64_t>(world, 0),  // all empty
    };
    for (int64_t r = 0; r < world; ++r) {
      size_cases[1].push_back(r + 1);
      size_cases[2].push_back(r % 2 == 0 ? 0 : 2 + r);
    }
    // One case per (sizes, dim, dtype). Shapes: dim 0 -> [s, 3, 2]; dim -1 -> [2, 3, s].
    struct Case {
      std::vector<int64_t> sizes;
      int64_t dim;
      at::ScalarType dtype;
      uint64_t seed;
    };
    std::vector<Case> cases;
    for (const auto& sizes : size_cases)
      for (int64_t dim : {0, -1})
        for (auto dtype : dtypes) cases.push_back({sizes, dim, dtype, kSeed + 100 + cases.size()});
    auto shape_of = [](const Case& c, int64_t extent) {
      return c.dim == 0 ? std::vector<int64_t>{extent, 3, 2} : std::vector<int64_t>{2, 3, extent};
    };

    std::vector<std::vector<at::Tensor>> results(cases.size(), std::vector<at::Tensor>(world));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          for (size_t i = 0; i < cases.size(); ++i) {
            const Case& c = cases[i];
            at::Tensor mine = rank_input(c.seed, comm.rank(), shape_of(c, c.sizes[comm.rank()]), c.dtype);
            results[i][comm.rank()] = comm.all_gather(mine, c.dim, c.sizes);
          }
        },
        test_options());

    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      std::vector<at::Tensor> pieces;
      for (int64_t r = 0; r < world; ++r) pieces.push_back(rank_input(c.seed, r, shape_of(c, c.sizes[r]), c.dtype));
      const at::Tensor expected = at::cat(pieces, c.dim);
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("world=" << world << " rank=" << rank << " dtype=" << c.dtype << " dim=" << c.dim
                      << " sizes=" << c10::IntArrayRef(c.sizes) << " seed=" << c.seed);
        REQUIRE(results[i][rank].sizes() == expected.sizes());
        CHECK(at::equal(results[i][rank], expected));
      }
    }
  }
}

TEST_CASE("reduce_scatter returns this rank's slice of the sum", "[comm]") {
  // auto: ranks as threads share the host, so the shared-memory path; process_group:
  // the group's own reduce_scatter (the path across hosts).
  for (AllReduceStrategy strategy : {AllReduceStrategy::kAuto, AllReduceStrategy::kProcessGroup})
    for (int64_t world : {1, 2, 3, 4}) {
      CommunicatorOptions options = test_options();
      options.all_reduce = strategy;
      std::vector<int64_t> uneven, with_zero;
      for (int64_t r = 0; r < world; ++r) {
        uneven.push_back(r + 2);
        with_zero.push_back(r == 0 ? 0 : r + 1);
      }
      struct Case {
        std::vector<int64_t> sizes;
        int64_t dim;
        at::ScalarType dtype;
        uint64_t seed;
      };
      std::vector<Case> cases;
      for (const auto& sizes : {uneven, with_zero})
        for (int64_t dim : {0, -1})
          for (auto dtype : {at::kFloat, at::kBFloat16, at::kDouble, at::kHalf})
            cases.push_back({sizes, dim, dtype, kSeed + 200 + cases.size()});
      auto shape_of = [](const Case& c) {
        int64_t total = 0;
        for (auto s : c.sizes) total += s;
        return c.dim == 0 ? std::vector<int64_t>{total, 3} : std::vector<int64_t>{3, total};
      };

      std::vector<std::vector<at::Tensor>> results(cases.size(), std::vector<at::Tensor>(world));
      tp::run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            for (size_t i = 0; i < cases.size(); ++i) {
              const Case& c = cases[i];
              at::Tensor t = rank_input(c.seed, comm.rank(), shape_of(c), c.dtype);
              results[i][comm.rank()] = comm.reduce_scatter(t, c.dim, c.sizes);
            }
          },
          options);

      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        const at::Tensor sum = reference_sum(c.seed, world, shape_of(c), c.dtype);
        const auto [rtol, atol] = tolerance(c.dtype);
        int64_t offset = 0;
        for (int64_t rank = 0; rank < world; ++rank) {
          INFO("strategy=" << strategy << " world=" << world << " rank=" << rank << " dtype=" << c.dtype
                           << " dim=" << c.dim << " sizes=" << c10::IntArrayRef(c.sizes) << " seed=" << c.seed);
          const at::Tensor expected = sum.narrow(c.dim, offset, c.sizes[rank]);
          offset += c.sizes[rank];
          REQUIRE(results[i][rank].sizes() == expected.sizes());
          CHECK(results[i][rank].scalar_type() == c.dtype);
          CHECK(at::allclose(results[i][rank].to(at::kDouble), expected, rtol, atol));
        }
      }
    }
}

TEST_CASE("reduce_scatter through shared memory gives the bits of the all_reduce, across chunks", "[comm]") {
  // 3 x 700000 float32 is 8.4 MB: the segment's 2 MiB buffers take it in several
  // chunks, and each rank's piece (uneven) straddles chunk boundaries.
  const std::vector<int64_t> sizes = {1, 2, 0};
  const std::vector<int64_t> shape = {3, 700000};
  std::vector<at::Tensor> scattered(3), reduced(3);
  CommunicatorOptions options = test_options();
  options.all_reduce = AllReduceStrategy::kSharedMemoryTwoShot;
  tp::run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        const int64_t r = comm.rank();
        at::Tensor t = rank_input(kSeed + 650, r, shape, at::kFloat);
        scattered[r] = comm.reduce_scatter(t, 0, sizes);
        reduced[r] = comm.all_reduce(t, AllReduceStrategy::kSharedMemoryOneShot);
        CHECK(comm.all_reduce_counts().at(AllReduceStrategy::kSharedMemoryTwoShot) == 1);  // the reduce_scatter
      },
      options);
  int64_t offset = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    INFO("rank=" << rank << " seed=" << kSeed + 650);
    REQUIRE(scattered[rank].sizes() == c10::IntArrayRef({sizes[rank], shape[1]}));
    CHECK(at::equal(scattered[rank], reduced[0].narrow(0, offset, sizes[rank])));
    offset += sizes[rank];
  }
}

TEST_CASE("broadcast copies root's tensor to every rank, from each root", "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    // results[root][rank]: a float32 [6, 4] and a non-contiguous bfloat16 view.
    std::vector<std::vector<at::Tensor>> dense(world, std::vector<at::Tensor>(world));
    std::vector<std::vector<at::Tensor>> viewed(world, std::vector<at::Tensor>(world));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          for (int64_t root = 0; root < world; ++root) {
            at::Tensor t = rank_input(kSeed + 300 + root, comm.rank(), {6, 4}, at::kFloat);
            comm.broadcast(t, root);
            dense[root][comm.rank()] = t;
            at::Tensor base = rank_input(kSeed + 400 + root, comm.rank(), {4, 6}, at::kBFloat16);
            at::Tensor v = base.t();
            comm.broadcast(v, root);
            viewed[root][comm.rank()] = base;
          }
        },
        test_options());
    for (int64_t root = 0; root < world; ++root) {
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("world=" << world << " rank=" << rank << " root=" << root << " seed=" << kSeed + 300 + root);
        CHECK(at::equal(dense[root][rank], rank_input(kSeed + 300 + root, root, {6, 4}, at::kFloat)));
        CHECK(at::equal(viewed[root][rank], rank_input(kSeed + 400 + root, root, {4, 6}, at::kBFloat16)));
      }
    }
  }
}

TEST_CASE("barrier returns only once every rank has reached it", "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    std::atomic<int64_t> arrived{0};
    std::vector<int64_t> seen(world, -1);
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          // Late arrivals: rank r reaches the barrier r * 30 ms after rank 0.
          std::this_thread::sleep_for(std::chrono::milliseconds(30 * comm.rank()));
          ++arrived;
          comm.barrier();
          seen[comm.rank()] = arrived.load();
        },
        test_options());
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank);
      CHECK(seen[rank] == world);
    }
  }
}

TEST_CASE("collectives give the same results with verify_calls off", "[comm]") {
  CommunicatorOptions options = test_options();
  options.verify_calls = false;
  const std::vector<int64_t> sizes = {2, 0, 3};
  std::vector<at::Tensor> reduced(3), gathered(3), scattered(3), broadcast(3);
  tp::run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        const int64_t r = comm.rank();
        at::Tensor t = rank_input(kSeed + 600, r, {5, 4}, at::kFloat);
        reduced[r] = comm.all_reduce(t);
        gathered[r] = comm.all_gather(rank_input(kSeed + 601, r, {sizes[r], 4}, at::kFloat), 0, sizes);
        scattered[r] = comm.reduce_scatter(rank_input(kSeed + 602, r, {5, 4}, at::kFloat), 0, sizes);
        broadcast[r] = rank_input(kSeed + 603, r, {7}, at::kHalf);
        comm.broadcast(broadcast[r], 2);
        comm.barrier();
      },
      options);
  const at::Tensor sum = reference_sum(kSeed + 600, 3, {5, 4}, at::kFloat);
  const at::Tensor sum2 = reference_sum(kSeed + 602, 3, {5, 4}, at::kFloat);
  std::vector<at::Tensor> pieces;
  for (int64_t r = 0; r < 3; ++r) pieces.push_back(rank_input(kSeed + 601, r, {sizes[r], 4}, at::kFloat));
  int64_t offset = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    INFO("world=3 rank=" << rank << " seed=" << kSeed + 600);
    CHECK(at::allclose(reduced[rank].to(at::kDouble), sum, 1e-5, 1e-5));
    CHECK(at::equal(gathered[rank], at::cat(pieces, 0)));
    CHECK(at::allclose(scattered[rank].to(at::kDouble), sum2.narrow(0, offset, sizes[rank]), 1e-5, 1e-5));
    offset += sizes[rank];
    CHECK(at::equal(broadcast[rank], rank_input(kSeed + 603, 2, {7}, at::kHalf)));
  }
}

TEST_CASE("a default-constructed Communicator is world 1 and its collectives are no-ops", "[comm]") {
  Communicator comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.world_size() == 1);
  CHECK_FALSE(comm.process_group());
  at::Tensor t = rank_input(kSeed + 500, 0, {3, 4}, at::kFloat);
  const at::Tensor before = t.clone();
  CHECK(comm.all_reduce(t).is_same(t));
  CHECK(at::equal(t, before));
  CHECK(comm.all_gather(t, 1, {4}).is_same(t));
  CHECK(comm.reduce_scatter(t, 0, {3}).is_same(t));
  comm.broadcast(t, 0);
  CHECK(at::equal(t, before));
  comm.barrier();
  // Counted as at world > 1 (all_reduce and reduce_scatter), and copies share the
  // handle and its counts.
  Communicator copy = comm;
  copy.all_reduce(t);
  CHECK(comm.all_reduce_counts().at(AllReduceStrategy::kProcessGroup) == 3);
}

TEST_CASE("AllReduceStrategy names round-trip and parse case-insensitively", "[comm]") {
  for (auto s : {AllReduceStrategy::kAuto, AllReduceStrategy::kProcessGroup, AllReduceStrategy::kSharedMemoryOneShot,
                 AllReduceStrategy::kSharedMemoryTwoShot}) {
    CHECK(tp::parse_all_reduce_strategy(tp::to_string(s)) == s);
  }
  CHECK(std::string(tp::to_string(AllReduceStrategy::kProcessGroup)) == "process_group");
  CHECK(tp::parse_all_reduce_strategy("Process_Group") == AllReduceStrategy::kProcessGroup);
  CHECK(tp::parse_all_reduce_strategy("AUTO") == AllReduceStrategy::kAuto);
  CHECK(tp::parse_all_reduce_strategy("SHM_One_Shot") == AllReduceStrategy::kSharedMemoryOneShot);
  CHECK(std::string(tp::to_string(AllReduceStrategy::kSharedMemoryTwoShot)) == "shm_two_shot");
  REQUIRE_THROWS_AS(tp::parse_all_reduce_strategy("ring"), c10::ValueError);
  REQUIRE_THROWS_WITH(tp::parse_all_reduce_strategy("ring"),
                      Contains("'ring'") && Contains("auto, process_group, shm_one_shot, shm_two_shot"));
}

TEST_CASE("the all_reduce strategy taken is counted, and can be forced by option or TP_ALLREDUCE", "[comm]") {
  using Counts = std::map<AllReduceStrategy, int64_t>;
  const Counts three = {{AllReduceStrategy::kProcessGroup, 3}};
  // Ranks as threads share the host, so kAuto takes shared memory for small CPU tensors.
  const Counts auto_on_one_host = {{AllReduceStrategy::kProcessGroup, 1}, {AllReduceStrategy::kSharedMemoryOneShot, 2}};
  auto three_calls = [](Communicator& comm) {
    at::Tensor t = at::ones({4});
    comm.all_reduce(t);                                    // kAuto: the selector
    comm.all_reduce(t, AllReduceStrategy::kProcessGroup);  // explicit
    comm.reduce_scatter(t, 0, std::vector<int64_t>(comm.world_size(), 4 / comm.world_size()));
  };
  EnvGuard unset("TP_ALLREDUCE", std::nullopt);

  SECTION("auto resolves to shared memory one-shot for small tensors on one host") {
    std::vector<Counts> counts(2);
    tp::run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          three_calls(comm);
          counts[comm.rank()] = comm.all_reduce_counts();
        },
        test_options());
    CHECK(counts[0] == auto_on_one_host);
    CHECK(counts[1] == auto_on_one_host);
  }
  SECTION("forced by CommunicatorOptions::all_reduce") {
    CommunicatorOptions options = test_options();
    options.all_reduce = AllReduceStrategy::kProcessGroup;
    std::vector<Counts> counts(2);
    tp::run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          three_calls(comm);
          counts[comm.rank()] = comm.all_reduce_counts();
        },
        options);
    CHECK(counts[0] == three);
  }
  SECTION("forced by TP_ALLREDUCE, any case") {
    for (const char* value : {"process_group", "PROCESS_GROUP", "auto"}) {
      EnvGuard env("TP_ALLREDUCE", std::string(value));
      INFO("TP_ALLREDUCE=" << value);
      std::vector<Counts> counts(2);
      tp::run_ranks_in_threads(
          2,
          [&](Communicator& comm) {
            three_calls(comm);
            counts[comm.rank()] = comm.all_reduce_counts();
          },
          test_options());
      CHECK(counts[0] == (std::string(value) == "auto" ? auto_on_one_host : three));
      Communicator solo;  // world 1: kAuto takes the process group (a no-op)
      three_calls(solo);
      CHECK(solo.all_reduce_counts() == three);
    }
  }
  SECTION("an unknown TP_ALLREDUCE is an error naming the variable") {
    EnvGuard env("TP_ALLREDUCE", std::string("carrier_pigeon"));
    REQUIRE_THROWS_AS(Communicator(), c10::ValueError);
    REQUIRE_THROWS_WITH(Communicator(), Contains("TP_ALLREDUCE='carrier_pigeon'") && Contains("process_group"));
    REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                            2, [](Communicator&) {}, test_options()),
                        Contains("TP_ALLREDUCE='carrier_pigeon'"));
  }
}
