#include "machine_limits.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "bench_util.h"
#include "cpu/amx.h"
#include "cpu/features.h"

namespace tp::bench {

namespace {

// The largest cache sysfs lists for cpu0 (the LLC), in bytes; 0 when unknown.
int64_t llc_size() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(in >> s) || s.empty()) continue;
    int64_t v = std::atoll(s.c_str());
    const char unit = s.back();
    if (unit == 'K') v <<= 10;
    if (unit == 'M') v <<= 20;
    best = std::max(best, v);
  }
  return best;
}

const char* env_or_dash(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : "-";
}

// One streaming pass: every 8-byte word of [p, p + n) summed by all threads. Each
// thread reads its part as 8 interleaved streams of cache lines (a single stream per
// core leaves DRAM bandwidth unused: measured 4 vs 6-7 GB/s per core on Sapphire
// Rapids), with plain integer adds the compiler vectorizes at the baseline ISA.
uint64_t sum_pass(const uint64_t* p, int64_t n) {
  constexpr int kStreams = 8;
  std::atomic<uint64_t> total{0};
  at::parallel_for(0, n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    const int64_t len = (e - b) / kStreams / 8 * 8;  // words per stream, whole cache lines
    uint64_t acc[kStreams][8] = {};
    for (int64_t i = 0; i < len; i += 8)
      for (int s = 0; s < kStreams; ++s)
        for (int l = 0; l < 8; ++l) acc[s][l] += p[b + s * len + i + l];
    uint64_t sum = 0;
    for (int64_t i = b + kStreams * len; i < e; ++i) sum += p[i];
    for (const auto& a : acc)
      for (const uint64_t v : a) sum += v;
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return total.load();
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// What the passes and GEMMs are timed by (the budgets always run on the wall clock).
using Timer = double (*)();

struct Bandwidth {
  double gb_s = 0.0;
  int64_t bytes = 0;
};

Bandwidth measure_read_bandwidth(int64_t llc, double budget, Timer timer) {
  // 4x the LLC (at least 256 MiB), at most 1/8 of the RAM: every pass comes from DRAM.
  const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  int64_t bytes = std::max<int64_t>(int64_t{256} << 20, 4 * llc);
  if (ram > 0) bytes = std::min(bytes, ram / 8);
  bytes &= ~int64_t{4095};
  const int64_t words = bytes / 8;
  auto buffer = at::empty({words}, at::kLong);
  auto* p = reinterpret_cast<uint64_t*>(buffer.data_ptr<int64_t>());
  // First touch by the threads that will read it (their NUMA node), with non-zero
  // data (untouched pages would all map the one zero page).
  at::parallel_for(0, words, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  });
  const double start = now_s();
  double best = 0.0;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < 20; ++pass) {
    const double t0 = timer();
    sink = sink + sum_pass(p, words);
    best = std::max(best, static_cast<double>(bytes) / (timer() - t0) / 1e9);
    if (pass >= 2 && now_s() - start > budget) break;
  }
  return {best, bytes};
}

// The float32 FMA ceiling: 12 independent vector FMA chains per thread (enough to
// cover the FMA latency on two FMA units), `iters` rounds; returns a value that
// depends on every chain so none is optimized away. Compiled for the ISA by attribute
// and entered only when tp::cpu::isa() allows it.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iters) {
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  alignas(64) float t[16];
  float out = 0;
  for (int j = 0; j < 12; ++j) {
    _mm512_store_ps(t, acc[j]);  // (not _mm512_reduce_add_ps: GCC 12 warns inside it)
    for (const float v : t) out += v;
  }
  return out;
}
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  alignas(32) float t[8];
  float out = 0;
  for (int j = 0; j < 12; ++j) {
    _mm256_store_ps(t, acc[j]);
    for (const float v : t) out += v;
  }
  return out;
}
#endif

// The float32 FMA ceiling of all threads in GFLOP/s (2 flops per lane per FMA), the
// best of short runs over `budget` seconds; 0 where there is no SIMD path.
double fma_ceiling(double budget, Timer timer) {
#if defined(__x86_64__)
  const auto isa = tp::cpu::isa();
  if (static_cast<int>(isa) < static_cast<int>(tp::cpu::Isa::kAvx2)) return 0.0;
  const bool wide = static_cast<int>(isa) >= static_cast<int>(tp::cpu::Isa::kAvx512);
  const int lanes = wide ? 16 : 8;
  const int threads = at::get_num_threads();
  const auto run = [&](int64_t iters) {
    std::atomic<int> sink{0};
    const double t0 = timer();
    at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const float v = wide ? fma_chains_avx512(iters) : fma_chains_avx2(iters);
        sink.fetch_add(v > 0.0f ? 1 : 0, std::memory_order_relaxed);
      }
    });
    return timer() - t0;
  };
  int64_t iters = 1 << 14;
  while (run(iters) < 0.01 && iters < (int64_t{1} << 30)) iters *= 2;  // ~10 ms a run
  const double start = now_s();
  double best = 1e30;
  for (int i = 0; i < 20 && (i < 3 || now_s() - start < budget); ++i) best = std::min(best, run(iters));
  return 2.0 * lanes * 12.0 * static_cast<double>(iters) * threads / best / 1e9;
#else
  (void)budget, (void)timer;
  return 0.0;
#endif
}

using ReorderOp = at::Tensor(const at::Tensor&, std::optional<int64_t>);
using LinearPointwiseOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                     c10::string_view, c10::List<std::optional<at::Scalar>>,
                                     std::optional<c10::string_view>);

// A square n x n x n GEMM by `kernel` ("at::mm" or "onednn") in `dtype`: returns the
// callable for one GEMM (operands made once).
std::function<void()> square_gemm(const std::string& kernel, c10::ScalarType dtype, int64_t n) {
  const auto a = at::randn({n, n}, at::kFloat).to(dtype);
  const auto b = at::randn({n, n}, at::kFloat).to(dtype);
  if (kernel == "at::mm") return [a, b] { (void)at::mm(a, b); };
  static const auto reorder =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "").typed<ReorderOp>();
  static const auto linear =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "").typed<LinearPointwiseOp>();
  const auto packed = reorder.call(b, n);
  return [a, packed] {
    (void)linear.call(a, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
  };
}

struct Rate {
  double gflop_s = 0.0;
  int64_t n = 0;
};

// The best rate of `kernel`: n grows from 256 until one GEMM takes ~1/6 of the budget
// (or n = 2048), then calls repeat until the budget is spent; the fastest call counts.
Rate peak_rate(const std::string& kernel, c10::ScalarType dtype, double budget, Timer timer) {
  const double start = now_s();
  int64_t n = 256;
  auto gemm = square_gemm(kernel, dtype, n);
  gemm();
  double t0 = timer();
  gemm();
  double t = timer() - t0;
  while (t < budget / 6 && n < 2048 && now_s() - start < budget / 2) {
    const double grow = std::cbrt(budget / 6 / std::max(t, 1e-6));
    const int64_t next = std::min<int64_t>(2048, std::max<int64_t>(2 * n, static_cast<int64_t>(n * grow) / 256 * 256));
    if (next <= n) break;
    n = next;
    gemm = square_gemm(kernel, dtype, n);
    gemm();
    t0 = timer();
    gemm();
    t = timer() - t0;
  }
  double best = t;
  for (int i = 0; i < 50 && now_s() - start < budget; ++i) {
    t0 = timer();
    gemm();
    best = std::min(best, timer() - t0);
  }
  return {2.0 * n * n * n / best / 1e9, n};
}

}  // namespace

double MachineLimits::peak_gflop_s(c10::ScalarType dtype) const {
  if (dtype == c10::kBFloat16 || dtype == c10::kHalf) return std::max(bf16_gflop_s, fp32_gflop_s);
  return fp32_gflop_s;
}

std::string MachineLimits::describe() const {
  return format(
      "limits: read %.1f GB/s (streaming %.2f GiB, LLC %.0f MiB, %d threads); peak fp32 %.0f GFLOP/s "
      "(FMA ceiling %.0f, best square GEMM %.0f), bf16 %.0f GFLOP/s (%s, n=%lld); balance fp32 %.1f flop/B; "
      "%s clock; measured in %.1f s",
      read_gb_s, read_buffer_bytes / double(1 << 30), llc_bytes / double(1 << 20), threads, fp32_gflop_s, fma_gflop_s,
      fp32_gemm_gflop_s, bf16_gflop_s, bf16_kernel.c_str(), static_cast<long long>(bf16_size), balance(c10::kFloat),
      clock == LimitClock::kThreadCpu ? "thread CPU" : "wall", seconds);
}

std::string cpu_description() {
  const auto isa = tp::cpu::isa();
  return format(
      "cpu: %s; isa %s (TP_CPU_ISA=%s); features: %s; amx tiles %s (%s); ATen %s (ATEN_CPU_CAPABILITY=%s); "
      "ONEDNN_MAX_CPU_ISA=%s MKL_ENABLE_INSTRUCTIONS=%s; torch threads %d",
      machine_description().c_str(), tp::cpu::to_string(isa), env_or_dash("TP_CPU_ISA"),
      tp::cpu::features().describe().c_str(), tp::cpu::amx_status().usable ? "usable" : "not usable",
      tp::cpu::amx_status().why.c_str(), at::get_cpu_capability().c_str(), env_or_dash("ATEN_CPU_CAPABILITY"),
      env_or_dash("ONEDNN_MAX_CPU_ISA"), env_or_dash("MKL_ENABLE_INSTRUCTIONS"), at::get_num_threads());
}

MachineLimits measure_machine_limits(double seconds, LimitClock clock) {
  c10::InferenceMode inference;
  const double start = now_s();
  MachineLimits l;
  l.threads = at::get_num_threads();
  TORCH_CHECK(clock == LimitClock::kWall || l.threads == 1,
              "measure_machine_limits: the thread CPU clock needs 1 thread (another thread's time would not count)");
  l.clock = clock;
  const Timer timer = clock == LimitClock::kThreadCpu ? thread_cpu_s : now_s;
  l.llc_bytes = llc_size();
  const auto bw = measure_read_bandwidth(l.llc_bytes, 0.4 * seconds, timer);
  l.read_gb_s = bw.gb_s;
  l.read_buffer_bytes = bw.bytes;
  const double gemm_budget = 0.15 * seconds;  // per kernel and dtype: 4 of them
  for (const auto dtype : {c10::kFloat, c10::kBFloat16}) {
    double& rate = dtype == c10::kFloat ? l.fp32_gflop_s : l.bf16_gflop_s;
    std::string& kernel = dtype == c10::kFloat ? l.fp32_kernel : l.bf16_kernel;
    int64_t& size = dtype == c10::kFloat ? l.fp32_size : l.bf16_size;
    // ATen's oneDNN ops refuse bf16 where oneDNN has no bf16 path (AVX2 machines, or
    // ONEDNN_MAX_CPU_ISA=AVX2).
    static const bool onednn_bf16 =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_is_mkldnn_bf16_supported", "").typed<bool()>().call();
    for (const std::string k : {"at::mm", "onednn"}) {
      if (k == "onednn" && dtype == c10::kBFloat16 && !onednn_bf16) continue;
      const auto r = peak_rate(k, dtype, gemm_budget, timer);
      if (r.gflop_s > rate) rate = r.gflop_s, kernel = k, size = r.n;
    }
  }
  // A square GEMM on a shared 2-core VM varies by 1.5x between runs, and a layer's own
  // GEMM beat it (fractions above 100 %): float32 rows are held to the FMA ceiling
  // where that is higher, which no kernel can pass.
  l.fp32_gemm_gflop_s = l.fp32_gflop_s;
  l.fma_gflop_s = fma_ceiling(0.05 * seconds, timer);
  if (l.fma_gflop_s > l.fp32_gflop_s) l.fp32_gflop_s = l.fma_gflop_s, l.fp32_kernel = "FMA ceiling", l.fp32_size = 0;
  l.seconds = now_s() - start;
  return l;
}

LimitFraction limit_fraction(const MachineLimits& limits, double bytes, double flops, double seconds,
                             c10::ScalarType dtype) {
  LimitFraction f;
  if (!(seconds > 0.0) || limits.read_gb_s <= 0.0) return f;
  const double peak = limits.peak_gflop_s(dtype);
  const double t_mem = bytes / (limits.read_gb_s * 1e9);
  const double t_compute = peak > 0.0 ? flops / (peak * 1e9) : 0.0;
  if (t_mem >= t_compute) {
    f.fraction = t_mem / seconds;
    f.limit = "mem";
  } else {
    f.fraction = t_compute / seconds;
    f.limit = dtype == c10::kBFloat16 && limits.bf16_gflop_s >= limits.fp32_gflop_s ? "bf16" : "fp32";
  }
  return f;
}

std::string format_limit(const LimitFraction& f) {
  if (f.limit.empty()) return "-";
  return format("%.0f%% %s", 100.0 * f.fraction, f.limit.c_str());
}

}  // namespace tp::bench
