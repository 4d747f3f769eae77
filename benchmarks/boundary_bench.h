#pragma once
// The layer boundary's table (tp-allreduce-bench --boundary, tp-bench --rows boundary):
// per token count and CPU strategy, the bare all-reduce of a row layer's partial sums
// [M, hidden], the unfused boundary as the layers ran it before the fusion (all-reduce,
// then residual add, RMSNorm and the optional per-token quantization as tensor
// operations) and Communicator::all_reduce_fusion doing all of it in one collective.

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/communicator.h"

namespace tp::bench {

struct BoundaryConfig {
  int64_t hidden = 4096;
  std::vector<int64_t> tokens = {1, 16, 256};
  c10::ScalarType dtype = c10::kBFloat16;
  AllReduceFusionQuant quant = AllReduceFusionQuant::kNone;
  int64_t repeat = 5;  // whole runs of the table: medians of their medians, and their range
};

/// What the table's numbers are (one paragraph, for the header).
std::string boundary_legend(const BoundaryConfig& c);

/// Every rank calls it; the table (the slowest rank's numbers) is the same on every rank.
std::string boundary_table(Communicator& comm, const BoundaryConfig& c);

/// tp-bench --rows boundary: the table of `base` for each dtype at each TP size > 1 (ranks
/// as threads, one intra-op thread each), with the machine and the load around it. `shape`
/// names the preset the hidden size came from.
int run_boundary_rows(const std::string& shape, BoundaryConfig base, const std::vector<int64_t>& tp_sizes,
                      const std::vector<c10::ScalarType>& dtypes, bool verify_calls);

}  // namespace tp::bench
