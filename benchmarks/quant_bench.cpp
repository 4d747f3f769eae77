// tp-quant-bench: one layer's GEMM in each quantized format against at::linear in
// float32 and bfloat16 on the same machine (issue 4's table): time per call, the
// ratio to both, the bytes of weight each call reads, and the error against the
// float64 product with the ORIGINAL float weight (what quantization costs) and
// against the format's own float64 model (dequantize_weight / quantize_activation:
// what the kernel adds).
//
//   tp-quant-bench                                   # 4096 x 11008, M = 1, 16, 256, every format
//   tp-quant-bench --k 4096 --n 11008 --m 1 --formats int8_weight_only,int4_gptq:g128 --seconds 1
//
// Each format runs as a ColumnParallelLinear at TP = 1 loaded from a checkpoint made
// by quantize_weight, so the timed call is exactly what a layer's forward costs.
// Sides alternate in rounds and the median over all calls is reported.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu/kernel_counts.h"
#include "guarded_main.h"
#include "machine_limits.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/communicator.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/quant/quantize.h"

using namespace tp;
using tp::bench::format;

namespace {

std::vector<std::string> every_format() {
  std::vector<std::string> out;
  for (const QuantFormat f : all_quant_formats()) out.push_back(to_string(QuantConfig{f}));
  return out;
}

struct Args {
  int64_t k = 4096, n = 11008;
  std::vector<int64_t> m = {1, 16, 256};
  std::vector<std::string> formats = every_format();  // each at its default options
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  double seconds = 0.5;  // measuring per side and M
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "tp-quant-bench: %s\n"
               "usage: tp-quant-bench [--k IN] [--n OUT] [--m 1,16,256] [--formats f1,f2,...]\n"
               "                      [--dtypes float32,bfloat16] [--seconds S]\n",
               error.c_str());
  std::exit(2);
}

at::ScalarType dtype_of(const std::string& name);

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("per-format GEMM time against at::linear");
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string v = argv[++i];
    try {
      if (flag == "--k")
        a.k = std::stoll(v);
      else if (flag == "--n")
        a.n = std::stoll(v);
      else if (flag == "--m") {
        a.m.clear();
        for (const auto& s : split_list(v)) a.m.push_back(std::stoll(s));
      } else if (flag == "--formats")
        a.formats = split_list(v);
      else if (flag == "--dtypes")
        a.dtypes = split_list(v);
      else if (flag == "--seconds")
        a.seconds = std::stod(v);
      else
        usage("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + flag);
    }
  }
  if (a.k <= 0 || a.n <= 0 || a.m.empty() || a.seconds <= 0) usage("sizes, M and seconds must be positive");
  // Formats and dtypes checked before any measuring, with the library's own message.
  for (const auto& f : a.formats) {
    try {
      (void)parse_quant_config(f);
    } catch (const c10::Error& e) {
      usage(e.what_without_backtrace());
    }
  }
  for (const auto& d : a.dtypes) (void)dtype_of(d);
  return a;
}

at::ScalarType dtype_of(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  usage("unknown dtype '" + name + "' (float32, bfloat16, float16)");
}

// x's per-token codes as the fused boundary makes them (all_reduce_fusion at TP 1 with an
// RMSNorm of unit weight): norm_out, and norm_out's quant_out / scale_out.
AllReduceFusionResult token_codes(const at::Tensor& x, TokenQuant quant) {
  AllReduceFusionParams p;
  p.norm = AllReduceFusionNorm::kRMS;
  p.norm_weight = at::ones({x.size(-1)}, x.options());
  p.quant_out = quant == TokenQuant::kInt8 ? AllReduceFusionQuant::kInt8PerToken : AllReduceFusionQuant::kFp8PerToken;
  return Communicator().all_reduce_fusion(x, p);
}

// Bytes of weight a call reads: every stored tensor of the format.
int64_t stored_bytes(const QuantizedTensors& tensors) {
  int64_t bytes = 0;
  for (const auto& [name, t] : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

double rel_error(const at::Tensor& y, const at::Tensor& ref) {
  const auto d = (y.to(at::kDouble) - ref).abs().max().item<double>();
  return d / std::max(1e-30, ref.abs().max().item<double>());
}

}  // namespace

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  at::NoGradGuard no_grad;  // a forward as inference runs it: the CPU GEMMs need no graph
  std::printf("tp-quant-bench: one %lld x %lld layer (in x out), TP = 1, %s, torch threads %d, load %s\n",
              static_cast<long long>(args.k), static_cast<long long>(args.n), bench::machine_description().c_str(),
              at::get_num_threads(), bench::load_average().c_str());
  std::printf("%s\n", bench::cpu_description().c_str());
  const auto limits = bench::measure_machine_limits();
  std::printf("%s\n", limits.describe().c_str());
  std::printf(
      "time: median ms per forward over alternating rounds (~%.2f s per side); fp32 ms: at::linear in\n"
      "float32 in the same rounds as the row (each row has its own); x fp32 / x bf16: how many\n"
      "times faster than at::linear in float32 / bfloat16; err float: max |y - x W^T| / max |x W^T| with\n"
      "the original float weight; err model: the same against the format's own float64 model; limit: the\n"
      "row's fraction of the limit that binds it (mem: weight + activation bytes / time over the read\n"
      "bandwidth; fp32 / bf16: GFLOP/s over the GEMM peak; int8_w8a8 multiplies in int8, so its compute\n"
      "fraction is against the fp32 peak and can pass 100%%); kernel: the CPU kernel the layer's forward ran\n"
      "(family/ISA: rows or gemv for small M, panel or gemm above; '-': none reported); from codes: for a\n"
      "format whose GEMM quantizes x per token (int8_w8a8, fp8_channel), ms per forward_quantized of the\n"
      "codes the fused boundary hands over, and how many times faster than forward of the same input.\n\n",
      args.seconds);

  const auto w = at::randn({args.n, args.k}, at::kDouble) / std::sqrt(static_cast<double>(args.k));
  const auto w32 = w.to(at::kFloat), w16 = w.to(at::kBFloat16);
  // A gross-error guard, not a tolerance (the tests hold each format to its own):
  // a kernel off by more than this against its own model is broken, and the run fails.
  constexpr double kModelErrorBound = 0.1;
  int wrong = 0;
  bench::Table table({"format", "dtype", "M", "ms", "fp32 ms", "x fp32", "x bf16", "weight MB", "GB/s", "limit",
                      "kernel", "from codes", "err float", "err model"});
  // The limit a row is held to: its bytes (weights as stored, x in, y out) and flops.
  auto limit = [&](double weight_bytes, int64_t m, at::ScalarType dtype, double ms) {
    const double bytes = weight_bytes + static_cast<double>(m) * (args.k + args.n) * c10::elementSize(dtype);
    return bench::format_limit(bench::limit_fraction(limits, bytes, 2.0 * m * args.n * args.k, ms * 1e-3, dtype));
  };
  for (const auto& fmt : args.formats) {
    const QuantConfig config = parse_quant_config(fmt);
    const auto stored = quantize_weight(w32, config);
    const auto w_model = dequantize_weight(stored, config).to(at::kDouble);
    Checkpoint ckpt;
    add_to_checkpoint(ckpt, "fc", stored);
    for (const auto& dtype_name : args.dtypes) {
      const auto dtype = dtype_of(dtype_name);
      ColumnParallelLinear layer(ColumnParallelLinearOptions(args.k, args.n).bias(false).dtype(dtype).quant(config));
      layer->load_weights(ckpt, "fc");
      for (int64_t m : args.m) {
        std::fprintf(stderr, "[tp-quant-bench] %s %s M=%lld\n", fmt.c_str(), dtype_name.c_str(),
                     static_cast<long long>(m));
        const auto x64 = at::randn({m, args.k}, at::kDouble);
        const auto x = x64.to(dtype), x32 = x64.to(at::kFloat), x16 = x64.to(at::kBFloat16);
        at::Tensor y;
        // Formats whose GEMM quantizes x per token also run from x's codes as the fused
        // boundary hands them over (forward_quantized): the same output without that pass.
        const TokenQuant token_quant = layer->input_quant(x);
        AllReduceFusionResult codes;
        if (token_quant != TokenQuant::kNone) codes = token_codes(x, token_quant);
        std::vector<std::function<void()>> sides = {[&] { at::linear(x32, w32); }, [&] { at::linear(x16, w16); },
                                                    [&] { y = layer->forward(x); }};
        if (codes.quant_out.defined()) {
          sides.push_back([&] { (void)layer->forward(codes.norm_out); });
          sides.push_back([&] { (void)layer->forward_quantized(codes.quant_out, codes.scale_out); });
        }
        const auto ms = bench::alternating_medians_ms(sides, args.seconds);
        std::string from_codes = "-";
        if (codes.quant_out.defined()) {
          if (!at::equal(layer->forward_quantized(codes.quant_out, codes.scale_out), layer->forward(codes.norm_out))) {
            std::fprintf(stderr, "tp-quant-bench: %s %s M=%lld: forward_quantized differs from forward\n", fmt.c_str(),
                         dtype_name.c_str(), static_cast<long long>(m));
            ++wrong;
          }
          from_codes = format("%.3f (%.2fx)", ms[4], ms[3] / ms[4]);
        }
        const auto ref_float = at::matmul(x.to(at::kDouble), w.t());
        const auto ref_model = at::matmul(quantize_activation(x, stored, config).to(at::kDouble), w_model.t());
        // Format none keeps the weight in the layer's dtype (the checkpoint holds float32).
        const double mb = config.format == QuantFormat::kNone
                              ? static_cast<double>(args.n) * args.k * c10::elementSize(dtype) / 1e6
                              : static_cast<double>(stored_bytes(stored)) / 1e6;
        const auto kernels_before = tp::cpu::kernel_counts();
        (void)layer->forward(x);
        const auto kernel = tp::cpu::kernels_between(kernels_before, tp::cpu::kernel_counts());
        const double err_model = rel_error(y, ref_model);
        if (!(err_model <= kModelErrorBound)) {
          std::fprintf(stderr, "tp-quant-bench: %s %s M=%lld: error %.3g against the format's model exceeds %.2g\n",
                       fmt.c_str(), dtype_name.c_str(), static_cast<long long>(m), err_model, kModelErrorBound);
          ++wrong;
        }
        table.add({to_string(config), dtype_name, std::to_string(m), format("%.3f", ms[2]), format("%.3f", ms[0]),
                   format("%.2f", ms[0] / ms[2]), format("%.2f", ms[1] / ms[2]), format("%.1f", mb),
                   format("%.1f", mb / ms[2]), limit(mb * 1e6, m, dtype, ms[2]), kernel, from_codes,
                   format("%.1e", rel_error(y, ref_float)), format("%.1e", err_model)});
        if (fmt == args.formats.front() && dtype_name == args.dtypes.front()) {
          // The baselines once per M, for reference (each row's own are its fp32 ms and ratios).
          table.add({"at::linear", "float32", std::to_string(m), format("%.3f", ms[0]), "", "1.00",
                     format("%.2f", ms[1] / ms[0]), format("%.1f", 4e-6 * args.n * args.k),
                     format("%.1f", 4e-6 * args.n * args.k / ms[0]), limit(4.0 * args.n * args.k, m, at::kFloat, ms[0]),
                     "at::linear", "", "", ""});
          table.add({"at::linear", "bfloat16", std::to_string(m), format("%.3f", ms[1]), "",
                     format("%.2f", ms[0] / ms[1]), "1.00", format("%.1f", 2e-6 * args.n * args.k),
                     format("%.1f", 2e-6 * args.n * args.k / ms[1]),
                     limit(2.0 * args.n * args.k, m, at::kBFloat16, ms[1]), "at::linear", "", "", ""});
        }
      }
    }
  }
  std::printf("%s", table.str().c_str());
  return wrong == 0 ? 0 : 1;
}

int main(int argc, char** argv) { return tp::bench::guarded_main("tp-quant-bench", argc, argv, run); }
