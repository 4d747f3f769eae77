// NVFP4 in both dialects (compressed-tensors: weight_global_scale divides; ModelOpt:
// weight_scale_2 multiplies): the dequantization formula on hand-made values (the test
// that catches the two conventions swapped), the CPU decoder bit for bit against
// dequantize_weight over every E4M3 scale byte, the layers at TP 1-4 against the float64
// reference (K split in whole groups of 16; decode batches on the rows kernel), fused
// layers whose parts carry global scales orders of magnitude apart, and the refusals.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "quant/nvfp4/nvfp4.h"
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

QuantConfig nvfp4(Nvfp4Dialect dialect) {
  QuantConfig c{QuantFormat::kNvfp4};
  c.nvfp4_dialect = dialect;
  return c;
}
const QuantConfig kCt = nvfp4(Nvfp4Dialect::kCompressedTensors);
const QuantConfig kModelOpt = nvfp4(Nvfp4Dialect::kModelOpt);

// One row of 16 codes, all 1.5 (code 3) but element 1 (-6, code 15), with scale 2 and
// global scale 4, in `config`'s names.
QuantizedTensors hand_made(const QuantConfig& config) {
  at::Tensor codes = at::full({1, 8}, 0x33, at::kByte);
  codes[0][0] = 0xF3;  // element 0 in the low nibble (code 3), element 1 in the high (code 15)
  return {{tp::detail::nvfp4_codes_name(config), codes},
          {"weight_scale", at::full({1, 1}, 2.0, at::kFloat).to(at::kFloat8_e4m3fn)},
          {tp::detail::nvfp4_global_name(config), at::full({1}, 4.0, at::kFloat)}};
}

}  // namespace

TEST_CASE("nvfp4's global scale divides in compressed-tensors' dialect and multiplies in ModelOpt's",
          "[quant][nvfp4]") {
  CHECK(to_string(kCt) == "nvfp4");
  CHECK(to_string(kModelOpt) == "nvfp4:modelopt");
  CHECK(parse_quant_config("nvfp4:modelopt") == kModelOpt);
  CHECK(parse_quant_config("nvfp4:compressed_tensors") == kCt);
  CHECK(kCt != kModelOpt);
  // compressed-tensors: 1.5 * (2 / 4) = 0.75; ModelOpt: 1.5 * (2 * 4) = 12.
  const at::Tensor ct = dequantize_weight(hand_made(kCt), kCt);
  const at::Tensor mo = dequantize_weight(hand_made(kModelOpt), kModelOpt);
  CHECK(ct[0][0].item<float>() == 0.75f);
  CHECK(ct[0][1].item<float>() == -3.0f);
  CHECK(mo[0][0].item<float>() == 12.0f);
  CHECK(mo[0][1].item<float>() == -48.0f);
  // The stored names differ, so one dialect's tensors are never read as the other's.
  CHECK(hand_made(kCt).count("weight_packed") == 1);
  CHECK(hand_made(kModelOpt).count("weight") == 1);
  CHECK(hand_made(kModelOpt).count("weight_scale_2") == 1);
}

TEST_CASE("nvfp4 quantizes to within half an E2M1 step of each group's E4M3 scale", "[quant][nvfp4]") {
  for (const auto& config : {kCt, kModelOpt}) {
    INFO(to_string(config));
    const at::Tensor w = test::random_weight(24, 64, 3).to(at::kFloat);
    const auto q = quantize_weight(w, config);
    CHECK(q.at(tp::detail::nvfp4_codes_name(config)).sizes() == c10::IntArrayRef({24, 32}));
    CHECK(q.at("weight_scale").sizes() == c10::IntArrayRef({24, 4}));
    CHECK(q.at(tp::detail::nvfp4_global_name(config)).numel() == 1);
    const at::Tensor d = dequantize_weight(q, config);
    // Each element within half the widest E2M1 step (2, between 4 and 6) of its group's
    // scale, or saturated at 6 of them; the E4M3 group scale near amax_group / 6.
    const at::Tensor g = q.at(tp::detail::nvfp4_global_name(config));
    const at::Tensor s = q.at("weight_scale").to(at::kFloat);
    const at::Tensor eff = (config == kCt ? s / g : s * g).unsqueeze(-1);
    const at::Tensor group_amax = w.reshape({24, 4, 16}).abs().amax(-1, true);
    CHECK((eff - group_amax / 6).abs().le(group_amax / 6 / 16 + 1e-6).all().item<bool>());
    const at::Tensor bound = at::maximum(eff, group_amax - 6 * eff).expand({24, 4, 16}).reshape({24, 64});
    CHECK((d - w).abs().le(bound * (1 + 1e-6)).all().item<bool>());
    CHECK(d.ne(0).any().item<bool>());
  }
}

TEST_CASE("nvfp4's CPU decoder writes dequantize_weight's float32 weights bit for bit, every E4M3 scale",
          "[quant][nvfp4][cpu_kernels]") {
  // Random codes; every finite E4M3 byte as some group's scale; global scales unlike 2^k;
  // K across the panel GEMM's chunk of 256.
  const int64_t n = 40, k = 288;
  auto gen = test::generator(5);
  at::Tensor scale_bytes = at::randint(0, 256, {n, k / 16}, gen, at::kByte);
  scale_bytes.view(-1).narrow(0, 0, 256).copy_(at::arange(0, 256, at::kByte));
  scale_bytes = at::where(scale_bytes.bitwise_and(0x7F).eq(0x7F), at::zeros_like(scale_bytes), scale_bytes);  // no NaN
  for (const auto& config : {kCt, kModelOpt}) {
    INFO(to_string(config));
    const at::Tensor global = at::full({1}, 2811.37f, at::kFloat);
    QuantizedTensors q{{tp::detail::nvfp4_codes_name(config), at::randint(0, 256, {n, k / 2}, gen, at::kByte)},
                       {"weight_scale", scale_bytes.view(at::kFloat8_e4m3fn)},
                       {tp::detail::nvfp4_global_name(config), global}};
    const at::Tensor rows = global.expand({n}).contiguous();
    const tp::detail::Nvfp4CpuWeight w{q.at(tp::detail::nvfp4_codes_name(config)).const_data_ptr<uint8_t>(),
                                       scale_bytes.const_data_ptr<uint8_t>(),
                                       rows.const_data_ptr<float>(),
                                       n,
                                       k,
                                       config.nvfp4_dialect == Nvfp4Dialect::kCompressedTensors};
    const at::Tensor want = dequantize_weight(q, config);
    CHECK(at::equal(tp::detail::nvfp4_cpu_decode_all(w).view(at::kInt), want.view(at::kInt)));
    // The GEMM on them: M <= 4 the rows kernel (AVX2 / AVX-512 machines), 5 the panels.
    for (int64_t m = 1; m <= 5; ++m) {
      INFO("M = " << m);
      const auto x = test::randn({m, k}, 6 + m).to(at::kFloat);
      const auto y = tp::detail::nvfp4_cpu_linear(x, w);
      const auto ref = at::matmul(x.to(at::kDouble), want.to(at::kDouble).t());
      CHECK(test::relative_error(y, ref) <= test::tolerance(at::kFloat));
    }
  }
}

TEST_CASE("nvfp4 layers match the float64 reference at TP 1-4, both dialects", "[quant][nvfp4]") {
  for (const auto& config : {kCt, kModelOpt}) {
    test::check_quant_layers({config, at::kFloat, test::tolerance(at::kFloat)});
    test::check_quant_layers({config, at::kBFloat16, test::tolerance(at::kBFloat16)});
  }
  // Decode-sized batches: the rows kernel.
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    test::QuantCheck decode{kCt, dtype, test::tolerance(dtype)};
    decode.shapes.tokens = 2;
    test::check_quant_layers(decode);
  }
  test::QuantCheck file{kModelOpt, at::kFloat, test::tolerance(at::kFloat)};
  file.from_file = true;
  file.worlds = {3};
  file.seed = 7;
  test::check_quant_layers(file);
}

TEST_CASE("nvfp4 fused layers keep each part's global scale, parts 300x apart, at TP 1-4", "[quant][nvfp4]") {
  // gate x 1/300 and up x 300 (q x 300, k x 1, v x 1/300): a scale shared by the parts
  // (their max) would round the small part's codes to zero. Each part is compared
  // against its own float64 reference, relative to its own size.
  const int64_t hidden = 64, inter = 48, head_dim = 16, heads = 6, kv_heads = 1, tokens = 3;
  const double mags[] = {300.0, 1.0, 1.0 / 300.0};
  for (const auto& config : {kCt, kModelOpt}) {
    INFO(to_string(config));
    Checkpoint ckpt;
    std::vector<at::Tensor> ref_w;  // q, k, v, gate, up: float64
    const auto add = [&](const std::string& name, int64_t out, double mag, uint64_t seed) {
      const auto q = quantize_weight(test::random_weight(out, hidden, seed) * mag, config);
      add_to_checkpoint(ckpt, name, q);
      ref_w.push_back(dequantize_weight(q, config).to(at::kDouble));
    };
    add("attn.q_proj", heads * head_dim, mags[0], 11);
    add("attn.k_proj", kv_heads * head_dim, mags[1], 12);
    add("attn.v_proj", kv_heads * head_dim, mags[2], 13);
    add("mlp.gate_proj", inter, mags[2], 14);
    add("mlp.up_proj", inter, mags[0], 15);
    const at::Tensor x = test::randn({tokens, hidden}, 16).to(at::kFloat);
    for (int64_t world = 1; world <= 4; ++world) {
      std::vector<at::Tensor> qkv(world), gate_up(world);
      run_ranks_in_threads(world, [&](Communicator& comm) {
        QKVParallelLinear a(
            QKVParallelLinearOptions(hidden, head_dim, heads, kv_heads).bias(false).gather_output(true).quant(config),
            comm);
        a->load_weights(ckpt, "attn");
        GateUpParallelLinear m(GateUpParallelLinearOptions(hidden, inter).bias(false).gather_output(true).quant(config),
                               comm);
        m->load_weights(ckpt, "mlp");
        qkv[comm.rank()] = a->forward(x);
        gate_up[comm.rank()] = m->forward(x);
      });
      const int64_t widths[] = {heads * head_dim, kv_heads * head_dim, kv_heads * head_dim, inter, inter};
      for (int64_t r = 0; r < world; ++r) {
        int64_t at_col = 0;
        for (int i = 0; i < 5; ++i) {
          const at::Tensor& y = i < 3 ? qkv[r] : gate_up[r];
          if (i == 3) at_col = 0;
          const at::Tensor got = y.narrow(1, at_col, widths[i]).to(at::kDouble);
          const at::Tensor ref = at::matmul(x.to(at::kDouble), ref_w[i].t());
          at_col += widths[i];
          INFO("world " << world << " rank " << r << " part " << i);
          const double size = ref.abs().max().item<double>();
          CHECK(size > 0);
          CHECK((got - ref).abs().max().item<double>() <= test::tolerance(at::kFloat) * size);
        }
      }
    }
  }
}

TEST_CASE("nvfp4 refuses K outside whole groups, the other dialect's names, W4A4 tensors and bad scales, by name",
          "[quant][nvfp4][errors]") {
  CHECK_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(40, 16).quant(kCt)),
                    Contains("not a multiple of NVFP4's scale group of 16"));
  const auto q = quantize_weight(test::random_weight(16, 64, 3).to(at::kFloat), kCt);
  const auto load = [&](const QuantizedTensors& tensors, const QuantConfig& config) {
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", tensors);
    ColumnParallelLinear fc(ColumnParallelLinearOptions(64, 16).bias(false).quant(config));
    fc->load_weights(ckpt, "fc");
  };
  CHECK_NOTHROW(load(q, kCt));
  // compressed-tensors' tensors read as ModelOpt's (and back) are missing tensors, not a
  // global scale read upside down.
  CHECK_THROWS_WITH(load(q, kModelOpt), Contains("fc.weight"));
  const auto mo = quantize_weight(test::random_weight(16, 64, 3).to(at::kFloat), kModelOpt);
  CHECK_THROWS_WITH(load(mo, kCt), Contains("fc.weight_packed"));
  // A W4A4 checkpoint's input scale is not dropped: the load refuses it.
  auto w4a4 = q;
  w4a4["input_global_scale"] = at::full({1}, 100.0f, at::kFloat);
  CHECK_THROWS_WITH(load(w4a4, kCt), Contains("fc.input_global_scale"));
  auto nan = q;
  nan["weight_scale"] = q.at("weight_scale").clone();
  nan["weight_scale"].view(at::kByte)[3][1] = 0x7F;
  CHECK_THROWS_WITH(load(nan, kCt), Contains("fc.weight_scale") && Contains("NaN"));
  auto zero = q;
  zero["weight_global_scale"] = at::zeros({1}, at::kFloat);
  CHECK_THROWS_WITH(load(zero, kCt), Contains("fc.weight_global_scale") && Contains("> 0"));
  auto typed = q;
  typed["weight_scale"] = q.at("weight_scale").to(at::kFloat);
  CHECK_THROWS_WITH(load(typed, kCt), Contains("fc.weight_scale") && Contains("float8_e4m3fn"));
  auto wide = q;
  wide["weight_packed"] = at::zeros({16, 64}, at::kByte);
  CHECK_THROWS_WITH(load(wide, kCt), Contains("fc.weight_packed") && Contains("[16, 32]"));
  auto per_row = q;
  per_row["weight_global_scale"] = at::ones({16}, at::kFloat);
  CHECK_THROWS_WITH(load(per_row, kCt), Contains("fc.weight_global_scale") && Contains("[] or [1]"));
}
