#include "cpu/dense/gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

#include "common/env.h"
#include "cpu/dense/backends.h"
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

// The table. Measured with tp-cpu-gemm-bench (1 thread, thread CPU clock, cold weights,
// Llama-3-8B layers at TP 1 and 2: 4096 x {6144, 4096, 28672}, 14336 x 4096 and their
// halves; ratios are at::linear's time / the backend's, same dtype, same run) on a
// Sapphire Rapids-class VM, natively (AVX-512, AMX) and capped to AVX2
// (TP_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
// MKL_ENABLE_INSTRUCTIONS=AVX2); docs/performance.md "CPU GEMM backends" has the tables.
//   float32, M <= 4 (on Intel with a packed copy M = 1 only, next row): gemv, at
//     at::linear's memory rate at M = 1 (0.9-1.04x on one thread; it also threads where
//     MKL's GEMV does not), 1.4-1.9x at M = 4.
//   float32, 1 < M <= 4, Intel: panels (an Emerald Rapids VM, 2026-12-02, 2 threads, the
//     four Llama shapes at TP 1 plus 4096 x 4096): 1.07-1.21x gemv natively, 1.03-1.43x
//     capped to AVX2, both at or near the memory rate; at M = 1 level (0.98-1.03x), so
//     gemv, which needs no packed copy. (The Sapphire Rapids rows below did not compare
//     the two at M <= 4.)
//   float32, 4 < M <= 64, Intel: panels (2 threads, 11008 x 4096, same run as
//     at::linear, oneDNN and gemv): AVX-512 M = 8 3.0x, 16 2.35-2.65x, 32 1.6-1.8x,
//     64 1.3-1.45x (oneDNN 1.7x, 1.4x, 1.2x, 1.2x; gemv 2.2x, 1.4-1.7x, 1.15x, 1.0x);
//     capped to AVX2 M = 5 2.7x, 8 1.9x, 16 1.65x, 32 1.2x, 64 1.1x (gemv 1.6x, 1.5x,
//     1.3x, 1.1x, 1.05x; MKL's packed SGEMM and oneDNN 0.9-1.08x).
//   float32, M > 64, Intel: at::linear. oneDNN is 1.07-1.17x at M = 96-256 with AVX-512,
//     but its copy of W would be a second one next to the panels (a layer keeps one:
//     cpu/dense/gemm.h), and the panels kernel is 0.9-1.05x there. Capped to AVX2, at::linear
//     is at 97 % of the FMA ceiling at M = 256 (MKL's packed SGEMM 1.02x, oneDNN 0.86x).
//   float32 on AMD (Zen 4 VM, 2 threads, 11008 x 4096 and 4096 x 14336, plus 4096 x
//     4096 and 6144 x 4096 at M = 96 and 256; 2026-12-02): MKL's SGEMM is far behind
//     there (M = 4 42 ms where gemv takes 7.5 ms), so every row is an own kernel or
//     oneDNN. Panels from M = 5 to any M, the layer's one packed copy: AVX-512 M = 8
//     3.0-4.95x at::linear, 16 3.5-5.1x, 64 2.2-2.5x (oneDNN 2.4-4.6x, 2.5-3.8x,
//     2.1-2.8x), M = 96 level with oneDNN, M = 256 1.4-1.85x (oneDNN 2-7 % faster with
//     AMD's 2 MiB x slices, kPanelXBlockBytesAmd; 5-11 % with 512 KiB); capped to AVX2,
//     panels 1.1-4.2x at::linear at M = 8-256, level with or ahead of oneDNN (capped
//     too: 0.9-1.5x) in all but one run at M = 256. Without packs, gemv at every M:
//     1.2-1.55x at::linear at M = 96-256 in both ISAs.
//   bfloat16 with bf16 arithmetic (AMX): gemv up to M = 4 (1.2-2.4x); at M = 8-16 the
//     packed oneDNN weight is 0.8-1.5x (slower on o and qkv/2), so at::linear (ATen's
//     oneDNN on the plain weight); above, oneDNN packed, 1.05-2.3x.
//   bfloat16 without it: at::linear (ATen's bf16 GEMM) is 2-6x slower than float32;
//     gemv to M = 4 (on Intel with packs the panels from M = 1, below); the panels
//     kernel (bf16 panels, half the bytes, widened in registers) to M = 64: against
//     float32 at::linear 1.9x at M = 8, 1.55-1.6x at 16,
//     1.2-1.3x at 32, 0.95x at 64, level with float32 panels (11008 x 4096, 2 threads,
//     capped to AVX2; gemv was 1.1-1.3x at M = 8-16, bf16_tiles 0.8x at 32);
//     then bf16_tiles (3-5.8x at::linear bf16; 0.7-0.9x at::linear float32 at M >= 64).
//     bf16 with AMX keeps at::linear to M = 16: there the panels kernel is 0.86-1.1x.
//     On AMD with AVX512_BF16 (Zen 4) oneDNN's packed weight is ahead from M = 5: 1.36-
//     1.59x at::linear at M = 16, 1.14-1.17x at 64, 1.06x at 256 (panels 1.1-1.2x at 16).
//     On Intel with AVX512_BF16 but no AMX (an Emerald Rapids VM that does not expose
//     AMX, 2026-12-02; Cooper Lake is the same ISA) the bf16 arithmetic does not pay:
//     11008 x 4096 and 4096 x 14336, 2 threads, the panels kernel on bf16 panels was
//     1.95-2.1x at::linear bf16 at M = 8-16, 1.4-1.6x at 32-64 (oneDNN 1.09-1.29x, gemv
//     1.07-1.34x), and bf16_tiles / panels 1.3-1.5x at 256 (oneDNN 1.02-1.06x): the rows
//     without bf16 arithmetic.
//   bfloat16 without bf16 arithmetic, Intel, with packs: the panels from M = 1 (same VM,
//     2 threads, the four Llama shapes at TP 1 plus 4096 x 4096, two runs each): gemv's
//     time / the panels' 1.01-1.20x at M = 1-4 natively (one 0.96), 1.07-1.41x capped to
//     AVX2. On AMD (the Zen 4 VM capped to AVX2, i.e. a Zen 3's ISA; 2026-12-02, same
//     shapes, 2 threads) gemv's time / the panels' was 0.90-1.01x at M = 1, 1.02-1.11x
//     at 2, 0.98-1.28x at 3, 1.14-1.33x at 4: gemv at M = 1 only, as for float32 on
//     Intel. (float32 there: gemv ahead natively at M <= 4, level capped to AVX2.)
//     Past M = 64 the panels stay on AMD, as for float32 there: bf16_tiles' time / the
//     panels' 1.15-1.48x at M = 96-512 (6144 x 4096, 28672 x 4096, 4096 x 14336), where
//     bf16_tiles was 1.2-1.5x slower than the float32 layer (its panels) and the bf16
//     panels level with it (0.96-1.12x).
DenseBackend select_dense_backend(const DenseProblem& p) {
  if (p.dtype != at::kFloat && p.dtype != at::kBFloat16) return DenseBackend::kAtLinear;
  // The portable ISA (TP_CPU_ISA=scalar, or a CPU without AVX2): ATen's own choice.
  if (p.isa == Isa::kScalar) return DenseBackend::kAtLinear;
  // bf16 arithmetic worth taking: AMX, or AMD's AVX512_BF16 (Intel's alone is not).
  const bool bf16_arithmetic = p.native_bf16 && (p.amx_bf16 || p.amd);
  int64_t gemv_max_m = kCpuGemvMaxM;
  if (p.allow_packs && p.dtype == at::kFloat && !p.amd) gemv_max_m = kCpuGemvMaxMPacked;
  if (p.allow_packs && p.dtype == at::kBFloat16 && !bf16_arithmetic) gemv_max_m = p.amd ? kCpuGemvMaxMPacked : 0;
  if (p.m <= gemv_max_m) return DenseBackend::kGemv;
  const bool onednn = p.onednn && p.allow_packs;
  if (p.dtype == at::kBFloat16) {
    if (bf16_arithmetic) {
      if (!onednn || (p.m <= kCpuBf16LinearMaxM && !p.amd)) return DenseBackend::kAtLinear;
      return DenseBackend::kOneDnn;
    }
    if (p.allow_packs && (p.m <= kCpuPanelsMaxM || p.amd)) return DenseBackend::kPanels;
    return p.m <= kCpuGemvMaxMBlocked ? DenseBackend::kGemv : DenseBackend::kBf16Tiles;
  }
  // AMD: MKL's SGEMM trails every other backend there, at every M.
  if (p.amd) return p.allow_packs ? DenseBackend::kPanels : DenseBackend::kGemv;
  if (p.allow_packs) return p.m <= kCpuPanelsMaxM ? DenseBackend::kPanels : DenseBackend::kAtLinear;
  return p.m <= kCpuGemvMaxMBlocked ? DenseBackend::kGemv : DenseBackend::kAtLinear;
}

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
  TORCH_INTERNAL_ASSERT(weight.dim() == 2, "CpuGemm: weight must be [N, K], got ", weight.sizes());
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
    wanted.push_back(select_dense_backend(dense_problem(m, weight.size(0), weight.size(1), weight.scalar_type())));
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
    default: TORCH_INTERNAL_ASSERT(false, "CpuGemm: ", to_string(backend), " keeps no packed weight");
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
  return select_dense_backend(p);
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
