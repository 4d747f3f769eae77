// The layers with ranks as separate processes (torchrun-style environment, TCP store).

#include "tp_catch.h"

#include <chrono>
#include <string>

#include "comm/spawn.h"

using Catch::Contains;

TEST_CASE("a Llama MLP across 2 and 3 processes matches one device", "[layers][process]") {
  for (int world : {2, 3}) {
    const auto results = tp::test::run_ranks_as_processes(TP_PROCESS_WORKER, {"mlp"}, world, std::chrono::seconds(90),
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
