// QKVParallelLinear and GateUpParallelLinear: fused layers loaded from separate
// q/k/v and gate/up checkpoint tensors, against the single-device projections.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"

using namespace tp;
using tp::test::randn;

namespace {

struct AttnShape {
  int64_t hidden, head_dim, heads, kv_heads;
};

struct QKVResult {
  at::Tensor q, k, v;
  HeadPlan plan;
};

}  // namespace

TEST_CASE("QKVParallelLinear owns whole heads and matches the q/k/v projections", "[layers]") {
  const AttnShape shapes[] = {
      {64, 16, 4, 4},  // MHA
      {96, 8, 8, 2},   // GQA, group 4
      {48, 12, 6, 3},  // GQA with 3 KV heads: uneven (2,1) at world 2; world 4 is refused
      {32, 8, 4, 1},   // MQA: one KV head replicated on every rank
  };
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16};
  uint64_t seed = 3000;
  for (const auto& s : shapes) {
    for (int64_t world = 1; world <= 4; ++world) {
      // world > kv_heads needs world % kv_heads == 0; those cases are errors (tested elsewhere).
      if (world > s.kv_heads && world % s.kv_heads != 0) continue;
      for (auto dtype : dtypes) {
        for (bool bias : {false, true}) {
          for (bool gather : {false, true}) {
            ++seed;
            INFO("hidden=" << s.hidden << " head_dim=" << s.head_dim << " heads=" << s.heads << " kv=" << s.kv_heads
                           << " world=" << world << " dtype=" << dtype << " bias=" << bias << " gather=" << gather
                           << " seed=" << seed);
            const int64_t q_size = s.heads * s.head_dim, kv_size = s.kv_heads * s.head_dim;
            const auto x = randn({3, s.hidden}, seed).to(dtype);
            Checkpoint ckpt;
            std::vector<at::Tensor> refs;
            const char* names[] = {"q_proj", "k_proj", "v_proj"};
            const int64_t sizes[] = {q_size, kv_size, kv_size};
            for (int i = 0; i < 3; ++i) {
              const auto w = randn({sizes[i], s.hidden}, seed * 10 + i).to(dtype);
              const auto b = randn({sizes[i]}, seed * 10 + 5 + i).to(dtype);
              ckpt.add(std::string("attn.") + names[i] + ".weight", w);
              if (bias) ckpt.add(std::string("attn.") + names[i] + ".bias", b);
              refs.push_back(at::linear(x.to(at::kDouble), w.to(at::kDouble),
                                        bias ? std::optional<at::Tensor>(b.to(at::kDouble)) : std::nullopt));
            }
            std::vector<QKVResult> results(world);
            run_ranks_in_threads(
                world,
                [&](Communicator& comm) {
                  QKVParallelLinear qkv(QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads)
                                            .bias(bias)
                                            .gather_output(gather)
                                            .dtype(dtype),
                                        comm);
                  qkv->load_weights(ckpt, "attn");
                  auto [q, k, v] = qkv->split(qkv->forward(x));
                  results[comm.rank()] = {q, k, v, qkv->head_plan()};
                },
                test::test_comm_options());
            std::vector<int64_t> q_owner(s.heads, 0);
            for (int64_t r = 0; r < world; ++r) {
              const auto& res = results[r];
              INFO("rank " << r << " q_heads " << res.plan.q_heads << " kv_heads " << res.plan.kv_heads);
              const auto q_ref =
                  gather ? refs[0]
                         : refs[0].narrow(1, res.plan.q_heads.begin * s.head_dim, res.plan.q_heads.size() * s.head_dim);
              const auto k_ref = gather ? refs[1]
                                        : refs[1].narrow(1, res.plan.kv_heads.begin * s.head_dim,
                                                         res.plan.kv_heads.size() * s.head_dim);
              const auto v_ref = gather ? refs[2]
                                        : refs[2].narrow(1, res.plan.kv_heads.begin * s.head_dim,
                                                         res.plan.kv_heads.size() * s.head_dim);
              REQUIRE(res.q.sizes() == q_ref.sizes());
              REQUIRE(res.k.sizes() == k_ref.sizes());
              CHECK(test::relative_error(res.q, q_ref) <= test::tolerance(dtype));
              CHECK(test::relative_error(res.k, k_ref) <= test::tolerance(dtype));
              CHECK(test::relative_error(res.v, v_ref) <= test::tolerance(dtype));
              // GQA: every query head a rank owns reads a KV head the rank holds.
              for (int64_t h = res.plan.q_heads.begin; h < res.plan.q_heads.end; ++h) {
                ++q_owner[h];
                const int64_t kv = h / (s.heads / s.kv_heads);
                CHECK((kv >= res.plan.kv_heads.begin && kv < res.plan.kv_heads.end));
              }
            }
            for (int64_t h = 0; h < s.heads; ++h) CHECK(q_owner[h] == 1);
          }
        }
      }
    }
  }
}

TEST_CASE("QKVParallelLinear replicates KV heads when world > num_kv_heads", "[layers]") {
  std::vector<HeadPlan> plans(4);
  std::vector<std::string> printed(4);
  run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        QKVParallelLinear qkv(QKVParallelLinearOptions(64, 16, 8, 2), comm);
        plans[comm.rank()] = qkv->head_plan();
        std::ostringstream os;
        qkv->pretty_print(os);
        printed[comm.rank()] = os.str();
        TORCH_CHECK(qkv->weight.size(0) == (2 + 2 * 1) * 16, "local weight rows ", qkv->weight.size(0));
      },
      test::test_comm_options());
  CHECK(plans[0].kv_heads == Range{0, 1});
  CHECK(plans[1].kv_heads == Range{0, 1});
  CHECK(plans[2].kv_heads == Range{1, 2});
  CHECK(plans[3].kv_heads == Range{1, 2});
  CHECK(plans[1].kv_replicas == 2);
  CHECK(printed[3] ==
        "tp::QKVParallelLinear(hidden_size=64, head_dim=16, num_heads=8, num_kv_heads=2, local_q_heads=[6,8), "
        "local_kv_heads=[1,2), kv_replicas=2, bias=false, rank=3/4)");
}

TEST_CASE("GateUpParallelLinear matches gate_proj and up_proj", "[layers]") {
  uint64_t seed = 7000;
  for (int64_t world = 1; world <= 4; ++world) {
    for (auto dtype : {at::kFloat, at::kDouble, at::kHalf}) {
      for (bool gather : {false, true}) {
        ++seed;
        const int64_t hidden = tp::test::randint(8, 80, seed), inter = 8 * tp::test::randint(1, 13, seed + 1);
        INFO("hidden=" << hidden << " intermediate=" << inter << " world=" << world << " dtype=" << dtype
                       << " gather=" << gather << " seed=" << seed);
        const auto x = randn({4, hidden}, seed).to(dtype);
        const auto wg = randn({inter, hidden}, seed + 2).to(dtype), wu = randn({inter, hidden}, seed + 3).to(dtype);
        Checkpoint ckpt;
        ckpt.add("mlp.gate_proj.weight", wg);
        ckpt.add("mlp.up_proj.weight", wu);
        const auto gate_ref = at::linear(x.to(at::kDouble), wg.to(at::kDouble));
        const auto up_ref = at::linear(x.to(at::kDouble), wu.to(at::kDouble));
        std::vector<at::Tensor> gates(world), ups(world);
        std::vector<Range> ranges(world);
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              GateUpParallelLinear gu(GateUpParallelLinearOptions(hidden, inter)
                                          .gather_output(gather)
                                          .dtype(dtype)
                                          .split(SplitPolicy{}.with_granularity(8)),
                                      comm);
              gu->load_weights(ckpt, "mlp");
              std::tie(gates[comm.rank()], ups[comm.rank()]) = gu->split(gu->forward(x));
              ranges[comm.rank()] = gu->local_range();
            },
            test::test_comm_options());
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r << " range " << ranges[r]);
          const auto g_ref = gather ? gate_ref : gate_ref.narrow(1, ranges[r].begin, ranges[r].size());
          const auto u_ref = gather ? up_ref : up_ref.narrow(1, ranges[r].begin, ranges[r].size());
          REQUIRE(gates[r].sizes() == g_ref.sizes());
          CHECK(test::relative_error(gates[r], g_ref) <= test::tolerance(dtype));
          CHECK(test::relative_error(ups[r], u_ref) <= test::tolerance(dtype));
        }
      }
    }
  }
}
