// The W8A8 CPU kernels' dispatcher (validates, packs x, threads over N with ATen's pool,
// picks the code path) and the portable scalar kernel, the reference of the SIMD ones.

#include "quant/int8/w8a8_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/bit_cast.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu/abs_max.h"
#include "cpu/amx.h"
#include "cpu/crossovers.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/parallel.h"

namespace tp::detail {

namespace {

// Rows per unit of work handed to a thread (cpu::parallel_rows): a multiple of every
// kernel's row tile (2, 3, 4, 6, 8), so no thread's range splits one.
constexpr int64_t kUnitRows = 24;

// Past these K the int32 sums could overflow (see the header).
constexpr int64_t kMaxKVnni = 65536;
constexpr int64_t kMaxK = kW8a8MaxK;

bool is_vnni(W8a8Kernel kernel) { return kernel == W8a8Kernel::kAvx2Vnni || kernel == W8a8Kernel::kAvx512Vnni; }

}  // namespace

const char* to_string(W8a8Kernel kernel) {
  switch (kernel) {
    case W8a8Kernel::kScalar: return "scalar";
    case W8a8Kernel::kAvx2: return "avx2";
    case W8a8Kernel::kAvx2Vnni: return "avx2_vnni";
    case W8a8Kernel::kAvx512: return "avx512";
    case W8a8Kernel::kAvx512Vnni: return "avx512_vnni";
    case W8a8Kernel::kAmx: return "amx";
  }
  return "unknown";
}

bool w8a8_kernel_supported(W8a8Kernel kernel) {
  const cpu::Isa isa = cpu::isa();
  const cpu::Features& f = cpu::features();
  switch (kernel) {
    case W8a8Kernel::kScalar: return true;
    case W8a8Kernel::kAvx2: return isa >= cpu::Isa::kAvx2;
    case W8a8Kernel::kAvx2Vnni: return isa >= cpu::Isa::kAvx2 && f.avx_vnni;
    case W8a8Kernel::kAvx512: return isa >= cpu::Isa::kAvx512;
    case W8a8Kernel::kAvx512Vnni: return isa >= cpu::Isa::kAvx512 && f.avx512vnni;
    case W8a8Kernel::kAmx: return cpu::amx_status().usable;
  }
  return false;
}

W8a8Kernel w8a8_best_kernel() {
  for (W8a8Kernel k : {W8a8Kernel::kAvx512Vnni, W8a8Kernel::kAvx512, W8a8Kernel::kAvx2Vnni, W8a8Kernel::kAvx2}) {
    if (w8a8_kernel_supported(k)) return k;
  }
  return W8a8Kernel::kScalar;
}

W8a8Kernel w8a8_best_kernel(int64_t m) {
  return m >= kW8a8AmxMinM && w8a8_kernel_supported(W8a8Kernel::kAmx) ? W8a8Kernel::kAmx : w8a8_best_kernel();
}

int64_t w8a8_amx_x_bytes(int64_t m, int64_t k) { return (m + 15) / 16 * ((k + 63) / 64) * 1024; }

void w8a8_pack_x_amx(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, int8_t* xb) {
  const int64_t kblocks = (k + 63) / 64;
  std::fill(xb, xb + w8a8_amx_x_bytes(m, k), int8_t{0});
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* src = q + i * ld_q;
    int8_t* tiles = xb + (i / 16) * kblocks * 1024 + (i % 16) * 4;
    const int64_t k4 = k / 4 * 4;
    for (int64_t c = 0; c < k4; c += 4) std::memcpy(tiles + (c / 64) * 1024 + ((c % 64) / 4) * 64, src + c, 4);
    for (int64_t c = k4; c < k; ++c) tiles[(c / 64) * 1024 + ((c % 64) / 4) * 64 + c % 4] = src[c];
  }
}

void w8a8_pack_x(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, bool offset, uint8_t* xp) {
  const int64_t kpad = cpu::round_up(k, kW8a8KPad);
  const uint8_t flip = offset ? 0x80 : 0x00;
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* src = q + i * ld_q;
    uint8_t* dst = xp + i * kpad;
    bool bad = false;
    for (int64_t c = 0; c < k; ++c) {
      bad |= src[c] == -128;
      dst[c] = static_cast<uint8_t>(src[c]) ^ flip;
    }
    TORCH_CHECK_VALUE(!bad, "w8a8 kernels: activation row ", i,
                      " holds -128; per-token int8 activations are quantized to -127..127");
    for (int64_t c = k; c < kpad; ++c) dst[c] = flip;  // 0 (+ 128)
  }
}

void w8a8_pack_x_panels(const int8_t* q, int64_t m, int64_t k, int64_t ld_q, uint8_t* xp) {
  constexpr int64_t kT = kW8a8PanelTokens;
  const int64_t panel = w8a8_panel_bytes(k), k4 = k / 4;
  std::fill(xp, xp + (m + kT - 1) / kT * panel, uint8_t{0});
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* src = q + i * ld_q;
    uint8_t* dst = xp + (i / kT) * panel + (i % kT) * 4;
    bool bad = false;
    for (int64_t c = 0; c < k; ++c) bad |= src[c] == -128;
    TORCH_CHECK_VALUE(!bad, "w8a8 kernels: activation row ", i,
                      " holds -128; per-token int8 activations are quantized to -127..127");
    for (int64_t s = 0; s < k4; ++s) {
      uint32_t v;
      std::memcpy(&v, src + 4 * s, 4);
      v ^= 0x80808080u;
      std::memcpy(dst + s * kT * 4, &v, 4);
    }
    for (int64_t c = 4 * k4; c < k; ++c) dst[k4 * kT * 4 + c % 4] = static_cast<uint8_t>(src[c]) ^ 0x80;
  }
}

void w8a8_gemm_scalar(const int8_t* q, int64_t m, int64_t ld_q, const float* x_scale, const W8a8WeightView& w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1) {
  for (int64_t r = n0; r < n1; ++r) {
    const int8_t* wr = w.data + r * w.ld;
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* xi = q + i * ld_q;
      int32_t acc = 0;
      for (int64_t c = 0; c < w.k; ++c) acc += static_cast<int32_t>(xi[c]) * static_cast<int32_t>(wr[c]);
      y[i * ld_y + r] = static_cast<float>(acc) * x_scale[i] * w.scale[r];
    }
  }
}

namespace {

// at::round(v).clamp(-127, 127) then the conversion to int8 (a NaN gives 0): the
// magnitude clamped to 128, rounded half to even by the float32 magic number (exact
// there), clamped to 127, the sign put back (rounding half to even is symmetric).
// Comparisons are on the bits, not on floats: under the default -ftrapping-math GCC does
// not if-convert a float comparison, and this loop must vectorize (a 4096-element row
// took ~27 us with the branches).
int8_t quantize_int8(float v) {
  const uint32_t bits = c10::bit_cast<uint32_t>(v);
  const uint32_t sign = bits & 0x80000000u;
  uint32_t mag = bits ^ sign;
  const int32_t keep = mag > 0x7F800000u ? 0 : 1;  // NaN -> 0
  mag = mag < 0x43000000u ? mag : 0x43000000u;     // 128
  constexpr float kMagic = 12582912.0f;            // 1.5 * 2^23
  int32_t r = static_cast<int32_t>((c10::bit_cast<float>(mag) + kMagic) - kMagic);
  r = (r < 127 ? r : 127) * keep;
  return static_cast<int8_t>(sign != 0 ? -r : r);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> w8a8_quantize_per_token(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(
      x.dim() == 2 && x.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf),
      "w8a8_quantize_per_token: x must be a float32, bfloat16 or float16 [M, K] CPU tensor; got ", x.sizes(), " ",
      dtype);
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1);
  at::Tensor q = at::empty({m, k}, xc.options().dtype(at::kChar));
  at::Tensor scale = at::empty({m, 1}, xc.options().dtype(at::kFloat));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = scale.data_ptr<float>();
  cpu::for_each_row_as_float(xc, [&](int64_t i, const float* xi) {
    const float amax = cpu::abs_max(xi, k);
    // where(amax > 0, amax / 127, 1): a NaN amax (at::amax propagates NaN) is not > 0.
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    sp[i] = s;
    int8_t* qi = qp + i * k;
    const int64_t len = k;  // a local: int8 stores may alias the captured k
    for (int64_t c = 0; c < len; ++c) qi[c] = quantize_int8(xi[c] / s);
  });
  return {q, scale};
}

at::Tensor w8a8_row_sums(const at::Tensor& w) {
  TORCH_CHECK_VALUE(w.dim() == 2 && w.scalar_type() == at::kChar && w.device().is_cpu(),
                    "w8a8_row_sums: expected an int8 [N, K] CPU weight; got ", w.sizes(), " ", w.scalar_type());
  return w.sum(1, /*keepdim=*/false, at::kInt).contiguous();
}

at::Tensor w8a8_linear_cpu(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                           const at::Tensor& w_scale, const at::Tensor& row_sums, W8a8Kernel kernel) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar && q.device().is_cpu(),
                    "w8a8_linear_cpu: q must be an int8 [M, K] CPU tensor; got ", q.sizes(), " ", q.scalar_type());
  TORCH_CHECK_VALUE(w.dim() == 2 && w.scalar_type() == at::kChar && w.device().is_cpu() && w.size(1) == q.size(1),
                    "w8a8_linear_cpu: w must be an int8 [N, K] CPU tensor with K = ", q.size(1), "; got ", w.sizes(),
                    " ", w.scalar_type());
  const int64_t m = q.size(0), n = w.size(0), k = w.size(1);
  TORCH_CHECK_VALUE(x_scale.scalar_type() == at::kFloat && x_scale.numel() == m,
                    "w8a8_linear_cpu: x_scale must be float32 [", m, "] or [", m, ", 1]; got ", x_scale.sizes(), " ",
                    x_scale.scalar_type());
  TORCH_CHECK_VALUE(w_scale.scalar_type() == at::kFloat && w_scale.numel() == n,
                    "w8a8_linear_cpu: w_scale must be float32 [", n, "] or [", n, ", 1]; got ", w_scale.sizes(), " ",
                    w_scale.scalar_type());
  TORCH_CHECK_VALUE(k <= kMaxK, "w8a8_linear_cpu: K = ", k, " exceeds ", kMaxK,
                    ", past which int32 sums of int8 products could overflow");
  TORCH_CHECK_VALUE(w8a8_kernel_supported(kernel), "w8a8_linear_cpu: kernel ", to_string(kernel),
                    " is not available on this CPU (TP_CPU_ISA cap ", to_string(cpu::isa()),
                    "; features: ", cpu::features().describe(), ")");
  // The VNNI sums of (x + 128) w would overflow first: larger K takes the sign kernel.
  // (The AMX sums are of x w alone, exact up to kMaxK.)
  if (is_vnni(kernel) && k > kMaxKVnni)
    kernel = kernel == W8a8Kernel::kAvx512Vnni ? W8a8Kernel::kAvx512 : W8a8Kernel::kAvx2;
  at::Tensor y = at::empty({m, n}, q.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return y;

  const at::Tensor qc = q.contiguous();
  const at::Tensor wc = w.contiguous();
  const at::Tensor xs = x_scale.contiguous();
  const at::Tensor ws = w_scale.contiguous();
  at::Tensor sums;
  if (is_vnni(kernel)) {
    sums = row_sums.defined() ? row_sums : w8a8_row_sums(wc);
    TORCH_CHECK_VALUE(sums.scalar_type() == at::kInt && sums.numel() == n, "w8a8_linear_cpu: row_sums must be int32 [",
                      n, "] (w8a8_row_sums); got ", sums.sizes(), " ", sums.scalar_type());
    sums = sums.contiguous();
  }
  W8a8WeightView view;
  view.data = wc.data_ptr<int8_t>();
  view.n = n;
  view.k = k;
  view.ld = k;
  view.scale = ws.data_ptr<float>();
  view.row_sum = sums.defined() ? sums.data_ptr<int32_t>() : nullptr;
  const bool panels = kernel == W8a8Kernel::kAvx512Vnni && m >= cpu::crossover_min_m(cpu::Crossover::kW8a8Panels);
  cpu::count_kernel(std::string("w8a8/") + to_string(kernel) + (panels ? "_panels" : ""));  // the kernel column
  const float* xsp = xs.data_ptr<float>();
  float* out = y.data_ptr<float>();

  if (kernel == W8a8Kernel::kScalar) {
    const int8_t* qp = qc.data_ptr<int8_t>();
    cpu::parallel_rows(n, kUnitRows,
                       [&](int64_t n0, int64_t n1) { w8a8_gemm_scalar(qp, m, k, xsp, view, out, n, n0, n1); });
    return y;
  }
  if (kernel == W8a8Kernel::kAmx) {
    if (k == 0) return y.zero_();  // no tile step to start the sums from
    // The weight's partial last 64 columns, zero padded, so no tile reads past a row.
    at::Tensor tail;
    if (k % 64 != 0) {
      tail = at::zeros({n, 64}, wc.options());
      tail.narrow(1, 0, k % 64).copy_(wc.narrow(1, k - k % 64, k % 64));
    }
    at::Tensor xb = at::empty({w8a8_amx_x_bytes(m, k)}, q.options().dtype(at::kChar));
    w8a8_pack_x_amx(qc.data_ptr<int8_t>(), m, k, k, xb.data_ptr<int8_t>());
    const auto* xbp = reinterpret_cast<const uint8_t*>(xb.data_ptr<int8_t>());
    const int8_t* tailp = tail.defined() ? tail.data_ptr<int8_t>() : nullptr;
    // Units of 32 rows: one 2-tile block of weight rows.
    cpu::parallel_rows(n, 32, [&](int64_t n0, int64_t n1) { w8a8_gemm_amx(xbp, m, xsp, view, tailp, out, n, n0, n1); });
    return y;
  }
  if (panels) {
    at::Tensor xp =
        at::empty({(m + kW8a8PanelTokens - 1) / kW8a8PanelTokens * w8a8_panel_bytes(k)}, q.options().dtype(at::kByte));
    w8a8_pack_x_panels(qc.data_ptr<int8_t>(), m, k, k, xp.data_ptr<uint8_t>());
    const uint8_t* xpp = xp.data_ptr<uint8_t>();
    cpu::parallel_rows(
        n, kUnitRows, [&](int64_t n0, int64_t n1) { w8a8_gemm_avx512_vnni_panels(xpp, m, xsp, view, out, n, n0, n1); });
    return y;
  }
  const int64_t kpad = cpu::round_up(std::max<int64_t>(k, 1), kW8a8KPad);
  at::Tensor xp = at::empty({m, kpad}, q.options().dtype(at::kByte));
  w8a8_pack_x(qc.data_ptr<int8_t>(), m, k, k, is_vnni(kernel), xp.data_ptr<uint8_t>());
  const uint8_t* xpp = xp.data_ptr<uint8_t>();
  using Fn = void (*)(const uint8_t*, int64_t, int64_t, const float*, const W8a8WeightView&, float*, int64_t, int64_t,
                      int64_t);
  Fn fn = nullptr;
  switch (kernel) {
    case W8a8Kernel::kAvx2: fn = &w8a8_gemm_avx2; break;
    case W8a8Kernel::kAvx2Vnni: fn = &w8a8_gemm_avx2_vnni; break;
    case W8a8Kernel::kAvx512: fn = &w8a8_gemm_avx512; break;
    case W8a8Kernel::kAvx512Vnni: fn = &w8a8_gemm_avx512_vnni; break;
    case W8a8Kernel::kScalar:
    case W8a8Kernel::kAmx: break;
  }
  TORCH_INTERNAL_ASSERT(fn != nullptr);
  cpu::parallel_rows(n, kUnitRows, [&](int64_t n0, int64_t n1) { fn(xpp, m, kpad, xsp, view, out, n, n0, n1); });
  return y;
}

at::Tensor w8a8_linear_cpu(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                           const at::Tensor& w_scale, const at::Tensor& row_sums) {
  return w8a8_linear_cpu(q, x_scale, w, w_scale, row_sums, w8a8_best_kernel(q.size(0)));
}

}  // namespace tp::detail
