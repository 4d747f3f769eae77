#pragma once
// Private: the row counts from which a quantized layer's CPU kernels change, other than a
// dense backend's (cpu/dense/table.h): below a crossover the format's rows / GEMV kernels
// (one streaming pass over the weight), from it a GEMM that amortizes the weight's decode
// over the rows of x. Data, as the dense backends' rules are: rows of the same CPU GEMM
// table (TP_CPU_GEMM_TABLE), per vendor and ISA, measured on the machine at hand by
// `tp-cpu-gemm-bench --crossovers --tune FILE`; the built-in values are
// benchmarks/RESULTS.md's (2026-12-07, issue 47).

#include <cstdint>
#include <string>

namespace tp::cpu {

enum class Crossover {
  /// bf16 layers of the weight-only formats (INT4, INT8, FP8, MXFP4) on AVX-512 bf16 dot
  /// products, where the CPU has avx512_bf16 and no usable AMX (cpu/bf16_dot.h).
  kBf16Dot,
  /// W8A8 on AVX512_VNNI: the panel kernel instead of the dot-product tiles
  /// (quant/int8/w8a8_kernels.h).
  kW8a8Panels,
};
inline constexpr int kCrossoverCount = 2;

/// "bf16_dot", "w8a8_panels": the table's spelling.
const char* to_string(Crossover c);

/// Parses the names above; c10::ValueError naming the valid ones otherwise.
Crossover parse_crossover(const std::string& name);

/// The fewest rows of x that take `c`'s kernel on this machine: the ScopedCrossover in
/// force, else the active table's value for this vendor and cpu::isa() (read once).
int64_t crossover_min_m(Crossover c);

/// While alive, crossover_min_m(c) is `min_m` in this process (benchmarks time both sides
/// of a crossover through a layer's own forward). Not for concurrent use with itself.
class ScopedCrossover {
 public:
  ScopedCrossover(Crossover c, int64_t min_m);
  ~ScopedCrossover();
  ScopedCrossover(const ScopedCrossover&) = delete;
  ScopedCrossover& operator=(const ScopedCrossover&) = delete;

 private:
  Crossover c_;
  int64_t previous_;
};

}  // namespace tp::cpu
