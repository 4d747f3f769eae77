#pragma once
// tp-bench --rows numerics: invariant numerics' cost (tp/layers/numerics/numerics.h), side by side.
//
// For each dtype, TP size and M, every rank builds the block's four layers twice from the
// same checkpoint, once with numerics=default and once with numerics=invariant, and times
// each row (qkv, o, gate_up, down and the block qkv -> o -> gate_up -> down) in
// alternating rounds of the two (medians after warm-up, each rank its own, the slowest
// rank reported). The ratio invariant / default is the mode's cost; "bits" says whether
// the invariant block's output equals the TP 1 output bit for bit (it must).

#include "layer_bench.h"

namespace tp::bench {

/// Runs the rows for config.tp_sizes x config.tokens x config.dtypes (format none, CPU,
/// ranks as threads); prints the table. Returns 1 when an invariant output's bits differ
/// from TP 1's, else 0.
int run_numerics_rows(const BenchConfig& config);

}  // namespace tp::bench
