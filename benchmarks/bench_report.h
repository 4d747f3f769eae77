#pragma once
// tp-bench's results as text: the tables it prints, JSON and CSV files, and the lines
// a worker process hands its results back in.

#include <string>
#include <vector>

#include "layer_bench.h"

namespace tp::bench {

/// Results as text lines and back (a worker process hands its results over this way).
std::string serialize(const BenchResults& results);
BenchResults deserialize(const std::string& text);

/// The rows of one (format, dtype, allreduce) setting as a table.
std::string row_table(const std::vector<RowResult>& rows);
/// The loads as a table.
std::string load_table(const std::vector<LoadResult>& loads);
/// Everything as JSON ({"settings": {...}, "loads": [...], "results": [...]}), and the
/// rows as CSV (one header line).
std::string to_json(const BenchConfig& config, const BenchResults& results, const std::string& machine);
std::string to_csv(const BenchConfig& config, const BenchResults& results);

}  // namespace tp::bench
