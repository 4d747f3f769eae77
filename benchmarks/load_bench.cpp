// tp-load-bench: what loading one rank's shard from a safetensors file costs in
// memory and time. See docs/performance.md "Loading benchmark".
//
//   tp-load-bench                          # [16384, 16384] float32 (1 GiB), rank 1 of 4
//   tp-load-bench --rows 8192 --cols 32768 --world 8 --rank 3 --dir /scratch
//   tp-load-bench --model [--hidden 2048 --intermediate 5632 --layers 8 --vocab 32000 --heads 16 --kv-heads 4]
//                 [--tp 1,2] [--formats bf16,fp8] [--check]   # whole models: load_bench_model.cpp
//
// The parent writes the tensor once (tp::save_safetensors) and reads the file once
// so the page cache is warm. Each split (dim 0: rows, dim 1: columns) is then
// measured in a fresh child process, so the peak RSS is that of the load alone:
//   memory: VmHWM after loading the shard minus VmRSS just before (the kernel's
//           peak is reset first via /proc/self/clear_refs), against shard + 64 MiB;
//   speed:  loading the shard (SafetensorsSource::read: mmap, copy, release) vs
//           reading the same bytes with plain pread into a fresh buffer (one pread
//           for a row range, one per row for a column range), alternating, medians;
//           and into a parameter already allocated, as a layer's load fills it: read
//           then copy_ (the path before issue 46) vs read_into (straight from the mapped
//           file), into float32 and into bfloat16 (the dtype converted on the way).

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "load_bench_model.h"
#include "tp/loader/safetensors.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/shard/split.h"

using namespace tp::bench;

namespace {

const char* kUsage = R"(usage: tp-load-bench [options]
  --rows N --cols N   the float32 tensor written and sharded   (default 16384 16384: 1 GiB)
  --world N --rank R  which shard is loaded                     (default 4, 1)
  --rounds N          timed rounds per side                     (default 7)
  --dir PATH          where the file is written                 (default $TMPDIR or /tmp)
  --keep              keep the file (reused by the next run with the same shape)
 or, for whole models (CausalLM::from_pretrained, one process per rank):
  --model             the loading table of a generated Llama folder
  --hidden N --intermediate N --layers N --vocab N --heads N --kv-heads N
                      its shape                                 (default 2048 5632 8 32000 16 4)
  --tp LIST           TP sizes                                  (default 1,2)
  --formats LIST      bf16 and / or fp8 (fp8_block)             (default bf16,fp8)
  --check             exit 1 when a rank's peak anonymous memory exceeds shard + largest tensor + 64 MiB
  --no-draw           leave out the bfloat16 rows with the model drawn first (the load before issue 46)
  --threads N         intra-op threads per rank                 (default: hardware threads / TP size)
)";

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

int model_main(int argc, char** argv) {
  tp::bench::ModelLoadConfig c;
  const char* tmp = std::getenv("TMPDIR");
  c.dir = tmp && *tmp ? tmp : "/tmp";
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--check") {
      c.check = true;
      continue;
    }
    if (flag == "--no-draw") {
      c.draw_rows = false;
      continue;
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-load-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    if (flag == "--dir") {
      c.dir = value;
    } else if (flag == "--tp") {
      c.tp_sizes = int_list(value);
    } else if (flag == "--formats") {
      c.formats.clear();
      std::stringstream in(value);
      std::string item;
      while (std::getline(in, item, ',')) {
        TORCH_CHECK_VALUE(item == "bf16" || item == "fp8", "tp-load-bench: --formats takes bf16 and fp8; got ", item);
        c.formats.push_back(item == "fp8");
      }
    } else if (flag == "--port") {
      c.port = static_cast<int>(std::stoll(value));
    } else {
      const int64_t v = std::stoll(value);
      TORCH_CHECK_VALUE(v > 0, "tp-load-bench: ", flag, " must be positive; got ", value);
      if (flag == "--hidden")
        c.hidden = v;
      else if (flag == "--intermediate")
        c.intermediate = v;
      else if (flag == "--layers")
        c.layers = v;
      else if (flag == "--vocab")
        c.vocab = v;
      else if (flag == "--heads")
        c.heads = v;
      else if (flag == "--kv-heads")
        c.kv_heads = v;
      else if (flag == "--threads")
        c.threads = static_cast<int>(v);
      else
        TORCH_CHECK_VALUE(false, "tp-load-bench: unknown option ", flag, "\n", kUsage);
    }
  }
  TORCH_CHECK_VALUE(c.hidden % c.heads == 0 && c.heads % c.kv_heads == 0,
                    "tp-load-bench: hidden must be a multiple of heads, heads of kv-heads");
  return tp::bench::run_model_load(c);
}

struct Config {
  int64_t rows = 16384, cols = 16384, world = 4, rank = 1, rounds = 7;
  std::string dir;
  bool keep = false;
};

void pread_all(int fd, uint8_t* dst, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
    TORCH_CHECK(got > 0, "tp-load-bench: pread failed: ", got < 0 ? std::strerror(errno) : "end of file");
    dst += got, n -= static_cast<size_t>(got), offset += static_cast<uint64_t>(got);
  }
}

// The data section's offset in the file: 8 + header length.
uint64_t data_offset(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t b[8] = {};
  in.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return 8 + n;
}

// The child: loads the shard once for memory, then alternates load and pread.
// Prints "peak_kib shard_bytes load_s pread_s".
int child(const std::string& path, int64_t dim, const Config& c) {
  const auto file = tp::SafetensorsFile::open(path);
  const auto source = file.source("w");
  const int64_t extent = source->shape()[dim];
  const tp::Range range = tp::split_for_rank(extent, c.world, c.rank, {}, dim == 0 ? "rows" : "cols");
  reset_peak_rss();
  const int64_t rss_before = proc_status_kib("VmRSS");
  at::Tensor shard = source->read(dim, range);
  const int64_t peak_kib = proc_status_kib("VmHWM") - rss_before;
  const size_t shard_bytes = shard.nbytes();
  shard.reset();

  const uint64_t base = data_offset(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "tp-load-bench: cannot open ", path);
  const size_t row_bytes = static_cast<size_t>(c.cols) * sizeof(float);
  auto by_pread = [&] {
    auto out = dim == 0 ? at::empty({range.size(), c.cols}, at::kFloat) : at::empty({c.rows, range.size()}, at::kFloat);
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    if (dim == 0) {
      pread_all(fd, dst, out.nbytes(), base + static_cast<uint64_t>(range.begin) * row_bytes);
    } else {
      const size_t run = static_cast<size_t>(range.size()) * sizeof(float);
      for (int64_t r = 0; r < c.rows; ++r)
        pread_all(fd, dst + r * run, run, base + r * row_bytes + range.begin * sizeof(float));
    }
    return out;
  };
  // Same bytes both ways (checked once, outside the timing).
  TORCH_CHECK(at::equal(source->read(dim, range), by_pread()), "tp-load-bench: the loaded shard differs from pread");
  std::vector<double> load_s, pread_s, copy_s, into_s, copy_bf16_s, into_bf16_s;
  auto shape = source->shape();
  shape[dim] = range.size();
  const at::Tensor param = at::empty(shape, at::kFloat), param_bf16 = at::empty(shape, at::kBFloat16);
  for (int64_t i = 0; i < c.rounds; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    { const auto t = source->read(dim, range); }
    load_s.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    { const auto t = by_pread(); }
    pread_s.push_back(seconds_since(t0));
    for (const auto& [dst, copy, into] :
         {std::tuple{param, &copy_s, &into_s}, std::tuple{param_bf16, &copy_bf16_s, &into_bf16_s}}) {
      t0 = std::chrono::steady_clock::now();
      dst.copy_(source->read(dim, range));
      copy->push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      source->read_into(dim, range, dst);
      into->push_back(seconds_since(t0));
    }
  }
  TORCH_CHECK(at::equal(param, source->read(dim, range)), "tp-load-bench: read_into differs from read");
  ::close(fd);
  std::cout << peak_kib << " " << shard_bytes << " " << median(load_s) << " " << median(pread_s) << " "
            << median(copy_s) << " " << median(into_s) << " " << median(copy_bf16_s) << " " << median(into_bf16_s)
            << std::endl;
  return 0;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  TORCH_CHECK(n > 0, "tp-load-bench: readlink(/proc/self/exe) failed");
  return std::string(buf, static_cast<size_t>(n));
}

Config parse(int argc, char** argv, std::vector<std::string>* child_args) {
  Config c;
  const char* tmp = std::getenv("TMPDIR");
  c.dir = tmp && *tmp ? tmp : "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--keep") {
      c.keep = true;
      continue;
    }
    if (flag == "--child") {  // internal: --child PATH DIM
      TORCH_CHECK_VALUE(i + 2 < argc, "tp-load-bench: --child needs PATH DIM");
      child_args->assign({argv[i + 1], argv[i + 2]});
      i += 2;
      continue;
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "tp-load-bench: ", flag, " needs a value\n", kUsage);
    const std::string value = argv[++i];
    if (flag == "--dir") {
      c.dir = value;
      continue;
    }
    int64_t v = 0;
    try {
      v = std::stoll(value);
    } catch (const std::exception&) {
      v = -1;
    }
    TORCH_CHECK_VALUE(v >= 0, "tp-load-bench: ", flag, " expects a non-negative integer; got '", value, "'");
    if (flag == "--rows")
      c.rows = v;
    else if (flag == "--cols")
      c.cols = v;
    else if (flag == "--world")
      c.world = v;
    else if (flag == "--rank")
      c.rank = v;
    else if (flag == "--rounds")
      c.rounds = v;
    else
      TORCH_CHECK_VALUE(false, "tp-load-bench: unknown option ", flag, "\n", kUsage);
  }
  TORCH_CHECK_VALUE(c.rows > 0 && c.cols > 0 && c.world > 0 && c.rank < c.world && c.rounds > 0,
                    "tp-load-bench: need rows, cols, world, rounds > 0 and rank < world");
  return c;
}

std::string child_flags(const Config& c) {
  std::ostringstream os;
  os << " --rows " << c.rows << " --cols " << c.cols << " --world " << c.world << " --rank " << c.rank << " --rounds "
     << c.rounds;
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--model") return model_main(argc, argv);
    if (argc > 7 && std::string(argv[1]) == "--model-child")  // internal: FOLDER WORLD RANK PORT draw|load THREADS
      return tp::bench::run_model_load_child(argv[2], std::stoll(argv[3]), std::stoll(argv[4]),
                                             static_cast<int>(std::stoll(argv[5])), std::string(argv[6]) == "draw",
                                             static_cast<int>(std::stoll(argv[7])));
    std::vector<std::string> child_args;
    const Config c = parse(argc, argv, &child_args);
    if (!child_args.empty()) return child(child_args[0], std::stoll(child_args[1]), c);

    const std::string path =
        c.dir + "/tp_load_bench_" + std::to_string(c.rows) + "x" + std::to_string(c.cols) + ".safetensors";
    const double gib = static_cast<double>(c.rows * c.cols * 4) / (1 << 30);
    if (!c.keep || ::access(path.c_str(), R_OK) != 0) {
      std::cerr << "  writing " << path << " (" << format("%.2f", gib) << " GiB)...\n";
      tp::save_safetensors(path, {{"w", at::arange(c.rows * c.cols, at::kFloat).view({c.rows, c.cols})}});
    }
    {  // warm the page cache: both sides then read from memory
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      TORCH_CHECK(fd >= 0, "tp-load-bench: cannot open ", path);
      std::vector<uint8_t> buf(size_t{64} << 20);
      while (::read(fd, buf.data(), buf.size()) > 0) {}
      ::close(fd);
    }
    std::cout << "tp-load-bench: rank " << c.rank << " of " << c.world << ", tensor [" << c.rows << ", " << c.cols
              << "] float32 (" << format("%.2f", gib) << " GiB) in " << path
              << "; page cache warm; each split in a fresh"
              << " process; times are medians of " << c.rounds << " alternating rounds\n";
    Table table({"split", "shard MiB", "peak RSS - before, MiB", "limit (shard + 64)", "ok", "load GB/s", "pread GB/s",
                 "load/pread", "read+copy_ GB/s", "read_into GB/s", "-> bf16: read+copy_", "read_into"});
    bool all_ok = true;
    for (int64_t dim : {0, 1}) {
      const std::string cmd =
          "'" + self_exe() + "'" + child_flags(c) + " --child '" + path + "' " + std::to_string(dim);
      std::FILE* p = ::popen(cmd.c_str(), "r");
      TORCH_CHECK(p != nullptr, "tp-load-bench: cannot start ", cmd);
      long long peak_kib = 0, shard_bytes = 0;
      double load_s = 0, pread_s = 0, copy_s = 0, into_s = 0, copy_bf16_s = 0, into_bf16_s = 0;
      const int got = std::fscanf(p, "%lld %lld %lf %lf %lf %lf %lf %lf", &peak_kib, &shard_bytes, &load_s, &pread_s,
                                  &copy_s, &into_s, &copy_bf16_s, &into_bf16_s);
      const int rc = ::pclose(p);
      TORCH_CHECK(got == 8 && rc == 0, "tp-load-bench: the child for dim ", dim, " failed (exit ", rc, ")");
      const double shard_mib = static_cast<double>(shard_bytes) / (1 << 20);
      const double peak_mib = static_cast<double>(peak_kib) / 1024;
      const bool ok = peak_mib <= shard_mib + 64;
      all_ok = all_ok && ok;
      table.add({dim == 0 ? "dim 0 (rows)" : "dim 1 (cols)", format("%.1f", shard_mib), format("%.1f", peak_mib),
                 format("%.1f", shard_mib + 64), ok ? "yes" : "NO", format("%.2f", shard_bytes / load_s / 1e9),
                 format("%.2f", shard_bytes / pread_s / 1e9), format("%.2f", pread_s / load_s),
                 format("%.2f", shard_bytes / copy_s / 1e9), format("%.2f", shard_bytes / into_s / 1e9),
                 format("%.2f", shard_bytes / copy_bf16_s / 1e9), format("%.2f", shard_bytes / into_bf16_s / 1e9)});
    }
    std::cout << table.str();
    if (!c.keep) ::unlink(path.c_str());
    return all_ok ? 0 : 1;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
