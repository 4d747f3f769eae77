// The CUDA GEMM entry points (src/gpu/gemm.h) against float64 references built from
// the same operands, plus CUDA-graph capture and replay. Tagged [cuda]: the runner
// excludes them where torch sees no GPU.

#include "support/tp_catch.h"

#if TP_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "gpu/gemm.h"
#include "support/gpu_test_util.h"
#include "support/test_util.h"

using namespace tp;
using tp::test::randn;
using tp::test::relative_error;
using tp::test::require_gpu;

namespace {

const at::Device kCuda(at::kCUDA, 0);

/// Dequantized FP8 codes in float64.
at::Tensor f64(const at::Tensor& t) { return t.cpu().to(at::kDouble); }

/// Block-scaled FP8 weight: codes [N, K] and scales [ceil(N/128), ceil(K/128)].
std::pair<at::Tensor, at::Tensor> quantize_fp8_blocks(const at::Tensor& w) {
  const int64_t N = w.size(0), K = w.size(1), nb = (N + 127) / 128, kb = (K + 127) / 128;
  auto scale = at::empty({nb, kb}, at::kFloat);
  auto q = at::empty({N, K}, at::kFloat);
  for (int64_t i = 0; i < nb; ++i) {
    for (int64_t j = 0; j < kb; ++j) {
      auto blk = w.narrow(0, i * 128, std::min<int64_t>(128, N - i * 128))
                     .narrow(1, j * 128, std::min<int64_t>(128, K - j * 128));
      const double s = std::max(blk.abs().max().item<double>() / 448.0, 1e-12);
      scale[i][j] = s;
      q.narrow(0, i * 128, blk.size(0)).narrow(1, j * 128, blk.size(1)).copy_(blk / s);
    }
  }
  return {q.to(at::kFloat8_e4m3fn), scale};
}

at::Tensor expand_blocks(const at::Tensor& scale, int64_t rows_per, int64_t cols_per, int64_t N, int64_t K) {
  return scale.repeat_interleave(rows_per, 0).narrow(0, 0, N).repeat_interleave(cols_per, 1).narrow(1, 0, K);
}

}  // namespace

TEST_CASE("cuda::linear matches the float64 reference (bias epilogue, odd shapes, 3-D x)", "[cuda][quant]") {
  require_gpu();
  struct Shape {
    int64_t m, n, k;
  };
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto& s :
         {Shape{1, 256, 128}, Shape{7, 96, 64}, Shape{33, 7, 13}, Shape{256, 512, 384}, Shape{0, 16, 16}}) {
      for (bool with_bias : {false, true}) {
        INFO("dtype=" << dtype << " M=" << s.m << " N=" << s.n << " K=" << s.k << " bias=" << with_bias);
        const auto x = randn({s.m, s.k}, 1).to(dtype);
        const auto w = (randn({s.n, s.k}, 2) * 0.1).to(dtype);
        const auto b = randn({s.n}, 3).to(dtype);
        std::optional<at::Tensor> bias;
        if (with_bias) bias = b.to(kCuda);
        const auto y = cuda::linear(x.to(kCuda), w.to(kCuda), bias);
        CHECK(y.scalar_type() == dtype);
        CHECK(y.sizes() == at::IntArrayRef{s.m, s.n});
        const auto ref = at::linear(f64(x), f64(w), with_bias ? std::optional<at::Tensor>(f64(b)) : std::nullopt);
        CHECK(relative_error(y.cpu(), ref) <= 2 * test::tolerance(dtype));
      }
    }
  }
  // [..., K] inputs keep their leading shape.
  const auto x3 = randn({2, 3, 64}, 4).to(at::kBFloat16);
  const auto w = (randn({32, 64}, 5) * 0.1).to(at::kBFloat16);
  const auto y3 = cuda::linear(x3.to(kCuda), w.to(kCuda), std::nullopt);
  CHECK(y3.sizes() == at::IntArrayRef{2, 3, 32});
  CHECK(relative_error(y3.cpu(), at::linear(f64(x3), f64(w))) <= 2 * test::tolerance(at::kBFloat16));
  REQUIRE_THROWS_WITH(cuda::linear(x3.to(kCuda), w.t().to(kCuda), std::nullopt), Catch::Contains("in_features"));
}

TEST_CASE("quantize_groups: per-token and 1x128 groups, int8 and FP8", "[cuda][quant]") {
  require_gpu();
  const auto x = randn({5, 384}, 6).to(at::kBFloat16);
  for (auto qtype : {at::kChar, at::kFloat8_e4m3fn}) {
    for (int64_t group : {0, 128}) {
      INFO("qtype=" << qtype << " group=" << group);
      auto [q, scale] = cuda::quantize_groups(x.to(kCuda), qtype, group);
      const int64_t g = group == 0 ? 384 : group;
      REQUIRE(scale.sizes() == at::IntArrayRef{5, 384 / g});
      const double qmax = qtype == at::kChar ? 127.0 : 448.0;
      const auto amax = f64(x).view({5, 384 / g, g}).abs().amax(-1);
      CHECK(relative_error(f64(scale), amax / qmax) <= 1e-6);
      const auto deq = f64(q).view({5, 384 / g, g}) * f64(scale).unsqueeze(-1);
      // int8: half a step of rounding; E4M3: 3 mantissa bits, a relative 2^-4.
      const double tol = qtype == at::kChar ? 0.5 / 127.0 + 1e-6 : 1.0 / 16.0;
      CHECK(relative_error(deq.view({5, 384}), f64(x)) <= tol);
    }
  }
  // All-zero rows get scale 1 and zero codes, never NaN.
  auto [q0, s0] = cuda::quantize_groups(at::zeros({2, 64}, at::TensorOptions(kCuda).dtype(at::kHalf)), at::kChar, 0);
  CHECK(at::all(s0.cpu() == 1.0).item<bool>());
  CHECK(at::all(q0.cpu() == 0).item<bool>());
}

TEST_CASE("fp8_gemm: per-tensor, per-channel and 128x128 block scales match the float64 reference", "[cuda][quant]") {
  require_gpu();
  struct Shape {
    int64_t m, n, k;
  };
  // Aligned shapes take cuBLASLt (or its fallback where this GPU lacks a scale mode);
  // the last one (N=100, K=200) is outside the FP8 rules and takes the fallback.
  for (const auto& s : {Shape{1, 256, 384}, Shape{5, 384, 256}, Shape{64, 256, 512}, Shape{3, 100, 200}}) {
    const auto w = randn({s.n, s.k}, 10) * 0.05;
    const auto xf = randn({s.m, s.k}, 11);
    const auto bias = randn({s.n}, 12).to(at::kBFloat16);
    for (auto scaling : {cuda::Fp8Scaling::kPerTensor, cuda::Fp8Scaling::kPerChannel, cuda::Fp8Scaling::kBlock}) {
      INFO("M=" << s.m << " N=" << s.n << " K=" << s.k << " scaling=" << cuda::to_string(scaling));
      at::Tensor wq, ws, xq, xs, w_deq, x_deq;
      if (scaling == cuda::Fp8Scaling::kBlock) {
        std::tie(wq, ws) = quantize_fp8_blocks(w);
        std::tie(xq, xs) =
            cuda::quantize_groups(at::constant_pad_nd(xf, {0, (s.k + 127) / 128 * 128 - s.k}).to(at::kFloat).to(kCuda),
                                  at::kFloat8_e4m3fn, 128);
        xq = xq.narrow(1, 0, s.k).contiguous();
        w_deq = f64(wq) * expand_blocks(f64(ws), 128, 128, s.n, s.k);
        x_deq = f64(xq) * expand_blocks(f64(xs), 1, 128, s.m, s.k);
      } else if (scaling == cuda::Fp8Scaling::kPerChannel) {
        ws = (w.abs().amax(1) / 448.0).to(at::kFloat);
        wq = (w / ws.to(at::kDouble).unsqueeze(1)).to(at::kFloat8_e4m3fn);
        std::tie(xq, xs) = cuda::quantize_groups(xf.to(at::kFloat).to(kCuda), at::kFloat8_e4m3fn, 0);
        xs = xs.reshape({s.m});
        w_deq = f64(wq) * f64(ws).unsqueeze(1);
        x_deq = f64(xq) * f64(xs).unsqueeze(1);
      } else {
        ws = (w.abs().max() / 448.0).to(at::kFloat).reshape({1});
        wq = (w / ws.to(at::kDouble)).to(at::kFloat8_e4m3fn);
        xs = (xf.abs().max() / 448.0).to(at::kFloat).reshape({1});
        xq = (xf / xs.to(at::kDouble)).to(at::kFloat8_e4m3fn).to(kCuda);
        w_deq = f64(wq) * f64(ws);
        x_deq = f64(xq) * f64(xs);
      }
      const auto y = cuda::fp8_gemm(xq.to(kCuda), xs.to(kCuda), wq.to(kCuda), ws.to(kCuda), scaling, bias.to(kCuda),
                                    at::kBFloat16);
      REQUIRE(y.sizes() == at::IntArrayRef{s.m, s.n});
      CHECK(y.scalar_type() == at::kBFloat16);
      // The GEMM of the dequantized operands: only accumulation order and the bf16
      // output rounding separate it from the reference.
      const auto ref = at::linear(x_deq, w_deq, f64(bias));
      CHECK(relative_error(y.cpu(), ref) <= 2 * test::tolerance(at::kBFloat16));
      // fp8_linear quantizes x itself; against the unquantized product the error is
      // the FP8 rounding of both operands (about 2^-4 relative per element, averaged).
      const auto y2 =
          cuda::fp8_linear(xf.to(at::kBFloat16).to(kCuda), wq.to(kCuda), ws.to(kCuda), scaling, bias.to(kCuda));
      CHECK(relative_error(y2.cpu(), at::linear(f64(xf.to(at::kBFloat16)), w_deq, f64(bias))) <= 0.08);
    }
  }
}

TEST_CASE("int8_gemm and int8_linear (W8A8) match the reference", "[cuda][quant]") {
  require_gpu();
  struct Shape {
    int64_t m, n, k;
  };
  for (const auto& s : {Shape{1, 256, 384}, Shape{16, 64, 128}, Shape{40, 256, 256}, Shape{3, 30, 50}}) {
    INFO("M=" << s.m << " N=" << s.n << " K=" << s.k);
    auto g = test::generator(20);
    const auto xq = at::randint(-127, 128, {s.m, s.k}, g).to(at::kChar);
    const auto wq = at::randint(-127, 128, {s.n, s.k}, g).to(at::kChar);
    const auto xs = (at::rand({s.m}, g) * 0.01 + 0.001).to(at::kFloat);
    const auto ws = (at::rand({s.n}, g) * 0.01 + 0.001).to(at::kFloat);
    const auto bias = randn({s.n}, 21).to(at::kBFloat16);
    const auto y =
        cuda::int8_gemm(xq.to(kCuda), xs.to(kCuda), wq.to(kCuda), ws.to(kCuda), bias.to(kCuda), at::kBFloat16);
    const auto ref = at::linear(f64(xq) * f64(xs).unsqueeze(1), f64(wq) * f64(ws).unsqueeze(1), f64(bias));
    CHECK(relative_error(y.cpu(), ref) <= 2 * test::tolerance(at::kBFloat16));
    const auto x = randn({s.m, s.k}, 22).to(at::kBFloat16);
    const auto y2 = cuda::int8_linear(x.to(kCuda), wq.to(kCuda), ws.to(kCuda), std::nullopt);
    CHECK(relative_error(y2.cpu(), at::linear(f64(x), f64(wq) * f64(ws).unsqueeze(1))) <= 0.03);
  }
}

TEST_CASE("weight-only INT8 / INT4: GEMV (M <= 16) and dequantize + GEMM match the reference", "[cuda][quant]") {
  require_gpu();
  for (int bits : {8, 4}) {
    for (int64_t group : {32, 128}) {
      for (bool with_zeros : {false, true}) {
        for (int64_t m : {1, 3, 16, 17, 64}) {
          for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
            const int64_t N = 96, K = 256, G = K / group;
            INFO("bits=" << bits << " group=" << group << " zeros=" << with_zeros << " M=" << m << " dtype=" << dtype);
            auto gen = test::generator(30 + bits);
            const auto codes = bits == 8 ? at::randint(-127, 128, {N, K}, gen) : at::randint(0, 16, {N, K}, gen);
            const auto scales = (at::rand({N, G}, gen) * 0.02 + 0.005).to(at::kFloat);
            const auto zeros = bits == 8 ? at::randint(-3, 4, {N, G}, gen).to(at::kFloat)
                                         : at::randint(5, 11, {N, G}, gen).to(at::kFloat);
            const auto qweight = bits == 8 ? codes.to(at::kChar) : cuda::pack_int4(codes);
            std::optional<at::Tensor> z;
            if (with_zeros) z = zeros.to(kCuda);
            const double zero_default = bits == 8 ? 0.0 : 8.0;
            const auto zref = with_zeros ? f64(zeros) : at::full({N, G}, zero_default, at::kDouble);
            const auto w_ref =
                (f64(codes) - zref.repeat_interleave(group, 1)) * f64(scales).repeat_interleave(group, 1);
            const auto x = randn({m, K}, 31).to(dtype);
            const auto bias = randn({N}, 32).to(dtype);
            const auto y = cuda::weight_only_linear(x.to(kCuda), qweight.to(kCuda), bits, scales.to(kCuda), z, group,
                                                    bias.to(kCuda));
            REQUIRE(y.sizes() == at::IntArrayRef{m, N});
            CHECK(relative_error(y.cpu(), at::linear(f64(x), w_ref, f64(bias))) <= 2 * test::tolerance(dtype));
            const auto w =
                cuda::dequantize_weight_only(qweight.to(kCuda), bits, scales.to(kCuda), z, group, at::kFloat);
            CHECK(relative_error(w.cpu(), w_ref) <= 1e-6);
          }
        }
      }
    }
  }
  REQUIRE_THROWS_WITH(
      cuda::weight_only_linear(at::ones({1, 256}, at::TensorOptions(kCuda).dtype(at::kBFloat16)),
                               at::zeros({8, 128}, at::TensorOptions(kCuda).dtype(at::kByte)), 4,
                               at::ones({8, 3}, at::TensorOptions(kCuda)), std::nullopt, 128, std::nullopt),
      Catch::Contains("scales must be [8, 2]"));
}

TEST_CASE("CUDA graphs: the GEMM paths capture and replay", "[cuda][quant]") {
  require_gpu();
  const int64_t M = 4, N = 256, K = 512;
  const auto w = (randn({N, K}, 40) * 0.05).to(at::kBFloat16).to(kCuda);
  const auto bias = randn({N}, 41).to(at::kBFloat16).to(kCuda);
  auto gen = test::generator(42);
  const auto q4 = cuda::pack_int4(at::randint(0, 16, {N, K}, gen)).to(kCuda);
  const auto s4 = (at::rand({N, K / 128}, gen) * 0.02 + 0.005).to(at::kFloat).to(kCuda);
  auto static_x = at::zeros({M, K}, at::TensorOptions(kCuda).dtype(at::kBFloat16));
  // Capture must run on a side stream; warm up on it first so that the cuBLASLt
  // workspace and heuristic lookups happen outside the capture.
  const auto stream = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(stream);
  auto run = [&] {
    return std::make_pair(cuda::linear(static_x, w, bias),
                          cuda::weight_only_linear(static_x, q4, 4, s4, std::nullopt, 128, bias));
  };
  run();
  stream.synchronize();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  auto [y_lin, y_w4] = run();
  graph.capture_end();
  for (uint64_t seed : {43, 44}) {
    INFO("replay with seed " << seed);
    const auto x = randn({M, K}, seed).to(at::kBFloat16);
    static_x.copy_(x.to(kCuda));
    graph.replay();
    stream.synchronize();
    const auto expect_lin = cuda::linear(static_x, w, bias);
    const auto expect_w4 = cuda::weight_only_linear(static_x, q4, 4, s4, std::nullopt, 128, bias);
    CHECK(at::equal(y_lin, expect_lin));
    CHECK(at::equal(y_w4, expect_w4));
    CHECK(relative_error(y_lin.cpu(), at::linear(f64(x), f64(w), f64(bias))) <= 2 * test::tolerance(at::kBFloat16));
  }
}

#endif  // TP_WITH_CUDA
