// Saving what was trained: a block trained one SGD step at TP 4 is gathered into full
// tensors under Hugging Face names (fused layers split back into q/k/v and gate/up,
// replicated KV heads once), written with save_safetensors, and reloaded at TP 3 and
// TP 1: the outputs are the TP 4 block's.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdio>
#include <set>
#include <vector>

#include "support/loader_test_util.h"
#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;

namespace {

constexpr int64_t kHidden = 12, kHeadDim = 4, kHeads = 6, kKvHeads = 1, kInter = 10;

// Shaped like a Hugging Face decoder layer, so gather_weights gives its names.
struct Attention : torch::nn::Module {
  QKVParallelLinear qkv_proj{nullptr};
  RowParallelLinear o_proj{nullptr};
  Attention(const Communicator& comm) {
    qkv_proj = register_module(
        "qkv_proj",
        QKVParallelLinear(QKVParallelLinearOptions(kHidden, kHeadDim, kHeads, kKvHeads).bias(true).dtype(at::kDouble),
                          comm));
    o_proj = register_module("o_proj", RowParallelLinear(RowParallelLinearOptions(kHeads * kHeadDim, kHidden)
                                                             .bias(false)
                                                             .split(qkv_proj->attention_output_split())
                                                             .dtype(at::kDouble),
                                                         comm));
  }
};

struct Mlp : torch::nn::Module {
  GateUpParallelLinear gate_up_proj{nullptr};
  RowParallelLinear down_proj{nullptr};
  Mlp(const Communicator& comm) {
    gate_up_proj = register_module(
        "gate_up_proj", GateUpParallelLinear(GateUpParallelLinearOptions(kHidden, kInter).dtype(at::kDouble), comm));
    down_proj = register_module(
        "down_proj", RowParallelLinear(RowParallelLinearOptions(kInter, kHidden).bias(true).dtype(at::kDouble), comm));
  }
};

// A plain module: its parameter is saved as is.
struct Norm : torch::nn::Module {
  at::Tensor weight;
  Norm() { weight = register_parameter("weight", at::ones({kHidden}, at::kDouble)); }
};

struct Layer : torch::nn::Module {
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<Norm> input_layernorm;
  at::Tensor norm;
  Layer(const Communicator& comm) {
    input_layernorm = register_module("input_layernorm", std::make_shared<Norm>());
    self_attn = register_module("self_attn", std::make_shared<Attention>(comm));
    mlp = register_module("mlp", std::make_shared<Mlp>(comm));
    norm = input_layernorm->weight;
  }
  void load(const Checkpoint& ckpt, const std::string& p) {
    self_attn->qkv_proj->load_weights(ckpt, p + "self_attn");
    self_attn->o_proj->load_weights(ckpt, p + "self_attn.o_proj");
    mlp->gate_up_proj->load_weights(ckpt, p + "mlp");
    mlp->down_proj->load_weights(ckpt, p + "mlp.down_proj");
    at::NoGradGuard no_grad;
    norm.copy_(ckpt.get(p + "input_layernorm.weight").read_all());
  }
  // Not a real attention: each query head times its KV head, elementwise (enough to
  // make every q, k and v weight matter).
  at::Tensor forward(const at::Tensor& x) {
    auto [q, k, v] = self_attn->qkv_proj->split(self_attn->qkv_proj->forward(x * norm));
    const int64_t nq = q.size(-1) / kHeadDim;
    const auto a = q * (k * v).repeat({1, nq});
    const auto h = x + self_attn->o_proj->forward(a);
    auto [gate, up] = mlp->gate_up_proj->split(mlp->gate_up_proj->forward(h));
    return h + mlp->down_proj->forward(at::silu(gate) * up);
  }
};

}  // namespace

TEST_CASE("gather_weights: train at TP 4, save, reload at TP 3 and 1", "[layers][autograd]") {
  const std::string p = "model.layers.0.";
  const int64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  Checkpoint ckpt;
  uint64_t seed = 900;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    ckpt.add(p + name, randn(shape, ++seed) * 0.3);
  };
  add("self_attn.q_proj.weight", {q, kHidden});
  add("self_attn.k_proj.weight", {kv, kHidden});
  add("self_attn.v_proj.weight", {kv, kHidden});
  add("self_attn.q_proj.bias", {q});
  add("self_attn.k_proj.bias", {kv});
  add("self_attn.v_proj.bias", {kv});
  add("self_attn.o_proj.weight", {kHidden, q});
  add("mlp.gate_proj.weight", {kInter, kHidden});
  add("mlp.up_proj.weight", {kInter, kHidden});
  add("mlp.down_proj.weight", {kHidden, kInter});
  add("mlp.down_proj.bias", {kHidden});
  add("input_layernorm.weight", {kHidden});
  const auto x = randn({5, kHidden}, 1), x2 = randn({3, kHidden}, 2);

  test::TempDir dir;
  const std::string path = dir.file("trained.safetensors");
  std::vector<at::Tensor> trained_out(4);
  std::vector<std::set<std::string>> names(4);
  run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        auto layer = std::make_shared<Layer>(comm);
        layer->load(ckpt, p);
        (layer->forward(x).pow(2).sum()).backward();
        {
          at::NoGradGuard no_grad;
          for (auto& t : layer->parameters())
            if (t.grad().defined()) t.sub_(0.05 * t.grad());
        }
        const auto tensors = gather_weights(*layer, "model.layers.0");
        for (const auto& [name, t] : tensors) names[comm.rank()].insert(name);
        if (comm.rank() == 0) save_safetensors(path, tensors);
        comm.barrier();
        at::NoGradGuard no_grad;
        trained_out[comm.rank()] = layer->forward(x2);
      },
      test::test_comm_options());
  const std::set<std::string> expected{
      p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
      p + "self_attn.q_proj.bias",   p + "self_attn.k_proj.bias",   p + "self_attn.v_proj.bias",
      p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight",    p + "mlp.up_proj.weight",
      p + "mlp.down_proj.weight",    p + "mlp.down_proj.bias",      p + "input_layernorm.weight"};
  for (int r = 0; r < 4; ++r) CHECK(names[r] == expected);
  const auto saved = open_checkpoint(path);
  CHECK(saved.get(p + "self_attn.k_proj.weight").shape() == std::vector<int64_t>{kv, kHidden});
  // The step changed the weights: the saved file is not the original checkpoint.
  CHECK(!at::allclose(saved.get(p + "mlp.up_proj.weight").read_all(), ckpt.get(p + "mlp.up_proj.weight").read_all()));
  for (int64_t world : {3, 1}) {
    std::vector<at::Tensor> out(world);
    auto body = [&](Communicator& comm) {
      auto layer = std::make_shared<Layer>(comm);
      layer->load(saved, p);
      at::NoGradGuard no_grad;
      out[comm.rank()] = layer->forward(x2);
    };
    if (world == 1) {
      Communicator single;
      body(single);
    } else {
      run_ranks_in_threads(world, body, test::test_comm_options());
    }
    for (int64_t r = 0; r < world; ++r) {
      INFO("reloaded at TP " << world << ", rank " << r);
      CHECK(test::relative_error(out[r], trained_out[0]) <= 1e-10);
    }
  }
}

TEST_CASE("gather_weights refuses quantized layers", "[layers][autograd]") {
  ColumnParallelLinear fc(ColumnParallelLinearOptions(256, 128).quant(parse_quant_config("int8_weight_only")));
  REQUIRE_THROWS_WITH(fc->gather_weights("fc"), Catch::Contains("needs an unquantized layer"));
}
