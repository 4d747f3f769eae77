// Quantized layers in training: the stored weights are frozen (no gradient), the input
// gradient goes through the dequantized weight, grad_x = grad_y W_deq, exact for the
// weight-only formats and the documented straight-through rule for the formats that
// also quantize activations (W8A8, FP8); the bias trains as usual. TP 1-3, float64
// layers, against dequantize_weight of the stored global tensors.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;

namespace {

const char* kFormats[] = {"fp8_tensor",
                          "fp8_channel",
                          "fp8_block",
                          "int8_w8a8",
                          "int8_weight_only",
                          "int4_gptq",
                          "int4_awq",
                          "int4_pack_quantized:g32:asym",
                          "nvfp4",
                          "nvfp4:modelopt"};

struct Grads {
  at::Tensor gx, gb;
  bool weight_frozen = false;
  Range range;
};

}  // namespace

TEST_CASE("Quantized layers: frozen weights, input gradients through the dequantized weight", "[layers][autograd]") {
  // Column: out 384 splits into whole 128-row blocks and 8-row INT4 words at TP 1-3;
  // Row: in 384 splits into whole 128-column blocks and INT4 groups. At TP 4 the three
  // FP8 blocks leave one rank without rows (or columns): its gradient is still right.
  const int64_t in = 256, out = 384, tokens = 3;
  uint64_t seed = 7000;
  for (const char* name : kFormats) {
    const auto config = parse_quant_config(name);
    for (bool column : {true, false}) {
      const int64_t n = column ? out : 256, k = column ? in : out;
      const auto stored = quantize_weight(test::random_weight(n, k, ++seed), config);
      const auto w_deq = dequantize_weight(stored, config).to(at::kDouble);
      const auto b = randn({n}, seed + 1);
      Checkpoint ckpt;
      add_to_checkpoint(ckpt, "l", stored);
      ckpt.add("l.bias", b);
      const auto x = randn({tokens, k}, seed + 2), G = randn({tokens, n}, seed + 3);
      for (int64_t world = 1; world <= 4; ++world) {
        INFO(name << (column ? " column" : " row") << " world=" << world);
        std::vector<Grads> got(world);
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              const int64_t r = comm.rank();
              at::Tensor y, xr, bias;
              Range range;
              bool frozen = true;
              if (column) {
                ColumnParallelLinear l(ColumnParallelLinearOptions(k, n).quant(config).dtype(at::kDouble), comm);
                l->load_weights(ckpt, "l");
                range = l->local_range();
                xr = x.clone().requires_grad_(true);
                y = l->forward(xr);
                (y * G.narrow(-1, range.begin, range.size())).sum().backward();
                for (const auto& p : l->named_parameters())
                  if (p.key() != "bias") frozen = frozen && !p.value().requires_grad() && !p.value().grad().defined();
                bias = l->bias;
              } else {
                RowParallelLinear l(RowParallelLinearOptions(k, n).quant(config).dtype(at::kDouble), comm);
                l->load_weights(ckpt, "l");
                range = l->local_range();
                xr = x.narrow(-1, range.begin, range.size()).clone().requires_grad_(true);
                y = l->forward(xr);
                (y * G).sum().backward();
                for (const auto& p : l->named_parameters())
                  if (p.key() != "bias") frozen = frozen && !p.value().requires_grad() && !p.value().grad().defined();
                bias = l->bias;
              }
              got[r] = {xr.grad(), bias.grad(), frozen, range};
            },
            test::test_comm_options());
        const auto gx_ref = G.matmul(w_deq);  // straight through any activation quantization
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r << " range " << got[r].range);
          const Range rg = got[r].range;
          CHECK(got[r].weight_frozen);
          CHECK(test::relative_error(got[r].gx, column ? gx_ref : gx_ref.narrow(-1, rg.begin, rg.size())) <= 1e-10);
          const auto gb_ref = G.sum(0);
          CHECK(test::relative_error(got[r].gb, column ? gb_ref.narrow(0, rg.begin, rg.size()) : gb_ref) <= 1e-10);
        }
      }
    }
  }
}

TEST_CASE("A frozen unquantized base still passes input gradients (adapter training)", "[layers][autograd]") {
  const auto x = randn({4, 6}, 1), w = randn({5, 6}, 2), G = randn({4, 5}, 3);
  Checkpoint ckpt;
  ckpt.add("l.weight", w);
  std::vector<at::Tensor> gx(2);
  std::vector<int> no_weight_grad(2);  // not vector<bool>: its ranks share bytes
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        ColumnParallelLinear l(ColumnParallelLinearOptions(6, 5).bias(false).dtype(at::kDouble), comm);
        l->load_weights(ckpt, "l");
        l->weight.requires_grad_(false);
        auto xr = x.clone().requires_grad_(true);
        const Range rg = l->local_range();
        (l->forward(xr) * G.narrow(-1, rg.begin, rg.size())).sum().backward();
        gx[comm.rank()] = xr.grad();
        no_weight_grad[comm.rank()] = !l->weight.grad().defined();
      },
      test::test_comm_options());
  for (int r = 0; r < 2; ++r) {
    CHECK(no_weight_grad[r]);
    CHECK(test::relative_error(gx[r], G.matmul(w)) <= 1e-12);
  }
}
