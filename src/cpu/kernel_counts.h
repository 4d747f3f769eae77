#pragma once
// Which kernels ran: a process-wide count of calls per kernel name, which the CPU
// kernels bump and the benchmarks diff around a row to print its "kernel" column
// (as they diff Communicator::all_reduce_counts for the AllReduce strategy).

#include <cstdint>
#include <map>
#include <string>

namespace tp::cpu {

/// Counts one call of the kernel `name` ("gemv/avx512", "onednn", ...). Thread-safe.
void count_kernel(const std::string& name);

/// Calls per kernel name since the process started.
std::map<std::string, int64_t> kernel_counts();

/// The names whose counts grew from `before` to `after`, '+'-joined in name order
/// ("gemv/avx2+onednn"); "-" when none did.
std::string kernels_between(const std::map<std::string, int64_t>& before, const std::map<std::string, int64_t>& after);

}  // namespace tp::cpu
