// The layers on CUDA tensors: world 1, and world 2 as threads on one GPU over Gloo
// (which moves CUDA tensors through host memory). Tagged [cuda]: the test runner
// excludes them where torch sees no GPU.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <vector>

#include "support/gpu_test_util.h"
#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;
using tp::test::require_gpu;

TEST_CASE("Column and Row layers on CUDA match the float64 reference", "[cuda][layers]") {
  require_gpu();
  const at::Device cuda(at::kCUDA, 0);
  for (int64_t world : {1, 2, 3, 4}) {  // 3: uneven shards
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO("world=" << world << " dtype=" << dtype);
      const int64_t hidden = 256, inter = 704, tokens = 7;
      const auto x = randn({tokens, hidden}, 1).to(dtype);
      const auto w_up = (randn({inter, hidden}, 2) * 0.1).to(dtype);
      const auto w_down = (randn({hidden, inter}, 3) * 0.1).to(dtype);
      const auto b_down = randn({hidden}, 4).to(dtype);
      Checkpoint ckpt;
      ckpt.add("up.weight", w_up);
      ckpt.add("down.weight", w_down);
      ckpt.add("down.bias", b_down);
      const auto h_ref = at::linear(x.to(at::kDouble), w_up.to(at::kDouble)).to(dtype).to(at::kDouble);
      const auto y_ref = at::linear(h_ref, w_down.to(at::kDouble), b_down.to(at::kDouble));
      std::vector<at::Tensor> outputs(world);
      std::vector<std::string> devices(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            ColumnParallelLinear up(ColumnParallelLinearOptions(hidden, inter).bias(false).dtype(dtype).device(cuda),
                                    comm);
            RowParallelLinear down(RowParallelLinearOptions(inter, hidden).dtype(dtype).device(cuda), comm);
            up->load_weights(ckpt, "up");
            down->load_weights(ckpt, "down");
            const auto y = down->forward(up->forward(x.to(cuda)));
            devices[comm.rank()] = y.device().str();
            outputs[comm.rank()] = y.cpu();
          },
          test::test_comm_options());
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r);
        CHECK(devices[r] == "cuda:0");
        // bf16/fp16 GEMMs on the GPU may accumulate in reduced precision in places:
        // twice the CPU tolerance.
        CHECK(test::relative_error(outputs[r], y_ref) <= 2 * test::tolerance(dtype));
        CHECK(at::equal(outputs[r], outputs[0]));
      }
    }
  }
}

TEST_CASE("QKV and GateUp layers on CUDA match the float64 reference", "[cuda][layers]") {
  require_gpu();
  const at::Device cuda(at::kCUDA, 0);
  const int64_t hidden = 128, d = 32, heads = 8, kv = 2, inter = 320, tokens = 5;
  const auto x = randn({tokens, hidden}, 10).to(at::kBFloat16);
  Checkpoint ckpt;
  std::vector<at::Tensor> w;
  const char* names[] = {"attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj"};
  const int64_t rows[] = {heads * d, kv * d, kv * d, inter, inter};
  for (int i = 0; i < 5; ++i) {
    w.push_back((randn({rows[i], hidden}, 20 + i) * 0.1).to(at::kBFloat16));
    ckpt.add(std::string(names[i]) + ".weight", w.back());
  }
  auto ref = [&](int i) { return at::linear(x.to(at::kDouble), w[i].to(at::kDouble)); };
  for (int64_t world : {1, 2, 4}) {  // 4 > kv: KV heads replicated
    INFO("world=" << world);
    std::vector<std::vector<at::Tensor>> outputs(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          QKVParallelLinear qkv(
              QKVParallelLinearOptions(hidden, d, heads, kv).dtype(at::kBFloat16).device(cuda).gather_output(true),
              comm);
          GateUpParallelLinear gu(
              GateUpParallelLinearOptions(hidden, inter).dtype(at::kBFloat16).device(cuda).gather_output(true), comm);
          qkv->load_weights(ckpt, "attn");
          gu->load_weights(ckpt, "mlp");
          auto [q, k, v] = qkv->split(qkv->forward(x.to(cuda)));
          auto [g, u] = gu->split(gu->forward(x.to(cuda)));
          outputs[comm.rank()] = {q.cpu(), k.cpu(), v.cpu(), g.cpu(), u.cpu()};
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      for (int i = 0; i < 5; ++i) {
        INFO("rank " << r << " output " << names[i]);
        CHECK(test::relative_error(outputs[r][i], ref(i)) <= 2 * test::tolerance(at::kBFloat16));
      }
    }
  }
}
