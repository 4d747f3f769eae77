// Bad input gets a clear error naming the layer, the tensor and the numbers.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"

using namespace tp;
using Catch::Contains;

TEST_CASE("forward rejects inputs of the wrong shape, dtype or device", "[layers]") {
  ColumnParallelLinear fc(ColumnParallelLinearOptions(128, 64));
  REQUIRE_THROWS_WITH(
      fc->forward(at::randn({2, 100})),
      Contains("ColumnParallelLinear: input has shape [2, 100] but in_features=128; expected [..., 128]"));
  REQUIRE_THROWS_WITH(fc->forward(at::randn({2, 128}, at::kDouble)),
                      Contains("ColumnParallelLinear: input has dtype Double but the layer computes in Float"));
  REQUIRE_THROWS_WITH(fc->forward(at::Tensor()), Contains("undefined"));
  REQUIRE_THROWS_WITH(fc->forward(at::randn({})), Contains("expected [..., 128]"));
  RowParallelLinear down(RowParallelLinearOptions(64, 32));
  REQUIRE_THROWS_WITH(down->forward(at::randn({3, 65})), Contains("RowParallelLinear: input has shape [3, 65]"));
}

TEST_CASE("construction rejects impossible shards with actionable messages", "[layers]") {
  REQUIRE_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(16, 0)),
                      Contains("ColumnParallelLinear: in_features and out_features must be positive"));
  REQUIRE_THROWS_WITH(
      ColumnParallelLinear(ColumnParallelLinearOptions(16, 100).split(SplitPolicy{}.with_granularity(64))),
      Contains("ColumnParallelLinear:") && Contains("100") && Contains("64") && Contains("128"));
  REQUIRE_THROWS_WITH(RowParallelLinear(RowParallelLinearOptions(16, 8).dtype(at::kInt)),
                      Contains("RowParallelLinear: dtype Int is not a floating-point type"));
  REQUIRE_THROWS_WITH(QKVParallelLinear(QKVParallelLinearOptions(64, 16, 6, 4)),
                      Contains("QKVParallelLinear:") && Contains("6") && Contains("4"));
  // world 3 with 2 KV heads: neither splits nor replicates evenly.
  std::vector<std::string> errors(3);
  try {
    run_ranks_in_threads(
        3,
        [&](Communicator& comm) {
          try {
            QKVParallelLinear qkv(QKVParallelLinearOptions(64, 16, 4, 2), comm);
          } catch (const c10::Error& e) {
            errors[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
  } catch (...) {}
  for (const auto& e : errors) {
    CHECK_THAT(e, Contains("QKVParallelLinear:") && Contains("world"));
  }
}

TEST_CASE("load_weights names the missing or misshapen tensor", "[layers][loader]") {
  Checkpoint ckpt;
  ckpt.add("fc.weight", at::randn({64, 31}));
  ckpt.add("gu.gate_proj.weight", at::randn({32, 16}));
  ckpt.add("int.weight", at::ones({64, 32}, at::kInt));
  ColumnParallelLinear fc(ColumnParallelLinearOptions(32, 64).bias(false));
  REQUIRE_THROWS_WITH(fc->load_weights(ckpt, "fc"),
                      Contains("ColumnParallelLinear: tensor 'fc.weight' has shape [64, 31]; expected [64, 32]"));
  REQUIRE_THROWS_WITH(fc->load_weights(ckpt, "missing"),
                      Contains("ColumnParallelLinear: checkpoint has no tensor 'missing.weight'"));
  REQUIRE_THROWS_WITH(fc->load_weights(ckpt, "int"), Contains("'int.weight' has dtype Int"));
  ColumnParallelLinear with_bias(ColumnParallelLinearOptions(31, 64));
  REQUIRE_THROWS_WITH(with_bias->load_weights(ckpt, "fc"), Contains("no tensor 'fc.bias'"));
  GateUpParallelLinear gu(GateUpParallelLinearOptions(16, 32));
  REQUIRE_THROWS_WITH(gu->load_weights(ckpt, "gu"),
                      Contains("GateUpParallelLinear: checkpoint has no tensor 'gu.up_proj.weight'"));
}
