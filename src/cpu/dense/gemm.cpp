#include "cpu/dense/gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

#include "common/env.h"
#include "cpu/dense/backends.h"
#include "cpu/dense/table.h"
#include "cpu/kernel_counts.h"

namespace tp::cpu {

namespace {

constexpr std::array<DenseBackend, kDenseBackendCount> kAllBackends{DenseBackend::kAtLinear,  DenseBackend::kOneDnn,
                                                                    DenseBackend::kGemv,      DenseBackend::kBf16Tiles,
                                                                    DenseBackend::kMklPacked, DenseBackend::kPanels};

std::array<std::atomic<int64_t>, kDenseBackendCount>& global_counts() {
  static std::array<std::atomic<int64_t>, kDenseBackendCount> counts{};
  return counts;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The name benchmarks print: the backend, with the ISA for the own kernels.
std::string kernel_name(DenseBackend b) {
  std::string name = to_string(b);
  if (b == DenseBackend::kGemv || b == DenseBackend::kBf16Tiles || b == DenseBackend::kPanels)
    name += std::string("/") + to_string(cpu::isa());
  return name;
}

bool packed_backend(DenseBackend b) {
  return b == DenseBackend::kOneDnn || b == DenseBackend::kMklPacked || b == DenseBackend::kPanels;
}

}  // namespace

// ---- names, problem, table ---------------------------------------------------------------

const char* to_string(DenseBackend backend) {
  switch (backend) {
    case DenseBackend::kAtLinear: return "at_linear";
    case DenseBackend::kOneDnn: return "onednn";
    case DenseBackend::kGemv: return "gemv";
    case DenseBackend::kBf16Tiles: return "bf16_tiles";
    case DenseBackend::kMklPacked: return "mkl_packed";
    case DenseBackend::kPanels: return "panels";
  }
  return "unknown";
}

DenseBackend parse_dense_backend(const std::string& name) {
  const std::string l = lower(name);
  for (const auto b : kAllBackends)
    if (l == to_string(b)) return b;
  TORCH_CHECK_VALUE(false, "unknown CPU GEMM backend '", name,
                    "'; expected auto, at_linear, onednn, mkl_packed, panels, gemv or bf16_tiles");
}

DenseProblem dense_problem(int64_t m, int64_t n, int64_t k, at::ScalarType dtype) {
  DenseProblem p;
  p.m = m, p.n = n, p.k = k, p.dtype = dtype;
  p.isa = cpu::isa();
  const auto& f = features();
  // TP_CPU_ISA=avx2 stands for a machine without AVX-512, hence without its bf16 too.
  p.native_bf16 = p.isa == Isa::kAvx512 && (f.avx512bf16 || f.amx_bf16);
  p.amx_bf16 = p.isa == Isa::kAvx512 && f.amx_bf16;
  p.amd = f.amd;
  p.threads = at::get_num_threads();
  p.onednn = onednn_supports(dtype);
  p.mkl_packed = dtype == at::kFloat && mkl_packed_available();
  static const bool allow_packs = detail::env_value("TP_CPU_GEMM_PACK").value_or("1") != "0";
  p.allow_packs = allow_packs;
  return p;
}

bool dense_supports(DenseBackend backend, const DenseProblem& p) {
  const bool floating = p.dtype == at::kFloat || p.dtype == at::kBFloat16;
  switch (backend) {
    case DenseBackend::kAtLinear: return true;
    case DenseBackend::kOneDnn: return floating && p.onednn;
    case DenseBackend::kGemv: return floating;
    case DenseBackend::kBf16Tiles: return p.dtype == at::kBFloat16;
    case DenseBackend::kMklPacked: return p.dtype == at::kFloat && p.mkl_packed;
    case DenseBackend::kPanels: return floating && p.isa != Isa::kScalar;
  }
  return false;
}

DenseBackend select_dense_backend(const DenseProblem& p) { return DenseTable::builtin().select(p); }

std::optional<DenseBackend> forced_dense_backend() {
  static const std::optional<DenseBackend> forced = []() -> std::optional<DenseBackend> {
    const auto env = detail::env_value("TP_CPU_GEMM");
    if (!env || lower(*env) == "auto") return std::nullopt;
    return parse_dense_backend(*env);
  }();
  return forced;
}

std::map<DenseBackend, int64_t> dense_backend_counts() {
  std::map<DenseBackend, int64_t> out;
  for (const auto b : kAllBackends) {
    const int64_t c = global_counts()[static_cast<int>(b)].load(std::memory_order_relaxed);
    if (c > 0) out[b] = c;
  }
  return out;
}

// ---- DenseGemm ---------------------------------------------------------------------------

void DenseGemm::bind(const at::Tensor& weight) {
  TORCH_INTERNAL_ASSERT(weight.dim() == 2, "DenseGemm: weight must be [N, K], got ", weight.sizes());
  std::lock_guard<std::mutex> lock(mutex_);
  weight_ = weight;
  for (auto& p : packs_by_backend_) p = Pack{};
  packs_ = 0;
  for (auto& c : counts_) c = 0;
}

void DenseGemm::prepare(const at::Tensor& weight) {
  bind(weight);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!serves(at::empty({0, weight.size(1)}, weight.options())) || weight.numel() == 0) return;
  // Pack now what the table (or TP_CPU_GEMM) picks for this weight at some M, so the
  // first forward does not pay for it.
  std::vector<DenseBackend> wanted;
  if (const auto forced = forced_dense_backend()) wanted.push_back(*forced);
  for (int64_t m = 1; m <= 4096; m *= 2)
    wanted.push_back(
        DenseTable::active().select(dense_problem(m, weight.size(0), weight.size(1), weight.scalar_type())));
  const auto p = dense_problem(1, weight.size(0), weight.size(1), weight.scalar_type());
  for (const auto b : wanted) {
    auto& pack = packs_by_backend_[static_cast<int>(b)];
    if (!packed_backend(b) || pack.data.defined() || !dense_supports(b, p)) continue;
    pack.data = make_pack(b);
    pack.key = TensorStamp::of({weight_});
    ++packs_;
  }
}

at::Tensor DenseGemm::make_pack(DenseBackend backend) const {
  at::NoGradGuard no_grad;
  switch (backend) {
    case DenseBackend::kOneDnn: return onednn_pack(weight_);
    case DenseBackend::kMklPacked: return mkl_pack(weight_);
    case DenseBackend::kPanels: return panels_pack(weight_, cpu::isa());
    default: TORCH_INTERNAL_ASSERT(false, "DenseGemm: ", to_string(backend), " keeps no packed weight");
  }
}

at::Tensor DenseGemm::packed(DenseBackend backend) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& pack = packs_by_backend_[static_cast<int>(backend)];
  TensorStamp now = TensorStamp::of({weight_});
  if (!pack.data.defined() || pack.key != now) {
    pack.data = at::Tensor();  // free the stale copy before making the new one
    pack.data = make_pack(backend);
    pack.key = std::move(now);
    ++packs_;
  }
  return pack.data;
}

int64_t DenseGemm::packed_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  const auto& onednn = packs_by_backend_[static_cast<int>(DenseBackend::kOneDnn)].data;
  if (onednn.defined()) bytes += onednn_packed_bytes(onednn);
  for (const auto b : {DenseBackend::kMklPacked, DenseBackend::kPanels}) {
    const auto& data = packs_by_backend_[static_cast<int>(b)].data;
    if (data.defined()) bytes += data.numel() * static_cast<int64_t>(data.element_size());
  }
  return bytes;
}

bool DenseGemm::serves(const at::Tensor& x) const {
  if (!weight_.defined() || !x.is_cpu() || !weight_.is_cpu()) return false;
  const auto t = weight_.scalar_type();
  if ((t != at::kFloat && t != at::kBFloat16) || x.scalar_type() != t) return false;
  if (weight_.dim() != 2 || x.dim() < 1 || x.size(-1) != weight_.size(1)) return false;
  return weight_.stride(1) == 1 && weight_.stride(0) >= weight_.size(1);
}

bool DenseGemm::can_run(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  if (!serves(x)) return false;
  const bool has_bias = bias && bias->defined();
  // The backends here have no backward: a call that records a graph takes at::linear.
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || weight_.requires_grad() || (has_bias && bias->requires_grad())))
    return false;
  // A bias at::linear would refuse or broadcast goes there, which reports or handles it.
  if (has_bias && (!bias->is_cpu() || bias->scalar_type() != weight_.scalar_type() || bias->dim() != 1 ||
                   bias->size(0) != weight_.size(0)))
    return false;
  return x.numel() > 0 && weight_.numel() > 0;
}

DenseBackend DenseGemm::backend_for(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  if (!can_run(x, bias)) return DenseBackend::kAtLinear;
  const auto p = dense_problem(x.numel() / x.size(-1), weight_.size(0), weight_.size(1), weight_.scalar_type());
  if (const auto forced = forced_dense_backend(); forced && dense_supports(*forced, p)) return *forced;
  return DenseTable::active().select(p);
}

at::Tensor DenseGemm::linear(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  return linear(x, bias, backend_for(x, bias));
}

at::Tensor DenseGemm::linear(const at::Tensor& x, const std::optional<at::Tensor>& bias, DenseBackend backend) const {
  if (backend != DenseBackend::kAtLinear &&
      (!can_run(x, bias) || !dense_supports(backend, dense_problem(x.numel() / x.size(-1), weight_.size(0),
                                                                   weight_.size(1), weight_.scalar_type()))))
    backend = DenseBackend::kAtLinear;
  counts_[static_cast<int>(backend)].fetch_add(1, std::memory_order_relaxed);
  global_counts()[static_cast<int>(backend)].fetch_add(1, std::memory_order_relaxed);
  count_kernel(kernel_name(backend));
  if (backend == DenseBackend::kAtLinear) return at::linear(x, weight_, bias);
  const auto x2d = x.reshape({-1, x.size(-1)}).contiguous();
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = weight_.size(0);
  return run(backend, x2d, bias).view(out_sizes);
}

at::Tensor DenseGemm::run(DenseBackend backend, const at::Tensor& x2d, const std::optional<at::Tensor>& bias) const {
  const bool has_bias = bias && bias->defined();
  at::Tensor y;  // float32 unless the backend produced the layer's dtype
  switch (backend) {
    case DenseBackend::kOneDnn:
      return onednn_linear(x2d, packed(backend),
                           has_bias ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt);
    case DenseBackend::kMklPacked: y = mkl_packed_linear(x2d, packed(backend), weight_.size(0)); break;
    case DenseBackend::kPanels:
      y = panels_linear(x2d, packed(backend), weight_.size(0), cpu::isa(),
                        features().amd ? kPanelXBlockBytesAmd : kPanelXBlockBytes);
      break;
    case DenseBackend::kGemv: y = gemv_linear(x2d, weight_, cpu::isa()); break;
    case DenseBackend::kBf16Tiles: y = bf16_tiles_linear(x2d, weight_, cpu::isa()); break;
    case DenseBackend::kAtLinear: return at::linear(x2d, weight_, bias);
  }
  if (has_bias) y.add_(*bias);
  if (y.scalar_type() == weight_.scalar_type()) return y.contiguous();
  auto out = at::empty(y.sizes(), y.options().dtype(weight_.scalar_type()));
  return out.copy_(y);  // one rounding to the layer's dtype, into a contiguous result
}

std::map<DenseBackend, int64_t> DenseGemm::counts() const {
  std::map<DenseBackend, int64_t> out;
  for (const auto b : kAllBackends) {
    const int64_t c = counts_[static_cast<int>(b)].load(std::memory_order_relaxed);
    if (c > 0) out[b] = c;
  }
  return out;
}

}  // namespace tp::cpu
