// tp-quant-kernels-bench: tp's FP8 and W8A8 CPU kernels (src/quant/fp8/cpu_kernels.h,
// src/quant/int8/w8a8_kernels.h), activation quantization included, against fp32
// at::linear on the same shape in the same process.
//
//   tp-quant-kernels-bench                          # Llama-3-8B shapes, M = 1, 16, 256, 1 and 2 threads
//   # an AVX2 machine's code paths, ours and the peer's:
//   TP_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
//     tp-quant-kernels-bench --shapes 11008x4096 --m 1,16 --threads 2
//
// Shapes are N x K (out x in features). The two sides alternate call by call and each
// reports its median wall time; "cpu x" is the ratio of the process CPU time per
// call, which a loaded machine disturbs less than wall time (other processes take
// turns on the cores, but the time this process runs stays its own). GB/s counts the
// weight bytes as stored (1 per element), GFLOP/s 2 M N K.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/features.h"
#include "guarded_main.h"
#include "quant/fp8/cpu_kernels.h"
#include "quant/int8/w8a8_kernels.h"
#include "tp/quant/quantize.h"

using namespace tp;
namespace td = tp::detail;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double wall() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double process_cpu() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + 1e-6 * r.ru_utime.tv_usec + r.ru_stime.tv_sec + 1e-6 * r.ru_stime.tv_usec;
}

struct Timing {
  double wall = 0, cpu = 0;  // medians per call, seconds
};

// Runs a and b alternately (after one warm-up call each) for at least `seconds` and
// 5 rounds; medians per side.
std::pair<Timing, Timing> race(const std::function<void()>& a, const std::function<void()>& b, double seconds) {
  a();
  b();
  std::vector<double> wa, wb, ca, cb;
  const double start = wall();
  for (int round = 0; round < 1000 && (round < 5 || wall() - start < seconds); ++round) {
    for (int side = 0; side < 2; ++side) {
      const double w0 = wall(), c0 = process_cpu();
      (side == 0 ? a : b)();
      (side == 0 ? wa : wb).push_back(wall() - w0);
      (side == 0 ? ca : cb).push_back(process_cpu() - c0);
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {{median(wa), median(ca)}, {median(wb), median(cb)}};
}

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "tp-quant-kernels-bench: %s\n"
               "usage: tp-quant-kernels-bench [--shapes NxK,...] [--m 1,16,256] [--threads 1,2]\n"
               "                              [--formats fp8_tensor,fp8_channel,fp8_block,int8_w8a8] [--seconds S]\n",
               error);
  std::exit(2);
}

}  // namespace

int run(int argc, char** argv) {
  std::vector<std::pair<int64_t, int64_t>> shapes = {{11008, 4096}, {14336, 4096}, {4096, 14336}};
  std::vector<int64_t> ms = {1, 16, 256}, threads = {1, 2};
  std::vector<std::string> formats = {"fp8_tensor", "fp8_channel", "fp8_block", "int8_w8a8"};
  double seconds = 1.5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--shapes") {
      shapes.clear();
      for (const auto& s : split(value)) {
        const auto x = s.find('x');
        if (x == std::string::npos) usage("a shape is NxK, e.g. 11008x4096");
        shapes.push_back({std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))});
      }
    } else if (arg == "--m" || arg == "--threads") {
      std::vector<int64_t>& out = arg == "--m" ? ms : threads;
      out.clear();
      for (const auto& s : split(value)) out.push_back(std::stoll(s));
    } else if (arg == "--formats") {
      formats = split(value);
    } else if (arg == "--seconds") {
      seconds = std::atof(value.c_str());
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "-";
  };
  std::printf("# CPU features: %s\n# tp kernels: %s (cap TP_CPU_ISA=%s), W8A8 path %s\n",
              tp::cpu::features().describe().c_str(), tp::cpu::to_string(tp::cpu::isa()), env("TP_CPU_ISA"),
              td::to_string(td::w8a8_best_kernel()));
  std::printf("# peer at::linear float32: ATEN_CPU_CAPABILITY=%s MKL_ENABLE_INSTRUCTIONS=%s ONEDNN_MAX_CPU_ISA=%s\n",
              env("ATEN_CPU_CAPABILITY"), env("MKL_ENABLE_INSTRUCTIONS"), env("ONEDNN_MAX_CPU_ISA"));
  std::printf("%-13s %4s %3s %-12s %10s %10s %7s %7s %8s %9s\n", "N x K", "M", "thr", "format", "fp32 ms", "tp ms",
              "wall x", "cpu x", "GB/s", "GFLOP/s");
  at::manual_seed(0);
  for (const auto& [n, k] : shapes) {
    const at::Tensor wf = at::randn({n, k}) * (1.0 / std::sqrt(static_cast<double>(k)));
    for (const auto& name : formats) {
      const QuantConfig config = parse_quant_config(name);
      const auto tensors = quantize_weight(wf, config);
      std::function<void(const at::Tensor&)> ours;
      at::Tensor w, scale, sums;
      int64_t group = k;
      float input_scale = 1.0f;
      td::Fp8Activation kind = td::Fp8Activation::kPerToken;
      if (config.format == QuantFormat::kInt8W8A8) {
        w = tensors.at("weight");
        scale = tensors.at("weight_scale").reshape({-1}).contiguous();
        sums = td::w8a8_row_sums(w);
        ours = [&](const at::Tensor& x) {
          const auto [q, xs] = td::w8a8_quantize_per_token(x);
          td::w8a8_linear_cpu(q, xs, w, scale, sums);
        };
      } else if (config.format == QuantFormat::kFp8PerTensor || config.format == QuantFormat::kFp8PerChannel ||
                 config.format == QuantFormat::kFp8Block) {
        w = tensors.at("weight");
        if (config.format == QuantFormat::kFp8Block) {
          scale = tensors.at("weight_scale_inv").repeat_interleave(128, 0).narrow(0, 0, n).contiguous();
          group = 128;
          kind = td::Fp8Activation::kGroup128;
        } else {
          scale = tensors.at("weight_scale").reshape({-1, 1}).expand({n, 1}).contiguous();
        }
        if (config.format == QuantFormat::kFp8PerTensor) {
          kind = td::Fp8Activation::kStatic;
          input_scale = tensors.at("input_scale").item<float>();
        }
        const bool nan_codes = td::fp8_has_nan_codes(w);
        ours = [&, nan_codes](const at::Tensor& x) {
          td::fp8_linear_cpu(td::fp8_fake_quant_cpu(x, kind, input_scale), w, scale, group, nan_codes);
        };
      } else {
        usage(("not a format of these kernels: " + name).c_str());
      }
      for (const int64_t t : threads) {
        at::set_num_threads(static_cast<int>(t));
        for (const int64_t m : ms) {
          const at::Tensor x = at::randn({m, k});
          const auto [ref, tp] = race([&] { at::linear(x, wf); }, [&] { ours(x); }, seconds);
          std::printf("%6ldx%-6ld %4ld %3ld %-12s %10.3f %10.3f %6.2fx %6.2fx %8.1f %9.1f\n", static_cast<long>(n),
                      static_cast<long>(k), static_cast<long>(m), static_cast<long>(t), name.c_str(), ref.wall * 1e3,
                      tp.wall * 1e3, ref.wall / tp.wall, ref.cpu / tp.cpu, n * k / tp.wall * 1e-9,
                      2.0 * m * n * k / tp.wall * 1e-9);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) { return tp::bench::guarded_main("tp-quant-kernels-bench", argc, argv, run); }
