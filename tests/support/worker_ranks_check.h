#pragma once
// Runs tp_process_worker in one of its modes as real ranks (one process each) and
// checks that every rank finished and said so. Shared by the [process] tests.

#include <chrono>
#include <string>

#include "support/spawn.h"
#include "support/tp_catch.h"

#ifndef TP_PROCESS_WORKER
#error "TP_PROCESS_WORKER (the path of tp_process_worker) must be defined"
#endif

namespace tp::test {

/// `tp_process_worker mode` as `world` processes with torchrun's variables and a 30 s
/// collective timeout (a failing rank reports instead of running into the 90 s
/// deadline): every rank must exit 0 and print "rank R ok".
inline void check_worker_ranks(const std::string& mode, int world) {
  const auto results = run_ranks_as_processes(TP_PROCESS_WORKER, {mode}, world, std::chrono::seconds(90),
                                              {{"TP_COMM_TIMEOUT_MS", "30000"}});
  REQUIRE(results.size() == static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    INFO("mode=" << mode << " world=" << world << " rank=" << rank << " output:\n" << results[rank].output);
    CHECK_FALSE(results[rank].timed_out);
    CHECK(results[rank].exit_code == 0);
    CHECK_THAT(results[rank].output, Catch::Contains("rank " + std::to_string(rank) + " ok"));
  }
}

}  // namespace tp::test
