// tp's FP8 E4M3 CPU kernels (src/quant/fp8/cpu_kernels.h), every code path this CPU
// supports forced in turn: the decode bit for bit against c10 (all 256 codes, NaNs
// included), the GEMV / GEMM against the float64 reference of each format
// (dequantize_weight, quantize_activation, at::linear) at edge shapes, NaN codes, the
// scalar fallback for odd group sizes, thread-count independence, and the errors; and
// the AMX bf16 tile kernel (cpu/row_decoded_gemm_amx.cpp) where AMX is usable.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/features.h"
#include "quant/fp8/cpu_kernels.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

using namespace tp;
using tp::cpu::Isa;
namespace td = tp::detail;
using Catch::Contains;

using tp::test::isas_here;

namespace {

constexpr int64_t kBlock = 128;

using DecodeFn = void (*)(const uint8_t*, int64_t, float, bool, float*);
DecodeFn decoder(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return &td::fp8_decode_scalar;
    case Isa::kAvx2: return &td::fp8_decode_avx2;
    case Isa::kAvx512: return &td::fp8_decode_avx512;
  }
  return nullptr;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float c10_value(uint8_t code) { return static_cast<float>(c10::Float8_e4m3fn(code, c10::Float8_e4m3fn::from_bits())); }

// A format's weight as the kernel takes it: the E4M3 codes and per-row scales
// [N, groups] (block scales expanded along N, per-tensor broadcast), with the group.
struct Fp8Case {
  QuantConfig config;
  QuantizedTensors tensors;
  at::Tensor scale;  // [N, groups] float32
  int64_t group = 0;
};

Fp8Case make_case(QuantFormat format, int64_t n, int64_t k, uint64_t seed) {
  Fp8Case c;
  c.config = QuantConfig{format};
  c.tensors = quantize_weight(test::randn({n, k}, seed).to(at::kFloat), c.config);
  if (format == QuantFormat::kFp8Block) {
    c.scale = c.tensors.at("weight_scale_inv").repeat_interleave(kBlock, 0).narrow(0, 0, n).contiguous();
    c.group = kBlock;
  } else if (format == QuantFormat::kFp8PerChannel) {
    c.scale = c.tensors.at("weight_scale").reshape({n, 1}).contiguous();
    c.group = k;
  } else {
    c.scale = c.tensors.at("weight_scale").reshape({1, 1}).expand({n, 1}).contiguous();
    c.group = k;
  }
  return c;
}

// The kernel's output against the float64 reference, element by element. The kernels
// see the reference's own quantized activations and decoded codes, so what is left is
// float32 arithmetic: K products and additions, plus the scale (folded into each
// weight, or multiplying a partial sum) and the fold of the vector lanes. A float32
// dot product of K terms computed in any order is within (K + 2) u sum |x_k w_k| of
// the exact one (u = 2^-24, first order; Higham, Accuracy and Stability, 3.1); four
// more u cover the scale products. So each output is held to (K + 6) u sum |x w|, a
// bound no wrong decode, scale or index survives (those err by O(|x w|) per term).
void check_against_reference(const at::Tensor& y, const at::Tensor& xq, const at::Tensor& w_deq) {
  const at::Tensor ref = at::linear(xq.to(at::kDouble), w_deq.to(at::kDouble));
  const at::Tensor mag = at::linear(xq.to(at::kDouble).abs(), w_deq.to(at::kDouble).abs());
  const double u = std::ldexp(1.0, -24);
  const at::Tensor bound = mag * ((static_cast<double>(xq.size(1)) + 6) * u) + 1e-300;
  const at::Tensor err = (y.to(at::kDouble) - ref).abs();
  const double worst = (err / bound).max().item<double>();
  INFO("worst |y - ref| / bound = " << worst << ", max |ref| = " << ref.abs().max().item<double>());
  CHECK(y.sizes() == ref.sizes());
  CHECK(at::isfinite(y).all().item<bool>());
  CHECK(worst <= 1.0);
}

std::string label(Isa isa, QuantFormat format, int64_t m, int64_t n, int64_t k) {
  return std::string(tp::cpu::to_string(isa)) + " " + to_string(format) + " M=" + std::to_string(m) +
         " N=" + std::to_string(n) + " K=" + std::to_string(k);
}

const std::vector<QuantFormat> kFormats = {QuantFormat::kFp8PerTensor, QuantFormat::kFp8PerChannel,
                                           QuantFormat::kFp8Block};

}  // namespace

TEST_CASE("fp8 decode matches c10's E4M3 -> float bit for bit on all 256 codes", "[quant][cpu_kernels]") {
  // Every code, at several offsets so each lands in every lane and every vector of
  // the decode, and in the partial last chunk.
  std::vector<uint8_t> codes;
  for (int rep = 0; rep < 3; ++rep)
    for (int b = 0; b < 256; ++b) codes.push_back(static_cast<uint8_t>((b * 7 + rep * 13) & 0xff));
  codes.resize(codes.size() - 19);  // not a multiple of any chunk
  for (Isa isa : isas_here()) {
    // Unit, ordinary, tiny, subnormal and huge scales (2^121: 256 * scale overflows, so
    // the kernels take their two-product path).
    for (float scale : {1.0f, 0.0123f, 3.5e-5f, 7.0e3f, 1.0e-40f, std::ldexp(1.0f, 121)}) {
      for (bool nan_codes : {true, false}) {
        INFO(tp::cpu::to_string(isa) << " scale " << scale << (nan_codes ? " (NaN-exact decode)" : ""));
        std::vector<float> out(codes.size(), -1.0f);
        decoder(isa)(codes.data(), static_cast<int64_t>(codes.size()), scale, nan_codes, out.data());
        int mismatches = 0;
        for (size_t i = 0; i < codes.size(); ++i) {
          if (!nan_codes && (codes[i] & 0x7f) == 0x7f) continue;
          // c10's value times the scale, one float32 rounding (dequantize_weight's product).
          const float want = c10_value(codes[i]) * scale;
          if (bits(out[i]) != bits(want) && ++mismatches < 5) {
            UNSCOPED_INFO("code 0x" << std::hex << int(codes[i]) << ": got 0x" << bits(out[i]) << ", c10 0x"
                                    << bits(want));
          }
        }
        CHECK(mismatches == 0);
      }
    }
    // The NaN codes' exact patterns (c10: 0x7ff00000 | sign).
    INFO(tp::cpu::to_string(isa));
    const uint8_t nans[2] = {0x7f, 0xff};
    float got[2];
    decoder(isa)(nans, 2, 1.0f, true, got);
    CHECK(bits(got[0]) == bits(c10_value(0x7f)));
    CHECK(bits(got[1]) == bits(c10_value(0xff)));
    CHECK(bits(got[0]) == 0x7ff00000u);
  }
}

TEST_CASE("fp8_fake_quant_cpu equals quantize_activation bit for bit", "[quant][cpu_kernels]") {
  // Random rows at several magnitudes, and the special rows: all zeros, a NaN, an inf,
  // values past the E4M3 range relative to the rest, subnormal-range values; K of one
  // element, a partial 128-group and several groups.
  const std::vector<std::pair<QuantFormat, td::Fp8Activation>> kinds = {
      {QuantFormat::kFp8PerTensor, td::Fp8Activation::kStatic},
      {QuantFormat::kFp8PerChannel, td::Fp8Activation::kPerToken},
      {QuantFormat::kFp8Block, td::Fp8Activation::kGroup128}};
  uint64_t seed = 900;
  for (const auto& [format, kind] : kinds) {
    for (int64_t k : {1, 100, 128, 300, 4096}) {
      const QuantConfig config{format};
      const auto tensors = quantize_weight(test::randn({4, k}, ++seed).to(at::kFloat), config);
      at::Tensor x = test::randn({9, k}, ++seed).to(at::kFloat);
      x[1] *= 1e-3;
      x[2] *= 1e4;
      x[3].zero_();
      x[4][k / 2] = std::numeric_limits<float>::quiet_NaN();
      x[5][0] = std::numeric_limits<float>::infinity();
      x[6] *= 1e-39;  // float32 subnormals
      x[7][k - 1] = 1e6;
      INFO(to_string(format) << " K=" << k);
      const at::Tensor want = quantize_activation(x, tensors, config);
      const float input_scale = format == QuantFormat::kFp8PerTensor ? tensors.at("input_scale").item<float>() : 1.0f;
      const at::Tensor got = td::fp8_fake_quant_cpu(x, kind, input_scale);
      CHECK(at::equal(got.view(at::kInt), want.view(at::kInt)));
      // bfloat16 / float16 activations (a bfloat16 layer's): widened as x.to(float) does.
      for (auto dtype : {at::kBFloat16, at::kHalf}) {
        INFO(c10::toString(dtype));
        const at::Tensor xr = x.to(dtype);
        CHECK(at::equal(td::fp8_fake_quant_cpu(xr, kind, input_scale).view(at::kInt),
                        quantize_activation(xr, tensors, config).view(at::kInt)));
      }
    }
  }
}

TEST_CASE("fp8_fake_quant_cpu rounds every E4M3 tie and its neighbours as c10's conversion", "[quant][cpu_kernels]") {
  // The vectorized rounding (bit operations, not c10's scalar conversion) against
  // c10::Float8_e4m3fn on: every E4M3 value, the midpoint of each neighbouring pair
  // (the ties, exact in float32) and 3 float32 steps either side of both, both signs;
  // past the range (clamped to 448), infinities, float32 subnormals and zeros. A NaN
  // row takes c10's own conversion and must keep its pattern.
  std::vector<float> v;
  const auto around = [&](float c) {
    float lo = c, hi = c;
    v.push_back(c);
    for (int i = 0; i < 3; ++i) {
      lo = std::nextafter(lo, -1.0f), hi = std::nextafter(hi, 1e9f);
      v.push_back(lo), v.push_back(hi);
    }
  };
  for (int code = 0; code < 0x7e; ++code) {
    const float a = c10_value(static_cast<uint8_t>(code)), b = c10_value(static_cast<uint8_t>(code + 1));
    around(a);
    around(0.5f * (a + b));
  }
  around(448.0f);
  for (const float f : {464.0f, 480.0f, 1e6f, std::numeric_limits<float>::infinity(), 1e-40f, 1e-45f,
                        std::numeric_limits<float>::min(), 0.0f})
    v.push_back(f);
  const int64_t n = static_cast<int64_t>(v.size());
  for (int64_t i = 0; i < n; ++i) v.push_back(-v[static_cast<size_t>(i)]);
  const at::Tensor x = at::from_blob(v.data(), {1, static_cast<int64_t>(v.size())}, at::kFloat).clone();
  for (const float scale : {1.0f, 0.37f, 3.0f}) {
    INFO("input scale " << scale);
    const at::Tensor got = td::fp8_fake_quant_cpu(x, td::Fp8Activation::kStatic, scale);
    const float* g = got.data_ptr<float>();
    int64_t mismatches = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const float q = v[i] / scale;
      const float want = static_cast<float>(c10::Float8_e4m3fn(std::min(std::max(q, -448.0f), 448.0f))) * scale;
      if (bits(g[i]) != bits(want)) {
        if (++mismatches <= 5) UNSCOPED_INFO("x=" << v[i] << " got " << g[i] << " want " << want);
      }
    }
    CHECK(mismatches == 0);
  }
  // A NaN in the span: every element as c10 rounds it, the NaN with c10's pattern.
  at::Tensor xn = x.clone();
  xn[0][3] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor gotn = td::fp8_fake_quant_cpu(xn, td::Fp8Activation::kStatic, 1.0f);
  CHECK(bits(gotn[0][3].item<float>()) == bits(static_cast<float>(c10::Float8_e4m3fn(xn[0][3].item<float>()))));
  CHECK(at::equal(gotn.narrow(1, 4, 100).view(at::kInt),
                  td::fp8_fake_quant_cpu(x, td::Fp8Activation::kStatic, 1.0f).narrow(1, 4, 100).view(at::kInt)));
}

TEST_CASE("fp8 kernels match the float64 reference at edge shapes", "[quant][cpu_kernels]") {
  // N not a multiple of any row tile (1, 5, 23, 25, 49); K of one element, under one
  // chunk, one 128-block, a partial second block, several blocks with a tail.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {5, 7},    {23, 128}, {25, 130},
                                                           {49, 300}, {24, 256}, {7, 1000}, {130, 64}};
  uint64_t seed = 100;
  for (const auto format : kFormats) {
    for (const auto& [n, k] : shapes) {
      const Fp8Case c = make_case(format, n, k, ++seed);
      const at::Tensor w_deq = dequantize_weight(c.tensors, c.config);
      // M = 1 (GEMV), 2..55 (dot-product panels), 70 and 90 (outer-product slivers from
      // 56 (AVX2) / 80 (AVX-512) rows on, with M tails).
      for (int64_t m : {1, 2, 3, 17, 37, 70, 90}) {
        const at::Tensor x = test::randn({m, k}, ++seed).to(at::kFloat);
        const at::Tensor xq = quantize_activation(x, c.tensors, c.config);
        for (Isa isa : isas_here()) {
          INFO(label(isa, format, m, n, k));
          const at::Tensor y = td::fp8_linear_cpu(xq, c.tensors.at("weight"), c.scale, c.group, false, isa);
          check_against_reference(y, xq, w_deq);
        }
      }
    }
  }
}

TEST_CASE("fp8 kernels match the float64 reference at Llama shapes", "[quant][cpu_kernels]") {
  // K = 4096 (q/k/v/o, gate/up inputs) and 11008 (down's input); N cut to a few
  // panels so the float64 reference stays quick.
  uint64_t seed = 500;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{200, 4096}, {96, 11008}}) {
    for (const auto format : {QuantFormat::kFp8PerChannel, QuantFormat::kFp8Block}) {
      const Fp8Case c = make_case(format, n, k, ++seed);
      const at::Tensor w_deq = dequantize_weight(c.tensors, c.config);
      for (int64_t m : {1, 16, 67, 100}) {
        const at::Tensor xq = quantize_activation(test::randn({m, k}, ++seed).to(at::kFloat), c.tensors, c.config);
        for (Isa isa : isas_here()) {
          INFO(label(isa, format, m, n, k));
          check_against_reference(td::fp8_linear_cpu(xq, c.tensors.at("weight"), c.scale, c.group, false, isa), xq,
                                  w_deq);
        }
      }
    }
  }
}

TEST_CASE("fp8 kernels turn NaN codes into NaN outputs of their rows only", "[quant][cpu_kernels]") {
  const int64_t n = 30, k = 200;
  Fp8Case c = make_case(QuantFormat::kFp8Block, n, k, 7);
  at::Tensor codes = c.tensors.at("weight").view(at::kByte).clone();
  CHECK_FALSE(td::fp8_has_nan_codes(codes));
  codes[3][5] = 0x7f;
  codes[17][199] = 0xff;  // in the partial last chunk of its row
  CHECK(td::fp8_has_nan_codes(codes));
  const at::Tensor w = codes.view(at::kFloat8_e4m3fn);
  c.tensors["weight"] = w;
  const at::Tensor w_deq = dequantize_weight(c.tensors, c.config);
  for (int64_t m : {1, 5, 90}) {
    const at::Tensor xq = quantize_activation(test::randn({m, k}, 8).to(at::kFloat), c.tensors, c.config);
    const at::Tensor ref = at::linear(xq.to(at::kDouble), w_deq.to(at::kDouble));
    for (Isa isa : isas_here()) {
      INFO(tp::cpu::to_string(isa) << " M=" << m);
      const at::Tensor y = td::fp8_linear_cpu(xq, w, c.scale, c.group, true, isa);
      CHECK(at::equal(at::isnan(y), at::isnan(ref)));
      CHECK(at::isnan(y).sum().item<int64_t>() == 2 * m);
      const at::Tensor finite = at::isfinite(ref);
      CHECK((y.to(at::kDouble) - ref).masked_select(finite).abs().max().item<double>() < 1e-4);
    }
  }
}

TEST_CASE("fp8 kernels take the scalar path for group sizes the SIMD chunks do not divide", "[quant][cpu_kernels]") {
  // No format has such groups; the dispatcher must still be right with them.
  const int64_t n = 11, k = 200;
  const at::Tensor codes =
      quantize_weight(test::randn({n, k}, 21).to(at::kFloat), QuantConfig{QuantFormat::kFp8PerChannel}).at("weight");
  for (int64_t group : {1, 50, 96}) {
    const int64_t groups = (k + group - 1) / group;
    const at::Tensor scale = at::rand({n, groups}, at::kFloat) + 0.5;
    const at::Tensor w_deq = codes.to(at::kFloat) * scale.repeat_interleave(group, 1).narrow(1, 0, k);
    const at::Tensor xq = test::randn({3, k}, 22).to(at::kFloat);
    for (Isa isa : isas_here()) {
      INFO(tp::cpu::to_string(isa) << " group " << group);
      check_against_reference(td::fp8_linear_cpu(xq, codes, scale, group, false, isa), xq, w_deq);
    }
  }
}

TEST_CASE("fp8 kernels give the same bits at 1 and 2 threads", "[quant][cpu_kernels]") {
  const Fp8Case c = make_case(QuantFormat::kFp8Block, 100, 384, 31);
  const int threads = at::get_num_threads();
  for (int64_t m : {1, 6, 90}) {
    const at::Tensor xq = quantize_activation(test::randn({m, 384}, 32).to(at::kFloat), c.tensors, c.config);
    for (Isa isa : isas_here()) {
      INFO(tp::cpu::to_string(isa) << " M=" << m);
      at::set_num_threads(1);
      const at::Tensor one = td::fp8_linear_cpu(xq, c.tensors.at("weight"), c.scale, c.group, false, isa);
      at::set_num_threads(2);
      const at::Tensor two = td::fp8_linear_cpu(xq, c.tensors.at("weight"), c.scale, c.group, false, isa);
      CHECK(at::equal(one, two));
    }
  }
  at::set_num_threads(threads);
}

TEST_CASE("fp8_linear_cpu rejects operands of the wrong shape or dtype", "[quant][cpu_kernels]") {
  const Fp8Case c = make_case(QuantFormat::kFp8Block, 8, 256, 41);
  const at::Tensor w = c.tensors.at("weight");
  const at::Tensor x = at::randn({2, 256});
  REQUIRE_THROWS_WITH(td::fp8_linear_cpu(at::randn({2, 255}), w, c.scale, c.group, false), Contains("K = 255"));
  REQUIRE_THROWS_WITH(td::fp8_linear_cpu(x.to(at::kDouble), w, c.scale, c.group, false), Contains("float32"));
  REQUIRE_THROWS_WITH(td::fp8_linear_cpu(x, w.to(at::kFloat), c.scale, c.group, false), Contains("float8_e4m3fn"));
  REQUIRE_THROWS_WITH(td::fp8_linear_cpu(x, w, c.scale.narrow(1, 0, 1), c.group, false), Contains("[8, 2]"));
  REQUIRE_THROWS_WITH(td::fp8_linear_cpu(x, w, c.scale, 0, false), Contains("group must be >= 1"));
}

TEST_CASE("fp8_linear_cpu handles empty operands", "[quant][cpu_kernels]") {
  const at::Tensor w = at::zeros({5, 0}, at::kFloat).to(at::kFloat8_e4m3fn);
  const at::Tensor y = td::fp8_linear_cpu(at::randn({3, 0}), w, at::ones({5, 1}), 1, false);
  CHECK(y.sizes() == at::IntArrayRef({3, 5}));
  CHECK(y.abs().max().item<float>() == 0.0f);
  CHECK(td::fp8_linear_cpu(at::randn({0, 4}), at::zeros({5, 4}).to(at::kFloat8_e4m3fn), at::ones({5, 1}), 4, false)
            .sizes() == at::IntArrayRef({0, 5}));
}

TEST_CASE("fp8 method: a weight written in place after finalize() still decodes its NaN codes",
          "[quant][cpu_kernels]") {
  // finalize() records whether the weight holds NaN codes; a weight changed since (its
  // version counter moved) must not be trusted to be free of them.
  for (const auto format : kFormats) {
    INFO(to_string(format));
    const QuantConfig config{format};
    torch::nn::Module layer;
    const auto method = make_quant_method(config);
    method->create_weights(layer, 40, 256, at::TensorOptions().dtype(at::kFloat));
    method->reset_parameters(256);
    const at::Tensor x = test::randn({3, 256}, 61).to(at::kFloat);
    CHECK(at::isfinite(method->apply(x, std::nullopt)).all().item<bool>());
    {
      at::NoGradGuard no_grad;
      method->weight().view(at::kByte)[7][100] = 0x7f;
    }
    const at::Tensor y = method->apply(x, std::nullopt);
    CHECK(at::isnan(y.select(1, 7)).all().item<bool>());
    CHECK(at::isnan(y).sum().item<int64_t>() == 3);
    method->finalize();  // now recorded: the same answer from the flag
    CHECK(at::equal(at::isnan(method->apply(x, std::nullopt)), at::isnan(y)));
  }
}

namespace {

td::Fp8Activation activation_of(QuantFormat format) {
  return format == QuantFormat::kFp8Block        ? td::Fp8Activation::kGroup128
         : format == QuantFormat::kFp8PerChannel ? td::Fp8Activation::kPerToken
                                                 : td::Fp8Activation::kStatic;
}

}  // namespace

TEST_CASE("fp8 AMX kernel matches the float64 reference at its tile, group, chunk and token-pass edges",
          "[quant][cpu_kernels]") {
  // The AMX path's boundaries: 16-row weight tiles and 32-row blocks (N = 1, 17, 33, 50),
  // 16-token tiles, 32-token blocks and 256-token passes (M = 5 ... 257), K off the 32-k
  // tile step, on and off the 128-k scale groups, and past the 4096-k chunk (4224). The
  // activations come from fp8_quantize_codes_cpu, checked here to be fp8_fake_quant_cpu's
  // (the reference's) q and scale bit for bit; the bound is check_against_reference's.
  if (!tp::cpu::amx_status().usable) {
    WARN("AMX not usable here (" << tp::cpu::amx_status().why << "): the AMX kernel is not run");
    return;
  }
  uint64_t seed = 5000;
  for (const auto format : kFormats) {
    for (const int64_t n : {1, 17, 33, 50}) {
      for (const int64_t k : {32, 127, 128, 300, 4224}) {
        const Fp8Case c = make_case(format, n, k, ++seed);
        const at::Tensor w_deq = dequantize_weight(c.tensors, c.config);
        const float input_scale =
            c.tensors.count("input_scale") != 0 ? c.tensors.at("input_scale").item<float>() : 1.0f;
        for (const int64_t m : {5, 16, 33, 70, 257}) {
          if (m == 257 && (k != 300 || n != 33)) continue;  // one 256-token pass case per format
          INFO("amx " << to_string(format) << " M=" << m << " N=" << n << " K=" << k);
          const at::Tensor x = test::randn({m, k}, ++seed).to(at::kBFloat16);
          const auto [q, x_scale] = td::fp8_quantize_codes_cpu(x, activation_of(format), input_scale);
          // q * scale is the fake quantization, bit for bit.
          const at::Tensor fq = td::fp8_fake_quant_cpu(x, activation_of(format), input_scale);
          const int64_t groups = x_scale.size(0);
          const at::Tensor per_elem =
              x_scale.narrow(1, 0, m).t().repeat_interleave(format == QuantFormat::kFp8Block ? 128 : k, 1);
          const at::Tensor q_float = q.view(at::kBFloat16).to(at::kFloat);
          CHECK(at::equal((q_float * per_elem.narrow(1, 0, k)).view(at::kInt), fq.view(at::kInt)));
          CHECK(groups == (format == QuantFormat::kFp8Block ? (k + 127) / 128 : 1));
          const at::Tensor y = td::fp8_linear_amx(q, x_scale, c.tensors.at("weight"), c.scale, c.group);
          check_against_reference(y, quantize_activation(x, c.tensors, c.config), w_deq);
        }
      }
    }
  }
}

TEST_CASE("fp8 AMX decode gives every non-NaN E4M3 code its c10 value", "[quant][cpu_kernels]") {
  if (!tp::cpu::amx_status().usable) {
    WARN("AMX not usable here (" << tp::cpu::amx_status().why << "): the AMX kernel is not run");
    return;
  }
  // Weight rows that hold every code (NaN codes 0x7f / 0xff made 0: the AMX path is not
  // taken for a weight with NaN codes), at shifted offsets so each lands in every lane
  // and in the partial last 32 codes; scale 1; x one-hot rows pick single weights out.
  const int64_t n = 20, k = 270;
  at::Tensor codes = at::empty({n, k}, at::kByte);
  auto* cp = codes.data_ptr<uint8_t>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const auto b = static_cast<uint8_t>((c * 11 + r * 37) & 0xff);
      cp[r * k + c] = (b & 0x7f) == 0x7f ? 0 : b;
    }
  const at::Tensor w = codes.view(at::kFloat8_e4m3fn);
  const at::Tensor x = at::eye(k, at::kFloat).to(at::kBFloat16);  // q = 448 e_c, scale 1 / 448 per token
  const auto [q, x_scale] = td::fp8_quantize_codes_cpu(x, td::Fp8Activation::kPerToken);
  const at::Tensor y = td::fp8_linear_amx(q, x_scale, w, at::ones({n, 1}), k);
  const at::Tensor want = (w.to(at::kFloat).t() * 448.0f) * x_scale.narrow(1, 0, k).t();  // y[c, r] = w[r, c]
  CHECK(at::equal(y, want));
}
