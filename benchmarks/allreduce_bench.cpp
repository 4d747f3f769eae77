// tp-allreduce-bench: all_reduce latency per strategy vs message size, ranks as
// threads of this process (all on one host), against the process group (Gloo).
//
//   tp-allreduce-bench                            # world 2 and 4, 1 KiB .. 64 MiB float32
//   tp-allreduce-bench --world 2 --max-kib 1024 --verify 1
//   # ranks as processes: one per process, torchrun's variables, a loopback address
//   for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 tp-allreduce-bench --from-env 1 & done
//
// Latency is rank 0's median time per call after warm-up; ratio = Gloo / strategy
// (above 1: faster than Gloo). verify_calls is off by default so the table shows the
// algorithms themselves; --verify 1 adds the per-call fingerprint exchange (a Gloo
// allgather) that a communicator does by default.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"

using namespace tp::bench;
using tp::AllReduceStrategy;

namespace {

const char* kUsage = R"(usage: tp-allreduce-bench [options]
  --world LIST     ranks (threads of this process)              (default 2,4)
  --min-kib N      smallest message, KiB; sizes go up by 4x      (default 1)
  --max-kib N      largest message, KiB                          (default 65536)
  --verify 0|1     exchange call fingerprints before each call   (default 0)
  --from-env 0|1   this process is one rank (RANK, WORLD_SIZE, MASTER_ADDR,
                   MASTER_PORT), instead of --world ranks as threads (default 0)
  --help
)";

struct Config {
  std::vector<int64_t> worlds = {2, 4};
  int64_t min_kib = 1;
  int64_t max_kib = 64 * 1024;
  bool verify = false;
  bool from_env = false;
};

/// Rank 0's median seconds per call, per message size and strategy, and what auto took.
struct Measured {
  std::map<int64_t, std::map<AllReduceStrategy, double>> median_s;
  std::map<int64_t, std::string> auto_took;
};

const std::vector<AllReduceStrategy> kStrategies = {
    AllReduceStrategy::kProcessGroup, AllReduceStrategy::kSharedMemoryOneShot,
    AllReduceStrategy::kSharedMemoryTwoShot, AllReduceStrategy::kAuto};

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
    if (flag == "--world") c.worlds = parse_list(value);
    else if (flag == "--min-kib") c.min_kib = std::stoll(value);
    else if (flag == "--max-kib") c.max_kib = std::stoll(value);
    else if (flag == "--verify") c.verify = value == "1";
    else if (flag == "--from-env") c.from_env = value == "1";
    else TORCH_CHECK_VALUE(false, "tp-allreduce-bench: unknown option ", flag, "\n", kUsage);
  }
  TORCH_CHECK_VALUE(c.min_kib >= 1 && c.max_kib >= c.min_kib, "tp-allreduce-bench: need 1 <= --min-kib <= --max-kib");
  return c;
}

std::string human(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::string micros(double seconds) { return format("%.1f", seconds * 1e6); }

/// Every rank makes the same calls; rank 0 records.
void measure(tp::Communicator& comm, const std::vector<int64_t>& sizes, Measured& out) {
  for (int64_t bytes : sizes) {
    at::Tensor t = at::ones({bytes / 4}, at::kFloat);
    // The same count on every rank (they must make the same calls): fewer for big messages.
    const int64_t iters = std::max<int64_t>(5, std::min<int64_t>(300, (int64_t{64} << 20) / bytes));
    for (auto strategy : kStrategies) {
      const auto before = comm.all_reduce_counts();
      for (int w = 0; w < 3; ++w) comm.all_reduce(t, strategy);
      std::vector<double> times;
      for (int64_t i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        comm.all_reduce(t, strategy);
        times.push_back(seconds_since(t0));
      }
      t.fill_(1);  // keep the values small: every call multiplies them by world
      if (comm.rank() != 0) continue;
      out.median_s[bytes][strategy] = median(times);
      if (strategy != AllReduceStrategy::kAuto) continue;
      for (const auto& [s, n] : comm.all_reduce_counts()) {
        const auto it = before.find(s);
        if (n != (it == before.end() ? 0 : it->second)) out.auto_took[bytes] = tp::to_string(s);
      }
    }
  }
}

std::string table(int64_t world, const std::vector<int64_t>& sizes, Measured& r) {
  Table table({"world", "bytes", "process_group us", "shm_one_shot us", "shm_two_shot us", "auto us", "auto took",
               "one_shot x", "two_shot x", "auto x"});
  for (int64_t bytes : sizes) {
    auto& m = r.median_s[bytes];
    const double pg = m[AllReduceStrategy::kProcessGroup];
    table.add({std::to_string(world), human(bytes), micros(pg), micros(m[AllReduceStrategy::kSharedMemoryOneShot]),
               micros(m[AllReduceStrategy::kSharedMemoryTwoShot]), micros(m[AllReduceStrategy::kAuto]),
               r.auto_took[bytes], format("%.1f", pg / m[AllReduceStrategy::kSharedMemoryOneShot]),
               format("%.1f", pg / m[AllReduceStrategy::kSharedMemoryTwoShot]),
               format("%.1f", pg / m[AllReduceStrategy::kAuto])});
  }
  return table.str();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config config = parse_args(argc, argv);
    std::vector<int64_t> sizes;
    for (int64_t kib = config.min_kib; kib <= config.max_kib; kib *= 4) sizes.push_back(kib << 10);
    tp::CommunicatorOptions options;
    options.verify_calls = config.verify;
    if (config.from_env) {
      tp::Communicator comm = tp::communicator_from_env(options);
      Measured measured;
      measure(comm, sizes, measured);
      comm.barrier();
      if (comm.rank() == 0) {
        std::cout << "tp-allreduce-bench: float32 all_reduce, ranks as processes (ranks_on_one_host="
                  << comm.ranks_on_one_host() << "); median us per call on rank 0; verify_calls=" << config.verify
                  << "\n\n" << table(comm.world_size(), sizes, measured) << std::flush;
      }
      return 0;
    }
    std::cout << "tp-allreduce-bench: float32 all_reduce, ranks as threads over Gloo + shared memory; "
              << "median us per call on rank 0; verify_calls=" << config.verify << "\n"
              << std::flush;
    for (int64_t world : config.worlds) {
      Measured measured;
      tp::run_ranks_in_threads(world, [&](tp::Communicator& comm) { measure(comm, sizes, measured); }, options);
      std::cout << "\n" << table(world, sizes, measured) << std::flush;
    }
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
