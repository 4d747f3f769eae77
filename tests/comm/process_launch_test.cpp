// The comm module across real processes: tp_process_worker ranks rendezvous through a
// TCP store (communicator_from_env), as under torchrun.

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/spawn.h"

#ifndef TP_PROCESS_WORKER
#error "TP_PROCESS_WORKER (the path of tp_process_worker) must be defined"
#endif

using Catch::Contains;

namespace {
// Startup (loading libtorch) plus rendezvous takes a few seconds; a hang is killed here.
constexpr std::chrono::seconds kDeadline{90};
}  // namespace

TEST_CASE("ranks as separate processes all_reduce, all_gather and barrier over TCP", "[comm][process]") {
  for (int world : {2, 3}) {
    // A short collective timeout so a failing rank reports instead of running into kDeadline.
    const auto results = tp::test::run_ranks_as_processes(TP_PROCESS_WORKER, {"comm"}, world, kDeadline,
                                                          {{"TP_COMM_TIMEOUT_MS", "30000"}});
    REQUIRE(results.size() == static_cast<size_t>(world));
    for (int rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank << " output:\n" << results[rank].output);
      CHECK_FALSE(results[rank].timed_out);
      CHECK(results[rank].exit_code == 0);
      CHECK_THAT(results[rank].output, Contains("rank " + std::to_string(rank) + " ok"));
    }
  }
}

TEST_CASE("a worker without torchrun's variables exits 1 with the error, not a crash", "[comm][process]") {
  const auto results = tp::test::run_processes(
      TP_PROCESS_WORKER, {"comm"}, {{{"RANK", std::nullopt}, {"WORLD_SIZE", "2"}}}, kDeadline);
  REQUIRE(results.size() == 1);
  INFO("output:\n" << results[0].output);
  CHECK(results[0].exit_code == 1);
  CHECK_THAT(results[0].output, Contains("RANK is not set"));
}
