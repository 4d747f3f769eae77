// tp-bench: what does tensor parallelism cost and buy, layer by layer, for this model
// shape, format and strategy — and is it still correct? See docs/performance.md
// "Reading tp-bench".
//
//   tp-bench                                   # the built-in default block: TP 1,2; M 1,64
//   tp-bench --preset llama3-8b --tp 1,2,4 --m 1,16 --json out.json
//   tp-bench --hidden 1024 --intermediate 2816 --heads 8 --kv-heads 2 --head-dim 128

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backward_bench.h"
#include "bench_report.h"
#include "boundary_bench.h"
#include "lora_bench.h"
#include "machine_limits.h"
#include "model_bench.h"
#include "moe_bench.h"
#include "numerics_bench.h"
#include "tp/comm/launch.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/quant/quant_config.h"

extern char** environ;

using namespace tp::bench;

namespace {

const char* kUsage = R"(usage: tp-bench [options]
  --preset NAME      default | llama3-8b | llama3-70b | qwen3-32b | mistral-7b | phi3-mini |
                     gemma2-9b (the model row builds that family); qwen3-30b-a3b | mixtral-8x7b
                     (mixtures of experts, for the moe row)                (default: default)
  --hidden N --intermediate N --heads N --kv-heads N --head-dim N     a custom shape (overrides the preset's)
  --experts N --top-k N --moe-intermediate N --shared-intermediate N  a custom mixture of experts
  --tp LIST          TP sizes                                             (default 1,2)
  --launch HOW       threads: ranks are threads of this process; processes: one process
                     per rank (torchrun-style variables, TCP store on 127.0.0.1)  (default threads)
  --m LIST           tokens per forward (the GEMMs' M)                    (default 1,64)
  --rows LIST        qkv,o,gate_up,down,block                             (default all)
                     or model alone: a whole tp::CausalLM (Llama) of the shape from a Hugging Face folder
                     written once: prefill and decode (M = 1, KV cache) tok/s at each TP vs TP=1, logit error
                     or moe alone: one mixture-of-experts layer, its experts split (tp) and distributed (ep)
                     at each TP size vs one device: prefill and decode time split into routing, expert
                     GEMMs, shared expert and all-reduce, expert bytes read per token, read bandwidth
                     or numerics alone: every layer and the block with numerics default and invariant side
                     by side (the mode's cost), and whether the invariant block has TP 1's bits
                     or boundary alone: the layer boundary (the shape's hidden, --m tokens, each --dtype) per
                     CPU strategy at each TP size > 1: the bare all-reduce, the unfused boundary (all-reduce,
                     residual add, RMSNorm) and all_reduce_fusion, each the median of three runs
                     or lora alone: qkv, o, gate_up and down with LoRA adapters of rank 16 beside the same
                     layers without (0, 1 and 4 adapters in the batch) at each TP size, --m tokens, each --dtype
  --model-layers N   decoder layers of the model row                      (default 2)
  --model-vocab N    vocabulary of the model row                          (default 32000)
  --prefill N        prompt tokens of the model and moe rows              (default 256)
  --quant LIST       weight formats: none, fp8_tensor, fp8_channel, fp8_block, int8_w8a8,
                     int8_weight_only, int4_gptq, int4_awq, int4_pack_quantized, mxfp4, nvfp4
                     (INT4: ":g64", ":asym")                              (default none)
  --allreduce LIST   auto,process_group,shm_one_shot,shm_two_shot         (default auto)
  --dtype LIST       float32 | float64 | bfloat16 | float16               (default float32)
  --device NAME      cpu | cuda                                           (default cpu)
  --numerics NAME    default | invariant: the order of the TP layers' sums (tp/layers/numerics/numerics.h); the
                     reference stays at::linear, so TP/linear is invariant numerics' cost (format none, CPU)
  --seconds S        measuring time per side of a case, before the iteration cap (default 0.5)
  --json FILE        write every result as JSON (benchmarks/plot_bench.py plots it)
  --csv FILE         write the result rows as CSV
  --ckpt-dir DIR     where the generated checkpoints are cached          (default ~/.cache/tp/bench)
  --verify           keep the communicator's per-collective shape check on (off: it costs a small allgather per call)
  --backward         forward + backward instead of the forward: time per layer and for the block vs the
                     single-device reference (at::linear with autograd), and the error of every gradient
                     (input, weights, biases; every layer gets a bias); format none only
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
  } catch (const std::exception&) {}
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
  std::string launch = "threads";  // threads | processes | worker (one rank, started by tp-bench)
  std::string worker_results;      // worker: where rank 0 writes its results
  bool backward = false;           // --backward: forward + backward (backward_bench.h)
  int64_t model_layers = 2, model_vocab = 32000, prefill = 256;  // --rows model (model_bench.h)
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
    if (flag == "--backward") {
      args.backward = true;
      continue;
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    if (flag == "--preset")
      config.shape = preset(value);
    else if (flag == "--tp")
      config.tp_sizes = parse_ints(flag, value);
    else if (flag == "--m")
      config.tokens = parse_ints(flag, value);
    else if (flag == "--rows" || flag == "--layers")
      config.rows = split_list(flag, value);
    else if (flag == "--quant") {
      config.formats.clear();  // canonical names: "int4_gptq" -> "int4_gptq:g128:sym"
      for (const auto& name : split_list(flag, value))
        config.formats.push_back(tp::to_string(tp::parse_quant_config(name)));
    } else if (flag == "--allreduce") {
      config.allreduce.clear();
      for (const auto& name : split_list(flag, value)) config.allreduce.push_back(tp::parse_all_reduce_strategy(name));
    } else if (flag == "--dtype") {
      config.dtypes.clear();
      for (const auto& name : split_list(flag, value)) config.dtypes.push_back(parse_dtype(name));
    } else if (flag == "--device") {
      config.device = parse_device(value);
    } else if (flag == "--numerics") {
      // Every layer built with numerics kAuto (all of tp-bench's) reads TP_NUMERICS, and
      // worker processes inherit it: the TP side runs in this order, the single-device
      // reference (at::linear) in the default one, so TP/linear is this order's cost.
      const tp::Numerics n = tp::parse_numerics(value);
      TORCH_CHECK_VALUE(n != tp::Numerics::kAuto, "tp-bench: --numerics takes default or invariant");
      setenv("TP_NUMERICS", tp::to_string(n), 1);
    } else if (flag == "--hidden" || flag == "--intermediate" || flag == "--heads" || flag == "--kv-heads" ||
               flag == "--head-dim" || flag == "--experts" || flag == "--top-k" || flag == "--moe-intermediate" ||
               flag == "--shared-intermediate")
      custom[flag] = parse_positive(flag, value);
    else if (flag == "--seconds") {
      try {
        config.timing.max_seconds = std::stod(value);
      } catch (const std::exception&) {
        TORCH_CHECK_VALUE(false, "tp-bench: --seconds expects a number; got '", value, "'");
      }
    } else if (flag == "--json")
      args.json = value;
    else if (flag == "--csv")
      args.csv = value;
    else if (flag == "--ckpt-dir")
      config.ckpt_dir = value;
    else if (flag == "--launch") {
      TORCH_CHECK_VALUE(value == "threads" || value == "processes" || value == "worker", "tp-bench: unknown --launch '",
                        value, "' (threads, processes)");
      args.launch = value;
    } else if (flag == "--worker-results")
      args.worker_results = value;
    else if (flag == "--model-layers")
      args.model_layers = parse_positive(flag, value);
    else if (flag == "--model-vocab")
      args.model_vocab = parse_positive(flag, value);
    else if (flag == "--prefill")
      args.prefill = parse_positive(flag, value);
    else
      TORCH_CHECK_VALUE(false, "tp-bench: unknown option ", flag, "\n", kUsage);
  }
  if (!custom.empty()) {
    auto& s = config.shape;
    for (const auto& [flag, v] : custom) {
      if (flag == "--hidden") s.hidden = v;
      if (flag == "--intermediate") s.intermediate = v;
      if (flag == "--heads") s.heads = v;
      if (flag == "--kv-heads") s.kv_heads = v;
      if (flag == "--head-dim") s.head_dim = v;
      if (flag == "--experts") s.experts = v;
      if (flag == "--top-k") s.top_k = v;
      if (flag == "--moe-intermediate") s.moe_intermediate = v;
      if (flag == "--shared-intermediate") s.shared_intermediate = v;
    }
    s.name = "custom";
  }
  return args;
}

void write_file(const std::string& path, const std::string& text, bool say = true) {
  std::ofstream out(path);
  out << text;
  out.close();
  TORCH_CHECK(static_cast<bool>(out), "tp-bench: cannot write ", path);
  if (say) std::cout << "wrote " << path << "\n";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(static_cast<bool>(in), "tp-bench: cannot read ", path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// One rank of a process launch: this process is rank RANK of WORLD_SIZE.
int worker_main(const Args& args) {
  auto config = args.config;
  config.ranks_are_processes = true;
  TORCH_CHECK_VALUE(config.tp_sizes.size() == 1, "tp-bench --launch worker: expects one --tp");
  tp::CommunicatorOptions options;
  options.verify_calls = config.verify_calls;
  tp::Communicator comm = tp::communicator_from_env(options);
  TORCH_CHECK_VALUE(comm.world_size() == config.tp_sizes[0], "tp-bench --launch worker: WORLD_SIZE=", comm.world_size(),
                    " but --tp ", config.tp_sizes[0]);
  const RankLauncher launcher = [&](int64_t, const std::function<void(tp::Communicator&)>& body) { body(comm); };
  const std::string text =
      args.backward ? serialize_backward(run_backward_bench(config, launcher)) : serialize(run_bench(config, launcher));
  if (comm.rank() == 0) write_file(args.worker_results, text, false);
  return 0;
}

// Runs `world` copies of this program as ranks 0..world-1 of one TP group and returns
// rank 0's results as text (serialize / serialize_backward). A rank that fails ends the others.
std::string run_processes(int argc, char** argv, int64_t world) {
  const std::string results_path = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                                   "/tp-bench-" + std::to_string(::getpid()) + "-tp" + std::to_string(world) + ".txt";
  std::vector<std::string> child_args(argv, argv + argc);
  child_args[0] = "/proc/self/exe";
  const std::vector<std::string> extra{"--tp",   std::to_string(world), "--launch",
                                       "worker", "--worker-results",    results_path};
  child_args.insert(child_args.end(), extra.begin(), extra.end());
  std::vector<char*> child_argv;
  for (auto& a : child_args) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);

  // A port that was free a moment ago, for rank 0's TCP store.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    TORCH_CHECK(fd >= 0, "tp-bench: socket() failed: ", std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    TORCH_CHECK(ok, "tp-bench: cannot find a free TCP port: ", std::strerror(errno));
    port = ntohs(addr.sin_port);
  }
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < world; ++rank) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const auto name = kv.substr(0, kv.find('='));
      if (name != "RANK" && name != "LOCAL_RANK" && name != "WORLD_SIZE" && name != "MASTER_ADDR" &&
          name != "MASTER_PORT")
        env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, child_argv.data(), envp.data());
    TORCH_CHECK(rc == 0, "tp-bench: cannot start rank ", rank, ": ", std::strerror(rc));
    pids.push_back(pid);
  }
  std::string failure;
  for (size_t done = 0; done < pids.size(); ++done) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(it - pids.begin()) +
                (WIFEXITED(status) ? " exited with status " + std::to_string(WEXITSTATUS(status))
                                   : " was ended by signal " + std::to_string(WTERMSIG(status)));
      for (const pid_t other : pids)
        if (other != pid) ::kill(other, SIGTERM);  // the others would wait for it until the timeout
    }
  }
  TORCH_CHECK(failure.empty(), "tp-bench: TP=", world, " as processes: ", failure);
  auto text = read_file(results_path);
  std::remove(results_path.c_str());
  return text;
}

// tp-bench --backward: forward + backward per layer and for the block.
int backward_main(int argc, char** argv, const Args& args) {
  const auto& config = args.config;
  TORCH_CHECK_VALUE(args.json.empty() && args.csv.empty(), "tp-bench --backward: --json and --csv are not supported");
  const auto& s = config.shape;
  std::cout
      << "tp-bench --backward: forward + backward of one Transformer block's TP layers vs the single-device\n"
      << "  reference (at::linear with autograd on the full weights)\n"
      << "  machine: " << machine_description() << "; torch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
      << "." << TORCH_VERSION_PATCH << "; device " << config.device << "; " << at::get_num_threads()
      << " intra-op threads (each of N ranks gets 1/N of them, at least 1; the reference gets all)\n"
      << "  load average (1, 5, 15 min) at the start: " << load_average() << "\n"
      << "  shape '" << s.name << "': hidden " << s.hidden << ", intermediate " << s.intermediate << ", heads "
      << s.heads << ", kv_heads " << s.kv_heads << ", head_dim " << s.head_dim
      << "; every layer with a bias (to check its gradient)\n"
      << "  block: " << block_description() << "\n"
      << "  ranks: " << (args.launch == "processes" ? "one process each" : "threads of this process")
      << ", Gloo groups; per-collective verification " << (config.verify_calls ? "on" : "off") << "\n"
      << "  each iteration: forward, then backward of the output against a fixed random gradient; times are\n"
      << "    medians after " << config.timing.warmup << " warm-ups, TP sides the slowest rank per iteration;\n"
      << "    TP fwd ms = the forward part of the same iterations. rel_err = ||TP - ref|| / ||ref|| of the\n"
      << "    output (y), the input gradient (dx), the weight and bias gradients (dW, db; the block: worst\n"
      << "    layer) over each rank's part vs float64 at::linear autograd, worst rank; '!' above the dtype's bound\n"
      << std::flush;
  std::vector<BackwardResult> results;
  if (args.launch == "threads") {
    results = run_backward_bench(config);
  } else {
    prepare_checkpoints(config);
    for (const auto tp : config.tp_sizes) {
      std::vector<BackwardResult> one;
      if (tp == 1) {
        auto single = config;
        single.tp_sizes = {1};
        single.ranks_are_processes = true;
        one = run_backward_bench(single);
      } else {
        std::cerr << "  TP=" << tp << ": starting " << tp << " processes\n" << std::flush;
        one = deserialize_backward(run_processes(argc, argv, tp));
      }
      results.insert(results.end(), one.begin(), one.end());
    }
  }
  bool suspicious = false;
  std::vector<std::string> dtypes;
  for (const auto& r : results) {
    suspicious = suspicious || r.suspicious;
    if (std::find(dtypes.begin(), dtypes.end(), r.dtype) == dtypes.end()) dtypes.push_back(r.dtype);
  }
  for (const auto& dtype : dtypes) {
    std::vector<BackwardResult> rows;
    for (const auto& r : results)
      if (r.dtype == dtype) rows.push_back(r);
    std::cout << "\n== forward + backward, " << dtype << ", format none\n" << backward_table(rows);
  }
  std::cout << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  if (suspicious) {
    std::cerr << "tp-bench --backward: some errors ('!') are above the bound for their dtype: a gradient is wrong\n";
    return 1;
  }
  return 0;
}

// tp-bench --rows model: the whole-model row (model_bench.h).
int model_main(const Args& args) {
  const auto& config = args.config;
  TORCH_CHECK_VALUE(args.launch == "threads" && args.json.empty() && args.csv.empty() && !config.device.is_cuda() &&
                        config.formats == std::vector<std::string>{"none"},
                    "tp-bench --rows model: ranks as threads on the CPU, format none, no --json / --csv");
  ModelBenchConfig m;
  m.shape = config.shape;
  m.layers = args.model_layers;
  m.vocab = args.model_vocab;
  m.prefill = args.prefill;
  m.tp_sizes = config.tp_sizes;
  m.dtypes = config.dtypes;
  m.timing = config.timing;
  m.ckpt_dir = config.ckpt_dir;
  m.seed = config.seed;
  return run_model_rows(m);
}

// tp-bench --rows boundary: the layer boundary's table (boundary_bench.h) at each TP size.
int boundary_main(const Args& args) {
  const auto& config = args.config;
  TORCH_CHECK_VALUE(args.launch == "threads" && args.json.empty() && args.csv.empty() && !config.device.is_cuda(),
                    "tp-bench --rows boundary: ranks as threads on the CPU, no --json / --csv");
  BoundaryConfig b;
  b.hidden = config.shape.hidden;
  b.tokens = config.tokens;
  b.repeat = 3;
  return run_boundary_rows(config.shape.name, b, config.tp_sizes, config.dtypes, config.verify_calls);
}

// tp-bench --rows lora: the block's layers with LoRA adapters beside the same layers without (lora_bench.h).
int lora_main(const Args& args) {
  const auto& config = args.config;
  TORCH_CHECK_VALUE(args.launch == "threads" && args.json.empty() && args.csv.empty() && !config.device.is_cuda(),
                    "tp-bench --rows lora: ranks as threads on the CPU, format none, no --json / --csv");
  return run_lora_rows(
      {config.shape, config.tokens, config.tp_sizes, config.dtypes, /*rank=*/16, /*iterations=*/7, config.seed});
}

// tp-bench --rows moe: one mixture-of-experts layer (moe_bench.h).
int moe_main(const Args& args) {
  const auto& config = args.config;
  TORCH_CHECK_VALUE(args.launch == "threads" && args.json.empty() && args.csv.empty() && !config.device.is_cuda(),
                    "tp-bench --rows moe: ranks as threads on the CPU, no --json / --csv");
  MoeBenchConfig m;
  m.shape = config.shape;
  m.prefill = args.prefill;
  m.tp_sizes = config.tp_sizes;
  m.dtypes = config.dtypes;
  m.formats = config.formats;
  m.timing = config.timing;
  m.seed = config.seed;
  return run_moe_rows(m);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto args = parse_args(argc, argv);
    if (args.launch == "worker") return worker_main(args);
    if (args.backward) return backward_main(argc, argv, args);
    if (args.config.rows == std::vector<std::string>{"model"}) return model_main(args);
    if (args.config.rows == std::vector<std::string>{"moe"}) return moe_main(args);
    if (args.config.rows == std::vector<std::string>{"boundary"}) return boundary_main(args);
    if (args.config.rows == std::vector<std::string>{"lora"}) return lora_main(args);
    if (args.config.rows == std::vector<std::string>{"numerics"}) {
      TORCH_CHECK_VALUE(args.launch == "threads" && args.json.empty() && args.csv.empty(),
                        "tp-bench --rows numerics: ranks as threads, no --json / --csv");
      return tp::bench::run_numerics_rows(args.config);
    }
    const auto& config = args.config;
    const auto& s = config.shape;
    const std::string machine = machine_description();
    if (const char* n = std::getenv("TP_NUMERICS"))
      std::cout << "numerics: " << n << " (TP_NUMERICS; the TP layers' sums; the reference is at::linear)\n";
    std::ostringstream strategies;
    for (size_t i = 0; i < config.allreduce.size(); ++i) strategies << (i ? "," : "") << config.allreduce[i];
    std::cout
        << "tp-bench: one Transformer block's TP layers vs the single-device reference from the same global weights\n"
        << "  machine: " << machine << "; torch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "."
        << TORCH_VERSION_PATCH << "; device " << config.device << "; " << at::get_num_threads()
        << " intra-op threads (each of N ranks gets 1/N of them, at least 1; the reference gets all)\n"
        << "  load average (1, 5, 15 min) at the start: " << load_average() << "\n"
        << "  shape '" << s.name << "': hidden " << s.hidden << ", intermediate " << s.intermediate << ", heads "
        << s.heads << ", kv_heads " << s.kv_heads << ", head_dim " << s.head_dim << "\n"
        << "  GEMMs [M,K]x[K,N]: qkv K=" << s.hidden << " N=" << (s.heads + 2 * s.kv_heads) * s.head_dim
        << "; o K=" << s.heads * s.head_dim << " N=" << s.hidden << "; gate_up K=" << s.hidden
        << " N=" << 2 * s.intermediate << "; down K=" << s.intermediate << " N=" << s.hidden << "\n"
        << "  block: " << block_description() << "\n"
        << "  ranks: " << (args.launch == "processes" ? "one process each" : "threads of this process")
        << ", Gloo groups" << (config.device.is_cuda() ? " (sharing the one GPU)" : "") << "; allreduce "
        << strategies.str() << "; per-collective verification " << (config.verify_calls ? "on" : "off") << "\n"
        << "  reference: format none: at::linear on the full weights (errors vs the same in float64); quantized:\n"
        << "    the format's layers on one device (errors vs float64 at::linear on dequantize_weight of the stored\n"
        << "    tensors and quantize_activation of each layer's input, the block's intermediate outputs in the\n"
        << "    dtype as the layers return them; at TP > 1 each rank of a row layer quantizes its own input slice)\n"
        << "  times: medians after " << config.timing.warmup << " warm-ups; " << config.timing.rounds
        << " alternating rounds of ref / TP / GEMM / comm, up to " << config.timing.max_iters << " iterations or ~"
        << config.timing.max_seconds << " s per side; TP sides: the slowest rank per iteration\n"
        << "    TP ms = the forward as a user runs it; GEMM ms = the same forward with reduce_output(false) (no\n"
        << "    AllReduce); comm ms = the AllReduce(s) of [M, hidden] alone; GB/s and GFLOP/s: the global problem\n"
        << "    (weights as stored + activations in and out; 2*M*K*N) over TP ms; rel_err = ||TP - ref|| / ||ref||\n"
        << "    over each rank's part, worst rank; '!' marks an error above the dtype's bound\n"
        << "    limit = the row's fraction of the machine limit that binds it (CPU; measured below): bytes / TP ms\n"
        << "    over the read bandwidth where the row's flop per byte is below the machine's balance (mem), else\n"
        << "    GFLOP/s over the peak (fp32: FMA ceiling or best GEMM; bf16); kernel = the GEMM kernels the TP forward "
           "ran\n"
        << std::flush;
    std::optional<MachineLimits> limits;
    if (!config.device.is_cuda()) {
      std::cout << "  " << cpu_description() << "\n" << std::flush;
      limits = measure_machine_limits();
      std::cout << "  " << limits->describe() << "\n" << std::flush;
    }
    BenchResults results;
    if (args.launch == "threads") {
      results = run_bench(config);
    } else {
      prepare_checkpoints(config);  // written once here, only read by the ranks
      for (const auto tp : config.tp_sizes) {
        BenchResults one;
        if (tp == 1) {
          auto single = config;
          single.tp_sizes = {1};
          single.ranks_are_processes = true;  // this process is the one rank
          one = run_bench(single);
        } else {
          std::cerr << "  TP=" << tp << ": starting " << tp << " processes\n" << std::flush;
          one = deserialize(run_processes(argc, argv, tp));
        }
        results.rows.insert(results.rows.end(), one.rows.begin(), one.rows.end());
        results.loads.insert(results.loads.end(), one.loads.begin(), one.loads.end());
      }
    }

    if (limits) {
      for (auto& r : results.rows) {
        const auto f =
            limit_fraction(*limits, r.bytes, r.flops, r.tp_s, r.dtype == "bfloat16" ? c10::kBFloat16 : c10::kFloat);
        r.limit_fraction = f.fraction, r.limit = f.limit;
      }
    }
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
      std::cout << "\n== " << dtype << ", format " << format << ", allreduce " << allreduce << "\n" << row_table(rows);
    }
    std::cout << "\nloading (every rank opens the checkpoint and reads its shard; peak RSS growth: VmHWM during the\n"
              << "loads minus VmRSS before, of the largest process; ranks as threads share one process)\n"
              << load_table(results.loads);
    std::cout << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
    if (!args.json.empty()) {
      auto described = config;
      described.ranks_are_processes = args.launch == "processes";
      write_file(args.json, to_json(described, results, machine));
    }
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
