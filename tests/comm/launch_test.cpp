// The launchers' configuration: TP_COMM_TIMEOUT_MS, torchrun's variables, connect_tcp.

#include <chrono>
#include <csignal>

#include <signal.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>  // process_group() hands out an intrusive_ptr

#include "support/comm_test_util.h"
#include "support/spawn.h"

using Catch::Contains;
using tp::AllReduceStrategy;
using tp::Communicator;
using tp::CommunicatorOptions;
using namespace tp::comm_test;

TEST_CASE("CommunicatorOptions::default_timeout reads TP_COMM_TIMEOUT_MS", "[comm]") {
  {
    EnvGuard env("TP_COMM_TIMEOUT_MS", std::nullopt);
    CHECK(CommunicatorOptions::default_timeout() == std::chrono::milliseconds(300000));
  }
  {
    EnvGuard env("TP_COMM_TIMEOUT_MS", std::string("1234"));
    CHECK(CommunicatorOptions::default_timeout() == std::chrono::milliseconds(1234));
    CHECK(CommunicatorOptions().timeout == std::chrono::milliseconds(1234));
  }
  for (const char* bad : {"soon", "-5", "0", "12ms", " 10"}) {
    EnvGuard env("TP_COMM_TIMEOUT_MS", std::string(bad));
    INFO("TP_COMM_TIMEOUT_MS=" << bad);
    REQUIRE_THROWS_AS(CommunicatorOptions::default_timeout(), c10::ValueError);
    REQUIRE_THROWS_WITH(CommunicatorOptions::default_timeout(),
                        Contains(std::string("TP_COMM_TIMEOUT_MS='") + bad + "'"));
  }
  CommunicatorOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                          2, [](Communicator&) {}, zero),
                      Contains("timeout=0"));
}

TEST_CASE("communicator_from_env names the variable that is missing or malformed", "[comm]") {
  EnvGuard rank("RANK", std::nullopt);
  EnvGuard world("WORLD_SIZE", std::string("4"));
  EnvGuard addr("MASTER_ADDR", std::string("127.0.0.1"));
  EnvGuard port("MASTER_PORT", std::string("29555"));
  REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("RANK is not set"));
  {
    EnvGuard bad("RANK", std::string("first"));
    REQUIRE_THROWS_AS(tp::communicator_from_env(test_options()), c10::ValueError);
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("RANK='first' is not an integer"));
  }
  {
    EnvGuard r("RANK", std::string("4"));
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("RANK=4 is out of range for WORLD_SIZE=4"));
  }
  EnvGuard r("RANK", std::string("0"));
  {
    EnvGuard w("WORLD_SIZE", std::string("4x"));
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("WORLD_SIZE='4x' is not an integer"));
  }
  {
    EnvGuard a("MASTER_ADDR", std::nullopt);
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("MASTER_ADDR is not set"));
  }
  {
    EnvGuard p("MASTER_PORT", std::string("70000"));
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("MASTER_PORT=70000 is out of range"));
  }
  {
    EnvGuard p("MASTER_PORT", std::nullopt);
    REQUIRE_THROWS_WITH(tp::communicator_from_env(test_options()), Contains("MASTER_PORT is not set"));
  }
}

TEST_CASE("connect_tcp builds a one-rank group over a TCP store", "[comm]") {
  Communicator comm = tp::connect_tcp("127.0.0.1", tp::test::free_tcp_port(), 0, 1, test_options());
  CHECK(comm.world_size() == 1);
  CHECK(comm.process_group());
  at::Tensor t = at::arange(6, at::kFloat);
  comm.all_reduce(t);
  comm.barrier();
  CHECK(at::equal(t, at::arange(6, at::kFloat)));
  REQUIRE_THROWS_WITH(tp::connect_tcp("127.0.0.1", 0, 0, 1, test_options()),
                      Contains("invalid port 0 (port should be in the 1..65535 range)"));
  REQUIRE_THROWS_WITH(tp::connect_tcp("127.0.0.1", 29555, 3, 2, test_options()),
                      Contains("invalid rank 3 (rank should be in the 0..1 range)"));
}

TEST_CASE("make_gloo_communicator fails within the timeout when a rank never joins", "[comm]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of 2, alone.
  REQUIRE_THROWS_WITH(tp::make_gloo_communicator(store, 0, 2, test_options(std::chrono::milliseconds(500))),
                      Contains("tp::make_gloo_communicator: rank 0 of world_size 2 could not connect "
                               "to its peers within 500 ms"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("took " << seconds << " s");
  CHECK(seconds < 10.0);
  REQUIRE_THROWS_WITH(tp::make_gloo_communicator(store, 2, 2, test_options()),
                      Contains("invalid rank 2 (rank should be in the 0..1 range)"));
  REQUIRE_THROWS_WITH(tp::make_gloo_communicator({}, 0, 2, test_options()), Contains("the store is null"));
}

TEST_CASE("a Gloo group ignores SIGPIPE, so a dead peer is an error and not a killed process", "[comm]") {
  // Gloo can write to a dead peer's socket without MSG_NOSIGNAL; SIGPIPE's default
  // action would end the process (seen on the GPU machine as a killed test binary).
  tp::run_ranks_in_threads(
      2, [](Communicator&) {}, test_options());
  struct sigaction current {};
  REQUIRE(sigaction(SIGPIPE, nullptr, &current) == 0);
  CHECK(current.sa_handler == SIG_IGN);
}
