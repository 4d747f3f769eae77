// tp-bench's checkpoint: the block's weights written once per (shape, seed, format,
// dtype) to a cached safetensors file that every rank then loads its shard of.

#include "bench_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "tp/loader/safetensors.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/quant/quantize.h"

namespace tp::bench {

namespace {

// The checkpoint tensors of one linear layer's weight [out, in] in `format`, by full
// name: the weight itself in the dtype under test (format none), or what
// quantize_weight makes of it.
std::map<std::string, at::Tensor> layer_tensors(const std::string& prefix, const at::Tensor& weight,
                                                const std::string& format, c10::ScalarType dtype) {
  const auto config = parse_quant_config(format);
  if (config.format == QuantFormat::kNone) return {{prefix + ".weight", weight.to(dtype)}};
  std::map<std::string, at::Tensor> out;
  for (const auto& [suffix, t] : quantize_weight(weight, config)) out.emplace(prefix + "." + suffix, t);
  return out;
}

int64_t source_bytes(const TensorSource& src) {
  int64_t n = 1;
  for (const auto d : src.shape()) n *= d;
  return n * static_cast<int64_t>(c10::elementSize(src.dtype()));
}

}  // namespace

QuantizedTensors read_layer(const Checkpoint& ckpt, const std::string& prefix) {
  QuantizedTensors out;
  for (const auto& n : ckpt.names())
    if (n.rfind(prefix + ".", 0) == 0) out.emplace(n.substr(prefix.size() + 1), ckpt.get(n).read_all());
  return out;
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    default: return c10::toString(dtype);
  }
}

std::string shape_tag(const BlockShape& s) {
  return format("h%lld-i%lld-q%lld-kv%lld-d%lld", (long long)s.hidden, (long long)s.intermediate, (long long)s.heads,
                (long long)s.kv_heads, (long long)s.head_dim);
}

CheckpointFile ensure_checkpoint(const BenchConfig& config, const std::string& format, c10::ScalarType dtype) {
  namespace fs = std::filesystem;
  std::string dir = config.ckpt_dir;
  if (dir.empty()) {
    const char* home = std::getenv("HOME");
    dir = std::string(home && *home ? home : "/tmp") + "/.cache/tp/bench";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(!ec, "tp-bench: cannot create the checkpoint folder ", dir, ": ", ec.message());
  const auto& s = config.shape;
  const std::string name = s.name == "custom" ? "custom-" + shape_tag(s) : s.name;
  CheckpointFile file;
  std::string format_tag = format;
  std::replace(format_tag.begin(), format_tag.end(), ':', '-');
  file.path = dir + "/" + name + "-" + format_tag + "-" + dtype_name(dtype) + ".safetensors";
  const std::string signature =
      shape_tag(s) + " seed " + std::to_string(config.seed) + " " + format + " " + dtype_name(dtype) + " v1";
  if (fs::exists(file.path)) {
    try {
      const auto existing = SafetensorsFile::open(file.path);
      const auto it = existing.metadata().find("tp_bench");
      if (it != existing.metadata().end() && it->second == signature) return file;
    } catch (const c10::Error&) {
      // Unreadable or stale: written again below.
    }
  }
  std::cerr << "  writing the checkpoint " << file.path << " (once; later runs reuse it)\n" << std::flush;
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, at::Tensor> tensors;
  uint64_t seed = config.seed;
  auto add = [&](const std::string& prefix, int64_t out, int64_t in) {
    auto gen = at::detail::createCPUGenerator(seed++);
    const auto w = at::randn({out, in}, gen, at::kFloat) / std::sqrt(static_cast<double>(in));
    for (auto& [n, t] : layer_tensors(prefix, w, format, dtype)) tensors.emplace(n, t);
  };
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  add(kQ, q, s.hidden);
  add(kK, kv, s.hidden);
  add(kV, kv, s.hidden);
  add(kO, s.hidden, q);
  add(kGate, s.intermediate, s.hidden);
  add(kUp, s.intermediate, s.hidden);
  add(kDown, s.hidden, s.intermediate);
  save_safetensors(file.path, tensors, {{"format", "pt"}, {"tp_bench", signature}});
  file.written = true;
  file.write_s = seconds_since(t0);
  return file;
}

int64_t stored_bytes(const Checkpoint& ckpt, const std::string& prefix) {
  int64_t total = 0;
  for (const auto& n : ckpt.names())
    if (n.rfind(prefix + ".", 0) == 0) total += source_bytes(ckpt.get(n));
  return total;
}

}  // namespace tp::bench
