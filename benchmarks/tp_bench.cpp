// tp-bench: what does tensor parallelism cost and buy, layer by layer, and is it
// still correct? Prints one table; see README "Reading the tp-bench table".
//
//   tp-bench                       # the built-in default block, TP 1 and 2, M 1 and 256
//   tp-bench --tp 1,2,4 --m 1,16,256 --dtype bfloat16 --layers qkv,down

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "layer_bench.h"

using namespace tp::bench;

namespace {

const char* kUsage = R"(usage: tp-bench [options]
  --tp LIST          TP sizes, ranks as threads of this process   (default 1,2)
  --m LIST           tokens per forward (GEMM M)                   (default 1,256)
  --layers LIST      column,qkv,o,gate_up,down                     (default all)
  --dtype NAME       float32 | float64 | bfloat16 | float16        (default float32)
  --device NAME      cpu | cuda                                    (default cpu)
  --hidden N --intermediate N --heads N --kv-heads N --head-dim N  (default block: 2048 5632 16 4 128)
  --seconds S        measuring time per case, before the iteration cap (default 1.0)
  --help
)";

std::vector<int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      TORCH_CHECK_VALUE(used == item.size() && v > 0, "");
      out.push_back(v);
    } catch (const std::exception&) {
      TORCH_CHECK_VALUE(false, "tp-bench: ", flag, " expects positive integers separated by commas; got '", text, "'");
    }
  }
  TORCH_CHECK_VALUE(!out.empty(), "tp-bench: ", flag, " is empty");
  return out;
}

std::vector<std::string> parse_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
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

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

LayerBenchConfig parse_args(int argc, char** argv) {
  LayerBenchConfig config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    auto one = [&] { return parse_list(flag, value).at(0); };
    if (flag == "--tp") config.tp_sizes = parse_list(flag, value);
    else if (flag == "--m") config.tokens = parse_list(flag, value);
    else if (flag == "--layers") config.layers = parse_names(value);
    else if (flag == "--dtype") config.dtype = parse_dtype(value);
    else if (flag == "--device") config.device = parse_device(value);
    else if (flag == "--hidden") config.shape.hidden = one(), config.shape.name = "custom";
    else if (flag == "--intermediate") config.shape.intermediate = one(), config.shape.name = "custom";
    else if (flag == "--heads") config.shape.heads = one(), config.shape.name = "custom";
    else if (flag == "--kv-heads") config.shape.kv_heads = one(), config.shape.name = "custom";
    else if (flag == "--head-dim") config.shape.head_dim = one(), config.shape.name = "custom";
    else if (flag == "--seconds") config.timing.max_seconds = std::stod(value);
    else TORCH_CHECK_VALUE(false, "tp-bench: unknown option ", flag, "\n", kUsage);
  }
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto config = parse_args(argc, argv);
    const auto& s = config.shape;
    std::cout << "tp-bench: per-layer TP forward vs at::linear on the full weights\n"
              << "  machine: " << cpu_model() << ", " << std::thread::hardware_concurrency() << " hardware threads; "
              << "torch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
              << ", intra-op threads " << at::get_num_threads() << " (each of N ranks gets 1/N of them)\n"
              << "  block '" << s.name << "': hidden " << s.hidden << ", intermediate " << s.intermediate << ", heads "
              << s.heads << ", kv_heads " << s.kv_heads << ", head_dim " << s.head_dim << "; dtype "
              << c10::toString(config.dtype) << "; device " << config.device
              << "; ranks as threads over Gloo" << (config.device.is_cuda() ? " (sharing the one GPU)" : "") << "\n"
              << "  times: medians after " << config.timing.warmup << " warm-up runs; TP time is the slowest rank"
              << " per iteration; max_abs_err vs float64 at::linear\n"
              << std::flush;
    const auto results = run_layer_bench(config, [](const std::string& what) {
      std::cerr << "  measuring " << what << "...\n";
    });
    std::cout << "\n" << layer_table(results);
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
