// QuantConfig names, and the harness the formats share, run on the unquantized method.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include "support/quant_formats.h"
#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

using namespace tp;

TEST_CASE("quant configs round-trip through their names", "[quant]") {
  for (const char* text :
       {"none", "fp8_tensor", "fp8_channel", "fp8_block", "int8_w8a8", "int8_weight_only", "int4_gptq:g32:sym",
        "int4_gptq:g128:asym", "int4_awq:g64:sym", "int4_awq:g128:asym", "int4_gptq:g64:asym:v2",
        "fp8_block:weight_scale", "int4_pack_quantized:g32:sym", "int4_pack_quantized:g128:asym"}) {
    INFO(text);
    CHECK(to_string(parse_quant_config(text)) == text);
  }
  const auto c = parse_quant_config("int4_awq:asym:g32");
  CHECK(c.format == QuantFormat::kInt4Awq);
  CHECK(c.group_size == 32);
  CHECK_FALSE(c.symmetric);
  CHECK(parse_quant_config("int4_gptq").group_size == 128);
  CHECK(parse_quant_config("int4_gptq").gptq_format == GptqFormat::kV1);
  CHECK(parse_quant_config("int4_gptq:v2:g64").gptq_format == GptqFormat::kV2);
  CHECK(to_string(parse_quant_config("int4_gptq:v1")) == "int4_gptq:g128:sym");
  CHECK(parse_quant_config("fp8_block").block_scale_name == BlockScaleName::kWeightScaleInv);
  CHECK(parse_quant_config("fp8_block:weight_scale").block_scale_name == BlockScaleName::kWeightScale);
  CHECK(to_string(parse_quant_config("fp8_block:weight_scale_inv")) == "fp8_block");
}

TEST_CASE("quant configs compare only the options their format takes", "[quant]") {
  QuantConfig a{QuantFormat::kFp8Block}, b = a;
  b.group_size = 64;
  b.gptq_format = GptqFormat::kV2;
  CHECK(a == b);
  b.block_scale_name = BlockScaleName::kWeightScale;
  CHECK(a != b);
  QuantConfig g1{QuantFormat::kInt4Gptq, 64, false}, g2 = g1;
  g2.block_scale_name = BlockScaleName::kWeightScale;
  CHECK(g1 == g2);
  g2.gptq_format = GptqFormat::kV2;
  CHECK(g1 != g2);
  CHECK(QuantConfig{QuantFormat::kInt4Awq, 64} != QuantConfig{QuantFormat::kInt4Awq, 128});
  CHECK(QuantConfig{QuantFormat::kInt4Awq} != QuantConfig{QuantFormat::kInt4PackQuantized});
}

TEST_CASE("the format table answers what layers and models ask without building a method", "[quant]") {
  std::vector<std::string> names = test::quantized_format_variants();
  names.insert(names.begin(), "none");
  for (const auto& name : names) {
    INFO(name);
    const QuantConfig config = parse_quant_config(name);
    const auto method = make_quant_method(config);
    for (const auto mode : {ShardMode::kColumn, ShardMode::kRow}) {
      CHECK(tp_alignment(config, mode) == method->tp_alignment(mode));
      CHECK(tp_alignment(config, mode) >= 1);
    }
    // Only plain weights are trainable; every stored format's codes are frozen.
    CHECK(method->trainable() == (config.format == QuantFormat::kNone));
  }
  // The alignments a model combines (decoder_layer.cpp): a quant block, a packed element.
  CHECK(tp_alignment(parse_quant_config("fp8_block"), ShardMode::kRow) == 128);
  CHECK(tp_alignment(parse_quant_config("int4_gptq:g64"), ShardMode::kRow) % 64 == 0);
  CHECK(tp_alignment(parse_quant_config("none"), ShardMode::kColumn) == 1);
}

TEST_CASE("unknown quant names are errors listing what is accepted", "[quant][errors]") {
  CHECK_THROWS_WITH(parse_quant_config("fp4"), Catch::Contains("unknown format 'fp4'") && Catch::Contains("int4_awq"));
  CHECK_THROWS_WITH(parse_quant_config("fp8_tensor:g64"), Catch::Contains("takes none"));
  CHECK_THROWS_WITH(parse_quant_config("fp8_block:g64"),
                    Catch::Contains("does not take 'g64'") && Catch::Contains("weight_scale_inv, weight_scale"));
  CHECK_THROWS_WITH(parse_quant_config("int4_awq:v2"), Catch::Contains("int4_awq does not take 'v2'"));
  CHECK_THROWS_WITH(parse_quant_config("int4_gptq:v3"), Catch::Contains("unknown option 'v3'"));
  CHECK_THROWS_WITH(parse_quant_config("int4_gptq:x"), Catch::Contains("unknown option 'x'"));
  CHECK_THROWS_WITH(parse_quant_config(""), Catch::Contains("expected one of"));
}

TEST_CASE("the quantized-layer check passes for the unquantized method at TP 1-4", "[quant]") {
  test::QuantCheck check{QuantConfig{}, at::kFloat, test::tolerance(at::kFloat)};
  test::check_quant_layers(check);
  check.from_file = true;
  check.worlds = {3};
  check.seed = 2;
  test::check_quant_layers(check);
}

TEST_CASE("unquantized layers match the float64 reference at TP 1-4 at every CPU GEMM's M (float32, bfloat16)",
          "[quant][layers][cpu_gemm_layers]") {
  // M = 1: the own GEMV; 3: the panels kernel for float32 on Intel, gemv elsewhere; 5 and
  // 40: the panels kernel (one chunk / several, AVX-512's panel pairs), oneDNN for bf16 on
  // AMD, at::linear with AMX bf16; 80: past the panels on Intel, at::linear, oneDNN or
  // bf16_tiles by CPU and dtype (src/cpu/dense/gemm.cpp's table).
  uint64_t seed = 10;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t tokens : {1, 3, 5, 40, 80}) {
      INFO(c10::toString(dtype) << " tokens " << tokens);
      test::QuantCheck check{QuantConfig{}, dtype, test::tolerance(dtype)};
      check.shapes.tokens = tokens;
      check.seed = ++seed;
      test::check_quant_layers(check);
    }
  }
}
