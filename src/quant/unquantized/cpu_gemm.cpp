#include "quant/unquantized/cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "quant/unquantized/cpu_gemm_kernels.h"

namespace tp::detail {

// ---- portable kernels (the scalar ISA; also the reference the others are tested against) --------

namespace {

inline float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) { return bf16_to_float(v); }

template <typename W>
void gemv_portable(const float* x, int64_t m, int64_t k, int64_t ld_x, const W* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1) {
  // Eight partial sums per output, so the compiler can keep them in vector lanes.
  constexpr int kLanes = 8;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * ld_x;
    for (int64_t n = n0; n < n1; ++n) {
      const W* wn = w + n * ld_w;
      float acc[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= k; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += to_float(wn[j + l]) * xi[j + l];
      float sum = 0.0f;
      for (; j < k; ++j) sum += to_float(wn[j]) * xi[j];
      for (int l = 0; l < kLanes; ++l) sum += acc[l];
      y[i * ld_y + n] = sum;
    }
  }
}

}  // namespace

void gemv_f32_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_portable(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void gemv_bf16_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w,
                      float* y, int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_portable(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

// ---- names, problem, table ---------------------------------------------------------------------

namespace {

constexpr std::array<CpuGemmBackend, kCpuGemmBackendCount> kAllBackends{
    CpuGemmBackend::kAtLinear, CpuGemmBackend::kOneDnn, CpuGemmBackend::kGemv, CpuGemmBackend::kBf16Tiles};

std::array<std::atomic<int64_t>, kCpuGemmBackendCount>& global_counts() {
  static std::array<std::atomic<int64_t>, kCpuGemmBackendCount> counts{};
  return counts;
}

bool onednn_in_build() {
#if AT_MKLDNN_ENABLED()
  return true;
#else
  return false;
#endif
}

}  // namespace

const char* to_string(CpuGemmBackend backend) {
  switch (backend) {
    case CpuGemmBackend::kAtLinear: return "at_linear";
    case CpuGemmBackend::kOneDnn: return "onednn";
    case CpuGemmBackend::kGemv: return "gemv";
    case CpuGemmBackend::kBf16Tiles: return "bf16_tiles";
  }
  return "unknown";
}

CpuGemmBackend parse_cpu_gemm_backend(const std::string& name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto b : kAllBackends)
    if (lower == to_string(b)) return b;
  TORCH_CHECK_VALUE(false, "unknown CPU GEMM backend '", name, "'; expected auto, at_linear, onednn, gemv or bf16_tiles");
}

CpuGemmProblem cpu_gemm_problem(int64_t m, int64_t n, int64_t k, at::ScalarType dtype) {
  CpuGemmProblem p;
  p.m = m, p.n = n, p.k = k, p.dtype = dtype;
  p.isa = cpu_isa();
  const auto& f = cpu_features();
  // TP_CPU_ISA=avx2 stands for a machine without AVX-512, hence without its bf16 too.
  p.native_bf16 = p.isa == CpuIsa::kAvx512 && (f.avx512bf16 || f.amx_bf16);
  p.threads = at::get_num_threads();
  return p;
}

bool cpu_gemm_supports(CpuGemmBackend backend, const CpuGemmProblem& p) {
  const bool floating = p.dtype == at::kFloat || p.dtype == at::kBFloat16;
  switch (backend) {
    case CpuGemmBackend::kAtLinear: return true;
    case CpuGemmBackend::kOneDnn: return floating && onednn_in_build();
    case CpuGemmBackend::kGemv: return floating;
    case CpuGemmBackend::kBf16Tiles: return p.dtype == at::kBFloat16;
  }
  return false;
}

CpuGemmBackend select_cpu_gemm(const CpuGemmProblem& p) {
  // Measured crossovers: see the table at the end of this file's commit message and
  // README "CPU GEMM backends". Placeholder until measured.
  if (!cpu_gemm_supports(CpuGemmBackend::kGemv, p)) return CpuGemmBackend::kAtLinear;
  // The portable ISA (TP_CPU_ISA=scalar, or a CPU without AVX2): ATen's own choice.
  if (p.isa == CpuIsa::kScalar) return CpuGemmBackend::kAtLinear;
  if (p.m <= kCpuGemvMaxM) return CpuGemmBackend::kGemv;
  if (p.dtype == at::kBFloat16 && !p.native_bf16) return CpuGemmBackend::kBf16Tiles;
  if (onednn_in_build()) return CpuGemmBackend::kOneDnn;
  return CpuGemmBackend::kAtLinear;
}

std::optional<CpuGemmBackend> forced_cpu_gemm() {
  static const std::optional<CpuGemmBackend> forced = []() -> std::optional<CpuGemmBackend> {
    const char* env = std::getenv("TP_CPU_GEMM");
    if (env == nullptr || *env == '\0') return std::nullopt;
    std::string lower(env);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "auto") return std::nullopt;
    return parse_cpu_gemm_backend(env);
  }();
  return forced;
}

// ---- the backends ----------------------------------------------------------------------------

namespace {

using ReorderOp = at::Tensor(const at::Tensor&, std::optional<int64_t>);
using LinearPointwiseOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                     c10::string_view, c10::List<std::optional<at::Scalar>>,
                                     std::optional<c10::string_view>);

// ATen's oneDNN ops (aten/src/ATen/native/mkldnn/Linear.cpp), the ones torch.compile's
// CPU backend uses for frozen linear weights: registered in libtorch_cpu, no header.
const c10::TypedOperatorHandle<ReorderOp>& reorder_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                             .typed<ReorderOp>();
  return op;
}
const c10::TypedOperatorHandle<LinearPointwiseOp>& linear_pointwise_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<LinearPointwiseOp>();
  return op;
}

// The batch size oneDNN's reorder picks the blocked layout for; one layout serves
// every M (measured: see select_cpu_gemm).
constexpr int64_t kOneDnnPackBatch = 64;

using GemvF32 = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                         int64_t);
using GemvBf16 = void (*)(const float*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t,
                          int64_t, int64_t);

GemvF32 gemv_f32_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return gemv_f32_avx512;
    case CpuIsa::kAvx2: return gemv_f32_avx2;
    case CpuIsa::kScalar: break;
  }
  return gemv_f32_scalar;
}
GemvBf16 gemv_bf16_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return gemv_bf16_avx512;
    case CpuIsa::kAvx2: return gemv_bf16_avx2;
    case CpuIsa::kScalar: break;
  }
  return gemv_bf16_scalar;
}

// y = x W^T by the own kernels, threaded over N. x2d: [M, K] contiguous; y: float32.
at::Tensor run_gemv(const at::Tensor& x2d, const at::Tensor& w) {
  const auto x = x2d.scalar_type() == at::kFloat ? x2d : x2d.to(at::kFloat);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), ld_w = w.stride(0);
  auto y = at::empty({m, n}, x.options().dtype(at::kFloat));
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  // At least ~64 KiB of weight per task, so the pool's hand-off stays small next to it.
  const int64_t grain = std::max<int64_t>(4, (int64_t{64} << 10) / std::max<int64_t>(1, k * w.element_size()));
  const CpuIsa isa = cpu_isa();
  if (w.scalar_type() == at::kBFloat16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(w.const_data_ptr<at::BFloat16>());
    const GemvBf16 kernel = gemv_bf16_for(isa);
    at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { kernel(xp, m, k, k, wp, ld_w, yp, n, n0, n1); });
  } else {
    const float* wp = w.const_data_ptr<float>();
    const GemvF32 kernel = gemv_f32_for(isa);
    at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { kernel(xp, m, k, k, wp, ld_w, yp, n, n0, n1); });
  }
  return y;
}

// Rows of W per bf16 tile: the float32 tile (rows x K) stays within ~1 MiB, so it is
// converted and consumed while in L2; at least 16 rows so the GEMM on it stays efficient.
int64_t bf16_tile_rows(int64_t k) {
  return std::clamp<int64_t>((int64_t{1} << 20) / (4 * std::max<int64_t>(1, k)), 16, 256);
}

// y = x W^T for a bfloat16 W on a machine without bf16 arithmetic: tiles of W rows
// converted to float32 (exact) and multiplied in float32 by MKL, one tile per task.
at::Tensor run_bf16_tiles(const at::Tensor& x2d, const at::Tensor& w) {
  const auto x = x2d.to(at::kFloat).contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  auto y = at::empty({m, n}, x.options());
  const int64_t rows = bf16_tile_rows(k);
  const int64_t tiles = (n + rows - 1) / rows;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    auto tile = at::empty({rows, k}, x.options());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * rows, r = std::min(rows, n - r0);
      auto wt = tile.narrow(0, 0, r);
      wt.copy_(w.narrow(0, r0, r));
      auto yt = y.narrow(1, r0, r);  // [M, r] with row stride N: BLAS writes it in place
      at::mm_out(yt, x, wt.t());
    }
  });
  return y;
}

}  // namespace

// ---- CpuGemm ---------------------------------------------------------------------------------

CpuGemm::Key CpuGemm::key_of(const at::Tensor& w) {
  Key key;
  key.data = w.const_data_ptr();
  key.version = w.is_inference() ? -1 : static_cast<int64_t>(w._version());
  key.sizes = w.sizes().vec();
  key.strides = w.strides().vec();
  key.dtype = w.scalar_type();
  return key;
}

void CpuGemm::prepare(const at::Tensor& weight) {
  TORCH_INTERNAL_ASSERT(weight.dim() == 2, "CpuGemm: weight must be [N, K], got ", weight.sizes());
  std::lock_guard<std::mutex> lock(mutex_);
  weight_ = weight;
  onednn_ = at::Tensor();
  packs_ = 0;
  for (auto& c : counts_) c = 0;
  if (!weight.is_cpu() || !serves(at::empty({0, weight.size(1)}, weight.options()))) return;
  // Pack now if the table picks oneDNN for this weight at some M (or it is forced),
  // so the first forward does not pay for it.
  const auto forced = forced_cpu_gemm();
  bool wanted = forced == CpuGemmBackend::kOneDnn;
  for (const int64_t m : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    if (wanted) break;
    wanted = select_cpu_gemm(cpu_gemm_problem(m, weight.size(0), weight.size(1), weight.scalar_type())) ==
             CpuGemmBackend::kOneDnn;
  }
  if (wanted && cpu_gemm_supports(CpuGemmBackend::kOneDnn,
                                  cpu_gemm_problem(1, weight.size(0), weight.size(1), weight.scalar_type()))) {
    at::NoGradGuard no_grad;
    onednn_ = reorder_op().call(weight_.contiguous(), kOneDnnPackBatch);
    onednn_key_ = key_of(weight_);
    ++packs_;
  }
}

bool CpuGemm::serves(const at::Tensor& x) const {
  if (!weight_.defined() || !x.is_cpu() || !weight_.is_cpu()) return false;
  const auto t = weight_.scalar_type();
  if ((t != at::kFloat && t != at::kBFloat16) || x.scalar_type() != t) return false;
  if (weight_.dim() != 2 || x.dim() < 1 || x.size(-1) != weight_.size(1)) return false;
  return weight_.stride(1) == 1 && weight_.stride(0) >= weight_.size(1);
}

at::Tensor CpuGemm::onednn_weight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Key now = key_of(weight_);
  if (!onednn_.defined() || !(onednn_key_ == now)) {
    at::NoGradGuard no_grad;
    onednn_ = reorder_op().call(weight_.contiguous(), kOneDnnPackBatch);
    onednn_key_ = now;
    ++packs_;
  }
  return onednn_;
}

int64_t CpuGemm::packed_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!onednn_.defined()) return 0;
  static const auto nbytes = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("mkldnn::_nbytes", "")
                                 .typed<int64_t(const at::Tensor&)>();
  return nbytes.call(onednn_);
}

bool CpuGemm::can_run(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  if (!serves(x)) return false;
  const bool has_bias = bias && bias->defined();
  // The backends here have no backward: a call that records a graph takes at::linear.
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight_.requires_grad() || (has_bias && bias->requires_grad())))
    return false;
  // A bias at::linear would refuse (or broadcast) goes there, which reports or handles it.
  if (has_bias && (!bias->is_cpu() || bias->scalar_type() != weight_.scalar_type() || bias->dim() != 1 ||
                   bias->size(0) != weight_.size(0)))
    return false;
  return x.numel() > 0 && weight_.numel() > 0;
}

CpuGemmBackend CpuGemm::backend_for(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  if (!can_run(x, bias)) return CpuGemmBackend::kAtLinear;
  const auto p = cpu_gemm_problem(x.numel() / x.size(-1), weight_.size(0), weight_.size(1), weight_.scalar_type());
  if (const auto forced = forced_cpu_gemm(); forced && cpu_gemm_supports(*forced, p)) return *forced;
  return select_cpu_gemm(p);
}

at::Tensor CpuGemm::linear(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
  return linear(x, bias, backend_for(x, bias));
}

at::Tensor CpuGemm::linear(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                           CpuGemmBackend backend) const {
  if (backend != CpuGemmBackend::kAtLinear &&
      (!can_run(x, bias) ||
       !cpu_gemm_supports(backend, cpu_gemm_problem(x.numel() / x.size(-1), weight_.size(0), weight_.size(1),
                                                    weight_.scalar_type()))))
    backend = CpuGemmBackend::kAtLinear;
  counts_[static_cast<int>(backend)].fetch_add(1, std::memory_order_relaxed);
  global_counts()[static_cast<int>(backend)].fetch_add(1, std::memory_order_relaxed);
  if (backend == CpuGemmBackend::kAtLinear) return at::linear(x, weight_, bias);
  const auto x2d = x.reshape({-1, x.size(-1)}).contiguous();
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = weight_.size(0);
  return run(backend, x2d, bias).view(out_sizes);
}

at::Tensor CpuGemm::run(CpuGemmBackend backend, const at::Tensor& x2d, const std::optional<at::Tensor>& bias) const {
  const bool has_bias = bias && bias->defined();
  switch (backend) {
    case CpuGemmBackend::kOneDnn:
      return linear_pointwise_op().call(x2d, onednn_weight(), has_bias ? bias : std::nullopt, "none",
                                        c10::List<std::optional<at::Scalar>>(), std::nullopt);
    case CpuGemmBackend::kGemv:
    case CpuGemmBackend::kBf16Tiles: {
      auto y = backend == CpuGemmBackend::kGemv ? run_gemv(x2d, weight_) : run_bf16_tiles(x2d, weight_);
      if (has_bias) y.add_(*bias);
      return y.scalar_type() == weight_.scalar_type() ? y : y.to(weight_.scalar_type());
    }
    case CpuGemmBackend::kAtLinear: break;
  }
  return at::linear(x2d, weight_, bias);
}

std::map<CpuGemmBackend, int64_t> cpu_gemm_counts() {
  std::map<CpuGemmBackend, int64_t> out;
  for (const auto b : kAllBackends) {
    const int64_t c = global_counts()[static_cast<int>(b)].load(std::memory_order_relaxed);
    if (c > 0) out[b] = c;
  }
  return out;
}

std::map<CpuGemmBackend, int64_t> CpuGemm::counts() const {
  std::map<CpuGemmBackend, int64_t> out;
  for (const auto b : kAllBackends) {
    const int64_t c = counts_[static_cast<int>(b)].load(std::memory_order_relaxed);
    if (c > 0) out[b] = c;
  }
  return out;
}

}  // namespace tp::detail
