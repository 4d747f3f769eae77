// tp-gpu-bench: the CUDA GEMM paths on one GPU. First the two ceilings of the machine
// (a large device-to-device copy in GB/s, a large bf16 GEMM in TFLOP/s), then, for each
// layer shape and token count, every format's median time, TFLOP/s, GB/s, its ratio
// to the reference (at::linear in bf16; at::_scaled_mm for the FP8 rows) measured
// side by side, and the fraction of the ceilings it reaches.
//
//   tp-gpu-bench [--shapes 8192x8192,8192x28672] [--m 1,16,4096] [--seconds 0.2]
//
// A shape is IN x OUT (K x N): y[M, N] = x[M, K] W[N, K]^T. FP8 and W8A8 rows time the
// GEMM on already-quantized activations (as at::_scaled_mm does); the weight-only rows
// take bf16 activations.

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include "bench_util.h"
#include "gpu/gemm.h"

using namespace tp;
using tp::bench::format;

namespace {

struct Args {
  std::vector<std::pair<int64_t, int64_t>> shapes{{8192, 8192}, {8192, 28672}};
  std::vector<int64_t> m{1, 16, 4096};
  double seconds = 0.2;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-gpu-bench: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--shapes") {
      a.shapes.clear();
      for (const auto& s : split(v, ',')) {
        const auto kn = split(s, 'x');
        TORCH_CHECK_VALUE(kn.size() == 2, "tp-gpu-bench: shape '", s, "' is not INxOUT");
        a.shapes.emplace_back(std::stoll(kn[0]), std::stoll(kn[1]));
      }
    } else if (k == "--m") {
      a.m.clear();
      for (const auto& s : split(v, ',')) a.m.push_back(std::stoll(s));
    } else if (k == "--seconds") {
      a.seconds = std::stod(v);
    } else {
      TORCH_CHECK_VALUE(false, "tp-gpu-bench: unknown option ", k, " (--shapes, --m, --seconds)");
    }
  }
  return a;
}

/// Median seconds per call of fn on the current stream: a warm-up, then 5 batches
/// timed with CUDA events, each batch sized to take about budget/5.
double time_gpu(const std::function<void()>& fn, double budget) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  for (int i = 0; i < 3; ++i) fn();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record(stream);
  fn();
  stop.record(stream);
  stop.synchronize();
  const double once = std::max(1e-6, start.elapsed_time(stop) / 1e3);
  const int iters = static_cast<int>(std::clamp(budget / 5 / once, 1.0, 1000.0));
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    start.record(stream);
    for (int i = 0; i < iters; ++i) fn();
    stop.record(stream);
    stop.synchronize();
    batches.push_back(start.elapsed_time(stop) / 1e3 / iters);
  }
  return bench::median(batches);
}

struct Row {
  std::string shape, format;
  int64_t m = 0;
  double seconds = 0, flops = 0, bytes = 0, reference = 0;
  std::string note;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    TORCH_CHECK(torch::cuda::is_available(), "tp-gpu-bench: no CUDA device");
    const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
    const auto bf16 = cuda.dtype(at::kBFloat16);
    at::manual_seed(1);

    // ---- ceilings ----
    const int64_t copy_bytes = int64_t{1} << 30;
    auto src = at::empty({copy_bytes}, cuda.dtype(at::kByte));
    auto dst = at::empty_like(src);
    const double copy_s = time_gpu([&] { dst.copy_(src); }, args.seconds * 2);
    const double peak_bw = 2.0 * copy_bytes / copy_s;  // read + write
    src = dst = at::Tensor();
    const int64_t g = 8192;
    auto a = at::randn({g, g}, bf16), b = at::randn({g, g}, bf16);
    const double gemm_s = time_gpu([&] { at::matmul(a, b); }, args.seconds * 2);
    const double peak_flops = 2.0 * g * g * g / gemm_s;
    a = b = at::Tensor();
    std::printf("ceilings: D2D copy %.0f GB/s (1 GiB, read+write); bf16 GEMM %.1f TFLOP/s (8192^3)\n", peak_bw / 1e9,
                peak_flops / 1e12);

    std::vector<Row> rows;
    for (const auto& [K, N] : args.shapes) {
      const std::string shape = format("%lldx%lld", static_cast<long long>(K), static_cast<long long>(N));
      std::fprintf(stderr, "[tp-gpu-bench] %s: quantizing weights\n", shape.c_str());
      const auto w = at::randn({N, K}, bf16) * 0.02;
      // FP8 weights: per tensor, per channel, 128x128 blocks (scales from the weight).
      const auto w_amax = w.abs().amax().to(at::kFloat);
      const auto w_scale_t = (w_amax / 448.0).reshape({1});
      const auto wq_t = (w.to(at::kFloat) / w_scale_t).to(at::kFloat8_e4m3fn);
      const auto w_scale_c = (w.abs().amax(1).to(at::kFloat) / 448.0).clamp_min(1e-12);
      const auto wq_c = (w.to(at::kFloat) / w_scale_c.unsqueeze(1)).to(at::kFloat8_e4m3fn);
      const auto w_blocks = w.to(at::kFloat).view({N / 128, 128, K / 128, 128});
      const auto w_scale_b = (w_blocks.abs().amax({1, 3}) / 448.0).clamp_min(1e-12);  // [N/128, K/128]
      const auto wq_b = (w_blocks / w_scale_b.view({N / 128, 1, K / 128, 1})).view({N, K}).to(at::kFloat8_e4m3fn);
      // INT8 (per channel), weight-only INT8 (per channel) and INT4 (group 128).
      const auto w_scale_i8 = (w.abs().amax(1).to(at::kFloat) / 127.0).clamp_min(1e-12);
      const auto wq_i8 = (w.to(at::kFloat) / w_scale_i8.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
      const auto w_g = w.to(at::kFloat).view({N, K / 128, 128});
      const auto w_scale_i4 = (w_g.abs().amax(2) / 7.0).clamp_min(1e-12);  // [N, K/128]
      const auto codes = (w_g / w_scale_i4.unsqueeze(2)).round().clamp(-8, 7).add(8).view({N, K});
      const auto wq_i4 = cuda::pack_int4(codes);

      for (const int64_t M : args.m) {
        std::fprintf(stderr, "[tp-gpu-bench] %s M=%lld\n", shape.c_str(), static_cast<long long>(M));
        const auto x = at::randn({M, K}, bf16);
        const double flops = 2.0 * M * N * K;
        const double act_bytes = M * K * 2.0 + M * N * 2.0;
        const double t_ref = time_gpu([&] { at::linear(x, w); }, args.seconds);
        auto add = [&](const std::string& fmt, double s, double weight_bytes, double act, double ref,
                       const std::string& note = "") {
          rows.push_back({shape, fmt, M, s, flops, weight_bytes + act, ref, note});
        };
        add("bf16 at::linear", t_ref, N * K * 2.0, act_bytes, t_ref);
        add("bf16 tp", time_gpu([&] { cuda::linear(x, w, std::nullopt); }, args.seconds), N * K * 2.0, act_bytes,
            t_ref);

        // FP8: our GEMM on quantized x vs at::_scaled_mm on the same operands.
        const double fp8_act = M * K * 1.0 + M * N * 2.0;
        auto fp8_row = [&](const char* name, cuda::Fp8Scaling sc, const at::Tensor& wq, const at::Tensor& ws,
                           int64_t group) {
          at::Tensor xq, xs;
          if (sc == cuda::Fp8Scaling::kPerTensor) {
            xs = (x.abs().amax().to(at::kFloat) / 448.0).reshape({1});
            xq = (x.to(at::kFloat) / xs).to(at::kFloat8_e4m3fn);
          } else {
            std::tie(xq, xs) = cuda::quantize_groups(x, at::kFloat8_e4m3fn, group);
            if (sc == cuda::Fp8Scaling::kPerChannel) xs = xs.reshape({M});
          }
          const double ours =
              time_gpu([&] { cuda::fp8_gemm(xq, xs, wq, ws, sc, std::nullopt, at::kBFloat16); }, args.seconds);
          double ref = 0;
          std::string note;
          try {
            at::Tensor sa, sb;
            if (sc == cuda::Fp8Scaling::kPerTensor) {
              sa = xs.reshape({});
              sb = ws.reshape({});
            } else if (sc == cuda::Fp8Scaling::kPerChannel) {
              sa = xs.reshape({M, 1});
              sb = ws.reshape({1, N});
            } else {
              sa = xs.t().contiguous().t();  // [M, K/128], outer-dim-major (torch's 1x128 layout)
              sb = ws.t();                   // [K/128, N/128] for mat2 = W^T
            }
            ref = time_gpu([&] { at::_scaled_mm(xq, wq.t(), sa, sb, std::nullopt, std::nullopt, at::kBFloat16); },
                           args.seconds);
          } catch (const c10::Error& e) {
            note = "_scaled_mm n/a";
          }
          add(name, ours, N * K * 1.0, fp8_act, ref, note);
        };
        fp8_row("fp8 per-tensor", cuda::Fp8Scaling::kPerTensor, wq_t, w_scale_t, 0);
        fp8_row("fp8 per-channel", cuda::Fp8Scaling::kPerChannel, wq_c, w_scale_c, 0);
        fp8_row("fp8 block128", cuda::Fp8Scaling::kBlock, wq_b, w_scale_b, 128);

        {
          auto [xq, xs] = cuda::quantize_groups(x, at::kChar, 0);
          xs = xs.reshape({M});
          add("int8 w8a8",
              time_gpu([&] { cuda::int8_gemm(xq, xs, wq_i8, w_scale_i8, std::nullopt, at::kBFloat16); }, args.seconds),
              N * K * 1.0, M * K * 1.0 + M * N * 2.0, t_ref);
        }
        const auto ones = w_scale_i8.view({N, 1});
        add("int8 weight-only",
            time_gpu([&] { cuda::weight_only_linear(x, wq_i8, 8, ones, std::nullopt, K, std::nullopt); }, args.seconds),
            N * K * 1.0 + N * 4.0, act_bytes, t_ref);
        add("int4 weight-only g128",
            time_gpu([&] { cuda::weight_only_linear(x, wq_i4, 4, w_scale_i4, std::nullopt, 128, std::nullopt); },
                     args.seconds),
            N * K * 0.5 + N * (K / 128) * 4.0, act_bytes, t_ref);
      }
    }

    bench::Table table(
        {"shape KxN", "M", "format", "time us", "TFLOP/s", "GB/s", "vs ref", "%peak FLOP", "%peak BW", "note"});
    for (const auto& r : rows) {
      table.add({r.shape, std::to_string(r.m), r.format, format("%.1f", r.seconds * 1e6),
                 format("%.1f", r.flops / r.seconds / 1e12), format("%.0f", r.bytes / r.seconds / 1e9),
                 r.reference > 0 ? format("%.2fx", r.reference / r.seconds) : "-",
                 format("%.0f%%", 100.0 * r.flops / r.seconds / peak_flops),
                 format("%.0f%%", 100.0 * r.bytes / r.seconds / peak_bw), r.note});
    }
    std::printf("%s", table.str().c_str());
    std::printf(
        "vs ref: reference time / this time (>1 is faster); reference = at::linear bf16, "
        "or at::_scaled_mm for fp8 rows\n");
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tp-gpu-bench: %s\n", e.what_without_backtrace());
    return 1;
  }
}
