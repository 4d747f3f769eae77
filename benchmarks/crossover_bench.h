#pragma once
// tp-cpu-gemm-bench --crossovers: the quantized kernels' crossovers (src/cpu/crossovers.h)
// timed on this machine, both sides through a bf16 layer's own forward (crossover_bench.cpp).

#include <cstdint>
#include <vector>

#include "cpu/dense/table.h"

namespace tp::bench {

/// For each crossover that changes a kernel on this machine (vendor, cpu::isa()): the
/// formats it governs as ColumnParallelLinear layers of [n, k] in bfloat16, timed at each
/// of `ms` with the crossover forced to 1 (the GEMM at every M) and past the largest M (the
/// kernels below it), alternating, `seconds` per side. The entry's min_m is the smallest M
/// from which the GEMM side is no slower at every larger M measured (the summed medians);
/// its measured_ms holds both sides per M. Prints a table as it goes; crossovers that
/// change nothing here are reported and left out.
std::vector<cpu::CrossoverEntry> measure_crossovers(int64_t n, int64_t k, double seconds);

}  // namespace tp::bench
