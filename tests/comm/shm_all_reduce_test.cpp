// The shared-memory all-reduce strategies (shm_one_shot, shm_two_shot): results vs a
// float64 reference at world 1..4 (ranks as threads) and as real processes, bitwise
// agreement across ranks and between the two algorithms, many back-to-back calls
// (flags and double buffers wrap), the selector's choices, the errors, and the timeout.

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>  // process_group() hands out an intrusive_ptr

#include "support/comm_test_util.h"
#include "support/spawn.h"
#include "support/worker_ranks_check.h"

#ifndef TP_PROCESS_WORKER
#error "TP_PROCESS_WORKER (the path of tp_process_worker) must be defined"
#endif

using Catch::Contains;
using tp::AllReduceStrategy;
using tp::Communicator;
using tp::CommunicatorOptions;
using namespace tp::comm_test;

namespace {

constexpr auto kOneShot = AllReduceStrategy::kSharedMemoryOneShot;
constexpr auto kTwoShot = AllReduceStrategy::kSharedMemoryTwoShot;
// One data buffer, a library-private constant (src/comm/all_reduce/shared_memory.h; tests see
// only the public headers). Should it change, the sizes below still run, but sit at
// different places relative to the boundaries.
constexpr int64_t kBufferBytes = int64_t{2} << 20;

/// The largest message (bytes) the built-in table sends through one-shot at world 2
/// on one host; two-shot above.
int64_t one_shot_max_bytes() {
  const tp::AllReduceTableEntry* e = tp::AllReduceTable::builtin().find(2, /*same_host=*/true);
  REQUIRE(e != nullptr);
  REQUIRE(e->rules.size() >= 2);
  REQUIRE(e->rules[0].strategy == kOneShot);
  REQUIRE(e->rules[1].strategy == kTwoShot);
  return e->rules[0].max_bytes;
}

/// Entries of /dev/shm whose name starts with `prefix`.
std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.emplace_back(e->d_name);
    }
    ::closedir(dir);
  }
  return found;
}

/// This process's segments (their names start with tp-<pid>-).
std::vector<std::string> own_segments() { return shm_entries("tp-" + std::to_string(::getpid()) + "-"); }

/// Element counts around every boundary: empty, one, odd, the selector's threshold,
/// 1 MiB, and more than one buffer (chunked; every dtype travels through the buffers
/// in its own width).
std::vector<int64_t> sizes_for(at::ScalarType dtype) {
  const int64_t item = c10::elementSize(dtype);
  const int64_t threshold = one_shot_max_bytes() / item;
  const int64_t buffer = kBufferBytes / item;
  return {0, 1, 15, threshold - 1, threshold, threshold + 1, (int64_t{1} << 20) / item, buffer + 7};
}

}  // namespace

TEST_CASE("shared-memory all_reduce matches the float64 sum, bitwise identical across ranks", "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    // got[dtype][size][strategy][rank]
    std::map<at::ScalarType, std::vector<std::vector<std::vector<at::Tensor>>>> got;
    for (auto dtype : kFloatTypes) {
      got[dtype].assign(sizes_for(dtype).size(),
                        std::vector<std::vector<at::Tensor>>(2, std::vector<at::Tensor>(world)));
    }
    std::vector<std::vector<std::string>> segments_left(world);
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          for (auto dtype : kFloatTypes) {
            const auto sizes = sizes_for(dtype);
            for (size_t i = 0; i < sizes.size(); ++i) {
              for (int k = 0; k < 2; ++k) {
                at::Tensor t = rank_input(kSeed + i, comm.rank(), {sizes[i]}, dtype);
                comm.all_reduce(t, k == 0 ? kOneShot : kTwoShot);
                got[dtype][i][k][comm.rank()] = t;
              }
            }
          }
          segments_left[comm.rank()] = own_segments();  // unlinked as soon as all had mapped it
        },
        test_options());
    for (auto dtype : kFloatTypes) {
      const auto sizes = sizes_for(dtype);
      const auto [rtol, atol] = tolerance(dtype);
      for (size_t i = 0; i < sizes.size(); ++i) {
        const at::Tensor expected = reference_sum(kSeed + i, world, {sizes[i]}, dtype);
        for (int k = 0; k < 2; ++k) {
          for (int64_t rank = 0; rank < world; ++rank) {
            INFO("world=" << world << " rank=" << rank << " dtype=" << dtype << " numel=" << sizes[i]
                          << " strategy=" << (k == 0 ? kOneShot : kTwoShot) << " seed=" << kSeed + i);
            const at::Tensor& t = got[dtype][i][k][rank];
            REQUIRE(t.scalar_type() == dtype);
            CHECK(at::allclose(t.to(at::kDouble), expected, rtol, atol));
            // Same accumulation order everywhere: every rank, and both algorithms, agree bit for bit.
            CHECK(at::equal(t, got[dtype][i][0][0]));
          }
        }
      }
    }
    for (int64_t rank = 0; rank < world; ++rank) CHECK(segments_left[rank].empty());
  }
}

TEST_CASE("1000 back-to-back shared-memory all_reduces of varying sizes wrap flags and buffers", "[comm]") {
  const int64_t world = 3;
  const int64_t chunked = kBufferBytes / 4 * 2 + 3;  // three chunks
  std::vector<std::string> failures(world);
  tp::run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        for (int64_t i = 0; i < 1000 && failures[comm.rank()].empty(); ++i) {
          // Integer-valued floats: the sum is exact, so any mix-up of buffers shows.
          const int64_t n = i % 250 == 249 ? chunked : 1 + (i * 7919) % 3000;
          at::Tensor t = at::arange(n, at::kFloat) * static_cast<double>(comm.rank() + 1) + static_cast<double>(i);
          comm.all_reduce(t, i % 3 == 0 ? kTwoShot : kOneShot);  // the strategies share the sequence
          const at::Tensor expected =
              at::arange(n, at::kFloat) * static_cast<double>(world * (world + 1) / 2) + static_cast<double>(world * i);
          if (!at::equal(t, expected)) {
            failures[comm.rank()] = "call " + std::to_string(i) + " (numel " + std::to_string(n) +
                                    ") differs by up to " + std::to_string((t - expected).abs().max().item<double>());
          }
        }
      },
      test_options());
  for (int64_t rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(failures[rank] == "");
  }
}

TEST_CASE("auto takes shared memory on one host, one-shot below the threshold, two-shot above", "[comm]") {
  EnvGuard unset("TP_ALLREDUCE", std::nullopt);
  using Counts = std::map<AllReduceStrategy, int64_t>;
  EnvGuard no_table("TP_ALLREDUCE_TABLE", std::nullopt);
  const int64_t at_threshold = one_shot_max_bytes() / 4;  // float32 elements
  std::vector<Counts> counts(2);
  std::vector<int> on_one_host(2, 0);  // int, not bool: threads write their own slot
  tp::run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        on_one_host[comm.rank()] = comm.ranks_on_one_host();
        at::Tensor small = at::ones({at_threshold});
        at::Tensor large = at::ones({at_threshold + 1});
        at::Tensor ints = at::ones({8}, at::kLong);
        comm.all_reduce(small);
        comm.all_reduce(large);
        comm.all_reduce(ints);  // shared memory reduces floating types and int32 only
        counts[comm.rank()] = comm.all_reduce_counts();
      },
      test_options());
  const Counts expected = {{kOneShot, 1}, {kTwoShot, 1}, {AllReduceStrategy::kProcessGroup, 1}};
  CHECK(counts[0] == expected);
  CHECK(counts[1] == expected);
  CHECK(on_one_host[0]);
  CHECK(on_one_host[1]);
  Communicator solo;  // world 1: nothing to reduce, the process group's no-op
  at::Tensor one = at::ones({4});
  solo.all_reduce(one);
  CHECK(solo.ranks_on_one_host());
  CHECK(solo.all_reduce_counts() == Counts{{AllReduceStrategy::kProcessGroup, 1}});
}

TEST_CASE("an impossible forced shared-memory all_reduce is an error saying why", "[comm]") {
  EnvGuard unset("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_table("TP_ALLREDUCE_TABLE", std::nullopt);
  std::vector<std::string> not_one_host(2), wrong_dtype(2);
  std::vector<int> outside_on_one_host(2, 1);  // int: threads write their own slot
  std::vector<std::map<AllReduceStrategy, int64_t>> outside_counts(2);
  tp::run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        // The same group, wrapped again with a host id per rank: as if on two hosts.
        CommunicatorOptions apart = comm.options();
        apart.host_id = "host-" + std::to_string(comm.rank());
        Communicator outside(comm.process_group(), apart);
        outside_on_one_host[comm.rank()] = outside.ranks_on_one_host();
        at::Tensor t = at::ones({16});
        not_one_host[comm.rank()] = error_of([&] { outside.all_reduce(t, kOneShot); });
        outside.all_reduce(t);  // auto takes no shared memory: the process group (built-in table, world 2)
        outside_counts[comm.rank()] = outside.all_reduce_counts();
        at::Tensor ints = at::ones({16}, at::kLong);
        wrong_dtype[comm.rank()] = error_of([&] { comm.all_reduce(ints, kTwoShot); });
      },
      test_options());
  for (int64_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK_FALSE(outside_on_one_host[rank]);
    CHECK_THAT(not_one_host[rank], Contains("shm_one_shot needs every rank on this host"));
    CHECK(outside_counts[rank] == std::map<AllReduceStrategy, int64_t>{{AllReduceStrategy::kProcessGroup, 1}});
    CHECK_THAT(wrong_dtype[rank], Contains("shm_two_shot supports float32, float64, bfloat16 and float16; got Long"));
  }
  SECTION("TP_ALLREDUCE forces it for every call") {
    EnvGuard env("TP_ALLREDUCE", std::string("shm_two_shot"));
    std::vector<std::map<AllReduceStrategy, int64_t>> counts(2);
    tp::run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          at::Tensor t = at::ones({4});
          comm.all_reduce(t);
          counts[comm.rank()] = comm.all_reduce_counts();
        },
        test_options());
    CHECK(counts[0] == std::map<AllReduceStrategy, int64_t>{{kTwoShot, 1}});
  }
}

TEST_CASE("a peer that stops calling makes the shared-memory all_reduce time out, leaving no segment", "[comm]") {
  const auto timeout = std::chrono::milliseconds(2000);
  CommunicatorOptions options = test_options(timeout);
  options.verify_calls = false;  // so the wait is in shared memory, not in the fingerprint exchange
  std::string first_error, second_error;
  double seconds = -1;
  std::atomic<bool> timed_out{false};
  REQUIRE_THROWS(tp::run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        at::Tensor t = at::ones({256});
        comm.all_reduce(t, kOneShot);  // both: the workspace exists
        if (comm.rank() == 1) {
          // Rank 1 stops calling but stays alive: were its communicator destroyed (by
          // returning into run_ranks_in_threads' barrier, whose own timeout can end
          // first), rank 0 would see "rank 1 is gone" instead of its timeout.
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!timed_out.load() && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        first_error = error_of([&] { comm.all_reduce(t, kOneShot); });
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        second_error = error_of([&] { comm.all_reduce(t, kTwoShot); });
        timed_out.store(true);
        throw std::runtime_error(first_error);
      },
      options));
  INFO("rank 0 failed after " << seconds << " s: " << first_error);
  CHECK_THAT(first_error, Contains("tp::Communicator::all_reduce failed on rank 0 of world_size 2"));
  CHECK_THAT(first_error, Contains("timeout 2000 ms, strategy shm_one_shot"));
  CHECK_THAT(first_error, Contains("at sequence 2 for rank(s) [1] to publish its input"));
  CHECK(seconds >= 1.5);
  CHECK(seconds < 5.0);
  CHECK_THAT(second_error, Contains("cannot be used again"));
  CHECK(own_segments().empty());
}

TEST_CASE("a peer that fails makes the others' shared-memory all_reduce fail at once", "[comm]") {
  const auto timeout = std::chrono::milliseconds(20000);
  std::string error;
  double seconds = -1;
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                          3,
                          [&](Communicator& comm) {
                            at::Tensor t = at::ones({256});
                            comm.all_reduce(t);  // the workspace exists from here on
                            if (comm.rank() == 1) throw std::runtime_error("rank 1 fails");
                            if (comm.rank() == 2) return;  // waits in the final barrier
                            const auto t0 = std::chrono::steady_clock::now();
                            error = error_of([&] { comm.all_reduce(t); });
                            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                          },
                          test_options(timeout)),
                      Contains("rank 1: rank 1 fails"));
  INFO("rank 0 failed after " << seconds << " s: " << error);
  CHECK_THAT(error, Contains("tp::Communicator::all_reduce failed on rank 0 of world_size 3"));
  CHECK_THAT(error, Contains("rank 1 is gone (its communicator was destroyed"));
  CHECK(seconds >= 0);
  CHECK(seconds < 5.0);  // not the 20 s timeout
}

TEST_CASE("ranks as separate processes all_reduce through shared memory and recursive doubling", "[comm][process]") {
  for (int world : {2, 3, 4}) tp::test::check_worker_ranks("shm", world);
}

TEST_CASE("a peer process that exits makes the shared-memory all_reduce fail at once", "[comm][process]") {
  // A 60 s collective timeout: only the exit check can make rank 0 fail within 5 s.
  const auto results = tp::test::run_ranks_as_processes(TP_PROCESS_WORKER, {"shm_peer_exits"}, 2,
                                                        std::chrono::seconds(90), {{"TP_COMM_TIMEOUT_MS", "60000"}});
  REQUIRE(results.size() == 2);
  INFO("rank 0 output:\n" << results[0].output << "\nrank 1 output:\n" << results[1].output);
  CHECK_FALSE(results[0].timed_out);
  CHECK(results[0].exit_code == 0);
  CHECK_THAT(results[0].output, Contains("rank 0 ok"));
  CHECK(results[1].exit_code == 0);
}

TEST_CASE("a rank killed while creating the shared-memory segment leaves no segment behind", "[comm][process]") {
  // TP_COMM_VERIFY=0: no fingerprint exchange first, so rank 0 is killed inside the
  // segment's setup, with rank 1 half-way through joining it. Rank 1's killer thread must
  // run while the segment exists; on a loaded machine it can miss that window (rank 1 then
  // exits with 3, kShmKillMissedWindow in process_worker.cpp), and the scenario runs again.
  constexpr int kMissedWindow = 3, kAttempts = 5;
  int attempts = 0;
  for (; attempts < kAttempts; ++attempts) {
    const auto results =
        tp::test::run_ranks_as_processes(TP_PROCESS_WORKER, {"shm_creator_killed"}, 2, std::chrono::seconds(90),
                                         {{"TP_COMM_TIMEOUT_MS", "5000"}, {"TP_COMM_VERIFY", "0"}});
    REQUIRE(results.size() == 2);
    INFO("attempt " << attempts + 1 << "; rank 0 output:\n"
                    << results[0].output << "\nrank 1 output:\n"
                    << results[1].output);
    CHECK_FALSE(results[1].timed_out);
    if (results[1].exit_code == kMissedWindow) continue;
    CHECK(results[0].exit_code == -SIGKILL);
    CHECK(results[1].exit_code == 0);
    CHECK_THAT(results[1].output, Contains("rank 1 ok"));
    break;
  }
  INFO("the kill missed the segment's setup in all " << kAttempts << " attempts");
  CHECK(attempts < kAttempts);
}
