#pragma once
// tp-bench --backward: forward + backward of each layer (qkv, o, gate_up, down) and of
// the block, at each TP size, against the single-device reference (at::linear with
// autograd on the full weights), with the error of every gradient: the input's, the
// weights' and the biases' (every layer gets a bias here, so that its gradient is
// checked too: the column layers' split biases and the row layers' mirrored ones).
// Unquantized weights only (quantized weights are frozen).

#include <string>
#include <vector>

#include "layer_bench.h"

namespace tp::bench {

/// One row of the --backward table: a layer (or the block) at one setting.
struct BackwardResult {
  std::string row, dtype;
  int64_t tp = 1, tokens = 1;
  double reference_s = 0.0;   // median forward+backward on one device, all threads
  double tp_s = 0.0;          // median TP forward+backward, slowest rank per iteration
  double tp_forward_s = 0.0;  // median TP forward alone (same iterations' forwards), slowest rank
  // Worst rank's ||TP - reference|| / ||reference|| over its part (the block: worst layer).
  double y_err = 0.0, dx_err = 0.0, dw_err = 0.0, db_err = 0.0;
  bool suspicious = false;  // an error above the dtype's bound
  double ratio() const { return reference_s > 0 ? tp_s / reference_s : 0.0; }
};

/// Runs the --backward cases of `config` (format none; each dtype, TP size, M, row).
/// `launcher` as in run_bench; only rank 0 of a process launch returns results.
std::vector<BackwardResult> run_backward_bench(const BenchConfig& config, const RankLauncher& launcher = {});

/// The results of one dtype as a table.
std::string backward_table(const std::vector<BackwardResult>& rows);

/// Results as text lines and back (worker processes hand them over this way).
std::string serialize_backward(const std::vector<BackwardResult>& rows);
std::vector<BackwardResult> deserialize_backward(const std::string& text);

}  // namespace tp::bench
