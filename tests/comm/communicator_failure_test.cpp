// tp::Communicator when things go wrong: bad arguments, ranks that disagree on a
// call, a peer that dies or stalls. Every case must end in an error, never a hang or
// an abort.

#include <chrono>
#include <functional>
#include <stdexcept>
#include <thread>

#include "support/comm_test_util.h"

using Catch::Contains;
using tp::AllReduceStrategy;
using tp::Communicator;
using tp::CommunicatorOptions;
using namespace tp::comm_test;

TEST_CASE("collectives reject bad arguments with errors that say what and why", "[comm]") {
  // The same calls at world 1 (no group) and on every rank of world 4: all ranks
  // refuse before talking, so nothing hangs.
  using Call = std::function<void(const Communicator&)>;
  struct Case {
    const char* name;
    Call call;
    std::vector<std::string> world1;  // substrings expected at world 1
    std::vector<std::string> world4;  // ... at world 4 (rank 2's view)
  };
  const at::Tensor x = at::ones({3, 5});
  const std::vector<Case> cases = {
      {"all_gather: wrong number of sizes",
       [&](const Communicator& c) {
         c.all_gather(x, 0, {3, 3, 3});
       },
       {"all_gather: sizes has 3 entries but world_size is 1"},
       {"tp::Communicator::all_gather: sizes has 3 entries but world_size is 4"}},
      {"all_gather: this rank's size disagrees with its tensor",
       [&](const Communicator& c) { c.all_gather(x, 0, std::vector<int64_t>(c.world_size(), 4)); },
       {"sizes[0]=4 but this rank's tensor has extent 3 along dim 0"},
       {"sizes[2]=4 but this rank's tensor has extent 3 along dim 0"}},
      {"all_gather: dim out of range",
       [&](const Communicator& c) { c.all_gather(x, 2, std::vector<int64_t>(c.world_size(), 3)); },
       {"dim=2 is out of range for a 2-D tensor", "-2..1"},
       {"dim=2 is out of range for a 2-D tensor"}},
      {"all_gather: negative dim out of range",
       [&](const Communicator& c) { c.all_gather(x, -3, std::vector<int64_t>(c.world_size(), 5)); },
       {"dim=-3 is out of range"},
       {"dim=-3 is out of range"}},
      {"all_gather: negative size",
       [&](const Communicator& c) {
         std::vector<int64_t> sizes(c.world_size(), 3);
         sizes.back() = -1;
         if (c.world_size() == 1) sizes = {-1};
         c.all_gather(x, 0, sizes);
       },
       {"sizes[0]=-1 is negative"},
       {"sizes[3]=-1 is negative"}},
      {"reduce_scatter: sizes do not cover the tensor",
       [&](const Communicator& c) { c.reduce_scatter(x, -1, std::vector<int64_t>(c.world_size(), 2)); },
       {"add up to 2 but the tensor has extent 5 along dim 1"},
       {"add up to 8 but the tensor has extent 5 along dim 1"}},
      {"reduce_scatter: wrong number of sizes",
       [&](const Communicator& c) {
         c.reduce_scatter(x, 0, {1, 2});
       },
       {"sizes has 2 entries but world_size is 1"},
       {"sizes has 2 entries but world_size is 4"}},
      {"broadcast: invalid root",
       [&](const Communicator& c) {
         at::Tensor t = x.clone();
         c.broadcast(t, 5);
       },
       {"invalid root 5 (root should be in the 0..0 range)"},
       {"tp::Communicator::broadcast: invalid root 5 (root should be in the 0..3 range)"}},
      {"broadcast: negative root",
       [&](const Communicator& c) {
         at::Tensor t = x.clone();
         c.broadcast(t, -1);
       },
       {"invalid root -1"},
       {"invalid root -1 (root should be in the 0..3 range)"}},
      {"all_reduce: bool cannot be summed",
       [&](const Communicator& c) {
         at::Tensor t = at::ones({2}, at::kBool);
         c.all_reduce(t);
       },
       {"dtype Bool cannot be summed"},
       {"dtype Bool cannot be summed"}},
      {"all_reduce: undefined tensor",
       [&](const Communicator& c) {
         at::Tensor t;
         c.all_reduce(t);
       },
       {"all_reduce: the tensor is undefined"},
       {"all_reduce: the tensor is undefined"}},
  };

  std::vector<std::vector<std::string>> errors(4, std::vector<std::string>(cases.size()));
  tp::run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        for (size_t i = 0; i < cases.size(); ++i) {
          errors[comm.rank()][i] = error_of([&] { cases[i].call(comm); });
        }
        comm.barrier();  // still in step after all those refusals
      },
      test_options());

  const Communicator solo;
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].name);
    const std::string at1 = error_of([&] { cases[i].call(solo); });
    INFO("world 1: " << at1);
    for (const auto& s : cases[i].world1) CHECK_THAT(at1, Contains(s));
    INFO("world 4, rank 2: " << errors[2][i]);
    for (const auto& s : cases[i].world4) CHECK_THAT(errors[2][i], Contains(s));
    for (int64_t rank = 0; rank < 4; ++rank) CHECK_FALSE(errors[rank][i].empty());
  }
  // Argument errors are c10::ValueError (or IndexError for a bad dim, TypeError for a dtype).
  at::Tensor t = x.clone();
  CHECK_THROWS_AS(solo.broadcast(t, 3), c10::ValueError);
  CHECK_THROWS_AS(solo.all_gather(x, 7, {3}), c10::IndexError);
}

TEST_CASE("ranks that disagree on a collective all get an error naming both calls", "[comm]") {
  // Without the fingerprint exchange (verify_calls) each of these would time out or,
  // for the larger-than-expected messages, abort the process inside Gloo.
  struct Case {
    const char* name;
    std::function<void(Communicator&)> call;
    std::vector<std::string> expected;  // in rank 0's error
  };
  const std::vector<Case> cases = {
      {"all_reduce shapes",
       [](Communicator& c) {
         at::Tensor t = at::ones({4 + c.rank()});
         c.all_reduce(t);
       },
       {"the ranks disagree on this collective", "all_reduce(dtype=Float, shape=[4]",
        "all_reduce(dtype=Float, shape=[5]"}},
      {"all_reduce dtypes",
       [](Communicator& c) {
         at::Tensor t = at::ones({4}, c.rank() == 2 ? at::kDouble : at::kFloat);
         c.all_reduce(t);
       },
       {"while rank 2 called all_reduce(dtype=Double, shape=[4]"}},
      {"different collectives",
       [](Communicator& c) {
         if (c.rank() == 1) {
           c.barrier();
         } else {
           at::Tensor t = at::ones({3});
           c.all_reduce(t);
         }
       },
       {"rank 0 called all_reduce(dtype=Float, shape=[3]", "while rank 1 called barrier()"}},
      {"all_gather sizes",
       [](Communicator& c) {
         // Each rank holds 2 rows, but rank 0 believes rank 1 holds 5.
         std::vector<int64_t> sizes(c.world_size(), 2);
         if (c.rank() == 0) sizes[1] = 5;
         c.all_gather(at::ones({2, 3}), 0, sizes);
       },
       {"all_gather(dtype=Float, shape=[*, 3], dim=0, sizes: 3 entries"}},
      {"broadcast roots",
       [](Communicator& c) {
         at::Tensor t = at::ones({6});
         c.broadcast(t, c.rank() == 0 ? 0 : 1);
       },
       {"broadcast(dtype=Float, shape=[6], root=0)", "broadcast(dtype=Float, shape=[6], root=1)"}},
      {"reduce_scatter dims",
       [](Communicator& c) {
         c.reduce_scatter(at::ones({3, 3}), c.rank() == 0 ? 0 : 1, {1, 1, 1});
       },
       {"reduce_scatter(dtype=Float, shape=[3, 3], dim=0", "dim=1"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> errors(3);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_THROWS_AS(tp::run_ranks_in_threads(
                          3,
                          [&](Communicator& comm) {
                            errors[comm.rank()] = error_of([&] { c.call(comm); });
                            if (!errors[comm.rank()].empty()) throw std::runtime_error(errors[comm.rank()]);
                          },
                          test_options()),
                      c10::Error);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(c.name << " (world=3), took " << seconds << " s");
    for (int64_t rank = 0; rank < 3; ++rank) {
      INFO("rank " << rank << ": " << errors[rank]);
      CHECK_THAT(errors[rank], Contains("the ranks disagree on this collective"));
    }
    INFO("rank 0: " << errors[0]);
    for (const auto& s : c.expected) CHECK_THAT(errors[0] + errors[1] + errors[2], Contains(s));
    CHECK(seconds < 10.0);  // refused at once, not after the 30 s timeout
  }
}

TEST_CASE("run_ranks_in_threads rethrows a rank's error with its rank", "[comm]") {
  REQUIRE_THROWS_AS(
      tp::run_ranks_in_threads(
          3, [](Communicator& comm) { TORCH_CHECK_VALUE(comm.rank() != 2, "rank two refuses"); }, test_options()),
      c10::ValueError);
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                          3,
                          [](Communicator& comm) {
                            if (comm.rank() == 1) throw std::runtime_error("plain std exception");
                          },
                          test_options()),
                      Contains("rank 1: plain std exception"));
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(0, [](Communicator&) {}), Contains("world_size=0"));
}

TEST_CASE("a peer that dies makes the survivors' collective fail within the timeout", "[comm]") {
  const auto timeout = std::chrono::milliseconds(2000);
  std::string rank0_error;
  double rank0_seconds = -1;
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                          2,
                          [&](Communicator& comm) {
                            if (comm.rank() == 1) throw std::runtime_error("rank 1 gives up before the collective");
                            at::Tensor t = at::ones({1024});
                            const auto t0 = std::chrono::steady_clock::now();
                            try {
                              comm.all_reduce(t);
                            } catch (const c10::Error& e) {
                              rank0_seconds =
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                              rank0_error = e.what_without_backtrace();
                              throw;
                            }
                          },
                          test_options(timeout)),
                      Contains("rank 1: rank 1 gives up before the collective"));
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("rank 0 error after " << rank0_seconds << " s: " << rank0_error);
  CHECK_THAT(rank0_error, Contains("tp::Communicator::all_reduce failed on rank 0 of world_size 2"));
  CHECK_THAT(rank0_error, Contains("timeout 2000 ms"));
  CHECK_THAT(rank0_error, Contains("peer rank died"));
  REQUIRE(rank0_seconds >= 0);
  REQUIRE(rank0_seconds < 5.0);
  REQUIRE(total < 10.0);
}

TEST_CASE("a peer that stalls makes the others' collective time out instead of hanging", "[comm]") {
  // Rank 1 keeps its group open but never joins the all_reduce: nothing fails but the
  // clock. The survivors must give up after about the timeout.
  const auto timeout = std::chrono::milliseconds(1500);
  std::vector<std::string> errors(3);
  std::vector<double> seconds(3, -1);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                          3,
                          [&](Communicator& comm) {
                            if (comm.rank() == 1) {
                              std::this_thread::sleep_for(timeout + std::chrono::milliseconds(1500));
                              return;
                            }
                            at::Tensor t = at::ones({64});
                            const auto t0 = std::chrono::steady_clock::now();
                            errors[comm.rank()] = error_of([&] { comm.all_reduce(t); });
                            seconds[comm.rank()] =
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                            if (!errors[comm.rank()].empty()) throw std::runtime_error(errors[comm.rank()]);
                          },
                          test_options(timeout)),
                      Contains("timeout 1500 ms"));
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int64_t rank : {0, 2}) {
    INFO("rank " << rank << " failed after " << seconds[rank] << " s: " << errors[rank]);
    CHECK_THAT(errors[rank], Contains("tp::Communicator::all_reduce failed on rank"));
    CHECK_THAT(errors[rank], Contains("timeout 1500 ms"));
    CHECK(seconds[rank] >= 1.0);
    CHECK(seconds[rank] < 5.0);
  }
  REQUIRE(total < 15.0);
}
