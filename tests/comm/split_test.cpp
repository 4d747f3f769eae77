// Communicator::split: groups of ranks inside a world, each with collectives of its own,
// formed twice in a row (fresh names), beside the parent's collectives; bad lists refused.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <vector>

#include "support/comm_test_util.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"

using Catch::Contains;
using tp::Communicator;

TEST_CASE("Communicator::split gives each group its own collectives", "[comm][split]") {
  // World 4 as {0, 1} {2, 3}, then as {0} {1, 2, 3}.
  struct Seen {
    int64_t pair_rank = -1, pair_size = 0, tail_size = 0;
    double pair_sum = 0, tail_sum = 0, world_sum = 0;
    std::vector<double> gathered;
  };
  std::vector<Seen> seen(4);
  tp::run_ranks_in_threads(4, [&](Communicator& comm) {
    const int64_t r = comm.rank();
    auto& out = seen[r];
    const Communicator pair = comm.split(r < 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2, 3});
    const Communicator tail = comm.split(r == 0 ? std::vector<int64_t>{0} : std::vector<int64_t>{1, 2, 3});
    out.pair_rank = pair.rank();
    out.pair_size = pair.world_size();
    out.tail_size = tail.world_size();
    at::Tensor x = at::full({3}, static_cast<double>(r + 1), at::kDouble);
    out.pair_sum = pair.all_reduce(x)[0].item<double>();
    at::Tensor y = at::full({2}, static_cast<double>(r + 1), at::kDouble);
    out.tail_sum = tail.all_reduce(y)[0].item<double>();
    at::Tensor z = at::full({1}, static_cast<double>(r + 1), at::kDouble);
    out.world_sum = comm.all_reduce(z)[0].item<double>();
    const at::Tensor g = pair.all_gather(at::full({r + 1}, static_cast<double>(r), at::kDouble), 0,
                                         r < 2 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 4});
    out.gathered = std::vector<double>(g.data_ptr<double>(), g.data_ptr<double>() + g.numel());
  });
  for (int64_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(seen[r].pair_rank == r % 2);
    CHECK(seen[r].pair_size == 2);
    CHECK(seen[r].tail_size == (r == 0 ? 1 : 3));
    CHECK(seen[r].pair_sum == (r < 2 ? 3.0 : 7.0));
    CHECK(seen[r].tail_sum == (r == 0 ? 1.0 : 9.0));
    CHECK(seen[r].world_sum == 10.0);
    CHECK(seen[r].gathered == (r < 2 ? std::vector<double>{0, 1, 1} : std::vector<double>{2, 2, 2, 3, 3, 3, 3}));
  }
}

TEST_CASE("Communicator::split refuses a list without this rank, repeated or out of order", "[comm][split]") {
  std::vector<std::string> errors(2);
  tp::run_ranks_in_threads(2, [&](Communicator& comm) {
    for (const auto& ranks : {std::vector<int64_t>{1 - comm.rank()}, std::vector<int64_t>{0, 0, 1},
                              std::vector<int64_t>{1, 0}, std::vector<int64_t>{0, 2}}) {
      try {
        comm.split(ranks);
      } catch (const c10::ValueError& e) {
        errors[comm.rank()] += std::string(e.what_without_backtrace()) + "\n";
      }
    }
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Contains("expected distinct ranks in 0..1 including"));
    CHECK_THAT(e, Contains("must list its ranks in increasing order"));
  }
}
