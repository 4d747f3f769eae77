// The GPU all-reduce strategies as seen from any machine: their names, and the clear
// errors when they cannot run (CPU tensors, no NCCL group, no GPU). The GPU behaviour
// itself is in cuda_comm_test.cpp ([cuda]).

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/nccl_communicator.h"
#include "tp/tp.h"

using namespace tp;

TEST_CASE("GPU all-reduce strategies have names that parse back", "[comm]") {
  for (auto s : {AllReduceStrategy::kNccl, AllReduceStrategy::kNcclBf16Wire}) {
    INFO(to_string(s));
    CHECK(parse_all_reduce_strategy(to_string(s)) == s);
  }
  CHECK(std::string(to_string(AllReduceStrategy::kNccl)) == "nccl");
  CHECK(parse_all_reduce_strategy("NCCL_BF16_WIRE") == AllReduceStrategy::kNcclBf16Wire);
}

TEST_CASE("GPU all-reduce strategies refuse CPU tensors on every rank alike", "[comm]") {
  std::vector<std::string> errors(2);
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        for (auto s : {AllReduceStrategy::kNccl, AllReduceStrategy::kNcclBf16Wire}) {
          auto t = at::ones({8});
          try {
            comm.all_reduce(t, s);
          } catch (const c10::Error& e) {
            errors[comm.rank()] += e.what_without_backtrace();
          }
        }
      },
      test::test_comm_options());
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].find("strategy nccl ") != std::string::npos);
    CHECK(errors[r].find("strategy nccl_bf16_wire ") != std::string::npos);
  }
}

TEST_CASE("make_nccl_communicator says why it cannot run without a GPU", "[comm]") {
  if (torch::cuda::is_available()) return;  // the GPU side is tested in cuda_comm_test.cpp
  auto store = c10::make_intrusive<c10d::HashStore>();
  REQUIRE_THROWS_WITH(make_nccl_communicator(store, 0, 1),
                      nccl_available() ? Catch::Contains("no CUDA device") : Catch::Contains("has no NCCL"));
  REQUIRE_THROWS_WITH(make_nccl_communicator(store, 3, 2),
                      Catch::Contains("invalid rank 3") || Catch::Contains("has no NCCL"));
}
