// tp-int-kernels-bench: tp's own INT4 / INT8 weight-only CPU kernels against float32
// at::linear on the same shape, side by side in one process.
//
//   tp-int-kernels-bench [--threads 1,2] [--m 1,16,256] [--shapes 4096x11008,...] [--reps 15]
//                        [--formats int4,int8] [--group 128] [--dtype float32|bfloat16]
//                        [--isas scalar,avx2,avx512]
//
// A shape KxN is in_features x out_features (the weight is [N, K]). Every repetition
// times the peer and each kernel once, in turn, so that a change in the machine's
// load hits all of them alike; the table shows medians after two warm-up calls.
// Columns: time, speedup over float32 at::linear, weight bytes as stored / time
// (GB/s), 2 M N K / time (GFLOP/s), the median process CPU time per call (all
// threads: at one thread, much less than the wall time means the machine was
// busy), and the max error relative to max |y| of at::linear over the dequantized
// weight.
// The ISAs default to every one up to tp::cpu::isa() (TP_CPU_ISA caps it); the peers
// follow ATEN_CPU_CAPABILITY / MKL_ENABLE_INSTRUCTIONS / ONEDNN_MAX_CPU_ISA. Exits 1
// when a kernel's error exceeds the float32 GEMM bound (bfloat16: its own), so the
// smoke run in CTest is a correctness check too.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/features.h"
#include "guarded_main.h"
#include "quant/int4/cpu_kernels.h"
#include "quant/int4/packing.h"
#include "quant/int8/weight_only_cpu_kernels.h"
#include "tp/quant/quantize.h"

namespace {

using namespace tp;
using namespace tp::detail;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> out;
  for (const auto& p : split(s, ',')) out.push_back(std::stoll(p));
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of the whole process (all threads), to tell a busy machine's preemption
// (wall >> cpu at one thread) from the kernel's own time.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct Candidate {
  std::string name;
  std::function<at::Tensor()> run;
  std::vector<double> times, cpu_times;
};

}  // namespace

int run(int argc, char** argv) {
  std::vector<int64_t> threads{1, 2}, ms{1, 16, 256};
  std::vector<std::string> shapes{"4096x11008", "14336x4096", "4096x14336"}, formats{"int4", "int8"}, isa_names;
  int64_t reps = 15, group = 128;
  std::string dtype_name = "float32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads")
      threads = ints(v);
    else if (a == "--m")
      ms = ints(v);
    else if (a == "--shapes")
      shapes = split(v, ',');
    else if (a == "--reps")
      reps = std::stoll(v);
    else if (a == "--formats")
      formats = split(v, ',');
    else if (a == "--group")
      group = std::stoll(v);
    else if (a == "--dtype")
      dtype_name = v;
    else if (a == "--isas")
      isa_names = split(v, ',');
    else {
      std::fprintf(stderr, "unknown option %s (see the header of int_kernels_bench.cpp)\n", a.c_str());
      return 2;
    }
  }
  const at::ScalarType dtype = dtype_name == "bfloat16" ? at::kBFloat16 : at::kFloat;
  std::vector<tp::cpu::Isa> isas;
  if (isa_names.empty()) {
    for (tp::cpu::Isa isa : {tp::cpu::Isa::kAvx2, tp::cpu::Isa::kAvx512})
      if (static_cast<int>(isa) <= static_cast<int>(tp::cpu::isa())) isas.push_back(isa);
  } else {
    for (const auto& n : isa_names) isas.push_back(tp::cpu::parse_isa(n));
  }

  std::printf("cpu features: %s\n", tp::cpu::features().describe().c_str());
  std::printf(
      "tp tp::cpu::isa: %s (TP_CPU_ISA=%s); peers: ATEN_CPU_CAPABILITY=%s MKL_ENABLE_INSTRUCTIONS=%s "
      "ONEDNN_MAX_CPU_ISA=%s\n",
      to_string(tp::cpu::isa()), env_or("TP_CPU_ISA", "-"), env_or("ATEN_CPU_CAPABILITY", "-"),
      env_or("MKL_ENABLE_INSTRUCTIONS", "-"), env_or("ONEDNN_MAX_CPU_ISA", "-"));
  std::printf("layer dtype %s, int4 group %lld, %lld reps (medians)\n\n", dtype_name.c_str(),
              static_cast<long long>(group), static_cast<long long>(reps));
  std::printf("%-6s %-11s %4s %3s  %-22s %9s %8s %7s %8s %9s %9s\n", "format", "KxN", "M", "thr", "kernel", "ms",
              "vs fp32", "GB/s", "GFLOP/s", "cpu ms", "max err");

  bool failed = false;
  for (const auto& shape : shapes) {
    const auto kn = split(shape, 'x');
    const int64_t k = std::stoll(kn.at(0)), n = std::stoll(kn.at(1));
    at::manual_seed(0);
    const auto w =
        at::empty({n, k}).uniform_(-1.0 / std::sqrt(static_cast<double>(k)), 1.0 / std::sqrt(static_cast<double>(k)));
    for (const auto& format : formats) {
      // The weight in the format, its reference (dequantized) float32 copy, and the packing.
      at::Tensor reference;
      Int4CpuWeight w4;
      Int8WoCpuWeight w8;
      int64_t bytes = 0;
      if (format == "int4") {
        const QuantConfig config{QuantFormat::kInt4Gptq, group, true};
        const auto q = quantize_weight(w, config);
        const auto u = unpack_gptq(q.at("qweight"), q.at("qzeros"), q.at("scales"), config.gptq_format);
        w4 = int4_cpu_pack(u.codes, u.scale, u.zero, group);
        reference = dequantize_weight(q, config);
        bytes = w4.bytes();
      } else {
        const QuantConfig config{QuantFormat::kInt8WeightOnly};
        const auto q = quantize_weight(w, config);
        w8 = int8_wo_cpu_pack(q.at("weight"), q.at("weight_scale"));
        reference = dequantize_weight(q, config);
        bytes = w8.bytes();
      }
      for (int64_t m : ms) {
        const auto x = at::randn({m, k}).to(dtype);
        const auto x32 = x.to(at::kFloat);
        const auto expected = at::linear(x32, reference);
        for (int64_t t : threads) {
          at::set_num_threads(static_cast<int>(t));
          std::vector<Candidate> cands;
          cands.push_back({"at::linear fp32", [&] { return at::linear(x32, reference); }, {}, {}});
          if (dtype == at::kBFloat16) {
            const auto wb = reference.to(at::kBFloat16);
            cands.push_back({"at::linear bf16", [&, wb] { return at::linear(x, wb); }, {}, {}});
          }
          for (tp::cpu::Isa isa : isas) {
            const std::string name = std::string("tp ") + format + " " + to_string(isa);
            if (format == "int4")
              cands.push_back({name, [&, isa] { return int4_cpu_linear(x, w4, isa); }, {}, {}});
            else
              cands.push_back({name, [&, isa] { return int8_wo_cpu_linear(x, w8, isa); }, {}, {}});
          }
          std::vector<double> errs;
          for (auto& c : cands) {
            const auto y = c.run().to(at::kFloat);
            errs.push_back(((y - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item<double>());
            c.run();
          }
          for (int64_t r = 0; r < reps; ++r) {
            for (auto& c : cands) {
              const double t0 = now(), c0 = cpu_now();
              c.run();
              c.times.push_back(now() - t0);
              c.cpu_times.push_back(cpu_now() - c0);
            }
          }
          const double bound = dtype == at::kBFloat16 ? 3e-2 : 2e-5;
          for (size_t i = 1; i < cands.size(); ++i) {
            if (errs[i] > bound) {
              std::fprintf(stderr, "%s: error %.3g above the bound %.1g (%s, M=%lld)\n", cands[i].name.c_str(), errs[i],
                           bound, shape.c_str(), static_cast<long long>(m));
              failed = true;
            }
          }
          const double peer = median(cands[0].times);
          for (size_t i = 0; i < cands.size(); ++i) {
            const double tm = median(cands[i].times);
            const double wbytes =
                i == 0 ? 4.0 * n * k : (cands[i].name.rfind("at::linear bf16", 0) == 0 ? 2.0 * n * k : bytes);
            std::printf("%-6s %-11s %4lld %3lld  %-22s %9.3f %7.2fx %7.1f %8.1f %9.3f %9.2e\n", format.c_str(),
                        shape.c_str(), static_cast<long long>(m), static_cast<long long>(t), cands[i].name.c_str(),
                        tm * 1e3, peer / tm, wbytes / tm / 1e9, 2.0 * m * n * k / tm / 1e9,
                        median(cands[i].cpu_times) * 1e3, errs[i]);
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return failed ? 1 : 0;
}

int main(int argc, char** argv) { return tp::bench::guarded_main("tp-int-kernels-bench", argc, argv, run); }
