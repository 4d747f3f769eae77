// tp-allreduce-bench: all_reduce latency per strategy vs message size, against the
// process group (Gloo), and the calibration that writes a tuning table for kAuto.
//
//   tp-allreduce-bench                            # ranks as threads, world 2 and 4, 1 KiB .. 64 MiB float32
//   tp-allreduce-bench --world 2 --max-kib 1024 --verify 1
//   # ranks as processes: one per process, torchrun's variables
//   for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 tp-allreduce-bench --from-env 1 & done
//   # calibration: time every strategy on this group and write (or update) a table
//   for r in 0 1; do RANK=$r ... tp-allreduce-bench --from-env 1 --tune allreduce.json & done
//   TP_ALLREDUCE_TABLE=allreduce.json my_program     # kAuto now reads it
//   # the layer boundary: bare all-reduce vs all-reduce + residual + RMSNorm (+ quant) vs all_reduce_fusion
//   tp-allreduce-bench --boundary 1 --world 2,3,4 --hidden 4096 --tokens 1,16,256 --repeat 5
//
// Latency: each rank's median time per call after warm-up, then the maximum over
// ranks (a collective is as slow as its slowest rank; every rank gets the same
// numbers, so with --tune all ranks would pick the same strategies). ratio x = Gloo
// time / strategy time (above 1: faster than Gloo). verify_calls is off by default so
// the table shows the algorithms themselves; --verify 1 adds the per-call fingerprint
// exchange a communicator does by default.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "boundary_bench.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/all_reduce_table.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"

using namespace tp::bench;
using tp::AllReduceStrategy;

namespace {

const char* kUsage = R"(usage: tp-allreduce-bench [options]
  --world LIST     ranks (threads of this process)              (default 2,4)
  --min-kib N      smallest message, KiB                         (default 1)
  --max-kib N      largest message, KiB                          (default 65536)
  --step N         each size is N times the previous one         (default 4)
  --wire W         native or bf16 (float32 data travels as bf16) (default native)
  --verify 0|1     exchange call fingerprints before each call   (default 0)
  --from-env 0|1   this process is one rank (RANK, WORLD_SIZE, MASTER_ADDR,
                   MASTER_PORT), instead of --world ranks as threads (default 0)
  --reduce-scatter 0|1  instead: reduce_scatter (each rank gets 1/world, uneven
                   when world does not divide it) against all_reduce of the same
                   tensor, both taking the communicator's strategy (--strategy)
  --strategy S     the communicator's default strategy (CommunicatorOptions::
                   all_reduce), for --reduce-scatter    (default auto)
  --boundary 0|1   instead: the layer boundary per strategy - the bare all_reduce,
                   the unfused boundary (all_reduce, then residual add, RMSNorm and
                   the quantization as separate tensor operations) and
                   all_reduce_fusion (into preallocated outputs) - at --hidden,
                   --tokens, --dtype, --quant, each
                   timed --repeat times (the spread across repeats is shown)
  --hidden N       the boundary's hidden size                  (default 4096)
  --tokens LIST    the boundary's token counts                 (default 1,16,256)
  --dtype D        the boundary's dtype: bf16 or f32           (default bf16)
  --quant Q        the boundary's quantization: none, fp8, int8 (default none)
  --repeat N       the boundary's repeated runs                (default 5)
  --tune FILE      calibrate: write the fastest strategy per size for this group
                   into FILE (a tuning table; an existing FILE keeps its entries for
                   other world sizes / topologies). Load it with TP_ALLREDUCE_TABLE=FILE
                   or CommunicatorOptions::all_reduce_table.
  --help
)";

struct Config {
  std::vector<int64_t> worlds = {2, 4};
  int64_t min_kib = 1;
  int64_t max_kib = 64 * 1024;
  int64_t step = 4;
  tp::WirePrecision wire = tp::WirePrecision::kNative;
  bool verify = false;
  bool from_env = false;
  std::string tune;
  bool reduce_scatter = false;
  AllReduceStrategy strategy = AllReduceStrategy::kAuto;
  bool boundary = false;
  int64_t hidden = 4096;
  std::vector<int64_t> tokens = {1, 16, 256};
  at::ScalarType dtype = at::kBFloat16;
  tp::AllReduceFusionQuant quant = tp::AllReduceFusionQuant::kNone;
  int64_t repeat = 5;
};

const std::vector<AllReduceStrategy> kStrategies = {
    AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling, AllReduceStrategy::kSharedMemoryOneShot,
    AllReduceStrategy::kSharedMemoryTwoShot, AllReduceStrategy::kAuto};

bool is_shm(AllReduceStrategy s) {
  return s == AllReduceStrategy::kSharedMemoryOneShot || s == AllReduceStrategy::kSharedMemoryTwoShot;
}

/// Seconds per call (max over ranks of each rank's median) per message size and
/// strategy; NaN where the strategy cannot run (shared memory across hosts). And what
/// auto took.
struct Measured {
  int64_t world = 0;
  bool same_host = false;
  std::map<int64_t, std::map<AllReduceStrategy, double>> seconds;
  std::map<int64_t, std::string> auto_took;
};

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

Config parse_args(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-allreduce-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    if (flag == "--world")
      c.worlds = parse_list(value);
    else if (flag == "--min-kib")
      c.min_kib = std::stoll(value);
    else if (flag == "--max-kib")
      c.max_kib = std::stoll(value);
    else if (flag == "--step")
      c.step = std::stoll(value);
    else if (flag == "--wire")
      c.wire = tp::parse_wire_precision(value);
    else if (flag == "--verify")
      c.verify = value == "1";
    else if (flag == "--from-env")
      c.from_env = value == "1";
    else if (flag == "--reduce-scatter")
      c.reduce_scatter = value == "1";
    else if (flag == "--strategy")
      c.strategy = tp::parse_all_reduce_strategy(value);
    else if (flag == "--tune")
      c.tune = value;
    else if (flag == "--boundary")
      c.boundary = value == "1";
    else if (flag == "--hidden")
      c.hidden = std::stoll(value);
    else if (flag == "--tokens")
      c.tokens = parse_list(value);
    else if (flag == "--dtype")
      c.dtype = value == "f32" ? at::kFloat : at::kBFloat16;
    else if (flag == "--quant")
      c.quant = value == "fp8"    ? tp::AllReduceFusionQuant::kFp8PerToken
                : value == "int8" ? tp::AllReduceFusionQuant::kInt8PerToken
                                  : tp::AllReduceFusionQuant::kNone;
    else if (flag == "--repeat")
      c.repeat = std::stoll(value);
    else
      TORCH_CHECK_VALUE(false, "tp-allreduce-bench: unknown option ", flag, "\n", kUsage);
  }
  TORCH_CHECK_VALUE(c.min_kib >= 1 && c.max_kib >= c.min_kib, "tp-allreduce-bench: need 1 <= --min-kib <= --max-kib");
  TORCH_CHECK_VALUE(c.step >= 2, "tp-allreduce-bench: --step ", c.step, " must be at least 2");
  TORCH_CHECK_VALUE(c.wire != tp::WirePrecision::kDefault, "tp-allreduce-bench: --wire must be native or bf16");
  return c;
}

std::string human(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::string micros(double seconds) { return std::isnan(seconds) ? "-" : format("%.1f", seconds * 1e6); }
std::string ratio(double a, double b) { return std::isnan(a) || std::isnan(b) ? "-" : format("%.1f", a / b); }

/// Every rank makes the same calls; all ranks end with the same Measured.
Measured measure(tp::Communicator& comm, const std::vector<int64_t>& sizes, tp::WirePrecision wire) {
  Measured out;
  out.world = comm.world_size();
  out.same_host = comm.ranks_on_one_host();
  std::vector<double> mine;  // [size][strategy], this rank's medians
  for (int64_t bytes : sizes) {
    at::Tensor t = at::ones({bytes / 4}, at::kFloat);
    // The same count on every rank (they must make the same calls): fewer for big messages.
    const int64_t iters = std::max<int64_t>(5, std::min<int64_t>(200, (int64_t{32} << 20) / bytes));
    for (auto strategy : kStrategies) {
      if (is_shm(strategy) && !out.same_host) {
        mine.push_back(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      const auto before = comm.all_reduce_counts();
      for (int w = 0; w < 3; ++w) comm.all_reduce(t, strategy, wire);
      std::vector<double> times;
      for (int64_t i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        comm.all_reduce(t, strategy, wire);
        times.push_back(seconds_since(t0));
      }
      t.fill_(1);  // keep the values small: every call multiplies them by world
      mine.push_back(median(times));
      if (strategy != AllReduceStrategy::kAuto) continue;
      for (const auto& [s, n] : comm.all_reduce_counts()) {
        const auto it = before.find(s);
        if (n != (it == before.end() ? 0 : it->second)) out.auto_took[bytes] = tp::to_string(s);
      }
    }
  }
  // The slowest rank's median, agreed by all ranks.
  const at::Tensor local = at::tensor(mine, at::kDouble).view({1, -1});
  const at::Tensor all = comm.all_gather(local, 0, std::vector<int64_t>(comm.world_size(), 1));
  const at::Tensor worst = std::get<0>(all.max(0));
  size_t i = 0;
  for (int64_t bytes : sizes) {
    for (auto strategy : kStrategies) out.seconds[bytes][strategy] = worst[static_cast<int64_t>(i++)].item<double>();
  }
  return out;
}

/// reduce_scatter against all_reduce of the same float32 tensor, per size: the
/// slowest rank's median of each, and what the strategy took. Bytes each rank
/// receives (a model, for the shared-memory and ring-like paths): all_reduce
/// (world - 1) x the tensor in one-shot, reduce_scatter (world - 1) x its piece.
std::string reduce_scatter_table(tp::Communicator& comm, const std::vector<int64_t>& sizes) {
  const int64_t world = comm.world_size();
  std::vector<double> mine;
  std::vector<std::string> took;
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    std::vector<int64_t> pieces(world, n / world);
    for (int64_t r = 0; r < n % world; ++r) ++pieces[r];
    at::Tensor t = at::rand({n}, at::kFloat);
    const int64_t iters = std::max<int64_t>(5, std::min<int64_t>(100, (int64_t{32} << 20) / bytes));
    const auto before = comm.all_reduce_counts();
    for (int w = 0; w < 3; ++w) comm.reduce_scatter(t, 0, pieces);
    for (const auto& [s, count] : comm.all_reduce_counts()) {
      const auto it = before.find(s);
      if (count != (it == before.end() ? 0 : it->second)) took.push_back(tp::to_string(s));
    }
    std::vector<double> ar, rs;
    for (int64_t i = 0; i < iters; ++i) {  // interleaved, so both see the same machine
      at::Tensor copy = t.clone();
      auto t0 = std::chrono::steady_clock::now();
      comm.all_reduce(copy);
      ar.push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      comm.reduce_scatter(t, 0, pieces);
      rs.push_back(seconds_since(t0));
    }
    mine.push_back(median(ar));
    mine.push_back(median(rs));
  }
  const at::Tensor local = at::tensor(mine, at::kDouble).view({1, -1});
  const at::Tensor worst = std::get<0>(comm.all_gather(local, 0, std::vector<int64_t>(world, 1)).max(0));
  Table table({"world", "bytes", "took", "all_reduce us", "reduce_scatter us", "rs x", "AR recv/rank", "RS recv/rank"});
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double ar = worst[static_cast<int64_t>(2 * i)].item<double>();
    const double rs = worst[static_cast<int64_t>(2 * i + 1)].item<double>();
    table.add({std::to_string(world), human(sizes[i]), i < took.size() ? took[i] : "?", micros(ar), micros(rs),
               ratio(ar, rs), human((world - 1) * sizes[i]), human((world - 1) * sizes[i] / world)});
  }
  return table.str();
}

std::string table(const std::vector<int64_t>& sizes, Measured& r) {
  Table table({"world", "bytes", "process_group us", "recursive_doubling us", "shm_one_shot us", "shm_two_shot us",
               "auto us", "auto took", "rd x", "one_shot x", "two_shot x", "auto x"});
  for (int64_t bytes : sizes) {
    auto& m = r.seconds[bytes];
    const double pg = m[AllReduceStrategy::kProcessGroup];
    table.add({std::to_string(r.world), human(bytes), micros(pg), micros(m[AllReduceStrategy::kRecursiveDoubling]),
               micros(m[AllReduceStrategy::kSharedMemoryOneShot]), micros(m[AllReduceStrategy::kSharedMemoryTwoShot]),
               micros(m[AllReduceStrategy::kAuto]), r.auto_took[bytes],
               ratio(pg, m[AllReduceStrategy::kRecursiveDoubling]),
               ratio(pg, m[AllReduceStrategy::kSharedMemoryOneShot]),
               ratio(pg, m[AllReduceStrategy::kSharedMemoryTwoShot]), ratio(pg, m[AllReduceStrategy::kAuto])});
  }
  return table.str();
}

/// The tuning-table entry for the measured group: per size the fastest strategy
/// (auto excluded); a rule ends halfway (geometrically) to the next size where
/// another strategy wins. Every rank computes the same entry from the same numbers.
tp::AllReduceTableEntry tuned_entry(const std::vector<int64_t>& sizes, const Measured& r) {
  tp::AllReduceTableEntry e;
  e.world_size = r.world;
  e.same_host = r.same_host;
  std::vector<AllReduceStrategy> best;
  for (int64_t bytes : sizes) {
    AllReduceStrategy winner = AllReduceStrategy::kProcessGroup;
    double fastest = std::numeric_limits<double>::infinity();
    for (auto strategy : kStrategies) {
      if (strategy == AllReduceStrategy::kAuto) continue;
      const double s = r.seconds.at(bytes).at(strategy);
      if (!std::isnan(s) && s < fastest) {
        fastest = s;
        winner = strategy;
      }
    }
    best.push_back(winner);
    std::map<std::string, double> us;
    for (auto strategy : kStrategies) {
      const double s = r.seconds.at(bytes).at(strategy);
      if (!std::isnan(s) && strategy != AllReduceStrategy::kAuto) us[tp::to_string(strategy)] = s * 1e6;
    }
    e.measured_us[bytes] = us;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i + 1 < sizes.size() && best[i + 1] == best[i]) continue;
    const int64_t limit =
        i + 1 < sizes.size() ? static_cast<int64_t>(std::sqrt(static_cast<double>(sizes[i]) * sizes[i + 1])) : -1;
    e.rules.push_back({limit, best[i]});
  }
  return e;
}

/// Adds (or replaces) `entry` in the table at `path` (created if absent) and writes it.
void write_tuned(const std::string& path, const tp::AllReduceTableEntry& entry) {
  tp::AllReduceTable table;
  table.entries.clear();
  if (std::ifstream(path).good()) table = tp::AllReduceTable::load(path);
  table.source = path;
  bool replaced = false;
  for (auto& e : table.entries) {
    if (e.device == entry.device && e.world_size == entry.world_size && e.same_host == entry.same_host) {
      e = entry;
      replaced = true;
    }
  }
  if (!replaced) table.entries.push_back(entry);
  table.validate();
  std::ofstream out(path);
  out << table.to_json("written by tp-allreduce-bench --tune");
  TORCH_CHECK(out.good(), "tp-allreduce-bench: could not write the table to ", path);
  std::cout << "tp-allreduce-bench: wrote the entry for world_size " << entry.world_size << ", same_host "
            << (entry.same_host ? "true" : "false") << " to " << path << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config config = parse_args(argc, argv);
    std::vector<int64_t> sizes;
    for (int64_t kib = config.min_kib; kib <= config.max_kib; kib *= config.step) sizes.push_back(kib << 10);
    tp::CommunicatorOptions options;
    options.verify_calls = config.verify;
    options.all_reduce = config.strategy;
    if (config.boundary) {
      BoundaryConfig b;
      b.hidden = config.hidden;
      b.tokens = config.tokens;
      b.dtype = config.dtype;
      b.quant = config.quant;
      b.repeat = config.repeat;
      std::cout << "tp-allreduce-bench --boundary: " << boundary_legend(b) << "\n" << std::flush;
      auto run = [&](tp::Communicator& comm) {
        const std::string text = boundary_table(comm, b);
        if (comm.rank() == 0) std::cout << "\n" << text << std::flush;
      };
      if (config.from_env) {
        tp::Communicator comm = tp::communicator_from_env(options);
        run(comm);
        comm.barrier();
      } else {
        for (int64_t world : config.worlds) tp::run_ranks_in_threads(world, run, options);
      }
      return 0;
    }
    if (config.reduce_scatter) {
      std::cout << "tp-allreduce-bench --reduce-scatter: float32, strategy " << tp::to_string(config.strategy)
                << ", verify_calls=" << (config.verify ? "1" : "0")
                << "; us per call = max over ranks of each rank's median, the two calls interleaved\n";
      auto run = [&](tp::Communicator& comm) {
        const std::string text = reduce_scatter_table(comm, sizes);
        if (comm.rank() == 0) std::cout << "\n" << text << std::flush;
      };
      if (config.from_env) {
        tp::Communicator comm = tp::communicator_from_env(options);
        run(comm);
        comm.barrier();
      } else {
        for (int64_t world : config.worlds) tp::run_ranks_in_threads(world, run, options);
      }
      return 0;
    }
    const std::string what = std::string("float32 all_reduce, wire ") + tp::to_string(config.wire) +
                             ", verify_calls=" + (config.verify ? "1" : "0") +
                             "; us per call = max over ranks of each rank's median";
    if (config.from_env) {
      tp::Communicator comm = tp::communicator_from_env(options);
      Measured measured = measure(comm, sizes, config.wire);
      comm.barrier();
      if (comm.rank() == 0) {
        std::cout << "tp-allreduce-bench: " << what
                  << "; ranks as processes (ranks_on_one_host=" << comm.ranks_on_one_host() << ")\n\n"
                  << table(sizes, measured) << std::flush;
        if (!config.tune.empty()) write_tuned(config.tune, tuned_entry(sizes, measured));
      }
      comm.barrier();
      return 0;
    }
    std::cout << "tp-allreduce-bench: " << what << "; ranks as threads\n" << std::flush;
    for (int64_t world : config.worlds) {
      Measured measured;
      tp::run_ranks_in_threads(
          world,
          [&](tp::Communicator& comm) {
            Measured m = measure(comm, sizes, config.wire);
            if (comm.rank() == 0) measured = std::move(m);
          },
          options);
      std::cout << "\n" << table(sizes, measured) << std::flush;
      if (!config.tune.empty()) write_tuned(config.tune, tuned_entry(sizes, measured));
    }
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
