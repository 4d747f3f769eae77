// compressed-tensors pack-quantized (int4_pack_quantized), GPTQ v2 (gptq_v2 zero
// points) and the compressed-tensors FP8 block scale name (weight_scale): the formats
// at TP 1-4 through the shared harness, their packings against tensors hand-built
// here with plain loops, the TP alignment of symmetric and asymmetric pack-quantized,
// and their errors.
//
// Tolerances (relative_error against x @ dequantize_weight(W)^T + b):
// - float64 layers: 1e-6. dequantize_weight rounds (q - zero) * scale to float32, the
//   float64 layer does not (measured ~1e-8 to 3e-8 relative); a zero point off by
//   one (issue 14's failure 4) is off by 0.1-0.25.
// - float32 layers: 3e-2, as the other INT4 formats (tests/quant/int4_test.cpp): the
//   CPU kernel's bfloat16 activations, scales and float zero points.
// - fp8_block: the FP8 tests' float32 tolerance (tests/quant/fp8_test.cpp; the reference
//   quantizes activations as the kernel does).

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <array>
#include <limits>

#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

QuantConfig pack(int64_t group, bool symmetric) {
  return QuantConfig{QuantFormat::kInt4PackQuantized, group, symmetric};
}

at::Tensor param(const torch::nn::Module& m, const std::string& name) {
  const auto* p = m.named_parameters().find(name);
  REQUIRE(p != nullptr);
  return *p;
}

int32_t word(const std::array<int64_t, 8>& nibbles) {
  uint32_t w = 0;
  for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>(nibbles[i] & 15) << (4 * i);
  return static_cast<int32_t>(w);
}

// compressed-tensors tensors written with plain loops from docs/checkpoint_formats.md
// §3.3: weight_packed [N, K/8] (element 8c + j of row n in nibble j, offset binary),
// weight_zero_point [N/8, K/g] (row 8r + j of group G in nibble j, offset binary),
// weight_scale [N, K/g]. Codes, zero points and scales vary per row and group.
struct HandBuilt {
  at::Tensor expected;  // f32 [N, K] = (q - zp) * s
  QuantizedTensors tensors;
};

HandBuilt hand_built(int64_t n, int64_t k, int64_t g, bool symmetric) {
  const auto q = [&](int64_t nn, int64_t kk) { return (nn * 7 + kk * 5 + nn * kk) % 16 - 8; };  // -8..7
  const auto zp = [&](int64_t nn, int64_t gg) { return symmetric ? 0 : (gg * 3 + nn * 5) % 16 - 8; };
  const auto s = [&](int64_t nn, int64_t gg) { return 0.01f * static_cast<float>(1 + (nn + 2 * gg) % 7); };
  HandBuilt h;
  h.expected = at::empty({n, k});
  auto packed = at::empty({n, k / 8}, at::kInt);
  auto scale = at::empty({n, k / g});
  for (int64_t nn = 0; nn < n; ++nn) {
    for (int64_t c = 0; c < k / 8; ++c) {
      std::array<int64_t, 8> nib{};
      for (int j = 0; j < 8; ++j) nib[j] = q(nn, 8 * c + j) + 8;
      packed[nn][c] = word(nib);
    }
    for (int64_t gg = 0; gg < k / g; ++gg) scale[nn][gg] = s(nn, gg);
    for (int64_t kk = 0; kk < k; ++kk)
      h.expected[nn][kk] = static_cast<float>(q(nn, kk) - zp(nn, kk / g)) * s(nn, kk / g);
  }
  h.tensors["weight_packed"] = packed;
  h.tensors["weight_scale"] = scale;
  h.tensors["weight_shape"] = at::tensor(std::vector<int64_t>{n, k}, at::kLong);
  if (!symmetric) {
    auto zero = at::empty({n / 8, k / g}, at::kInt);
    for (int64_t r = 0; r < n / 8; ++r) {
      for (int64_t gg = 0; gg < k / g; ++gg) {
        std::array<int64_t, 8> nib{};
        for (int j = 0; j < 8; ++j) nib[j] = zp(8 * r + j, gg) + 8;
        zero[r][gg] = word(nib);
      }
    }
    h.tensors["weight_zero_point"] = zero;
  }
  return h;
}

QuantizedTensors local_tensors(const torch::nn::Module& m, bool symmetric, int64_t n, int64_t k) {
  QuantizedTensors t{{"weight_packed", param(m, "weight_packed")}, {"weight_scale", param(m, "weight_scale")}};
  if (!symmetric) t["weight_zero_point"] = param(m, "weight_zero_point");
  return t;
}

}  // namespace

TEST_CASE("int4_pack_quantized layers match the float64 reference at TP 1-4", "[quant][int4][pack]") {
  int i = 0;
  for (bool symmetric : {true, false}) {
    for (int64_t group : {32, 64, 128}) {
      const auto config = pack(group, symmetric);
      INFO(to_string(config));
      // The reference dequantizes in float32 (dequantize_weight), the float64 layer in
      // float64: they differ by float32's rounding of (q - zero) * scale (~3e-8 relative);
      // a zero point off by one is off by 0.1-0.25.
      test::QuantCheck f64{config, at::kDouble, 1e-6};
      test::QuantCheck f32{config, at::kFloat, 3e-2};
      f64.seed = 40 + i;
      f32.seed = 60 + i;
      f32.worlds = {1 + i % 4};  // every world size over the six configs
      test::check_quant_layers(f64);
      test::check_quant_layers(f32);
      ++i;
    }
  }
  test::QuantCheck file{pack(64, false), at::kFloat, 3e-2};
  file.from_file = true;
  file.worlds = {3};
  test::check_quant_layers(file);
}

TEST_CASE("int4_pack_quantized decodes hand-built compressed-tensors tensors", "[quant][int4][pack]") {
  for (bool symmetric : {true, false}) {
    INFO((symmetric ? "sym" : "asym"));
    const auto h = hand_built(24, 128, 32, symmetric);
    CHECK(at::equal(dequantize_weight(h.tensors, pack(32, symmetric)), h.expected));
  }
  // The library's quantizer: compressed-tensors' parameters, within half a step per element.
  const auto w = test::random_weight(40, 256, 3).to(at::kFloat);
  for (bool symmetric : {true, false}) {
    const auto config = pack(64, symmetric);
    const auto q = quantize_weight(w, config);
    CHECK(q.count("weight_zero_point") == (symmetric ? 0u : 1u));
    CHECK(q.at("weight_packed").sizes() == at::IntArrayRef({40, 32}));
    CHECK(q.at("weight_scale").sizes() == at::IntArrayRef({40, 4}));
    CHECK(at::equal(q.at("weight_shape"), at::tensor(std::vector<int64_t>{40, 256}, at::kLong)));
    const auto step = q.at("weight_scale").repeat_interleave(64, 1);
    const auto err = (dequantize_weight(q, config) - w).abs();
    CHECK((err <= step * 0.5001).all().item<bool>());
  }
}

TEST_CASE("int4_pack_quantized shards: COLUMN and ROW slices of hand-built tensors", "[quant][int4][pack][loader]") {
  const int64_t k = 256, g = 64;
  for (bool symmetric : {true, false}) {
    // N = 44 is no multiple of 8: symmetric pack-quantized (packed along K only) splits
    // it anywhere; the asymmetric one (zero points packed along N) needs N = 48.
    const int64_t n = symmetric ? 44 : 48;
    const auto config = pack(g, symmetric);
    const auto h = hand_built(n, k, g, symmetric);
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", h.tensors);
    for (int64_t world : {2, 3, 4}) {
      INFO(to_string(config) << " world " << world);
      std::vector<at::Tensor> col_w(world), row_w(world), col_y(world), row_y(world);
      std::vector<Range> col_r(world), row_r(world);
      const auto x = test::randn({3, k}, 61).to(at::kFloat);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            const int64_t r = comm.rank();
            ColumnParallelLinear col(ColumnParallelLinearOptions(k, n).bias(false).quant(config), comm);
            col->load_weights(ckpt, "fc");
            col_r[r] = col->local_range();
            col_w[r] = dequantize_weight(local_tensors(*col, symmetric, col_r[r].size(), k), config);
            col_y[r] = col->forward(x);
            RowParallelLinear row(RowParallelLinearOptions(k, n).bias(false).quant(config).input_is_parallel(false),
                                  comm);
            row->load_weights(ckpt, "fc");
            row_r[r] = row->local_range();
            row_w[r] = dequantize_weight(local_tensors(*row, symmetric, n, row_r[r].size()), config);
            row_y[r] = row->forward(x);
          },
          test::test_comm_options());
      const auto ref = at::matmul(x.to(at::kDouble), h.expected.to(at::kDouble).t());
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r << " column rows " << col_r[r] << " row cols " << row_r[r]);
        if (!symmetric) CHECK(col_r[r].begin % 8 == 0);
        CHECK(row_r[r].begin % g == 0);
        CHECK(at::equal(col_w[r], h.expected.narrow(0, col_r[r].begin, col_r[r].size())));
        CHECK(at::equal(row_w[r], h.expected.narrow(1, row_r[r].begin, row_r[r].size())));
        CHECK(test::relative_error(col_y[r], ref.narrow(1, col_r[r].begin, col_r[r].size())) < 3e-2);
        CHECK(test::relative_error(row_y[r], ref) < 3e-2);
      }
      if (symmetric && world == 3) CHECK(col_r[0].size() % 8 != 0);  // really split off the 8-grid
    }
  }
}

TEST_CASE("int4_pack_quantized refuses tensors that do not match its configuration",
          "[quant][int4][pack][loader][errors]") {
  const auto sym = hand_built(16, 128, 64, true), asym = hand_built(16, 128, 64, false);
  const auto load = [](const QuantizedTensors& t, const QuantConfig& config) {
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", t);
    ColumnParallelLinear fc(ColumnParallelLinearOptions(128, 16).bias(false).quant(config));
    fc->load_weights(ckpt, "fc");
  };
  CHECK_NOTHROW(load(sym.tensors, pack(64, true)));
  CHECK_NOTHROW(load(asym.tensors, pack(64, false)));
  // A zero point the symmetric layer would ignore, and one the asymmetric layer misses.
  CHECK_THROWS_WITH(load(asym.tensors, pack(64, true)),
                    Contains("fc.weight_zero_point") && Contains("':asym'") && Contains("symmetric: false"));
  CHECK_THROWS_WITH(load(sym.tensors, pack(64, false)), Contains("fc.weight_zero_point"));
  // The group size is in the shapes.
  CHECK_THROWS_WITH(load(sym.tensors, pack(32, true)), Contains("fc.weight_scale") && Contains("[16, 4]"));
  auto t = sym.tensors;
  t["weight_shape"] = at::tensor(std::vector<int64_t>{16, 120}, at::kLong);
  CHECK_THROWS_WITH(load(t, pack(64, true)), Contains("fc.weight_shape") && Contains("[16, 120]"));
  t = sym.tensors;
  t["weight_packed"] = t["weight_packed"].to(at::kLong);
  CHECK_THROWS_WITH(load(t, pack(64, true)), Contains("fc.weight_packed") && Contains("int32"));
  t = sym.tensors;
  t.erase("weight_shape");
  CHECK_THROWS_WITH(load(t, pack(64, true)), Contains("fc.weight_shape"));
  // A scale that is not finite would decode to inf / NaN weights.
  t = sym.tensors;
  t["weight_scale"] = t["weight_scale"].clone();
  t["weight_scale"][3][1] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(load(t, pack(64, true)),
                    Contains("fc.weight_scale") && Contains("non-finite value (inf) at index [3, 1]"));
  // Asymmetric layers split N in multiples of 8 only.
  CHECK_THROWS_WITH(ColumnParallelLinear(ColumnParallelLinearOptions(128, 20).bias(false).quant(pack(64, false))),
                    Contains("multiple of the granularity 8"));
  CHECK_NOTHROW(ColumnParallelLinear(ColumnParallelLinearOptions(128, 20).bias(false).quant(pack(64, true))));
  CHECK_THROWS_WITH(parse_quant_config("int4_pack_quantized:v2"), Contains("does not take 'v2'"));
}

TEST_CASE("GPTQ v2 checkpoints store the zero point itself: read as v1 every zero is one too high",
          "[quant][int4][gptq]") {
  const auto w = test::random_weight(64, 256, 9).to(at::kFloat);
  QuantConfig v1{QuantFormat::kInt4Gptq, 64, false}, v2 = v1;
  v2.gptq_format = GptqFormat::kV2;
  const auto t1 = quantize_weight(w, v1), t2 = quantize_weight(w, v2);
  CHECK(at::equal(t1.at("qweight"), t2.at("qweight")));
  CHECK(at::equal(t1.at("scales"), t2.at("scales")));
  // GPTQModel's v1 -> v2 conversion: add 1 to every nibble (no nibble of v1 is 15:
  // the zero points are 1..15, stored minus one).
  const auto v1_words = t1.at("qzeros").to(at::kLong) & 0xFFFFFFFFLL;
  const auto v2_words = t2.at("qzeros").to(at::kLong) & 0xFFFFFFFFLL;
  CHECK(at::equal(v2_words, v1_words + 0x11111111LL));
  CHECK(at::equal(dequantize_weight(t1, v1), dequantize_weight(t2, v2)));
  // Failure 4 of issue 14: the v2 tensors read as v1: (q - zero - 1) * scale, off by one scale step everywhere.
  const auto scale = t2.at("scales").to(at::kFloat).repeat_interleave(64, 0).t();
  CHECK(at::allclose(dequantize_weight(t2, v2) - dequantize_weight(t2, v1), scale, 0, 1e-6));
  // The layers, at TP 1-4 through the shared harness.
  for (bool symmetric : {true, false}) {
    auto config = v2;
    config.symmetric = symmetric;
    INFO(to_string(config));
    test::QuantCheck f64{config, at::kDouble, 1e-6};  // float32 reference: see above
    f64.worlds = {1, 3};
    test::check_quant_layers(f64);
    test::QuantCheck f32{config, at::kFloat, 3e-2};
    f32.worlds = {symmetric ? 2 : 4};
    test::check_quant_layers(f32);
  }
}

TEST_CASE("fp8_block reads the compressed-tensors scale name weight_scale", "[quant][fp8]") {
  QuantConfig ct{QuantFormat::kFp8Block};
  ct.block_scale_name = BlockScaleName::kWeightScale;
  const auto w = test::random_weight(256, 384, 4).to(at::kFloat);
  const auto stored = quantize_weight(w, ct);
  CHECK(stored.count("weight_scale") == 1);
  CHECK(stored.count("weight_scale_inv") == 0);
  const auto hf = quantize_weight(w, QuantConfig{QuantFormat::kFp8Block});
  CHECK(at::equal(stored.at("weight_scale"), hf.at("weight_scale_inv")));
  CHECK(at::equal(dequantize_weight(stored, ct), dequantize_weight(hf, QuantConfig{QuantFormat::kFp8Block})));
  ColumnParallelLinear fc(ColumnParallelLinearOptions(384, 256).bias(false).quant(ct));
  CHECK(fc->named_parameters().find("weight_scale") != nullptr);
  CHECK(fc->named_parameters().find("weight_scale_inv") == nullptr);
  Checkpoint ckpt;
  add_to_checkpoint(ckpt, "fc", hf);
  CHECK_THROWS_WITH(fc->load_weights(ckpt, "fc"), Contains("fc.weight_scale"));
  test::QuantCheck check{ct, at::kFloat, test::tolerance(at::kFloat)};
  check.worlds = {1, 2};
  test::check_quant_layers(check);
}
