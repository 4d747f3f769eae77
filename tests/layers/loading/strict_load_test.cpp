// Strict loading: a layer reads exactly the tensors its format defines under its
// prefix. A tensor it would ignore (a bias for a bias-free layer, a scale for an
// unquantized one, a tensor of another format) or a dtype it would misread (FP8 or
// integer codes for a float layer) is an error naming the tensor, the layer and the
// fix, on every rank. Issue 14, failures 1 and 2. A LoadSession reports the checkpoint
// tensors nothing read.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <mutex>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/loading/load_session.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Runs `fn` on `world` thread ranks and returns each rank's error message ("" if none).
std::vector<std::string> errors_on_ranks(int64_t world, const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(world);
  run_ranks_in_threads(
      world, [&](Communicator& comm) { errors[comm.rank()] = error_of([&] { fn(comm); }); }, test::test_comm_options());
  return errors;
}

at::Tensor weight(int64_t n, int64_t k, uint64_t seed) { return test::randn({n, k}, seed).to(at::kFloat); }

}  // namespace

TEST_CASE("a bias in the checkpoint for a layer built with bias=false is an error on every rank (failure 2)",
          "[layers][loader]") {
  // Qwen2's q/k/v projections have a bias; loading them into bias=false layers used to
  // drop it silently.
  Checkpoint ckpt;
  const std::string p = "model.layers.0.self_attn";
  ckpt.add(p + ".q_proj.weight", weight(64, 32, 1));
  ckpt.add(p + ".q_proj.bias", weight(64, 1, 2).reshape({64}));
  ckpt.add(p + ".k_proj.weight", weight(32, 32, 3));
  ckpt.add(p + ".k_proj.bias", weight(32, 1, 4).reshape({32}));
  ckpt.add(p + ".v_proj.weight", weight(32, 32, 5));
  ckpt.add(p + ".v_proj.bias", weight(32, 1, 6).reshape({32}));
  ckpt.add(p + ".o_proj.weight", weight(32, 64, 7));
  ckpt.add(p + ".o_proj.bias", weight(32, 1, 8).reshape({32}));
  for (int64_t world : {1, 2}) {
    INFO("world " << world);
    const auto errors = errors_on_ranks(world, [&](Communicator& comm) {
      QKVParallelLinear qkv(QKVParallelLinearOptions(32, 16, 4, 2).bias(false), comm);
      qkv->load_weights(ckpt, p);
    });
    for (int64_t r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Contains("QKVParallelLinear") && Contains("'" + p + ".q_proj.bias'") &&
                                Contains("bias=false") && Contains("bias=true"));
      // All three biases are listed, not only the first.
      CHECK_THAT(errors[r], Contains("k_proj.bias") && Contains("v_proj.bias"));
      if (world > 1) CHECK_THAT(errors[r], Contains("every rank (2 of 2)"));
    }
    const auto row_errors = errors_on_ranks(world, [&](Communicator& comm) {
      RowParallelLinear o(RowParallelLinearOptions(64, 32).bias(false), comm);
      o->load_weights(ckpt, p + ".o_proj");
    });
    for (const auto& e : row_errors)
      CHECK_THAT(e, Contains("RowParallelLinear") && Contains("'" + p + ".o_proj.bias'"));
  }
  // Built with the bias it loads, and equal to the reference.
  QKVParallelLinear qkv(QKVParallelLinearOptions(32, 16, 4, 2).bias(true));
  qkv->load_weights(ckpt, p);
  CHECK(at::equal(qkv->bias.narrow(0, 0, 64), ckpt.get(p + ".q_proj.bias").read_all()));
}

TEST_CASE("FP8 or integer weights loaded into an unquantized layer are an error, not codes used as floats (failure 1)",
          "[layers][loader]") {
  const auto w = weight(48, 64, 11);
  for (const auto format : {QuantFormat::kFp8PerChannel, QuantFormat::kFp8Block, QuantFormat::kFp8PerTensor,
                            QuantFormat::kInt8W8A8, QuantFormat::kInt4Gptq}) {
    const QuantConfig config{format, 32};
    INFO("checkpoint format " << to_string(config));
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", quantize_weight(w, config));
    for (int64_t world : {1, 2}) {
      INFO("world " << world);
      const auto errors = errors_on_ranks(world, [&](Communicator& comm) {
        ColumnParallelLinear fc(ColumnParallelLinearOptions(64, 48).bias(false), comm);
        fc->load_weights(ckpt, "fc");
      });
      for (const auto& e : errors) {
        INFO("message: " << e);
        CHECK_THAT(e, Contains("ColumnParallelLinear"));
        if (format == QuantFormat::kInt4Gptq) {
          CHECK_THAT(e, Contains("no tensor 'fc.weight'"));  // GPTQ stores qweight
        } else {
          CHECK_THAT(e, Contains("'fc.weight'") && Contains("quant format is none") && Contains("quant="));
        }
      }
    }
    // The right format loads and matches the dequantized reference.
    ColumnParallelLinear right(ColumnParallelLinearOptions(64, 48).bias(false).quant(config));
    right->load_weights(ckpt, "fc");
  }
  // A float weight with a scale beside it: the scale would be ignored.
  Checkpoint scaled;
  scaled.add("fc.weight", w);
  scaled.add("fc.weight_scale", at::ones({48, 1}));
  ColumnParallelLinear fc(ColumnParallelLinearOptions(64, 48).bias(false));
  REQUIRE_THROWS_WITH(fc->load_weights(scaled, "fc"),
                      Contains("'fc.weight_scale' would be ignored") && Contains("quant format is none"));
  // A float64 / float16 / bfloat16 checkpoint still loads into a float32 layer.
  for (const auto dtype : {at::kDouble, at::kHalf, at::kBFloat16}) {
    Checkpoint c;
    c.add("fc.weight", w.to(dtype));
    fc->load_weights(c, "fc");
    CHECK(at::equal(fc->weight, w.to(dtype).to(at::kFloat)));
  }
}

TEST_CASE("a tensor of another format or variant under a quantized layer's prefix is an error", "[layers][loader]") {
  const auto w = weight(32, 64, 21);
  // W8A8 with static activation scales (compressed-tensors' int-quantized with a
  // static input): tp's int8_w8a8 quantizes activations per token, so it would ignore it.
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "fc", quantize_weight(w, {QuantFormat::kInt8W8A8}));
  ckpt.add("fc.input_scale", at::ones({1}));
  ColumnParallelLinear fc(ColumnParallelLinearOptions(64, 32).bias(false).quant({QuantFormat::kInt8W8A8}));
  REQUIRE_THROWS_WITH(fc->load_weights(ckpt, "fc"), Contains("'fc.input_scale' would be ignored") &&
                                                        Contains("int8_w8a8 reads 'fc.weight', 'fc.weight_scale'"));
  // AWQ has no g_idx: a GPTQ-only tensor under an AWQ layer is another format.
  Checkpoint awq;
  add_to_checkpoint(awq, "fc", quantize_weight(w, {QuantFormat::kInt4Awq, 32}));
  awq.add("fc.g_idx", at::arange(64, at::kInt).div(32, "floor").to(at::kInt));
  ColumnParallelLinear a(ColumnParallelLinearOptions(64, 32).bias(false).quant({QuantFormat::kInt4Awq, 32}));
  REQUIRE_THROWS_WITH(a->load_weights(awq, "fc"), Contains("'fc.g_idx' would be ignored"));
  // Something else entirely (an adapter): named, with how to allow it.
  Checkpoint lora;
  lora.add("fc.weight", w);
  lora.add("fc.lora_A.weight", at::ones({4, 64}));
  ColumnParallelLinear plain(ColumnParallelLinearOptions(64, 32).bias(false));
  REQUIRE_THROWS_WITH(plain->load_weights(lora, "fc"),
                      Contains("'fc.lora_A.weight' would be ignored") && Contains("allow_unread"));
  LoadSession session(lora, Communicator(), LoadSessionOptions().allow_unread({"*.lora_*"}));
  plain->load_weights(session.checkpoint(), "fc");
  CHECK(session.unread().empty());
  session.finish();
  // A bias for a bias-free row layer in a bf16 checkpoint; and a bias of the wrong dtype.
  Checkpoint with_bias;
  with_bias.add("fc.weight", w.to(at::kBFloat16));
  with_bias.add("fc.bias", at::ones({32}, at::kInt));
  RowParallelLinear row(RowParallelLinearOptions(64, 32));
  REQUIRE_THROWS_WITH(row->load_weights(with_bias, "fc"), Contains("'fc.bias' has dtype Int"));
  // Names that only share the prefix's text are not the layer's ("fc_norm.weight").
  Checkpoint neighbours;
  neighbours.add("fc.weight", w);
  neighbours.add("fc_norm.weight", at::ones({64}));
  plain->load_weights(neighbours, "fc");
}

TEST_CASE("fused layers check every tensor they read from, in every layout", "[layers][loader]") {
  const auto gate = weight(40, 32, 31), up = weight(40, 32, 32);
  Checkpoint separate;
  separate.add("mlp.gate_proj.weight", gate);
  separate.add("mlp.up_proj.weight", up);
  separate.add("mlp.up_proj.bias", at::ones({40}));
  Checkpoint fused;
  fused.add("mlp.gate_up_proj.weight", at::cat({gate, up}));
  fused.add("mlp.gate_up_proj.weight_scale", at::ones({80, 1}));
  for (int64_t world : {1, 2}) {
    INFO("world " << world);
    auto errors = errors_on_ranks(world, [&](Communicator& comm) {
      GateUpParallelLinear mlp(GateUpParallelLinearOptions(32, 40).bias(false), comm);
      mlp->load_weights(separate, "mlp");
    });
    for (const auto& e : errors) CHECK_THAT(e, Contains("GateUpParallelLinear") && Contains("'mlp.up_proj.bias'"));
    errors = errors_on_ranks(world, [&](Communicator& comm) {
      GateUpParallelLinear mlp(GateUpParallelLinearOptions(32, 40).bias(false), comm);
      mlp->load_weights(fused, "mlp", GateUpCheckpointLayout().layout(GateUpLayout::kFused));
    });
    for (const auto& e : errors)
      CHECK_THAT(e, Contains("checkpoint layout fused") && Contains("'mlp.gate_up_proj.weight_scale'"));
  }
}

TEST_CASE("a LoadSession reports the tensors no layer read, on every rank, and allows patterns", "[layers][loader]") {
  Checkpoint ckpt;
  ckpt.add("model.embed_tokens.weight", weight(16, 32, 41));
  ckpt.add("model.layers.0.mlp.down_proj.weight", weight(32, 64, 42));
  ckpt.add("model.layers.0.mlp.up_proj.weight", weight(64, 32, 43));
  ckpt.add("model.layers.0.self_attn.rotary_emb.inv_freq", at::ones({8}));
  ckpt.add("model.norm.weight", at::ones({32}));
  for (int64_t world : {1, 3}) {
    INFO("world " << world);
    std::vector<std::vector<std::string>> unread(world);
    const auto errors = errors_on_ranks(world, [&](Communicator& comm) {
      LoadSession session(ckpt, comm);
      RowParallelLinear down(RowParallelLinearOptions(64, 32).bias(false), comm);
      down->load_weights(session.checkpoint(), "model.layers.0.mlp.down_proj");
      ColumnParallelLinear up(ColumnParallelLinearOptions(32, 64).bias(false), comm);
      up->load_weights(session.checkpoint(), "model.layers.0.mlp.up_proj");
      session.checkpoint().get("model.norm.weight").read_all();  // read by the caller's own code
      unread[comm.rank()] = session.unread();
      session.finish();
    });
    for (int64_t r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK(unread[r] == std::vector<std::string>{"model.embed_tokens.weight"});  // inv_freq is allowed by default
      CHECK_THAT(errors[r], Contains("LoadSession") && Contains("'model.embed_tokens.weight'") &&
                                Contains("allow_unread") && Contains("*rotary_emb.inv_freq"));
      CHECK_THAT(errors[r], !Contains("down_proj") && !Contains("model.norm.weight"));
    }
    // Reading it, or allowing it, makes finish() pass on every rank.
    const auto ok = errors_on_ranks(world, [&](Communicator& comm) {
      LoadSession session(ckpt, comm, LoadSessionOptions().allow_unread({"model.layers.*", "*.embed_tokens.*"}));
      session.checkpoint().get("model.norm.weight");
      session.finish();
    });
    for (const auto& e : ok) CHECK(e.empty());
  }
  // Without the default allow list, inv_freq is reported too.
  LoadSession strict(ckpt, Communicator(), LoadSessionOptions().allow_unread({}));
  CHECK(strict.unread().size() == ckpt.size());
}
