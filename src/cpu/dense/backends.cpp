#include "cpu/dense/backends.h"

#include <ATen/ATen.h>
#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/dense/kernels.h"

namespace tp::cpu {

// ---- portable kernels (the scalar ISA) ---------------------------------------------------

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
void gemv_portable(const float* x, int64_t m, int64_t k, int64_t ld_x, const W* w, int64_t ld_w, float* y, int64_t ld_y,
                   int64_t n0, int64_t n1) {
  constexpr int kLanes = 8;  // partial sums the compiler can keep in vector lanes
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

void gemv_bf16_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1) {
  gemv_portable(x, m, k, ld_x, w, ld_w, y, ld_y, n0, n1);
}

void bf16_to_f32_scalar(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld_dst + c] = bf16_to_float(src[r * ld_src + c]);
}

namespace {

// The panel kernels' chunks of x (cpu/dense/kernels.h): ceil(m / max_rows) of them, sizes
// differing by at most one; where chunk c begins.
int64_t panel_chunks(int64_t m, int64_t max_rows) { return (m + max_rows - 1) / max_rows; }
int64_t panel_chunk_begin(int64_t m, int64_t chunks, int64_t c) {
  const int64_t base = m / chunks, extra = m % chunks;
  return c * base + std::min(c, extra);
}

}  // namespace

namespace {

template <typename W>
void pack_panels(const W* w, int64_t n, int64_t k, int64_t ld_w, W* panels, int64_t p0, int64_t p1,
                 bool halves_interleaved) {
  // Where column j of a panel row is stored (cpu/dense/kernels.h).
  int64_t slot[kPanelCols];
  for (int64_t j = 0; j < kPanelCols; ++j) slot[j] = halves_interleaved ? (j % 8) * 2 + j / 8 : j;
  for (int64_t p = p0; p < p1; ++p) {
    W* out = panels + p * k * kPanelCols;
    const int64_t c0 = p * kPanelCols, cols = std::min(kPanelCols, n - c0);
    // 16 rows of W read side by side, each sequentially: one pass over the panel's rows.
    for (int64_t kk = 0; kk < k; ++kk) {
      W* row = out + kk * kPanelCols;
      for (int64_t j = 0; j < kPanelCols; ++j) row[slot[j]] = j < cols ? w[(c0 + j) * ld_w + kk] : W{0};
    }
  }
}

}  // namespace

void pack_panels_f32(const float* w, int64_t n, int64_t k, int64_t ld_w, float* panels, int64_t p0, int64_t p1) {
  pack_panels(w, n, k, ld_w, panels, p0, p1, false);
}

void pack_panels_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ld_w, uint16_t* panels, int64_t p0, int64_t p1,
                      bool halves_interleaved) {
  pack_panels(w, n, k, ld_w, panels, p0, p1, halves_interleaved);
}

void pack_panel_x(const float* x, int64_t m, int64_t k, int64_t ld_x, int64_t max_rows, float* out) {
  const int64_t chunks = panel_chunks(m, max_rows);
  // Threaded over chunks at large M (256 x 14336 floats took ~3 % of the GEMM's time on
  // one thread while the other waited).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, max_rows * k));
  at::parallel_for(0, chunks, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = panel_chunk_begin(m, chunks, c), rows = panel_chunk_begin(m, chunks, c + 1) - r0;
      float* chunk = out + r0 * k;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + (r0 + r) * ld_x;
        for (int64_t kk = 0; kk < k; ++kk) chunk[kk * rows + r] = xr[kk];
      }
    }
  });
}

// ---- oneDNN ----------------------------------------------------------------------------

namespace {

using ReorderOp = at::Tensor(const at::Tensor&, std::optional<int64_t>);
using LinearPointwiseOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                     c10::string_view, c10::List<std::optional<at::Scalar>>,
                                     std::optional<c10::string_view>);

// ATen's oneDNN ops (aten/src/ATen/native/mkldnn/Linear.cpp; torch.compile's CPU backend
// uses them for frozen linear weights): registered in libtorch_cpu, reached by name.
const c10::TypedOperatorHandle<ReorderOp>& reorder_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "").typed<ReorderOp>();
  return op;
}
const c10::TypedOperatorHandle<LinearPointwiseOp>& linear_pointwise_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "").typed<LinearPointwiseOp>();
  return op;
}

// The batch size the reorder picks the blocked layout for. One layout serves every M:
// packed for M = 1, 16, 64 or for no M in particular, the times at M = 1..256 agree
// within this machine's noise (4096 x 4096 and 28672 x 4096, float32 and bfloat16).
constexpr int64_t kOneDnnPackBatch = 64;

}  // namespace

bool onednn_supports(at::ScalarType dtype) {
#if AT_MKLDNN_ENABLED()
  if (dtype == at::kFloat) return true;
  if (dtype != at::kBFloat16) return false;
  static const bool bf16 =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_is_mkldnn_bf16_supported", "").typed<bool()>().call();
  return bf16;
#else
  (void)dtype;
  return false;
#endif
}

at::Tensor onednn_pack(const at::Tensor& w) { return reorder_op().call(w.contiguous(), kOneDnnPackBatch); }

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  return linear_pointwise_op().call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

int64_t onednn_packed_bytes(const at::Tensor& packed) {
  static const auto nbytes =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_nbytes", "").typed<int64_t(const at::Tensor&)>();
  return nbytes.call(packed);
}

// ---- MKL packed SGEMM -------------------------------------------------------------------

namespace {

// CBLAS constants (mkl_cblas.h); MKL_INT is int in the LP64 MKL LibTorch links.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

struct MklPackedApi {
  size_t (*get_size)(int identifier, int m, int n, int k) = nullptr;
  void (*pack)(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src, int ld,
               float* dest) = nullptr;
  void (*compute)(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) = nullptr;
  // The Fortran SGEMM (column-major; LibTorch's MKL exports sgemm_, not cblas_sgemm):
  // optional, bf16_tiles uses at::mm without it.
  void (*sgemm)(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
                const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                const int* ldc) = nullptr;
};

// y[:, r0 : r0 + r] (row-major, row stride ldy) = x [m, k] * tile [r, k]^T through the
// column-major SGEMM: that block is the column-major r x m matrix tile * x^T.
void sgemm_rows(const MklPackedApi& api, const float* x, int m, int k, const float* tile, int r, float* y, int ldy) {
  const float one = 1.0f, zero = 0.0f;
  api.sgemm("T", "N", &r, &m, &k, &one, tile, &k, x, &k, &zero, y, &ldy);
}

// The library that defines ATen's own functions (libtorch_cpu), already loaded.
void* aten_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

at::Tensor pack_with(const MklPackedApi& api, const at::Tensor& w) {
  const int n = static_cast<int>(w.size(0)), k = static_cast<int>(w.size(1));
  // B = W^T: W [n, k] row-major is op(src) = src^T with ld = k. The pack's layout does
  // not depend on m (its size does not), and any m may use it (checked below).
  const size_t bytes = api.get_size(kBMatrix, 1, n, k);
  auto packed = at::empty({static_cast<int64_t>(bytes / sizeof(float) + 1)}, w.options().dtype(at::kFloat));
  const auto wc = w.contiguous();
  api.pack(kRowMajor, kBMatrix, kTrans, 1, n, k, 1.0f, wc.const_data_ptr<float>(), k, packed.mutable_data_ptr<float>());
  return packed;
}

void compute_with(const MklPackedApi& api, const float* x, int m, int n, int k, const at::Tensor& packed, float* y) {
  api.compute(kRowMajor, kNoTrans, kPacked, m, n, k, x, k, packed.const_data_ptr<float>(), k, 0.0f, y, n);
}

const MklPackedApi* mkl_api() {
  static const std::optional<MklPackedApi> api = []() -> std::optional<MklPackedApi> {
    void* lib = aten_library();
    if (lib == nullptr) return std::nullopt;
    MklPackedApi a;
    a.get_size = reinterpret_cast<decltype(a.get_size)>(dlsym(lib, "cblas_sgemm_pack_get_size"));
    a.pack = reinterpret_cast<decltype(a.pack)>(dlsym(lib, "cblas_sgemm_pack"));
    a.compute = reinterpret_cast<decltype(a.compute)>(dlsym(lib, "cblas_sgemm_compute"));
    if (!a.get_size || !a.pack || !a.compute) return std::nullopt;
    a.sgemm = reinterpret_cast<decltype(a.sgemm)>(dlsym(lib, "sgemm_"));
    // Self-check on a small product (packed for one M, used at others), so an MKL with
    // another integer width or semantics disables the backend instead of miscomputing.
    const auto w = at::arange(1, 3 * 37 + 1, at::kFloat).reshape({37, 3}).div_(16.0);
    const auto packed = pack_with(a, w);
    for (const int m : {1, 5}) {
      const auto x = at::arange(1, m * 3 + 1, at::kFloat).reshape({m, 3}).sub_(4.0);
      auto y = at::empty({m, 37}, at::kFloat);
      compute_with(a, x.const_data_ptr<float>(), m, 37, 3, packed, y.mutable_data_ptr<float>());
      if (!at::equal(y, at::mm(x, w.t()))) return std::nullopt;  // small integers / 16: exact in float32
      if (a.sgemm != nullptr) {  // the plain SGEMM, into a wider row stride; dropped if it disagrees
        auto y2 = at::zeros({m, 40}, at::kFloat);
        sgemm_rows(a, x.const_data_ptr<float>(), m, 3, w.const_data_ptr<float>(), 37, y2.mutable_data_ptr<float>(), 40);
        if (!at::equal(y2.narrow(1, 0, 37), y)) a.sgemm = nullptr;
      }
    }
    return a;
  }();
  return api ? &*api : nullptr;
}

}  // namespace

bool mkl_packed_available() { return mkl_api() != nullptr; }

bool mkl_packed_exported() {
  void* lib = aten_library();
  return lib != nullptr && dlsym(lib, "cblas_sgemm_pack") != nullptr && dlsym(lib, "cblas_sgemm_compute") != nullptr &&
         dlsym(lib, "cblas_sgemm_pack_get_size") != nullptr;
}

at::Tensor mkl_pack(const at::Tensor& w) {
  const auto* api = mkl_api();
  TORCH_INTERNAL_ASSERT(api != nullptr, "mkl_pack: MKL's packed SGEMM is not available");
  TORCH_CHECK(w.size(0) <= INT_MAX && w.size(1) <= INT_MAX, "mkl_pack: weight ", w.sizes(),
              " exceeds MKL's 32-bit sizes");
  return pack_with(*api, w);
}

at::Tensor mkl_packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  const auto* api = mkl_api();
  TORCH_INTERNAL_ASSERT(api != nullptr, "mkl_packed_linear: MKL's packed SGEMM is not available");
  TORCH_CHECK(x.size(0) <= INT_MAX, "mkl_packed_linear: ", x.size(0), " rows exceed MKL's 32-bit sizes");
  auto y = at::empty({x.size(0), n}, x.options());
  compute_with(*api, x.const_data_ptr<float>(), static_cast<int>(x.size(0)), static_cast<int>(n),
               static_cast<int>(x.size(1)), packed, y.mutable_data_ptr<float>());
  return y;
}

// ---- own kernels ------------------------------------------------------------------------

namespace {

using GemvF32 = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                         int64_t);
using GemvBf16 = void (*)(const float*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t,
                          int64_t);
using Bf16ToF32 = void (*)(const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t);

GemvF32 gemv_f32_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return gemv_f32_avx512;
    case Isa::kAvx2: return gemv_f32_avx2;
    case Isa::kScalar: break;
  }
  return gemv_f32_scalar;
}
GemvBf16 gemv_bf16_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return gemv_bf16_avx512;
    case Isa::kAvx2: return gemv_bf16_avx2;
    case Isa::kScalar: break;
  }
  return gemv_bf16_scalar;
}
Bf16ToF32 bf16_to_f32_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return bf16_to_f32_avx512;
    case Isa::kAvx2: return bf16_to_f32_avx2;
    case Isa::kScalar: break;
  }
  return bf16_to_f32_scalar;
}

// Rows of W per bf16 tile: the float32 tile (rows x K) within ~4 MiB, so it is widened
// and consumed while in L2/L3; 64..512 rows, a multiple of 16. (128, 512 and 1024 rows
// measured alike at K = 4096, M = 64 and 256.)
int64_t bf16_tile_rows(int64_t k) {
  const int64_t rows = (int64_t{4} << 20) / (4 * std::max<int64_t>(1, k));
  return std::clamp<int64_t>(rows / 16 * 16, 64, 512);
}

}  // namespace

at::Tensor gemv_linear(const at::Tensor& x_in, const at::Tensor& w, Isa isa) {
  const auto x = x_in.scalar_type() == at::kFloat ? x_in : x_in.to(at::kFloat);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), ld_w = w.stride(0);
  auto y = at::empty({m, n}, x.options());
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  // Tasks of at least ~64 KiB of weight, so the pool's hand-off stays small next to them.
  const int64_t grain = std::max<int64_t>(4, (int64_t{64} << 10) / std::max<int64_t>(1, k * w.element_size()));
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

at::Tensor panels_pack(const at::Tensor& w, Isa isa) {
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  TORCH_INTERNAL_ASSERT((bf16 || w.scalar_type() == at::kFloat) && w.stride(1) == 1,
                        "panels_pack: float32 / bf16 rows");
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kPanelCols - 1) / kPanelCols;
  auto out = at::empty({panels, k, kPanelCols}, w.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t ld_w = w.stride(0);
  if (bf16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(w.const_data_ptr<at::BFloat16>());
    auto* op = reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>());
    const bool interleaved = isa == Isa::kAvx2;
    at::parallel_for(0, panels, 1,
                     [&](int64_t p0, int64_t p1) { pack_panels_bf16(wp, n, k, ld_w, op, p0, p1, interleaved); });
  } else {
    const float* wp = w.const_data_ptr<float>();
    float* op = out.mutable_data_ptr<float>();
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) { pack_panels_f32(wp, n, k, ld_w, op, p0, p1); });
  }
  return out;
}

at::Tensor panels_linear(const at::Tensor& x_in, const at::Tensor& panels, int64_t n, Isa isa, int64_t x_block_bytes) {
  TORCH_INTERNAL_ASSERT(isa != Isa::kScalar, "panels_linear: AVX2 or AVX-512");
  const auto x = x_in.scalar_type() == at::kFloat ? x_in : x_in.to(at::kFloat);
  const int64_t m = x.size(0), k = x.size(1), count = panels.size(0);
  const bool avx512 = isa == Isa::kAvx512, bf16 = panels.scalar_type() == at::kBFloat16;
  // AVX-512 past one chunk of 16 rows: 12-row chunks against two panels at a time.
  const bool pairs = avx512 && m > kPanelRowsAvx512;
  const int64_t max_rows = pairs ? kPanelPairRowsAvx512 : avx512 ? kPanelRowsAvx512 : kPanelRowsAvx2;
  const auto chunk = bf16 ? (avx512 ? panel_chunk_bf16_avx512 : panel_chunk_bf16_avx2)
                          : (avx512 ? panel_chunk_f32_avx512 : panel_chunk_f32_avx2);
  const auto pair = bf16 ? panel_pair_bf16_avx512 : panel_pair_f32_avx512;
  auto x_packed = at::empty({m * k}, x.options());
  pack_panel_x(x.const_data_ptr<float>(), m, k, x.stride(0), max_rows, x_packed.mutable_data_ptr<float>());
  auto y = at::empty({m, n}, x.options());
  const float* xp = x_packed.const_data_ptr<float>();
  const auto* pp = static_cast<const char*>(panels.const_data_ptr());
  const int64_t elem = panels.element_size();
  float* yp = y.mutable_data_ptr<float>();
  const int64_t chunks = panel_chunks(m, max_rows);
  // Every chunk of x against panels [p, p + width) over K rows [k0, k0 + kb). With a
  // `next` task (large M), chunks 1..kPrefetchChunks pull its panels into L2 in equal
  // slices, and only the thread's first task streams its own from memory (chunk 0).
  struct Next {
    int64_t p = -1, k0 = 0, kb = 0;
  };
  constexpr int64_t kPrefetchChunks = 8;
  const auto step = [&](int64_t p, int64_t width, int64_t k0, int64_t kb, const Next& next, bool first) {
    PanelTask t;
    t.panel = pp + (p * k + k0) * kPanelCols * elem;
    t.panel_stride = k * kPanelCols;
    t.kc = kb;
    t.ld_y = n;
    t.cols = std::min(width * kPanelCols, n - p * kPanelCols);
    t.accumulate = k0 > 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = panel_chunk_begin(m, chunks, c);
      t.rows = panel_chunk_begin(m, chunks, c + 1) - r0;
      t.x = xp + r0 * k + k0 * t.rows;
      t.y = yp + r0 * n + p * kPanelCols;
      t.stream = c == 0 && (first || chunks < 2);  // else the previous task fetched this one's panels
      const int64_t sharers = std::min(kPrefetchChunks, chunks - 1);
      if (next.p >= 0 && c >= 1 && c <= sharers) {
        const int64_t bytes = next.kb * kPanelCols * elem, slice = (bytes + sharers - 1) / sharers;
        const int64_t begin = std::min(bytes, (c - 1) * slice);
        t.prefetch_next = pp + (next.p * k + next.k0) * kPanelCols * elem + begin;
        t.prefetch_bytes = std::min(slice, bytes - begin);
      } else {
        t.prefetch_next = nullptr;
        t.prefetch_bytes = 0;
      }
      (width == 2 ? pair : chunk)(t);
    }
  };
  const auto width_at = [&](int64_t p, int64_t p1) -> int64_t { return pairs && p + 1 < p1 ? 2 : 1; };
  // Tasks of at least ~64 KiB of panels, as gemv_linear's.
  const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, k * kPanelCols * elem));
  if (m * k * 4 <= x_block_bytes) {
    // x stays in L2: each panel over all of K, chunk after chunk. (Interleaving the
    // chunks in K steps of 256-1024 rows, so that the first chunk's reads from memory
    // would overlap the others' FMAs, was 5-25 % slower at M = 8 and 16 with AVX2.)
    at::parallel_for(0, count, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0, w = 0; p < p1; p += w) step(p, w = width_at(p, p1), 0, k, Next{}, true);
    });
  } else {
    // Large M: K blocks whose slice of x (M x kc floats, ~x_block_bytes) is reused from
    // cache while every panel of the task passes over it; a multiple of 64, keeping the
    // kernel's 4 K streams whole.
    const int64_t kc = std::max<int64_t>(256, x_block_bytes / (m * 4) / 64 * 64);
    at::parallel_for(0, count, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t k0 = 0; k0 < k; k0 += kc)
        for (int64_t p = p0, w = 0; p < p1; p += w) {
          w = width_at(p, p1);
          Next next;  // the thread's next task: the next panels of this K block, or the first of the next block
          if (p + w < p1)
            next = Next{p + w, k0, std::min(kc, k - k0)};
          else if (k0 + kc < k)
            next = Next{p0, k0 + kc, std::min(kc, k - k0 - kc)};
          step(p, w, k0, std::min(kc, k - k0), next, k0 == 0 && p == p0);
        }
    });
  }
  return y;
}

at::Tensor bf16_tiles_linear(const at::Tensor& x_in, const at::Tensor& w, Isa isa) {
  const auto x = x_in.to(at::kFloat).contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), ld_w = w.stride(0);
  const int64_t rows = bf16_tile_rows(k);
  const int64_t tiles = (n + rows - 1) / rows;
  const auto* wp = reinterpret_cast<const uint16_t*>(w.const_data_ptr<at::BFloat16>());
  const Bf16ToF32 widen = bf16_to_f32_for(isa);
  const auto* mkl = mkl_api();
  const bool blas = mkl != nullptr && mkl->sgemm != nullptr && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
  // With MKL's SGEMM at hand each task writes its columns of y in place (ldc = N);
  // through at::mm, it forms y^T[tile rows, :] = W_tile x^T, one contiguous block each.
  auto out = blas ? at::empty({m, n}, x.options()) : at::empty({n, m}, x.options());
  const auto x_t = x.t();
  const float* xp = x.const_data_ptr<float>();
  float* yp = out.mutable_data_ptr<float>();  // taken here: the pool's threads are not in this one's InferenceMode
  const at::ThreadLocalState state;           // ... which the at::mm_out fallback needs there
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    at::ThreadLocalStateGuard guard(state);
    auto tile = at::empty({rows, k}, x.options());
    float* tp = tile.mutable_data_ptr<float>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * rows, r = std::min(rows, n - r0);
      widen(wp + r0 * ld_w, r, k, ld_w, tp, k);
      if (blas) {
        sgemm_rows(*mkl, xp, static_cast<int>(m), static_cast<int>(k), tp, static_cast<int>(r), yp + r0,
                   static_cast<int>(n));
      } else {
        auto block = out.narrow(0, r0, r);
        at::mm_out(block, tile.narrow(0, 0, r), x_t);  // MKL runs single-threaded inside the task
      }
    }
  });
  return blas ? out : out.t();
}

}  // namespace tp::cpu
