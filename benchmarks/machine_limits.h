#pragma once
// The machine's limits for the CPU benchmarks, measured at start-up in about 1-2 s:
// the read bandwidth with all threads (a streaming sum over a buffer several times the
// last-level cache) and the peak float32 and bfloat16 rates (the best of at::mm and
// oneDNN on a large square GEMM; for float32 also the FMA ceiling of tp::cpu::isa()'s
// vectors, when higher). Each benchmark row then reports the fraction of
// the limit that binds it, roofline style:
//
//   t_min = max(bytes / bandwidth, flops / peak)        fraction = t_min / t
//
// so a row whose arithmetic intensity (flops / bytes) is below the machine's balance
// (peak / bandwidth) is held to the bandwidth ("mem": achieved GB/s / read GB/s), and
// one above it to the GEMM peak ("fp32" / "bf16": achieved GFLOP/s / peak GFLOP/s).
//
//   const auto limits = tp::bench::measure_machine_limits();
//   std::printf("%s\n", limits.describe().c_str());
//   const auto f = tp::bench::limit_fraction(limits, weight_bytes, flops, seconds, at::kFloat);
//   // f.fraction = 0.87, f.limit = "mem"  ->  format_limit(f) == "87% mem"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace tp::bench {

/// What the limits are timed by. kThreadCpu (1 thread only): the calling thread's CPU
/// time, so the other tenants of a shared machine that preempt it do not count (their
/// use of memory bandwidth still does); for benchmarks that time their rows the same way.
enum class LimitClock { kWall, kThreadCpu };

/// What this machine can do at most, measured once.
struct MachineLimits {
  int threads = 1;                 ///< at::get_num_threads() during the measurement
  double read_gb_s = 0.0;          ///< streaming read, all threads, best pass (1e9 bytes / s)
  int64_t read_buffer_bytes = 0;   ///< the buffer it streamed (>= 4x the LLC)
  int64_t llc_bytes = 0;           ///< last-level cache size from sysfs (0: unknown)
  double fp32_gflop_s = 0.0;       ///< the float32 peak: the higher of the two below
  std::string fp32_kernel;         ///< which one set it: "at::mm", "onednn" or "FMA ceiling"
  int64_t fp32_size = 0;           ///< n of the n x n x n GEMM (0: the FMA ceiling)
  double fp32_gemm_gflop_s = 0.0;  ///< best float32 square GEMM, of at::mm and oneDNN
  double fma_gflop_s = 0.0;        ///< vector FMAs per second x 2 x lanes, all threads (tp::cpu::isa())
  double bf16_gflop_s = 0.0;       ///< peak bfloat16 GEMM (at::mm / oneDNN in bf16)
  std::string bf16_kernel;
  int64_t bf16_size = 0;
  double seconds = 0.0;                  ///< how long measuring took (wall)
  LimitClock clock = LimitClock::kWall;  ///< what the rates were timed by

  /// The GEMM peak a row in `dtype` is held to. bfloat16: the better of the bf16 and
  /// fp32 peaks (a bf16 GEMM can always be run in fp32 after an exact conversion).
  double peak_gflop_s(c10::ScalarType dtype) const;
  /// Machine balance for `dtype`: the flop per byte where the two limits meet.
  double balance(c10::ScalarType dtype) const { return peak_gflop_s(dtype) / read_gb_s; }
  /// One line of limits: "limits: read 12.3 GB/s (1.2 GiB, 2 threads), fp32 GEMM ...".
  std::string describe() const;
};

/// "cpu: Intel(R) Xeon(R) Processor, 2 hardware threads; isa avx512 (TP_CPU_ISA=-);
/// features: avx2 fma ...; ATen AVX512; ATEN_CPU_CAPABILITY=- ONEDNN_MAX_CPU_ISA=- ...".
std::string cpu_description();

/// Measures the limits with the current thread count, spending about `seconds` (the
/// bandwidth buffer's first touch included), timed by `clock`.
MachineLimits measure_machine_limits(double seconds = 1.5, LimitClock clock = LimitClock::kWall);

/// The binding limit of one row and how close the row came to it.
struct LimitFraction {
  double fraction = 0.0;  ///< t_min / t: 1.0 is at the limit
  std::string limit;      ///< "mem", "fp32" or "bf16"
};

/// For a row that read `bytes` (weights as stored, plus activations if the caller
/// counts them) and did `flops` in `seconds`, in `dtype` (the GEMM's compute dtype).
LimitFraction limit_fraction(const MachineLimits& limits, double bytes, double flops, double seconds,
                             c10::ScalarType dtype);

/// "87% mem"; "-" for a row without time.
std::string format_limit(const LimitFraction& f);

}  // namespace tp::bench
