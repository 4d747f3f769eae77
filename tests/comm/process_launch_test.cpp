// The comm module across real processes: tp_process_worker ranks rendezvous through a
// TCP store (communicator_from_env), as under torchrun.

#include <chrono>
#include <string>
#include <vector>

#include "support/tp_catch.h"

#include "support/spawn.h"
#include "support/worker_ranks_check.h"

#ifndef TP_PROCESS_WORKER
#error "TP_PROCESS_WORKER (the path of tp_process_worker) must be defined"
#endif

using Catch::Contains;

namespace {
// Startup (loading libtorch) plus rendezvous takes a few seconds; a hang is killed here.
constexpr std::chrono::seconds kDeadline{90};
}  // namespace

TEST_CASE("ranks as separate processes all_reduce, all_gather and barrier over TCP", "[comm][process]") {
  for (int world : {2, 3}) tp::test::check_worker_ranks("comm", world);
}

TEST_CASE("a worker without torchrun's variables exits 1 with the error, not a crash", "[comm][process]") {
  const auto results =
      tp::test::run_processes(TP_PROCESS_WORKER, {"comm"}, {{{"RANK", std::nullopt}, {"WORLD_SIZE", "2"}}}, kDeadline);
  REQUIRE(results.size() == 1);
  INFO("output:\n" << results[0].output);
  CHECK(results[0].exit_code == 1);
  CHECK_THAT(results[0].output, Contains("RANK is not set"));
}
