// The FP8 formats (fp8_tensor, fp8_channel, fp8_block): every layer type at TP 1-4
// against the float64 reference, the loading rules (scale spans, replicated and
// per-part scales), partial 128-blocks, and the errors.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/loader_test_util.h"
#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

const QuantConfig kTensor{QuantFormat::kFp8PerTensor};
const QuantConfig kChannel{QuantFormat::kFp8PerChannel};
const QuantConfig kBlock{QuantFormat::kFp8Block};

// Tolerances on relative_error (max abs error / max(1, max |ref|)), per format and
// layer dtype. Where they come from:
// - The layer and the reference see the same quantized activations (the kernel calls
//   quantize_activation's own functions) and the same dequantized weights (the kernel
//   decodes FP8 and folds the scales in with the same float32 product as
//   dequantize_weight). What is left is float32 accumulation (K <= 640: ~1e-6) and, at
//   bfloat16, the rounding of the output to bfloat16 (half an ulp, 2^-9 relative to
//   the largest output): test::tolerance's budgets cover both.
// - fp8_channel in a RowParallelLinear is the exception: each rank quantizes its slice
//   of x with that slice's own amax (the kernel cannot see the other ranks' columns),
//   the reference the whole row with the row's amax. The two roundings of an element
//   land on different FP8 grids and differ by up to one E4M3 step (2^-3 |x_k|, 3
//   mantissa bits), roughly uniformly, so an output's error is a random sum with a
//   standard deviation of ~2^-3/sqrt(3) ~ 7% of the output's own spread; the largest
//   of the ~5000 outputs checked sits ~3.5 standard deviations out, i.e. ~7% of
//   max |y| (measured: up to 5.3% at TP 3 with K=520). 0.1 bounds that; the column
//   and fused layers of this format, which see the reference's activations exactly,
//   are held to the tight bound separately (the fp8_channel scale tests below), and
//   a wrong scale (a row off by its scale ratio, 1-2 decades here) fails either way.
double tolerance(const QuantConfig& config, at::ScalarType dtype) {
  if (config.format == QuantFormat::kFp8PerChannel) return 0.1;
  return test::tolerance(dtype);
}

std::string label(const QuantConfig& c, at::ScalarType dtype) {
  return std::string(to_string(c.format)) + " " + c10::toString(dtype);
}

}  // namespace

TEST_CASE("fp8 layers match the float64 reference at TP 1-4 (float32, bfloat16)", "[quant][fp8]") {
  for (const auto& config : {kTensor, kChannel, kBlock}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      INFO(label(config, dtype));
      test::QuantCheck check{config, dtype, tolerance(config, dtype)};
      test::check_quant_layers(check);
    }
  }
}

TEST_CASE("fp8 layers load from a safetensors file", "[quant][fp8][loader]") {
  for (const auto& config : {kTensor, kChannel, kBlock}) {
    INFO(label(config, at::kFloat));
    test::QuantCheck check{config, at::kFloat, tolerance(config, at::kFloat)};
    check.from_file = true;
    check.worlds = {1, 3};
    check.seed = 3;
    test::check_quant_layers(check);
  }
}

TEST_CASE("fp8 layers with partial 128-blocks (N=1000, K=520) at TP 1-3", "[quant][fp8]") {
  // out=1000 and intermediate=1000 end in a 104-row block, in=hidden=520 in an
  // 8-column one. At TP 2 the split is 512/488 (the last rank owns the partial block);
  // GateUp's up segment starts at local row 1000 at TP 1, inside a 128-row block.
  test::QuantLayerShapes shapes;
  shapes.in = 520;
  shapes.out = 1000;
  shapes.hidden = 520;
  shapes.intermediate = 1000;
  for (const auto& config : {kBlock, kTensor, kChannel}) {
    INFO(label(config, at::kFloat));
    test::QuantCheck check{config, at::kFloat, tolerance(config, at::kFloat)};
    check.shapes = shapes;
    check.worlds = {1, 2, 3};
    check.seed = 4;
    test::check_quant_layers(check);
  }
}

TEST_CASE("fp8 quantize/dequantize round trip and activation semantics", "[quant][fp8]") {
  const auto w = test::random_weight(300, 200, 11).to(at::kFloat);
  for (const auto& config : {kTensor, kChannel, kBlock}) {
    INFO(to_string(config.format));
    const auto q = quantize_weight(w, config);
    CHECK(q.at("weight").scalar_type() == at::kFloat8_e4m3fn);
    CHECK(q.at("weight").sizes() == w.sizes());
    // E4M3 keeps 3 mantissa bits: every element within 2^-4 of itself, relative to its
    // scale group's largest element, and the group's largest is hit (almost) exactly.
    const auto back = dequantize_weight(q, config);
    CHECK(test::relative_error(back, w) <= 0.0625 * w.abs().max().item<double>());
    CHECK(back.abs().max().item<double>() == Approx(w.abs().max().item<double>()).epsilon(1e-6));
  }
  CHECK(quantize_weight(w, kTensor).at("weight_scale").dim() == 0);
  CHECK(quantize_weight(w, kTensor).at("input_scale").dim() == 0);
  CHECK(quantize_weight(w, kChannel).at("weight_scale").sizes() == at::IntArrayRef({300, 1}));
  CHECK(quantize_weight(w, kBlock).at("weight_scale_inv").sizes() == at::IntArrayRef({3, 2}));
  // An all-zero weight quantizes to zeros (scale 1), not NaN.
  for (const auto& config : {kTensor, kChannel, kBlock}) {
    const auto back = dequantize_weight(quantize_weight(at::zeros({130, 129}), config), config);
    CHECK(back.abs().max().item<double>() == 0.0);
  }
  // Activations: per-token scales come from each row's amax, 1x128 groups from each
  // group's amax, so a row's (group's) largest element survives exactly and a zero row
  // stays zero.
  auto x = at::randn({3, 300}, test::generator(5)).to(at::kFloat);
  x[1].zero_();
  x[2].narrow(0, 0, 128).mul_(1000);  // group 0 of row 2 is huge, groups 1-2 must not care
  const auto xc = quantize_activation(x, {}, kChannel);
  const auto xb = quantize_activation(x, {}, kBlock);
  CHECK(xc[1].abs().max().item<double>() == 0.0);
  CHECK(xb[1].abs().max().item<double>() == 0.0);
  CHECK(xc[0].abs().max().item<double>() == Approx(x[0].abs().max().item<double>()).epsilon(1e-6));
  const auto tail = x[2].narrow(0, 128, 172);
  CHECK(test::relative_error(xb[2].narrow(0, 128, 172), tail) <= 0.0625 * tail.abs().max().item<double>());
  // Static input_scale: saturates at 448 * input_scale.
  const QuantizedTensors s{{"input_scale", at::scalar_tensor(0.01f)}};
  CHECK(quantize_activation((at::ones({1, 4}) * 100), s, kTensor).max().item<double>() == Approx(4.48));
}

TEST_CASE("fp8_block: every rank reads its own scale blocks (span 128), column and row", "[quant][fp8][loader]") {
  // Block (i, j) of the weight is scaled by 4^(i + 2j) (spread over 8 decades): a
  // scale read with the wrong span, offset or dim lands on a block of another
  // magnitude and the output is off by orders of magnitude.
  const int64_t n = 640, k = 384;
  auto w = test::random_weight(n, k, 21).to(at::kFloat);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) w.narrow(0, i * 128, 128).narrow(1, j * 128, 128).mul_(std::pow(4.0, i + 2 * j));
  const auto q = quantize_weight(w, kBlock);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "fc", q);
  const auto x = at::randn({4, k}, test::generator(22)).to(at::kFloat);
  const auto ref =
      at::matmul(quantize_activation(x, q, kBlock).to(at::kDouble), dequantize_weight(q, kBlock).to(at::kDouble).t());
  // Expected per-row block scales: row r of block i, column block j.
  const auto scale_rows = q.at("weight_scale_inv").repeat_interleave(128, 0);  // [640, 3]
  for (int64_t world : {2, 3, 4}) {
    std::vector<at::Tensor> col(world), row(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          ColumnParallelLinear c(ColumnParallelLinearOptions(k, n).bias(false).gather_output(true).quant(kBlock), comm);
          c->load_weights(ckpt, "fc");
          const Range mine = c->local_range();
          const at::Tensor scale = c->named_parameters()["weight_scale_inv"];
          CHECK(at::equal(scale, scale_rows.narrow(0, mine.begin, mine.size())));
          col[comm.rank()] = c->forward(x);
          RowParallelLinear r(RowParallelLinearOptions(k, n).bias(false).input_is_parallel(false).quant(kBlock), comm);
          r->load_weights(ckpt, "fc");
          row[comm.rank()] = r->forward(x);
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      CHECK(test::relative_error(col[r], ref) <= 2e-5);
      CHECK(test::relative_error(row[r], ref) <= 2e-5);
    }
  }
}

TEST_CASE("fp8_channel: a row-parallel layer replicates the [N,1] scales, a column layer slices them",
          "[quant][fp8][loader]") {
  const int64_t n = 96, k = 64;
  const auto q = quantize_weight(test::random_weight(n, k, 31), kChannel);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "fc", q);
  const auto& s = q.at("weight_scale");
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        RowParallelLinear r(RowParallelLinearOptions(k, n).bias(false).quant(kChannel), comm);
        r->load_weights(ckpt, "fc");
        CHECK(at::equal(r->named_parameters()["weight_scale"], s));
        ColumnParallelLinear c(ColumnParallelLinearOptions(k, n).bias(false).quant(kChannel), comm);
        c->load_weights(ckpt, "fc");
        const Range mine = c->local_range();
        CHECK(at::equal(c->named_parameters()["weight_scale"], s.narrow(0, mine.begin, mine.size())));
        // Column layers quantize the whole activation row, as the reference does: the
        // tight float32 bound holds (the row layer's looser one is explained at the top).
        const auto x = at::randn({5, k}, test::generator(32)).to(at::kFloat);
        const auto ref = at::matmul(quantize_activation(x, q, kChannel).to(at::kDouble),
                                    dequantize_weight(q, kChannel).to(at::kDouble).t());
        CHECK(test::relative_error(c->forward(x), ref.narrow(1, mine.begin, mine.size())) <= 2e-5);
      },
      test::test_comm_options());
}

TEST_CASE("fp8_tensor: fused QKV keeps each part's weight scale and uses the largest input scale",
          "[quant][fp8][loader]") {
  // q, k and v of very different magnitudes (so different weight scales) and
  // different static input scales.
  const int64_t hidden = 64, head_dim = 16, heads = 4, kv_heads = 2;
  const std::vector<std::pair<std::string, int64_t>> parts = {
      {"q_proj", heads * head_dim}, {"k_proj", kv_heads * head_dim}, {"v_proj", kv_heads * head_dim}};
  const double magnitude[] = {1.0, 100.0, 0.01};
  const float input_scale[] = {4.f / 448, 8.f / 448, 2.f / 448};
  Checkpoint ckpt;
  std::vector<QuantizedTensors> q;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto t = quantize_weight(test::random_weight(parts[i].second, hidden, 40 + i) * magnitude[i], kTensor);
    t["input_scale"] = at::ones({1}) * input_scale[i];  // [1] is accepted as well as []
    add_to_checkpoint(ckpt, "attn." + parts[i].first, t);
    q.push_back(t);
  }
  const auto x = (at::randn({5, hidden}, test::generator(41)) * 2).to(at::kFloat);
  // One activation feeds q, k and v: it is quantized once, with the largest scale.
  const QuantizedTensors max_scale{{"input_scale", at::scalar_tensor(8.f / 448)}};
  const auto xq = quantize_activation(x, max_scale, kTensor).to(at::kDouble);
  std::vector<at::Tensor> refs;
  for (const auto& t : q) refs.push_back(at::matmul(xq, dequantize_weight(t, kTensor).to(at::kDouble).t()));
  const auto ref = at::cat(refs, -1);
  for (int64_t world : {1, 2}) {
    std::vector<at::Tensor> out(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          QKVParallelLinear l(QKVParallelLinearOptions(hidden, head_dim, heads, kv_heads)
                                  .bias(false)
                                  .gather_output(true)
                                  .quant(kTensor),
                              comm);
          l->load_weights(ckpt, "attn");
          CHECK(l->named_parameters()["input_scale"].item<float>() == 8.f / 448);
          out[comm.rank()] = l->forward(x);
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      // Relative to max |ref| ~ 100x the q part: the q and v parts are checked on
      // their own too, so a scale mix-up between parts cannot hide under k's magnitude.
      CHECK(test::relative_error(out[r], ref) <= 2e-5);
      const auto q_out = out[r].narrow(-1, 0, heads * head_dim), q_ref = refs[0];
      const auto v_out = out[r].narrow(-1, (heads + kv_heads) * head_dim, kv_heads * head_dim);
      CHECK(test::relative_error(q_out * 100, q_ref * 100) <= 1e-4);
      CHECK(test::relative_error(v_out * 1e4, refs[2] * 1e4) <= 1e-4);
    }
  }
}

TEST_CASE("fp8 layers refuse unsupported shards at construction, listing what works", "[quant][fp8][errors]") {
  // A RowParallelLinear with in_features=300 at TP 3 splits as 128/128/44: a partial
  // last block is fine for fp8_block, so this must construct and compute.
  std::vector<at::Tensor> out(3);
  const auto q = quantize_weight(test::random_weight(64, 300, 51), kBlock);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "down", q);
  const auto x = at::randn({2, 300}, test::generator(52)).to(at::kFloat);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        RowParallelLinear r(RowParallelLinearOptions(300, 64).bias(false).input_is_parallel(false).quant(kBlock), comm);
        r->load_weights(ckpt, "down");
        out[comm.rank()] = r->forward(x);
      },
      test::test_comm_options());
  const auto ref =
      at::matmul(quantize_activation(x, q, kBlock).to(at::kDouble), dequantize_weight(q, kBlock).to(at::kDouble).t());
  for (const auto& y : out) CHECK(test::relative_error(y, ref) <= 2e-5);

  // QKV with head_dim=64 and fp8_block: a KV head is half a 128-row block, so two KV
  // heads must stay together; 3 KV heads cannot be split on the block at all.
  REQUIRE_THROWS_WITH(
      QKVParallelLinear(QKVParallelLinearOptions(256, 64, 6, 3).quant(kBlock)),
      Contains("QKVParallelLinear:") && Contains("granularity 128") && Contains("pad num_kv_heads to 4"));
  // World 4 with two KV heads of 64 rows: each would be replicated on two ranks,
  // which cuts a 128-row block.
  std::vector<std::string> errors(4);
  run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        try {
          QKVParallelLinear l(QKVParallelLinearOptions(256, 64, 4, 2).quant(kBlock), comm);
        } catch (const c10::Error& e) {
          errors[comm.rank()] = e.what_without_backtrace();
        }
      },
      test::test_comm_options());
  for (const auto& e : errors) {
    CHECK_THAT(e, Contains("QKVParallelLinear:") && Contains("granularity 128") && Contains("world sizes that work"));
  }
  // A layer dtype that is not floating point, and a device this build cannot run FP8 on.
  REQUIRE_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(128, 128).dtype(at::kInt).quant(kBlock)),
                      Contains("not a floating-point type"));
  REQUIRE_THROWS_WITH(
      ColumnParallelLinear(ColumnParallelLinearOptions(128, 128).device(at::Device("meta")).quant(kTensor)),
      Contains("fp8_tensor: this build runs FP8 layers on CPU only; got device meta"));
}

TEST_CASE("fp8 load errors name the tensor and the numbers", "[quant][fp8][errors][loader]") {
  const auto w = test::random_weight(256, 128, 61);
  auto block = quantize_weight(w, kBlock);
  auto channel = quantize_weight(w, kChannel);
  auto tensor = quantize_weight(w, kTensor);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "block", block);
  add_to_checkpoint(ckpt, "channel", channel);
  add_to_checkpoint(ckpt, "tensor", tensor);
  ckpt.add("float.weight", w.to(at::kFloat));
  ckpt.add("float.weight_scale_inv", block.at("weight_scale_inv"));
  ckpt.add("badblock.weight", block.at("weight"));
  ckpt.add("badblock.weight_scale_inv", at::ones({2, 2}));  // [ceil(256/128), ceil(128/128)] is [2, 1]
  ckpt.add("badchannel.weight", channel.at("weight"));
  ckpt.add("badchannel.weight_scale", at::ones({256}));  // must be [256, 1]
  ckpt.add("intscale.weight", channel.at("weight"));
  ckpt.add("intscale.weight_scale", at::ones({256, 1}, at::kInt));
  ckpt.add("badtensor.weight", tensor.at("weight"));
  ckpt.add("badtensor.weight_scale", at::ones({2}));
  ckpt.add("badtensor.input_scale", tensor.at("input_scale"));
  ckpt.add("noinput.weight", tensor.at("weight"));
  ckpt.add("noinput.weight_scale", tensor.at("weight_scale"));
  ckpt.add("zeroinput.weight", tensor.at("weight"));
  ckpt.add("zeroinput.weight_scale", tensor.at("weight_scale"));
  ckpt.add("zeroinput.input_scale", at::zeros({}));

  ColumnParallelLinear b(ColumnParallelLinearOptions(128, 256).bias(false).quant(kBlock));
  REQUIRE_THROWS_WITH(b->load_weights(ckpt, "float"),
                      Contains("ColumnParallelLinear: tensor 'float.weight' has dtype Float but fp8_block expects "
                               "float8_e4m3fn"));
  REQUIRE_THROWS_WITH(b->load_weights(ckpt, "badblock"),
                      Contains("ColumnParallelLinear: tensor 'badblock.weight_scale_inv' has shape [2, 2]; "
                               "fp8_block expects [2, 1]"));
  REQUIRE_THROWS_WITH(b->load_weights(ckpt, "channel"),
                      Contains("checkpoint has no tensor 'channel.weight_scale_inv'"));
  RowParallelLinear wide(RowParallelLinearOptions(256, 256).bias(false).quant(kBlock));
  REQUIRE_THROWS_WITH(wide->load_weights(ckpt, "block"),
                      Contains("RowParallelLinear: tensor 'block.weight' has shape [256, 128]; expected [256, 256]"));

  ColumnParallelLinear c(ColumnParallelLinearOptions(128, 256).bias(false).quant(kChannel));
  REQUIRE_THROWS_WITH(c->load_weights(ckpt, "badchannel"),
                      Contains("tensor 'badchannel.weight_scale' has shape [256]; fp8_channel expects [256, 1]"));
  REQUIRE_THROWS_WITH(c->load_weights(ckpt, "intscale"),
                      Contains("tensor 'intscale.weight_scale' has dtype Int but fp8_channel expects a "
                               "floating-point scale"));

  RowParallelLinear t(RowParallelLinearOptions(128, 256).bias(false).quant(kTensor));
  REQUIRE_THROWS_WITH(t->load_weights(ckpt, "badtensor"),
                      Contains("tensor 'badtensor.weight_scale' has shape [2]; fp8_tensor expects [] (or [1])"));
  REQUIRE_THROWS_WITH(t->load_weights(ckpt, "noinput"), Contains("no tensor 'noinput.input_scale'"));
  REQUIRE_THROWS_WITH(t->load_weights(ckpt, "zeroinput"),
                      Contains("tensor 'zeroinput.input_scale' is 0; an input_scale must be finite and > 0"));
  t->load_weights(ckpt, "tensor");  // and the good one loads
}

TEST_CASE("fp8 layers initialise, run and register their tensors without a checkpoint", "[quant][fp8]") {
  for (const auto& config : {kTensor, kChannel, kBlock}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO(label(config, dtype));
      ColumnParallelLinear fc(ColumnParallelLinearOptions(200, 300).dtype(dtype).quant(config));
      const auto params = fc->named_parameters();
      CHECK(params["weight"].scalar_type() == at::kFloat8_e4m3fn);
      CHECK_FALSE(params["weight"].requires_grad());
      CHECK(fc->weight.sizes() == at::IntArrayRef({300, 200}));
      const char* scale = config.format == QuantFormat::kFp8Block ? "weight_scale_inv" : "weight_scale";
      REQUIRE(params.contains(scale));
      CHECK(params.contains("input_scale") == (config.format == QuantFormat::kFp8PerTensor));
      const auto x = at::randn({2, 3, 200}).to(dtype);
      const auto y = fc->forward(x);
      CHECK(y.scalar_type() == dtype);
      CHECK(y.sizes() == at::IntArrayRef({2, 3, 300}));
      CHECK(y.isfinite().all().item<bool>());
      CHECK(y.abs().max().item<double>() > 0);
    }
  }
}
