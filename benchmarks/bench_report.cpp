#include "bench_report.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <tuple>

namespace tp::bench {

// ---- results as text lines (a worker process hands them to tp-bench this way) --------------

std::string serialize(const BenchResults& results) {
  std::ostringstream os;
  os.precision(17);
  for (const auto& r : results.rows) {
    os << "row\t" << r.row << "\t" << r.format << "\t" << r.dtype << "\t" << r.allreduce << "\t" << r.allreduce_taken
       << "\t" << r.tp << "\t" << r.tokens << "\t" << r.in_features << "\t" << r.out_features << "\t" << r.flops << "\t"
       << r.bytes << "\t" << r.max_abs_err << "\t" << r.rel_err << "\t" << r.reference_s << "\t" << r.tp_s << "\t"
       << r.gemm_s << "\t" << r.comm_s << "\t" << r.suspicious << "\t" << r.kernel << "\n";
  }
  for (const auto& l : results.loads) {
    os << "load\t" << l.format << "\t" << l.dtype << "\t" << l.checkpoint << "\t" << l.written << "\t" << l.write_s
       << "\t" << l.tp << "\t" << l.ranks << "\t" << l.load_s << "\t" << l.shard_bytes << "\t" << l.peak_rss_delta
       << "\n";
  }
  return os.str();
}

BenchResults deserialize(const std::string& text) {
  BenchResults results;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    std::string field;
    while (std::getline(fields, field, '\t')) f.push_back(field);
    if (!f.empty() && f[0] == "row" && f.size() == 20) {
      RowResult r;
      r.row = f[1], r.format = f[2], r.dtype = f[3], r.allreduce = f[4], r.allreduce_taken = f[5];
      r.tp = std::stoll(f[6]), r.tokens = std::stoll(f[7]), r.in_features = std::stoll(f[8]);
      r.out_features = std::stoll(f[9]), r.flops = std::stod(f[10]), r.bytes = std::stod(f[11]);
      r.max_abs_err = std::stod(f[12]), r.rel_err = std::stod(f[13]), r.reference_s = std::stod(f[14]);
      r.tp_s = std::stod(f[15]), r.gemm_s = std::stod(f[16]), r.comm_s = std::stod(f[17]), r.suspicious = f[18] == "1";
      r.kernel = f[19];
      results.rows.push_back(r);
    } else if (!f.empty() && f[0] == "load" && f.size() == 11) {
      LoadResult l;
      l.format = f[1], l.dtype = f[2], l.checkpoint = f[3], l.written = f[4] == "1", l.write_s = std::stod(f[5]);
      l.tp = std::stoll(f[6]), l.ranks = f[7], l.load_s = std::stod(f[8]), l.shard_bytes = std::stoll(f[9]);
      l.peak_rss_delta = std::stoll(f[10]);
      results.loads.push_back(l);
    } else {
      TORCH_CHECK(false, "tp-bench: malformed result line from a worker process: '", line, "'");
    }
  }
  return results;
}

// ---- output --------------------------------------------------------------------------------

std::string row_table(const std::vector<RowResult>& rows) {
  auto sorted = rows;
  auto order = [](const std::string& row) {
    return std::find(all_rows().begin(), all_rows().end(), row) - all_rows().begin();
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const RowResult& a, const RowResult& b) {
    return std::make_tuple(order(a.row), a.tp, a.tokens) < std::make_tuple(order(b.row), b.tp, b.tokens);
  });
  Table table({"row", "TP", "M", "max_abs_err", "rel_err", "ref ms", "TP ms", "GEMM ms", "comm ms", "TP/ref", "GB/s",
               "GFLOP/s", "limit", "allreduce", "kernel"});
  for (const auto& r : sorted) {
    table.add({r.row, std::to_string(r.tp), std::to_string(r.tokens), format("%.2e", r.max_abs_err),
               format("%.2e%s", r.rel_err, r.suspicious ? " !" : ""), format("%.3f", r.reference_s * 1e3),
               format("%.3f", r.tp_s * 1e3), format("%.3f", r.gemm_s * 1e3),
               r.allreduce_taken == "-" && r.comm_s == 0.0 ? std::string("-") : format("%.3f", r.comm_s * 1e3),
               format("%.3f", r.ratio()), format("%.1f", r.gbytes_per_s()), format("%.1f", r.gflops()),
               r.limit.empty() ? std::string("-") : format("%.0f%% %s", 100.0 * r.limit_fraction, r.limit.c_str()),
               r.allreduce_taken, r.kernel});
  }
  return table.str();
}

std::string load_table(const std::vector<LoadResult>& loads) {
  Table table({"format", "dtype", "TP", "ranks", "load s (slowest rank)", "shard MiB (largest rank)",
               "peak RSS growth MiB (largest process)", "checkpoint"});
  std::vector<std::string> paths;
  for (const auto& l : loads) {
    table.add({l.format, l.dtype, std::to_string(l.tp), l.ranks, format("%.3f", l.load_s),
               format("%.1f", l.shard_bytes / 1048576.0),
               l.peak_rss_delta < 0 ? std::string("n/a") : format("%.1f", l.peak_rss_delta / 1048576.0),
               l.written ? format("written (%.1f s)", l.write_s) : std::string("cached")});
    if (std::find(paths.begin(), paths.end(), l.checkpoint) == paths.end()) paths.push_back(l.checkpoint);
  }
  std::string out = table.str();
  for (const auto& p : paths) out += "checkpoint: " + p + "\n";
  return out;
}

std::string to_json(const BenchConfig& config, const BenchResults& results, const std::string& machine) {
  std::ostringstream os;
  const auto& s = config.shape;
  os << "{\n  \"settings\": {\"machine\": " << json_string(machine) << ", \"preset\": " << json_string(s.name)
     << ", \"hidden\": " << s.hidden << ", \"intermediate\": " << s.intermediate << ", \"heads\": " << s.heads
     << ", \"kv_heads\": " << s.kv_heads << ", \"head_dim\": " << s.head_dim
     << ", \"device\": " << json_string(config.device.str())
     << ", \"ranks\": " << json_string(config.ranks_are_processes ? "processes" : "threads")
     << ", \"intra_op_threads\": " << at::get_num_threads()
     << ", \"verify_calls\": " << (config.verify_calls ? "true" : "false")
     << ", \"block\": " << json_string(block_description()) << "},\n  \"loads\": [";
  for (size_t i = 0; i < results.loads.size(); ++i) {
    const auto& l = results.loads[i];
    os << (i ? ",\n" : "\n") << "    {\"format\": " << json_string(l.format) << ", \"dtype\": " << json_string(l.dtype)
       << ", \"tp\": " << l.tp << ", \"ranks\": " << json_string(l.ranks) << ", \"load_s\": " << l.load_s
       << ", \"shard_bytes\": " << l.shard_bytes << ", \"peak_rss_delta_bytes\": " << l.peak_rss_delta
       << ", \"checkpoint\": " << json_string(l.checkpoint) << ", \"written\": " << (l.written ? "true" : "false")
       << "}";
  }
  os << "\n  ],\n  \"results\": [";
  for (size_t i = 0; i < results.rows.size(); ++i) {
    const auto& r = results.rows[i];
    os << (i ? ",\n" : "\n") << "    {\"row\": " << json_string(r.row) << ", \"format\": " << json_string(r.format)
       << ", \"dtype\": " << json_string(r.dtype) << ", \"allreduce\": " << json_string(r.allreduce)
       << ", \"allreduce_taken\": " << json_string(r.allreduce_taken) << ", \"tp\": " << r.tp << ", \"m\": " << r.tokens
       << ", \"in_features\": " << r.in_features << ", \"out_features\": " << r.out_features
       << ", \"flops\": " << r.flops << ", \"bytes\": " << r.bytes << ", \"max_abs_err\": " << r.max_abs_err
       << ", \"rel_err\": " << r.rel_err << ", \"ref_ms\": " << r.reference_s * 1e3 << ", \"tp_ms\": " << r.tp_s * 1e3
       << ", \"gemm_ms\": " << r.gemm_s * 1e3 << ", \"comm_ms\": " << r.comm_s * 1e3 << ", \"ratio\": " << r.ratio()
       << ", \"gb_per_s\": " << r.gbytes_per_s() << ", \"gflop_per_s\": " << r.gflops()
       << ", \"limit_fraction\": " << r.limit_fraction << ", \"limit\": " << json_string(r.limit)
       << ", \"kernel\": " << json_string(r.kernel) << ", \"suspicious\": " << (r.suspicious ? "true" : "false") << "}";
  }
  os << "\n  ]\n}\n";
  return os.str();
}

std::string to_csv(const BenchConfig& config, const BenchResults& results) {
  std::ostringstream os;
  os << "preset,device,row,format,dtype,allreduce,allreduce_taken,tp,m,in_features,out_features,flops,bytes,"
        "max_abs_err,rel_err,ref_ms,tp_ms,gemm_ms,comm_ms,ratio,gb_per_s,gflop_per_s,limit_fraction,limit,kernel\n";
  for (const auto& r : results.rows) {
    os << config.shape.name << "," << config.device.str() << "," << r.row << "," << r.format << "," << r.dtype << ","
       << r.allreduce << "," << r.allreduce_taken << "," << r.tp << "," << r.tokens << "," << r.in_features << ","
       << r.out_features << "," << r.flops << "," << r.bytes << "," << r.max_abs_err << "," << r.rel_err << ","
       << r.reference_s * 1e3 << "," << r.tp_s * 1e3 << "," << r.gemm_s * 1e3 << "," << r.comm_s * 1e3 << ","
       << r.ratio() << "," << r.gbytes_per_s() << "," << r.gflops() << "," << r.limit_fraction << "," << r.limit << ","
       << r.kernel << "\n";
  }
  return os.str();
}

}  // namespace tp::bench
