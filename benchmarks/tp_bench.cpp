// tp-bench: what does tensor parallelism cost and buy, layer by layer, for this model
// shape, format and strategy — and is it still correct? See README "Reading tp-bench".
//
//   tp-bench                                   # the built-in default block: TP 1,2; M 1,64
//   tp-bench --preset llama3-8b --tp 1,2,4 --m 1,16 --json out.json
//   tp-bench --hidden 1024 --intermediate 2816 --heads 8 --kv-heads 2 --head-dim 128

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "layer_bench.h"

using namespace tp::bench;

namespace {

const char* kUsage = R"(usage: tp-bench [options]
  --preset NAME      default | llama3-8b | llama3-70b | qwen3-32b     (default: default)
  --hidden N --intermediate N --heads N --kv-heads N --head-dim N     a custom shape (overrides the preset's)
  --tp LIST          TP sizes; ranks are threads of this process          (default 1,2)
  --m LIST           tokens per forward (the GEMMs' M)                    (default 1,64)
  --rows LIST        qkv,o,gate_up,down,block                             (default all)
  --quant LIST       weight formats: none                                 (default none)
  --allreduce LIST   auto,process_group,shm_one_shot,shm_two_shot         (default auto)
  --dtype LIST       float32 | float64 | bfloat16 | float16               (default float32)
  --device NAME      cpu | cuda                                           (default cpu)
  --seconds S        measuring time per side of a case, before the iteration cap (default 0.5)
  --json FILE        write every result as JSON (benchmarks/plot_bench.py plots it)
  --csv FILE         write the result rows as CSV
  --ckpt-dir DIR     where the generated checkpoints are cached          (default ~/.cache/tp/bench)
  --verify           keep the communicator's per-collective shape check on (off: it costs a small allgather per call)
  --help
)";

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    TORCH_CHECK_VALUE(!item.empty(), "tp-bench: ", flag, " has an empty item in '", text, "'");
    out.push_back(item);
  }
  TORCH_CHECK_VALUE(!out.empty(), "tp-bench: ", flag, " is empty");
  return out;
}

int64_t parse_positive(const std::string& flag, const std::string& item) {
  try {
    size_t used = 0;
    const long long v = std::stoll(item, &used);
    if (used == item.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  TORCH_CHECK_VALUE(false, "tp-bench: ", flag, " expects positive integers (comma-separated for lists); got '", item,
                    "'");
}

std::vector<int64_t> parse_ints(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(flag, text)) out.push_back(parse_positive(flag, item));
  return out;
}

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return c10::kFloat;
  if (name == "float64" || name == "fp64") return c10::kDouble;
  if (name == "bfloat16" || name == "bf16") return c10::kBFloat16;
  if (name == "float16" || name == "fp16") return c10::kHalf;
  TORCH_CHECK_VALUE(false, "tp-bench: unknown --dtype '", name, "' (float32, float64, bfloat16, float16)");
}

c10::Device parse_device(const std::string& name) {
  TORCH_CHECK_VALUE(name == "cpu" || name == "cuda", "tp-bench: unknown --device '", name, "' (cpu, cuda)");
  if (name == "cpu") return c10::kCPU;
  TORCH_CHECK_VALUE(torch::cuda::is_available(), "tp-bench: --device cuda, but torch sees no CUDA device");
  return {c10::kCUDA, 0};
}

struct Args {
  BenchConfig config;
  std::string json, csv;
};

Args parse_args(int argc, char** argv) {
  Args args;
  auto& config = args.config;
  config.timing.max_seconds = 0.5;
  std::map<std::string, int64_t> custom;  // shape flags, applied over the preset at the end
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--verify") {
      config.verify_calls = true;
      continue;
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    if (flag == "--preset") config.shape = preset(value);
    else if (flag == "--tp") config.tp_sizes = parse_ints(flag, value);
    else if (flag == "--m") config.tokens = parse_ints(flag, value);
    else if (flag == "--rows" || flag == "--layers") config.rows = split_list(flag, value);
    else if (flag == "--quant") config.formats = split_list(flag, value);
    else if (flag == "--allreduce") {
      config.allreduce.clear();
      for (const auto& name : split_list(flag, value)) config.allreduce.push_back(tp::parse_all_reduce_strategy(name));
    } else if (flag == "--dtype") {
      config.dtypes.clear();
      for (const auto& name : split_list(flag, value)) config.dtypes.push_back(parse_dtype(name));
    } else if (flag == "--device") config.device = parse_device(value);
    else if (flag == "--hidden" || flag == "--intermediate" || flag == "--heads" || flag == "--kv-heads" ||
             flag == "--head-dim")
      custom[flag] = parse_positive(flag, value);
    else if (flag == "--seconds") {
      try {
        config.timing.max_seconds = std::stod(value);
      } catch (const std::exception&) {
        TORCH_CHECK_VALUE(false, "tp-bench: --seconds expects a number; got '", value, "'");
      }
    } else if (flag == "--json") args.json = value;
    else if (flag == "--csv") args.csv = value;
    else if (flag == "--ckpt-dir") config.ckpt_dir = value;
    else TORCH_CHECK_VALUE(false, "tp-bench: unknown option ", flag, "\n", kUsage);
  }
  if (!custom.empty()) {
    auto& s = config.shape;
    for (const auto& [flag, v] : custom) {
      if (flag == "--hidden") s.hidden = v;
      if (flag == "--intermediate") s.intermediate = v;
      if (flag == "--heads") s.heads = v;
      if (flag == "--kv-heads") s.kv_heads = v;
      if (flag == "--head-dim") s.head_dim = v;
    }
    s.name = "custom";
  }
  return args;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  TORCH_CHECK(static_cast<bool>(out), "tp-bench: cannot write ", path);
  std::cout << "wrote " << path << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto args = parse_args(argc, argv);
    const auto& config = args.config;
    const auto& s = config.shape;
    const std::string machine = machine_description();
    std::ostringstream strategies;
    for (size_t i = 0; i < config.allreduce.size(); ++i) strategies << (i ? "," : "") << config.allreduce[i];
    std::cout
        << "tp-bench: one Transformer block's TP layers vs the single-device reference from the same global weights\n"
        << "  machine: " << machine << "; torch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "."
        << TORCH_VERSION_PATCH << "; device " << config.device << "; " << at::get_num_threads()
        << " intra-op threads (each of N ranks gets 1/N of them, at least 1; the reference gets all)\n"
        << "  shape '" << s.name << "': hidden " << s.hidden << ", intermediate " << s.intermediate << ", heads "
        << s.heads << ", kv_heads " << s.kv_heads << ", head_dim " << s.head_dim << "\n"
        << "  GEMMs [M,K]x[K,N]: qkv K=" << s.hidden << " N=" << (s.heads + 2 * s.kv_heads) * s.head_dim
        << "; o K=" << s.heads * s.head_dim << " N=" << s.hidden << "; gate_up K=" << s.hidden
        << " N=" << 2 * s.intermediate << "; down K=" << s.intermediate << " N=" << s.hidden << "\n"
        << "  block: " << block_description() << "\n"
        << "  ranks: threads of this process, Gloo groups" << (config.device.is_cuda() ? " (sharing the one GPU)" : "")
        << "; allreduce " << strategies.str() << "; per-collective verification "
        << (config.verify_calls ? "on" : "off") << "\n"
        << "  reference: at::linear on the full weights (format none; errors vs the same in float64), or the same\n"
        << "    format's layers on one device (quantized formats; errors vs their output)\n"
        << "  times: medians after " << config.timing.warmup << " warm-ups; " << config.timing.rounds
        << " alternating rounds of ref / TP / GEMM / comm, up to " << config.timing.max_iters
        << " iterations or ~" << config.timing.max_seconds << " s per side; TP sides: the slowest rank per iteration\n"
        << "    TP ms = the forward as a user runs it; GEMM ms = the same forward with reduce_output(false) (no\n"
        << "    AllReduce); comm ms = the AllReduce(s) of [M, hidden] alone; GB/s and GFLOP/s: the global problem\n"
        << "    (weights as stored + activations in and out; 2*M*K*N) over TP ms; rel_err = ||TP - ref|| / ||ref||\n"
        << "    over each rank's part, worst rank; '!' marks an error above the dtype's bound\n"
        << std::flush;
    const auto results = run_bench(config);

    // One table per (dtype, format, allreduce) setting, in the order run.
    std::vector<std::tuple<std::string, std::string, std::string>> settings;
    for (const auto& r : results.rows) {
      const auto key = std::make_tuple(r.dtype, r.format, r.allreduce);
      if (std::find(settings.begin(), settings.end(), key) == settings.end()) settings.push_back(key);
    }
    bool suspicious = false;
    for (const auto& [dtype, format, allreduce] : settings) {
      std::vector<RowResult> rows;
      for (const auto& r : results.rows) {
        if (std::make_tuple(r.dtype, r.format, r.allreduce) == std::make_tuple(dtype, format, allreduce)) {
          rows.push_back(r);
          suspicious = suspicious || r.suspicious;
        }
      }
      std::cout << "\n== " << dtype << ", format " << format << ", allreduce " << allreduce << "\n"
                << row_table(rows);
    }
    std::cout << "\nloading (every rank opens the checkpoint and reads its shard; ranks are threads, so the peak RSS\n"
              << "growth is the whole process's: VmHWM during the loads minus VmRSS before)\n"
              << load_table(results.loads);
    if (!args.json.empty()) write_file(args.json, to_json(config, results, machine));
    if (!args.csv.empty()) write_file(args.csv, to_csv(config, results));
    if (suspicious) {
      std::cerr << "tp-bench: some errors ('!') are above the bound for their dtype: the TP result is wrong\n";
      return 1;
    }
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
