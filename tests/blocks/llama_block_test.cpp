// Layers composed the way a Llama block uses them, at TP=3 (uneven), against the
// same computation on one device from the same global weights.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <vector>

#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;

namespace {

// Causal attention over `q_heads` query heads that start at global head q_begin,
// reading KV heads that start at global head kv_begin (GQA: head h reads h / group).
// q: [T, nq * d]; k, v: [T, nkv * d] -> [T, nq * d].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t d, int64_t q_begin,
                            int64_t kv_begin, int64_t group) {
  const int64_t T = q.size(0), nq = q.size(1) / d;
  if (nq == 0) return at::empty({T, 0}, q.options());
  std::vector<int64_t> kv_index;
  for (int64_t h = q_begin; h < q_begin + nq; ++h) kv_index.push_back(h / group - kv_begin);
  const auto idx = at::tensor(kv_index, at::kLong);
  auto heads = [&](const at::Tensor& t) { return t.view({T, -1, d}).transpose(0, 1); };  // [H, T, d]
  const auto qh = heads(q), kh = heads(k).index_select(0, idx), vh = heads(v).index_select(0, idx);
  const auto out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true);
  return out.transpose(0, 1).reshape({T, nq * d});
}

}  // namespace

TEST_CASE("Llama MLP (gate_up -> SiLU(gate)*up -> down) at TP=3 matches one device", "[layers][block]") {
  const int64_t hidden = 48, inter = 200, tokens = 5, world = 3;  // 200/8 = 25 units: 9,8,8
  const auto x = randn({tokens, hidden}, 11);
  Checkpoint ckpt;
  const auto wg = randn({inter, hidden}, 12) * 0.2, wu = randn({inter, hidden}, 13) * 0.2;
  const auto wd = randn({hidden, inter}, 14) * 0.1;
  ckpt.add("mlp.gate_proj.weight", wg);
  ckpt.add("mlp.up_proj.weight", wu);
  ckpt.add("mlp.down_proj.weight", wd);
  const auto reference = at::linear(at::silu(at::linear(x, wg)) * at::linear(x, wu), wd);

  std::vector<at::Tensor> outputs(world);
  run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        const auto split = SplitPolicy{}.with_granularity(8);
        GateUpParallelLinear gate_up(GateUpParallelLinearOptions(hidden, inter).dtype(at::kDouble).split(split), comm);
        RowParallelLinear down(RowParallelLinearOptions(inter, hidden).bias(false).dtype(at::kDouble).split(split),
                               comm);
        gate_up->load_weights(ckpt, "mlp");
        down->load_weights(ckpt, "mlp.down_proj");
        TORCH_CHECK(gate_up->local_range() == down->local_range(),
                    "gate_up and down disagree on the intermediate slice");
        auto [gate, up] = gate_up->split(gate_up->forward(x));
        outputs[comm.rank()] = down->forward(at::silu(gate) * up);
      },
      test::test_comm_options());
  for (int64_t r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(test::relative_error(outputs[r], reference) <= 1e-12);
  }
}

TEST_CASE("Attention projections (QKV -> causal GQA attention -> O) at TP=3 match one device", "[layers][block]") {
  // 12 heads over 3 KV heads (group 4); at TP=3 each rank owns one KV head. And
  // 8 heads over 4 KV heads: TP=3 splits KV heads 2,1,1 and query heads 4,2,2, so the
  // O projection must follow the uneven query split (attention_output_split).
  struct Shape {
    int64_t hidden, d, heads, kv;
  };
  for (const Shape s : {Shape{64, 16, 12, 3}, Shape{64, 8, 8, 4}}) {
    INFO("hidden=" << s.hidden << " head_dim=" << s.d << " heads=" << s.heads << " kv=" << s.kv);
    const int64_t tokens = 6, world = 3, group = s.heads / s.kv;
    const auto x = randn({tokens, s.hidden}, 21);
    Checkpoint ckpt;
    const auto wq = randn({s.heads * s.d, s.hidden}, 22) * 0.2, wk = randn({s.kv * s.d, s.hidden}, 23) * 0.2;
    const auto wv = randn({s.kv * s.d, s.hidden}, 24) * 0.2, wo = randn({s.hidden, s.heads * s.d}, 25) * 0.1;
    ckpt.add("attn.q_proj.weight", wq);
    ckpt.add("attn.k_proj.weight", wk);
    ckpt.add("attn.v_proj.weight", wv);
    ckpt.add("attn.o_proj.weight", wo);
    const auto attn_ref = causal_attention(at::linear(x, wq), at::linear(x, wk), at::linear(x, wv), s.d, 0, 0, group);
    const auto reference = at::linear(attn_ref, wo);

    std::vector<at::Tensor> outputs(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          QKVParallelLinear qkv(QKVParallelLinearOptions(s.hidden, s.d, s.heads, s.kv).dtype(at::kDouble), comm);
          RowParallelLinear o(RowParallelLinearOptions(s.heads * s.d, s.hidden)
                                  .bias(false)
                                  .dtype(at::kDouble)
                                  .split(qkv->attention_output_split()),
                              comm);
          qkv->load_weights(ckpt, "attn");
          o->load_weights(ckpt, "attn.o_proj");
          const auto& plan = qkv->head_plan();
          TORCH_CHECK((o->local_range() == Range{plan.q_heads.begin * s.d, plan.q_heads.end * s.d}),
                      "O projection slice ", o->local_range(), " does not match query heads ", plan.q_heads);
          auto [q, k, v] = qkv->split(qkv->forward(x));
          const auto attn = causal_attention(q, k, v, s.d, plan.q_heads.begin, plan.kv_heads.begin, group);
          outputs[comm.rank()] = o->forward(attn);
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(test::relative_error(outputs[r], reference) <= 1e-12);
    }
  }
}
