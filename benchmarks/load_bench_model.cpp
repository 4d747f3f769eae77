// tp-load-bench --model: what CausalLM::from_pretrained costs, a rank per process.
//
// For a generated Llama folder (bfloat16, and the same weights in HF fine-grained FP8,
// fp8_block), at each TP size, every rank is its own process (connect_tcp over
// loopback), so /proc/self/status is that rank's alone:
//   load s       from_pretrained (config, headers, allocation, reads, checks), slowest rank
//   read MB      the checkpoint bytes this rank's parameters hold (its shard, as stored)
//   GB/s         read MB / load s, against the page cache's read bandwidth (one pread
//                of the warm file) and a cold file's (after POSIX_FADV_DONTNEED)
//   peak RSS     VmHWM - VmRSS before the load
//   peak anon    the highest RssAnon sampled every millisecond during the load, minus
//                RssAnon before: the memory the load allocated, mapped file pages excluded
//   packs        the anonymous memory the load keeps beyond the parameters: the CPU
//                GEMMs' packed weights, which the layers' finalize() prepares at load so
//                the first forward does not (one-time preparation, counted apart)
//   bound        the rank's parameters' bytes + the largest single checkpoint tensor +
//                64 MiB (threads, Gloo's buffers); --check fails when peak anon - packs
//                exceeds it
//   1st fwd anon the peak anonymous memory of the first forward (a token), counted
//                separately: the CPU kernels' one-time preparation (packed weights)

#include "load_bench_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/loading/load_session.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/models/causal_lm.h"
#include "tp/quant/quantize.h"

namespace tp::bench {
namespace {

std::string config_json(const ModelLoadConfig& c, bool fp8) {
  std::ostringstream out;
  out << "{\"model_type\": \"llama\", \"hidden_size\": " << c.hidden << ", \"intermediate_size\": " << c.intermediate
      << ", \"num_hidden_layers\": " << c.layers << ", \"num_attention_heads\": " << c.heads
      << ", \"num_key_value_heads\": " << c.kv_heads << ", \"head_dim\": " << c.hidden / c.heads
      << ", \"vocab_size\": " << c.vocab
      << ", \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "
         "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"";
  if (fp8)
    out << ", \"quantization_config\": {\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\", "
           "\"weight_block_size\": [128, 128]}";
  return out.str() + "}\n";
}

bool exists(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

// A Llama folder of random weights (linear N(0, 1/in), embeddings N(0, 1), norms 1),
// bfloat16 or its linear layers in fp8_block; reused when present.
std::string write_folder(const ModelLoadConfig& c, bool fp8) {
  std::ostringstream name;
  name << c.dir << "/tp-load-model-h" << c.hidden << "-i" << c.intermediate << "-L" << c.layers << "-V" << c.vocab
       << "-q" << c.heads << "-kv" << c.kv_heads << (fp8 ? "-fp8" : "-bf16");
  const std::string folder = name.str();
  if (exists(folder + "/config.json") && exists(folder + "/model.safetensors")) return folder;
  TORCH_CHECK(std::system(("mkdir -p '" + folder + "'").c_str()) == 0, "tp-load-bench: cannot create ", folder);
  std::cerr << "  writing " << folder << "\n" << std::flush;
  const std::string json = config_json(c, fp8);
  const auto model_config = ModelConfig::from_json(json, folder + "/config.json");
  auto gen = at::detail::createCPUGenerator(46);
  const int64_t d = c.hidden / c.heads;
  std::map<std::string, at::Tensor> t;
  auto put_linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    const at::Tensor w = at::randn({out, in}, gen, at::kFloat) / std::sqrt(static_cast<double>(in));
    if (!fp8) {
      t[prefix + ".weight"] = w.to(at::kBFloat16);
      return;
    }
    for (auto& [suffix, tensor] : quantize_weight(w, model_config.quant_config(prefix)))
      t[prefix + "." + suffix] = tensor;
  };
  t["model.embed_tokens.weight"] = at::randn({c.vocab, c.hidden}, gen, at::kFloat).to(at::kBFloat16);
  t["lm_head.weight"] =
      (at::randn({c.vocab, c.hidden}, gen, at::kFloat) / std::sqrt(static_cast<double>(c.hidden))).to(at::kBFloat16);
  t["model.norm.weight"] = at::ones({c.hidden}, at::kBFloat16);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    put_linear(p + ".self_attn.q_proj", c.heads * d, c.hidden);
    put_linear(p + ".self_attn.k_proj", c.kv_heads * d, c.hidden);
    put_linear(p + ".self_attn.v_proj", c.kv_heads * d, c.hidden);
    put_linear(p + ".self_attn.o_proj", c.hidden, c.heads * d);
    put_linear(p + ".mlp.gate_proj", c.intermediate, c.hidden);
    put_linear(p + ".mlp.up_proj", c.intermediate, c.hidden);
    put_linear(p + ".mlp.down_proj", c.hidden, c.intermediate);
    t[p + ".input_layernorm.weight"] = at::ones({c.hidden}, at::kBFloat16);
    t[p + ".post_attention_layernorm.weight"] = at::ones({c.hidden}, at::kBFloat16);
  }
  save_safetensors(folder + "/model.safetensors", t, {{"format", "pt"}});
  std::ofstream(folder + "/config.json") << json;
  return folder;
}

// Reads the whole file with pread into one buffer: GB/s. `cold`: its pages are dropped
// from the page cache first (POSIX_FADV_DONTNEED: this file's only).
double read_bandwidth(const std::string& path, bool cold) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "tp-load-bench: cannot open ", path);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (cold) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  std::vector<uint8_t> buf(static_cast<size_t>(size));
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t got = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    TORCH_CHECK(got > 0, "tp-load-bench: pread of ", path, " failed");
    done += static_cast<size_t>(got);
  }
  const double s = seconds_since(t0);
  ::close(fd);
  return static_cast<double>(size) / s / 1e9;
}

// GB/s of the first write to fresh anonymous memory, `threads` threads each over its own
// 256 MiB (summed over them): the kernel's zeroed pages faulted in one by one, what every new
// parameter byte costs before a byte of the file reaches it (best of 5; transparent huge
// pages as the allocator gets them).
double first_touch_bandwidth(int threads) {
  const size_t size = size_t{256} << 20;
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<void*> maps;
    for (int t = 0; t < threads; ++t) {
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "tp-load-bench: cannot map ", size, " bytes");
      maps.push_back(p);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (void* p : maps) workers.emplace_back([p, size] { std::memset(p, 1, size); });
    for (auto& w : workers) w.join();
    best = std::max(best, static_cast<double>(size) * threads / seconds_since(t0) / 1e9);
    for (void* p : maps) ::munmap(p, size);
  }
  return best;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  TORCH_CHECK(n > 0, "tp-load-bench: readlink(/proc/self/exe) failed");
  return std::string(buf, static_cast<size_t>(n));
}

struct RankLine {
  double load_s = 0;
  long long read_bytes = 0, largest_bytes = 0, peak_rss_kib = 0, peak_anon_kib = 0, forward_anon_kib = 0,
            kept_anon_kib = 0;
};

}  // namespace

int run_model_load_child(const std::string& folder, int64_t world, int64_t rank, int port, bool draw, int threads) {
  // The sampler: the highest RssAnon seen, from `base` on.
  std::atomic<long long> peak_anon{proc_status_kib("RssAnon")};
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    while (!stop.load()) {
      const long long now = proc_status_kib("RssAnon");
      if (now > peak_anon.load()) peak_anon.store(now);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / static_cast<int>(world));
  at::set_num_threads(threads);
  Communicator comm = connect_tcp("127.0.0.1", port, rank, world);
  comm.barrier();
  reset_peak_rss();
  const long long rss_before = proc_status_kib("VmRSS"), anon_before = proc_status_kib("RssAnon");
  peak_anon.store(anon_before);
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<CausalLMImpl> model;
  if (draw) {  // from_pretrained as it was: every tensor drawn at random, then overwritten by the load
    const Checkpoint checkpoint = open_checkpoint(folder);
    auto config = ModelConfig::from_pretrained(folder);
    config.use_expert_layout_of(checkpoint);
    model = std::make_shared<CausalLMImpl>(std::move(config), CausalLMOptions().init_weights(true), comm);
    const LoadSession session(checkpoint, comm);
    model->load_weights(session.checkpoint());
    session.finish();
  } else {
    model = CausalLMImpl::from_pretrained(folder, {}, comm);
  }
  const double load_s = seconds_since(t0);
  const long long load_peak_anon = peak_anon.load() - anon_before;
  const long long peak_rss = proc_status_kib("VmHWM") - rss_before;
  // What this rank holds, as stored in the checkpoint, and the largest single tensor.
  const Checkpoint checkpoint = open_checkpoint(folder);
  long long largest = 0;
  for (const auto& name : checkpoint.names()) {
    const auto& s = checkpoint.get(name);
    long long bytes = static_cast<long long>(c10::elementSize(s.dtype()));
    for (auto n : s.shape()) bytes *= n;
    largest = std::max(largest, bytes);
  }
  long long held = 0;
  for (const auto& p : model->parameters()) held += static_cast<long long>(p.nbytes());
  // The first forward's one-time preparation, separately.
  const long long anon_after_load = proc_status_kib("RssAnon");
  const long long kept_anon = anon_after_load - anon_before;
  peak_anon.store(anon_after_load);
  {
    at::NoGradGuard no_grad;
    model->forward(at::zeros({1, 1}, at::kLong));
  }
  const long long forward_anon = peak_anon.load() - anon_after_load;
  stop.store(true);
  sampler.join();
  comm.barrier();
  std::cout << load_s << " " << held << " " << largest << " " << peak_rss << " " << load_peak_anon << " "
            << forward_anon << " " << kept_anon << std::endl;
  return 0;
}

int run_model_load(const ModelLoadConfig& c) {
  std::cout << "tp-load-bench --model: CausalLM::from_pretrained of a generated Llama folder (hidden " << c.hidden
            << ", intermediate " << c.intermediate << ", " << c.layers << " layers, vocab " << c.vocab << ", heads "
            << c.heads << "/" << c.kv_heads << "), one process per rank (Gloo over loopback)\n"
            << "  machine: " << machine_description() << "; load average: " << load_average() << "\n"
            << "  rows '(drawn first, as before)': the model drawn at random, then loaded (from_pretrained before "
               "issue 46); '(no packs)': the load without the CPU GEMMs' packed weights (the reads alone)\n"
            << "  load s: slowest rank; read MB: the rank's parameters as stored; peak RSS / anon: per rank, over "
               "RSS / RssAnon before the load; packs: the anonymous memory kept beyond the parameters (the CPU "
               "GEMMs' packed weights, prepared at load), counted apart; bound: held + largest tensor + 64 MiB, "
               "against peak anon - packs; 1st fwd: the first forward's own anonymous peak\n"
            << "  cache / cold GB/s: one thread's pread of the file from the page cache / from disk into memory "
               "already touched; touch GB/s: one thread's first write to fresh anonymous memory (each parameter "
               "page, before any of the file reaches it), and all hardware threads' together\n"
            << std::flush;
  Table table({"folder", "TP", "load s", "read MB/rank", "GB/s/rank", "cache GB/s", "cold GB/s", "touch GB/s",
               "touch all", "peak RSS MiB", "peak anon MiB", "packs MiB", "anon - packs", "bound MiB", "ok",
               "1st fwd anon MiB"});
  bool all_ok = true;
  int port = c.port;
  for (const bool fp8 : c.formats) {
    const std::string folder = write_folder(c, fp8);
    const std::string file = folder + "/model.safetensors";
    const double cold = read_bandwidth(file, /*cold=*/true);
    const double warm = read_bandwidth(file, /*cold=*/false);
    const double touch = first_touch_bandwidth(1);
    const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const double touch_all = first_touch_bandwidth(hardware);
    enum class Kind { kLoad, kDrawn, kNoPacks };
    std::vector<std::pair<int64_t, Kind>> rows;
    for (const int64_t world : c.tp_sizes) {
      if (c.draw_rows && !fp8) rows.emplace_back(world, Kind::kDrawn);
      rows.emplace_back(world, Kind::kLoad);
      if (!fp8) rows.emplace_back(world, Kind::kNoPacks);
    }
    for (const auto& [world, kind] : rows) {
      const bool draw = kind == Kind::kDrawn;
      ++port;
      std::vector<std::FILE*> pipes;
      for (int64_t r = 0; r < world; ++r) {
        const std::string cmd = std::string(kind == Kind::kNoPacks ? "TP_CPU_GEMM_PACK=0 " : "") + "'" + self_exe() +
                                "' --model-child '" + folder + "' " + std::to_string(world) + " " + std::to_string(r) +
                                " " + std::to_string(port) + (draw ? " draw " : " load ") + std::to_string(c.threads);
        std::FILE* p = ::popen(cmd.c_str(), "r");
        TORCH_CHECK(p != nullptr, "tp-load-bench: cannot start ", cmd);
        pipes.push_back(p);
      }
      std::vector<RankLine> lines(static_cast<size_t>(world));
      for (int64_t r = 0; r < world; ++r) {
        auto& l = lines[static_cast<size_t>(r)];
        const int got =
            std::fscanf(pipes[r], "%lf %lld %lld %lld %lld %lld %lld", &l.load_s, &l.read_bytes, &l.largest_bytes,
                        &l.peak_rss_kib, &l.peak_anon_kib, &l.forward_anon_kib, &l.kept_anon_kib);
        const int rc = ::pclose(pipes[r]);
        TORCH_CHECK(got == 7 && rc == 0, "tp-load-bench: rank ", r, " of ", world, " on ", folder, " failed (exit ", rc,
                    ")");
      }
      double slowest = 0;
      RankLine worst;
      bool ok = true;
      long long bound_kib = 0, packs_kib = 0;
      for (const auto& l : lines) {
        slowest = std::max(slowest, l.load_s);
        const long long bound = (l.read_bytes + l.largest_bytes) / 1024 + 64 * 1024;
        const long long packs = std::max(0LL, l.kept_anon_kib - l.read_bytes / 1024);
        ok = ok && l.peak_anon_kib - packs <= bound;
        if (l.peak_anon_kib >= worst.peak_anon_kib) worst = l, bound_kib = bound, packs_kib = packs;
      }
      if (kind == Kind::kLoad) all_ok = all_ok && ok;  // the bound is the new load's
      const double mb = static_cast<double>(worst.read_bytes) / 1e6;
      table.add(
          {std::string(fp8 ? "fp8_block" : "bfloat16") + (draw                     ? " (drawn first, as before)"
                                                          : kind == Kind::kNoPacks ? " (no packs: TP_CPU_GEMM_PACK=0)"
                                                                                   : ""),
           std::to_string(world), format("%.3f", slowest), format("%.1f", mb), format("%.2f", mb / 1e3 / slowest),
           format("%.2f", warm), format("%.2f", cold), format("%.2f", touch), format("%.2f", touch_all),
           format("%.1f", worst.peak_rss_kib / 1024.0), format("%.1f", worst.peak_anon_kib / 1024.0),
           format("%.1f", packs_kib / 1024.0), format("%.1f", (worst.peak_anon_kib - packs_kib) / 1024.0),
           format("%.1f", bound_kib / 1024.0), ok ? "yes" : "NO", format("%.1f", worst.forward_anon_kib / 1024.0)});
    }
  }
  std::cout << table.str() << "load average at the end: " << load_average() << "\n";
  if (c.check && !all_ok) {
    std::cerr << "tp-load-bench --model: a rank's peak anonymous memory exceeded its bound\n";
    return 1;
  }
  return 0;
}

}  // namespace tp::bench
