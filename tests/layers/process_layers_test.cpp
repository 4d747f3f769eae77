// The layers with ranks as separate processes (torchrun-style environment, TCP store).

#include "support/tp_catch.h"

#include "support/worker_ranks_check.h"

TEST_CASE("a Llama MLP across 2 and 3 processes matches one device", "[layers][process]") {
  for (int world : {2, 3}) tp::test::check_worker_ranks("mlp", world);
}
