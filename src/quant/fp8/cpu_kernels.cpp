// The FP8 CPU kernels' dispatcher (validates, packs x, threads over N with ATen's pool,
// picks the ISA) and the portable scalar kernel, which is the reference the SIMD ones
// are tested against and the path of CPUs without AVX2.

#include "quant/fp8/cpu_kernels.h"

#include <ATen/ATen.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/bit_cast.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu/abs_max.h"
#include "cpu/amx.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/parallel.h"
#include "cpu/row_decoded_gemm.h"

namespace tp::detail {

namespace {

// Every E4M3 bit pattern as a float, decoded by c10's own conversion.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      t[static_cast<size_t>(b)] =
          static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(b), c10::Float8_e4m3fn::from_bits()));
    }
    return t;
  }();
  return table;
}

// Rows per unit of work handed to a thread (cpu::parallel_rows): a multiple of every
// kernel's row blocking (GEMV 4 rows, microkernels 3 / 6, panels 24), so no thread's
// range splits a panel.
constexpr int64_t kUnitRows = 24;

}  // namespace

void fp8_pack_x(const float* x, int64_t m, int64_t k, int64_t ld_x, int64_t chunk, int64_t ld_xp, float* xp) {
  const int64_t kpad = cpu::round_up(k, chunk);
  const int64_t lanes = chunk / 4;
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + i * ld_x;
    float* dst = xp + i * ld_xp;
    for (int64_t base = 0; base < kpad; base += chunk) {
      // Lane j of decoded vector v (0..3) of a chunk holds the chunk's column
      // (v / 2) * 2 * lanes + 2j + v % 2: even columns, odd columns, of each half.
      const bool whole = base + chunk <= k;
      for (int64_t v = 0; v < 4; ++v) {
        const int64_t first = base + (v / 2) * 2 * lanes + v % 2;
        float* out = dst + base + v * lanes;
        if (whole) {
          for (int64_t j = 0; j < lanes; ++j) out[j] = src[first + 2 * j];
        } else {
          for (int64_t j = 0; j < lanes; ++j) out[j] = first + 2 * j < k ? src[first + 2 * j] : 0.0f;
        }
      }
    }
  }
}

void fp8_decode_scalar(const uint8_t* codes, int64_t count, float scale, bool, float* out) {
  const auto& table = e4m3_table();
  for (int64_t i = 0; i < count; ++i) out[i] = table[codes[i]] * scale;
}

void fp8_gemm_scalar(const float* x, int64_t m, int64_t ld_x, const Fp8WeightView& w, float* y, int64_t ld_y,
                     int64_t n0, int64_t n1) {
  // Each row decoded (w_deq = float(code) * scale, as dequantize_weight computes it),
  // then dotted with every row of x in float32.
  std::vector<float> row(static_cast<size_t>(w.k));
  const int64_t groups = (w.k + w.group - 1) / w.group;
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* src = w.codes + r * w.ld;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * w.group, c1 = std::min(w.k, c0 + w.group);
      fp8_decode_scalar(src + c0, c1 - c0, w.scale[r * w.scale_ld + g], true, row.data() + c0);
    }
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ld_x;
      float acc = 0.0f;
      for (int64_t c = 0; c < w.k; ++c) acc += xi[c] * row[static_cast<size_t>(c)];
      y[i * ld_y + r] = acc;
    }
  }
}

bool fp8_has_nan_codes(const at::Tensor& codes) {
  TORCH_CHECK_VALUE(codes.scalar_type() == at::kFloat8_e4m3fn || codes.scalar_type() == at::kByte,
                    "fp8_has_nan_codes: expected float8_e4m3fn or uint8 codes; got ", codes.scalar_type());
  const at::Tensor c = codes.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  const int64_t count = c.numel();
  // A parallel OR over the codes; NaN is 0x7f / 0xff (every low bit set).
  return at::parallel_reduce(
      0, count, int64_t{1} << 20, false,
      [&](int64_t b, int64_t e, bool found) {
        if (found) return true;
        uint8_t all = 0;
        for (int64_t i = b; i < e; ++i) all |= static_cast<uint8_t>((p[i] & 0x7f) == 0x7f);
        return all != 0;
      },
      [](bool a, bool b) { return a || b; });
}

namespace {

constexpr float kE4m3Max = 448.0f;

// clamp(v, -448, 448) as at::clamp computes it (NaN passes through), rounded to E4M3 by
// c10's conversion, decoded back to float.
float e4m3_round(float v) {
  const float c = v != v ? v : std::min(std::max(v, -kE4m3Max), kE4m3Max);
  return static_cast<float>(c10::Float8_e4m3fn(c));
}

// The scale of an amax as method.cpp's scale_of: amax / 448 where amax > 0 (a NaN amax
// is not), 1 elsewhere.
float scale_of(float amax) { return amax > 0.0f ? amax / kE4m3Max : 1.0f; }

// e4m3_round without c10's scalar conversion (~8 ns an element: the activation's fake
// quantization took ~33 us per 4096-element row), for a non-NaN v: the same value bit
// for bit (the fp8 tests sweep every E4M3 tie and its neighbours) in integer and float
// operations the compiler vectorizes (comparisons on bits: a float comparison is not
// if-converted under the default -ftrapping-math). The magnitude is clamped to 448,
// then rounded to a multiple of 2^-9 in E4M3's subnormal range (below 2^-6: adding
// 2^14 rounds there, ties to even) and to 3 mantissa bits above it (ties to even on the
// bits; a carry moves it to the next binade, never past 448); the sign is put back
// afterwards, so -0 stays -0 as in c10's conversion.
inline float e4m3_round_no_nan(float v) {
  const uint32_t bits = c10::bit_cast<uint32_t>(v);
  const uint32_t sign = bits & 0x80000000u;
  uint32_t mag = bits ^ sign;
  mag = mag < 0x43E00000u ? mag : 0x43E00000u;  // 448
  const uint32_t normal = (mag + 0x7FFFFu + ((mag >> 20) & 1u)) & 0xFFF00000u;
  const uint32_t subnormal = c10::bit_cast<uint32_t>((c10::bit_cast<float>(mag) + 16384.0f) - 16384.0f);
  const uint32_t tiny = 0u - static_cast<uint32_t>(mag < 0x3C800000u);  // all ones below 2^-6
  return c10::bit_cast<float>(((subnormal & tiny) | (normal & ~tiny)) | sign);
}

void fake_quant_span(const float* x, int64_t n, float scale, float* out) {
  uint32_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] / scale;
    nan |= static_cast<uint32_t>((c10::bit_cast<uint32_t>(v) & 0x7FFFFFFFu) > 0x7F800000u);
    out[i] = e4m3_round_no_nan(v) * scale;
  }
  // A NaN (rare) takes c10's own conversion for the whole span: its NaN pattern.
  if (nan != 0)
    for (int64_t i = 0; i < n; ++i) out[i] = e4m3_round(x[i] / scale) * scale;
}

// The activations' scale spans, as quantize_activation cuts them: f(i, c0, len, scale, xi)
// for each row i of x (widened to float32) and each span [c0, c0 + len) of it with its
// scale (the whole row for kStatic / kPerToken, 128-column groups for kGroup128).
template <class F>
void for_each_scale_span(const at::Tensor& xc, Fp8Activation kind, float input_scale, const F& f) {
  const int64_t k = xc.size(1);
  cpu::for_each_row_as_float(xc, [&](int64_t i, const float* xi) {
    switch (kind) {
      case Fp8Activation::kStatic: f(i, 0, k, input_scale, xi); break;
      case Fp8Activation::kPerToken: f(i, 0, k, scale_of(cpu::abs_max(xi, k)), xi); break;
      case Fp8Activation::kGroup128:
        for (int64_t c = 0; c < k; c += 128) {
          const int64_t len = std::min<int64_t>(128, k - c);
          f(i, c, len, scale_of(cpu::abs_max(xi + c, len)), xi);
        }
        break;
    }
  });
}

void check_activations(const at::Tensor& x, const char* what) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(
      x.dim() == 2 && x.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf),
      what, ": x must be a float32, bfloat16 or float16 [M, K] CPU tensor; got ", x.sizes(), " ", dtype);
}

// The kernels' view of an [N, K] E4M3 weight and its [N, groups] scales (both contiguous).
Fp8WeightView weight_view(const at::Tensor& wc, const at::Tensor& sc, int64_t group, bool nan_codes) {
  Fp8WeightView view;
  view.codes = static_cast<const uint8_t*>(wc.data_ptr());
  view.n = wc.size(0);
  view.k = wc.size(1);
  view.ld = view.k;
  view.scale = sc.data_ptr<float>();
  view.scale_ld = sc.size(1);
  view.group = std::min(group, view.k);  // one group of k: the kernels' "one scale per row"
  view.nan_codes = nan_codes;
  return view;
}

// fake_quant_span's q = e4m3(x / scale), as bf16 bits (exact; a NaN as the quiet NaN).
void quant_span_codes(const float* x, int64_t n, float scale, uint16_t* out) {
  uint32_t nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] / scale;
    nan |= static_cast<uint32_t>((c10::bit_cast<uint32_t>(v) & 0x7FFFFFFFu) > 0x7F800000u);
    out[i] = static_cast<uint16_t>(c10::bit_cast<uint32_t>(e4m3_round_no_nan(v)) >> 16);
  }
  if (nan != 0) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = c10::bit_cast<uint32_t>(e4m3_round(x[i] / scale));
      out[i] = (bits & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((bits >> 16) | 0x7FC0u)
                                                  : static_cast<uint16_t>(bits >> 16);
    }
  }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> fp8_quantize_codes_cpu(const at::Tensor& x, Fp8Activation kind, float input_scale) {
  check_activations(x, "fp8_quantize_codes_cpu");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), m_pad = cpu::round_up(std::max<int64_t>(m, 1), 16);
  const int64_t groups = kind == Fp8Activation::kGroup128 ? std::max<int64_t>((k + 127) / 128, 1) : 1;
  at::Tensor q = at::empty({m, k}, xc.options().dtype(at::kShort));
  at::Tensor scale = at::zeros({groups, m_pad}, xc.options().dtype(at::kFloat));
  auto* qp = reinterpret_cast<uint16_t*>(q.data_ptr<int16_t>());
  float* sp = scale.data_ptr<float>();
  for_each_scale_span(xc, kind, input_scale, [&](int64_t i, int64_t c0, int64_t len, float s, const float* xi) {
    sp[(c0 / 128) * m_pad + i] = s;  // c0 is 0 but for kGroup128
    quant_span_codes(xi + c0, len, s, qp + i * k + c0);
  });
  return {q, scale};
}

std::pair<at::Tensor, at::Tensor> fp8_codes_from_e4m3(const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK_VALUE(codes.dim() == 2 && codes.scalar_type() == at::kFloat8_e4m3fn && codes.device().is_cpu() &&
                        scales.scalar_type() == at::kFloat && scales.numel() == codes.size(0),
                    "fp8_codes_from_e4m3: expected float8_e4m3fn codes [M, K] and float32 scales [M, 1]; got ",
                    codes.sizes(), " ", codes.scalar_type(), " and ", scales.sizes(), " ", scales.scalar_type());
  // Each E4M3 code's value as bf16 bits (exact), as quant_span_codes writes them (a NaN
  // code as the quiet NaN with its sign).
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int c = 0; c < 256; ++c) {
      const float v = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(c), c10::Float8_e4m3fn::from_bits()));
      const uint32_t bits = c10::bit_cast<uint32_t>(v);
      t[static_cast<size_t>(c)] = (bits & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((bits >> 16) | 0x7FC0u)
                                                                     : static_cast<uint16_t>(bits >> 16);
    }
    return t;
  }();
  const at::Tensor cc = codes.contiguous(), sc = scales.reshape({-1}).contiguous();
  const int64_t m = cc.size(0), k = cc.size(1), m_pad = cpu::round_up(std::max<int64_t>(m, 1), 16);
  at::Tensor q = at::empty({m, k}, cc.options().dtype(at::kShort));
  at::Tensor scale = at::zeros({1, m_pad}, cc.options().dtype(at::kFloat));
  const auto* src = static_cast<const uint8_t*>(cc.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(q.data_ptr<int16_t>());
  for (int64_t i = 0; i < m * k; ++i) dst[i] = table[src[i]];
  std::copy_n(sc.data_ptr<float>(), m, scale.data_ptr<float>());
  return {q, scale};
}

namespace {

// The arguments of the two codes-times-codes GEMMs (fp8_linear_amx, fp8_linear_bf16dot),
// checked: returns whether the scales are grouped (128 k).
bool check_codes_gemm(const char* what, const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                      const at::Tensor& scale, int64_t group) {
  TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kShort && q.is_contiguous(), what,
                    ": q must be fp8_quantize_codes_cpu's [M, K] codes; got ", q.sizes(), " ", q.scalar_type());
  TORCH_CHECK_VALUE(
      w.dim() == 2 && w.scalar_type() == at::kFloat8_e4m3fn && w.device().is_cpu() && w.size(1) == q.size(1), what,
      ": w must be a float8_e4m3fn [N, K] CPU tensor with K = ", q.size(1), "; got ", w.sizes(), " ", w.scalar_type());
  const int64_t m = q.size(0), n = w.size(0), k = w.size(1);
  const bool grouped = group < k;
  const int64_t groups = grouped ? (k + 127) / 128 : 1;
  TORCH_CHECK_VALUE(!grouped || group == 128, what, ": scale groups are 128 columns or whole rows; got ", group);
  TORCH_CHECK_VALUE(x_scale.dim() == 2 && x_scale.scalar_type() == at::kFloat && x_scale.size(0) == groups &&
                        x_scale.size(1) >= cpu::round_up(std::max<int64_t>(m, 1), 16) && x_scale.is_contiguous(),
                    what, ": x_scale must be float32 [", groups, ", round_up(M, 16)]; got ", x_scale.sizes());
  TORCH_CHECK_VALUE(scale.dim() == 2 && scale.scalar_type() == at::kFloat && scale.size(0) == n &&
                        scale.size(1) == std::max<int64_t>(groups, 1),
                    what, ": scale must be float32 [", n, ", ", groups, "]; got ", scale.sizes());
  return grouped;
}

}  // namespace

namespace {

// q x e4m3(w) on the row-decoded GEMM's `loop` (cpu/row_decoded_gemm.h).
at::Tensor codes_gemm(cpu::RowsLoop loop, const char* what, const at::Tensor& q, const at::Tensor& x_scale,
                      const at::Tensor& w, const at::Tensor& scale, int64_t group) {
  const bool grouped = check_codes_gemm(what, q, x_scale, w, scale, group);
  const int64_t m = q.size(0), n = w.size(0), k = w.size(1);
  at::Tensor y = at::empty({m, n}, q.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return y;
  if (k == 0) return y.zero_();
  // The benchmarks' kernel column.
  cpu::count_kernel(loop == cpu::RowsLoop::kAmx ? "fp8 gemm/amx" : "fp8 gemm/avx512_bf16");
  const at::Tensor wc = w.contiguous();
  const at::Tensor sc = scale.contiguous();
  const Fp8WeightView view = weight_view(wc, sc, group, /*nan_codes=*/false);
  at::Tensor xb = at::empty({cpu::pair_tiles_size(m, k)}, q.options());
  auto* xbp = reinterpret_cast<uint16_t*>(xb.data_ptr<int16_t>());
  cpu::pack_pair_tiles(reinterpret_cast<const uint16_t*>(q.data_ptr<int16_t>()), m, k, k, xbp);
  cpu::RowDecodedWeight rows;
  rows.n = n;
  rows.k = k;
  rows.decode = cpu::features().avx512vbmi ? &fp8_decode_row_bf16_vbmi : &fp8_decode_row_bf16;
  rows.weight = &view;
  rows.scale = view.scale;
  rows.scale_ld = view.scale_ld;
  rows.grouped = grouped;
  cpu::row_decoded_gemm_parallel(loop, xbp, m, x_scale.data_ptr<float>(), x_scale.size(1), rows, y.data_ptr<float>(),
                                 n);
  return y;
}

}  // namespace

at::Tensor fp8_linear_amx(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w, const at::Tensor& scale,
                          int64_t group) {
  TORCH_INTERNAL_ASSERT(cpu::amx_status().usable, "fp8_linear_amx: AMX is not usable here");
  return codes_gemm(cpu::RowsLoop::kAmx, "fp8_linear_amx", q, x_scale, w, scale, group);
}

at::Tensor fp8_linear_bf16dot(const at::Tensor& q, const at::Tensor& x_scale, const at::Tensor& w,
                              const at::Tensor& scale, int64_t group) {
  TORCH_INTERNAL_ASSERT(cpu::features().avx512bf16, "fp8_linear_bf16dot: this CPU has no avx512_bf16");
  return codes_gemm(cpu::RowsLoop::kAvx512Bf16, "fp8_linear_bf16dot", q, x_scale, w, scale, group);
}

at::Tensor fp8_fake_quant_cpu(const at::Tensor& x, Fp8Activation kind, float input_scale) {
  check_activations(x, "fp8_fake_quant_cpu");
  const at::Tensor xc = x.contiguous();
  const int64_t k = xc.size(1);
  at::Tensor out = at::empty({xc.size(0), k}, xc.options().dtype(at::kFloat));
  float* dst = out.data_ptr<float>();
  for_each_scale_span(xc, kind, input_scale, [&](int64_t i, int64_t c0, int64_t len, float s, const float* xi) {
    fake_quant_span(xi + c0, len, s, dst + i * k + c0);
  });
  return out;
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group,
                          bool nan_codes, cpu::Isa isa) {
  TORCH_CHECK_VALUE(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
                    "fp8_linear_cpu: x must be a float32 [M, K] CPU tensor; got ", x.sizes(), " ", x.scalar_type(),
                    " on ", x.device());
  TORCH_CHECK_VALUE(
      w.dim() == 2 && w.scalar_type() == at::kFloat8_e4m3fn && w.device().is_cpu() && w.size(1) == x.size(1),
      "fp8_linear_cpu: w must be a float8_e4m3fn [N, K] CPU tensor with K = ", x.size(1), "; got ", w.sizes(), " ",
      w.scalar_type());
  TORCH_CHECK_VALUE(group >= 1, "fp8_linear_cpu: group must be >= 1; got ", group);
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const int64_t groups = (k + group - 1) / group;
  TORCH_CHECK_VALUE(scale.dim() == 2 && scale.scalar_type() == at::kFloat && scale.size(0) == n &&
                        scale.size(1) == std::max<int64_t>(groups, 1),
                    "fp8_linear_cpu: scale must be float32 [", n, ", ", std::max<int64_t>(groups, 1), "]; got ",
                    scale.sizes(), " ", scale.scalar_type());
  TORCH_CHECK_VALUE(static_cast<int>(isa) <= static_cast<int>(cpu::max_isa()), "fp8_linear_cpu: ISA ", to_string(isa),
                    " is not supported by this CPU (", cpu::features().describe(), ")");
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return y.zero_();

  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = w.contiguous();
  const at::Tensor sc = scale.contiguous();
  const Fp8WeightView view = weight_view(wc, sc, group, nan_codes);

  const int64_t chunk = isa == cpu::Isa::kAvx512 ? kFp8ChunkAvx512 : kFp8ChunkAvx2;
  // The SIMD kernels keep a scale group within whole chunks; a group size that is not
  // a multiple of the chunk (no format has one) takes the scalar kernel.
  if (isa != cpu::Isa::kScalar && view.group < k && view.group % chunk != 0) isa = cpu::Isa::kScalar;
  cpu::count_kernel(std::string(m == 1 ? "fp8 gemv/" : "fp8 gemm/") + to_string(isa));  // the benchmarks' kernel column
  float* out = y.data_ptr<float>();
  if (isa == cpu::Isa::kScalar) {
    const float* xs = xc.data_ptr<float>();
    cpu::parallel_rows(n, kUnitRows, [&](int64_t n0, int64_t n1) { fp8_gemm_scalar(xs, m, k, view, out, n, n0, n1); });
    return y;
  }
  // Packed rows 16 floats longer than the padded K: rows a multiple of 4 KB apart
  // would share L1 sets in the microkernels.
  const int64_t kpad = cpu::round_up(k, chunk), ld_xp = kpad + 16;
  at::Tensor xp = at::empty({m, ld_xp}, x.options());
  fp8_pack_x(xc.data_ptr<float>(), m, k, k, chunk, ld_xp, xp.data_ptr<float>());
  const float* xps = xp.data_ptr<float>();
  const auto kernel = isa == cpu::Isa::kAvx512 ? &fp8_gemm_avx512 : &fp8_gemm_avx2;
  cpu::parallel_rows(n, kUnitRows, [&](int64_t n0, int64_t n1) { kernel(xps, m, ld_xp, view, out, n, n0, n1); });
  return y;
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group,
                          bool nan_codes) {
  return fp8_linear_cpu(x, w, scale, group, nan_codes, cpu::isa());
}

}  // namespace tp::detail
