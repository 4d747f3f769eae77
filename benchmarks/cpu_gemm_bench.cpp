// tp-cpu-gemm-bench: every CPU GEMM backend of the unquantized method
// (src/cpu/dense/gemm.h) forced, the table's choice ("auto") and
// at::linear, side by side on the same shapes in one process: the measurements the
// selection table is built from, and the check that the choice is never slower than
// at::linear.
//
//   tp-cpu-gemm-bench                                     # Llama-3-8B layers at TP 1 and 2, M = 1..256
//   tp-cpu-gemm-bench --shapes 4096x4096 --m 1,16 --dtypes float32 --seconds 0.5
//   TP_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 tp-cpu-gemm-bench
//
// Weights are "cold" by default: the calls cycle through enough copies of each weight
// to exceed twice the last-level cache, as a model's layers do, so memory-bound rows
// read DRAM (--cold 0: one copy, which may stay in cache). Sides alternate in rounds;
// medians are reported, with each row's fraction of the machine's limit.
//
// The table the choice reads (src/cpu/dense/table.h) is data: --print-table prints
// the one in use; --tune FILE writes it with this machine's entries replaced by the
// fastest backend per measured M (times summed over the shapes), and the quantized
// kernels' crossovers as measured here (--crossovers: crossover_bench.h), for
// TP_CPU_GEMM_TABLE=FILE.
//
//   tp-cpu-gemm-bench --only-crossovers --tune table.json  # the crossovers alone

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu/dense/gemm.h"
#include "cpu/dense/table.h"
#include "crossover_bench.h"
#include "guarded_main.h"
#include "machine_limits.h"

using tp::bench::format;
using tp::cpu::DenseBackend;
using tp::cpu::DenseGemm;

namespace {

struct NamedShape {
  std::string name;
  int64_t n, k;  // W: [n, k]
};

struct Args {
  std::vector<NamedShape> shapes = {
      // Llama-3-8B: hidden 4096, intermediate 14336, 32 heads / 8 KV heads of 128.
      {"qkv", 6144, 4096},   {"o", 4096, 4096},   {"gate_up", 28672, 4096},   {"down", 4096, 14336},
      {"qkv/2", 3072, 4096}, {"o/2", 4096, 2048}, {"gate_up/2", 14336, 4096}, {"down/2", 4096, 7168}};
  std::vector<int64_t> m = {1, 4, 16, 64, 256};
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  std::vector<std::string> backends = {"at_linear", "onednn", "mkl_packed", "panels", "gemv", "bf16_tiles"};
  double seconds = 0.25;  // measuring per side and case
  bool cold = true;
  double limits_seconds = 1.5;
  int threads = 0;                                  // 0: ATen's default
  bool cpu_clock = false;                           // time by the thread's CPU clock (1 thread only)
  std::string tune;                                 // --tune FILE: write the recalibrated table there
  bool crossovers = false;                          // also time the quantized kernels' crossovers (always with --tune)
  bool only_crossovers = false;                     // only them: no backend sweep
  int64_t crossover_n = 11008, crossover_k = 4096;  // the layer they are timed on
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "tp-cpu-gemm-bench: %s\n"
               "usage: tp-cpu-gemm-bench [--shapes NxK,...] [--m 1,4,16,64,256] [--dtypes float32,bfloat16]\n"
               "                         [--backends at_linear,onednn,mkl_packed,panels,gemv,bf16_tiles] [--seconds S] "
               "[--cold 0|1]\n"
               "                         [--limits-seconds S] [--threads T] [--clock wall|cpu]\n"
               "                         [--tune FILE] [--print-table] [--crossovers] [--only-crossovers]\n"
               "                         [--crossover-shape NxK]\n"
               "--crossovers: time the quantized kernels' crossovers (src/cpu/crossovers.h) on a bf16 layer of\n"
               "--crossover-shape (11008x4096), each side forced; --tune measures and writes them too.\n"
               "--clock cpu (with --threads 1): time by the thread's CPU clock, so the other tenants of a\n"
               "shared machine that preempt this one do not count (their use of memory bandwidth still does).\n",
               error.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("the unquantized method's CPU GEMM backends side by side");
    if (flag == "--crossovers" || flag == "--only-crossovers") {
      a.crossovers = true;
      a.only_crossovers = a.only_crossovers || flag == "--only-crossovers";
      continue;
    }
    if (flag == "--print-table") {
      const auto& table = tp::cpu::DenseTable::active();
      std::printf("%s", table.to_json("read from " + table.source).c_str());
      std::exit(0);
    }
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string v = argv[++i];
    try {
      if (flag == "--shapes") {
        a.shapes.clear();
        for (const auto& s : split_list(v)) {
          const auto x = s.find('x');
          if (x == std::string::npos) usage("bad shape '" + s + "' (expected NxK)");
          a.shapes.push_back({s, std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))});
        }
      } else if (flag == "--m") {
        a.m.clear();
        for (const auto& s : split_list(v)) a.m.push_back(std::stoll(s));
      } else if (flag == "--dtypes")
        a.dtypes = split_list(v);
      else if (flag == "--backends")
        a.backends = split_list(v);
      else if (flag == "--seconds")
        a.seconds = std::stod(v);
      else if (flag == "--cold")
        a.cold = std::stoi(v) != 0;
      else if (flag == "--limits-seconds")
        a.limits_seconds = std::stod(v);
      else if (flag == "--tune")
        a.tune = v, a.crossovers = true;
      else if (flag == "--crossover-shape") {
        const auto x = v.find('x');
        if (x == std::string::npos) usage("bad shape '" + v + "' (expected NxK)");
        a.crossover_n = std::stoll(v.substr(0, x)), a.crossover_k = std::stoll(v.substr(x + 1));
      } else if (flag == "--threads")
        a.threads = std::stoi(v);
      else if (flag == "--clock") {
        if (v != "wall" && v != "cpu") usage("--clock takes wall or cpu");
        a.cpu_clock = v == "cpu";
      } else
        usage("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + flag);
    }
  }
  if (a.shapes.empty() || a.m.empty() || a.seconds <= 0) usage("shapes, M and seconds must be given and positive");
  if (a.cpu_clock && a.threads != 1) usage("--clock cpu needs --threads 1 (other threads' time would not count)");
  return a;
}

at::ScalarType dtype_of(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  usage("unknown dtype '" + name + "' (float32, bfloat16)");
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Medians (ms) of sides measured in alternating rounds, by the wall clock or this
// thread's CPU clock.
std::vector<double> median_ms(const std::vector<std::function<void()>>& sides, double seconds, bool cpu_clock) {
  for (const auto& f : sides)
    for (int i = 0; i < 2; ++i) f();
  std::vector<std::vector<double>> samples(sides.size());
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 500; ++round) {
    for (size_t s = 0; s < sides.size(); ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_clock ? thread_cpu_s() : 0.0;
      sides[s]();
      samples[s].push_back(cpu_clock ? (thread_cpu_s() - c0) * 1e3 : tp::bench::seconds_since(t0) * 1e3);
    }
    if (round >= 4 && tp::bench::seconds_since(start) > seconds * static_cast<double>(sides.size())) break;
  }
  std::vector<double> out;
  for (auto& s : samples) out.push_back(tp::bench::median(s));
  return out;
}

// This machine's entries (vendor, ISA in use, dtype, bf16 arithmetic; with and without
// packed copies) from the measured winners, merged into the table in use: a rule per
// run of M one backend won, up to the last M it won.
void write_tuned_table(const std::string& path,
                       const std::map<std::string, std::map<int64_t, std::map<std::string, double>>>& tuned,
                       const std::vector<tp::cpu::CrossoverEntry>& crossovers, const Args& args) {
  using tp::cpu::DenseBackend;
  auto table = tp::cpu::DenseTable::active();
  table.source = path;
  for (const auto& c : crossovers) table.put(c);
  for (const auto& [dtype_name, by_m] : tuned) {
    const auto p = tp::cpu::dense_problem(1, 1, 1, dtype_of(dtype_name));
    if (p.isa == tp::cpu::Isa::kScalar) {
      std::printf("--tune: the portable ISA always takes at::linear; no entry for it\n");
      continue;
    }
    for (const bool packs : {true, false}) {
      tp::cpu::DenseTableEntry e;
      e.vendor = tp::cpu::vendor_name(p.amd);
      e.isa = tp::cpu::to_string(p.isa);
      e.dtype = p.dtype;
      e.bf16_arithmetic = p.dtype == at::kBFloat16 && p.bf16_arithmetic();
      e.packs = packs;
      for (const auto& [m, by_backend] : by_m) {
        std::string best;
        for (const auto& [name, ms] : by_backend) {
          const auto b = tp::cpu::parse_dense_backend(name);
          const bool packed = b == DenseBackend::kOneDnn || b == DenseBackend::kMklPacked || b == DenseBackend::kPanels;
          if (packed && !packs) continue;
          if (best.empty() || ms < by_backend.at(best)) best = name;
        }
        const auto b = tp::cpu::parse_dense_backend(best);
        if (!e.rules.empty() && e.rules.back().backend == b)
          e.rules.back().max_m = m;
        else
          e.rules.push_back({m, b});
        if (packs) e.measured_ms[m] = by_backend;
      }
      e.rules.back().max_m = -1;
      table.put(std::move(e));
    }
  }
  table.validate();
  std::string shapes;
  for (const auto& s : args.shapes) shapes += (shapes.empty() ? "" : ", ") + s.name;
  const std::string note = "tp-cpu-gemm-bench --tune on " + tp::bench::cpu_description() + "; shapes " +
                           (tuned.empty() ? std::string("none (crossovers only)") : shapes) + "; crossovers on " +
                           std::to_string(args.crossover_n) + "x" + std::to_string(args.crossover_k);
  std::ofstream out(path, std::ios::binary);
  out << table.to_json(note);
  TORCH_CHECK(out.good(), "tp-cpu-gemm-bench: could not write ", path);
  std::printf("\nwrote %s (use it with TP_CPU_GEMM_TABLE=%s)\n", path.c_str(), path.c_str());
}

}  // namespace

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (args.threads > 0) at::set_num_threads(args.threads);
  c10::InferenceMode inference;  // as a model's forward runs; the backends need no graph
  std::printf("tp-cpu-gemm-bench: load %s\n%s\n", tp::bench::load_average().c_str(),
              tp::bench::cpu_description().c_str());
  const auto limits = tp::bench::measure_machine_limits(
      args.limits_seconds, args.cpu_clock ? tp::bench::LimitClock::kThreadCpu : tp::bench::LimitClock::kWall);
  std::printf("%s\n", limits.describe().c_str());
  std::printf(
      "ms: median per call (%s clock) over alternating rounds (~%.2f s per side), %s weights; x lin: at::linear's "
      "time\n"
      "in the same dtype / this row's; x f32: at::linear float32's / this row's; '*': the table's choice;\n"
      "limit: the row's fraction of the binding limit (mem: GB/s of weight / read GB/s; fp32/bf16: GFLOP/s /\n"
      "peak). err: max |y - ref| / max |ref| against float64.\n\n",
      args.cpu_clock ? "thread CPU" : "wall", args.seconds, args.cold ? "cold (copies > 2x LLC)" : "warm (one copy)");

  std::vector<DenseBackend> backends;
  for (const auto& b : args.backends) backends.push_back(tp::cpu::parse_dense_backend(b));
  tp::bench::Table table(
      {"shape", "N x K", "dtype", "M", "backend", "ms", "GB/s", "GFLOP/s", "limit", "x lin", "x f32", "err"});
  tp::bench::Table summary({"shape", "dtype", "M", "chosen", "fastest", "chosen ms", "at::linear ms", "x lin"});
  int wrong = 0, slower = 0;
  // --tune: median ms per dtype, M and backend, summed over the shapes.
  std::map<std::string, std::map<int64_t, std::map<std::string, double>>> tuned;
  for (const auto& shape : args.only_crossovers ? std::vector<NamedShape>{} : args.shapes) {
    for (const auto& dtype_name : args.dtypes) {
      const auto dtype = dtype_of(dtype_name);
      const auto w64 = at::randn({shape.n, shape.k}, at::kDouble) / std::sqrt(static_cast<double>(shape.k));
      const double bytes = static_cast<double>(shape.n) * shape.k * c10::elementSize(dtype);
      const double bytes32 = static_cast<double>(shape.n) * shape.k * 4.0;
      const int copies = args.cold && limits.llc_bytes > 0
                             ? std::max(1, static_cast<int>(std::ceil(2.0 * limits.llc_bytes / bytes)))
                             : 1;
      const int copies32 = args.cold && limits.llc_bytes > 0
                               ? std::max(1, static_cast<int>(std::ceil(2.0 * limits.llc_bytes / bytes32)))
                               : 1;
      std::vector<at::Tensor> ws, ws32;
      std::vector<std::unique_ptr<DenseGemm>> gemms;
      for (int c = 0; c < copies; ++c) {
        ws.push_back(w64.to(dtype));
        gemms.push_back(std::make_unique<DenseGemm>());
        gemms.back()->prepare(ws.back());
      }
      for (int c = 0; c < copies32; ++c) ws32.push_back(w64.to(at::kFloat));
      const auto w_ref = ws[0].to(at::kDouble);
      for (const int64_t m : args.m) {
        std::fprintf(stderr, "[tp-cpu-gemm-bench] %s %s M=%lld\n", shape.name.c_str(), dtype_name.c_str(),
                     static_cast<long long>(m));
        const auto x64 = at::randn({m, shape.k}, at::kDouble);
        const auto x = x64.to(dtype), x32 = x64.to(at::kFloat);
        const auto ref = at::matmul(x.to(at::kDouble), w_ref.t());
        const double flops = 2.0 * m * shape.n * shape.k;
        const auto chosen = gemms[0]->backend_for(x);

        // Sides: at::linear fp32, at::linear in dtype, each backend forced, auto.
        int c32 = 0, c = 0;
        std::vector<std::string> names{"at::linear f32", "at::linear"};
        std::vector<std::function<at::Tensor()>> calls{[&] {
                                                         c32 = (c32 + 1) % copies32;
                                                         return at::linear(x32, ws32[c32]);
                                                       },
                                                       [&] {
                                                         c = (c + 1) % copies;
                                                         return at::linear(x, ws[c]);
                                                       }};
        for (const auto b : backends) {
          if (b == DenseBackend::kAtLinear) continue;  // the side above
          if (!tp::cpu::dense_supports(b, tp::cpu::dense_problem(m, shape.n, shape.k, dtype))) continue;
          names.push_back(tp::cpu::to_string(b));
          calls.push_back([&, b] {
            c = (c + 1) % copies;
            return gemms[c]->linear(x, std::nullopt, b);
          });
        }
        names.push_back("auto");
        calls.push_back([&] {
          c = (c + 1) % copies;
          return gemms[c]->linear(x, std::nullopt);
        });

        std::vector<double> err;
        for (auto& call : calls) {
          const auto y = call().to(at::kDouble);
          err.push_back((y - ref).abs().max().item<double>() / std::max(1e-30, ref.abs().max().item<double>()));
        }
        std::vector<std::function<void()>> sides;
        for (auto& call : calls) sides.push_back([&call] { (void)call(); });
        const auto ms = median_ms(sides, args.seconds, args.cpu_clock);
        const double lin = ms[1], lin32 = ms[0];
        size_t fastest = 1;
        for (size_t s = 1; s + 1 < names.size(); ++s)
          if (ms[s] < ms[fastest]) fastest = s;
        const double bound = dtype == at::kFloat ? 1e-4 : 3e-2;  // gross-error guard; the tests hold the bounds
        for (size_t s = 0; s < names.size(); ++s) {
          const bool is32 = s == 0;
          const double row_bytes = is32 ? bytes32 : bytes;
          const auto f = tp::bench::limit_fraction(limits, row_bytes, flops, ms[s] * 1e-3, is32 ? at::kFloat : dtype);
          const bool is_chosen =
              names[s] == tp::cpu::to_string(chosen) || (chosen == DenseBackend::kAtLinear && s == 1);
          table.add(
              {shape.name, format("%lldx%lld", (long long)shape.n, (long long)shape.k), is32 ? "float32" : dtype_name,
               std::to_string(m), names[s] + (is_chosen ? " *" : ""), format("%.3f", ms[s]),
               format("%.1f", row_bytes / ms[s] / 1e6), format("%.1f", flops / ms[s] / 1e6), tp::bench::format_limit(f),
               format("%.2f", (is32 ? lin32 : lin) / ms[s]), format("%.2f", lin32 / ms[s]), format("%.1e", err[s])});
          if (!(err[s] <= bound)) {
            std::fprintf(stderr, "tp-cpu-gemm-bench: %s %s M=%lld %s: error %.3g exceeds %.2g\n", shape.name.c_str(),
                         dtype_name.c_str(), static_cast<long long>(m), names[s].c_str(), err[s], bound);
            ++wrong;
          }
        }
        for (size_t s = 1; s + 1 < names.size(); ++s) tuned[dtype_name][m][s == 1 ? "at_linear" : names[s]] += ms[s];
        const double auto_ms = ms.back();
        // 5 %: below that the sides' medians are within this machine's run-to-run noise.
        if (auto_ms > 1.05 * lin) ++slower;
        summary.add({shape.name, dtype_name, std::to_string(m), tp::cpu::to_string(chosen), names[fastest],
                     format("%.3f", auto_ms), format("%.3f", lin),
                     format("%.2f%s", lin / auto_ms, auto_ms > 1.05 * lin ? " SLOWER" : "")});
      }
    }
  }
  if (!args.only_crossovers) {
    std::printf("%s\n%s", table.str().c_str(), summary.str().c_str());
    std::printf("\nthe table's choice slower than at::linear by > 5%%: %d case(s)\n", slower);
  }
  std::vector<tp::cpu::CrossoverEntry> crossovers;
  if (args.crossovers) {
    std::printf(
        "\nquantized kernels' crossovers (bf16 layers of %lldx%lld; below: the crossover past the last M, "
        "from: forced to 1; ms summed over the formats it governs):\n",
        static_cast<long long>(args.crossover_n), static_cast<long long>(args.crossover_k));
    crossovers = tp::bench::measure_crossovers(args.crossover_n, args.crossover_k, args.seconds);
  }
  if (!args.tune.empty()) write_tuned_table(args.tune, tuned, crossovers, args);
  return wrong == 0 ? 0 : 1;
}

int main(int argc, char** argv) { return tp::bench::guarded_main("tp-cpu-gemm-bench", argc, argv, run); }
