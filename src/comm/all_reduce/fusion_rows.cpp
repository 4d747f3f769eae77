#include "comm/all_reduce/fusion_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include "comm/all_reduce/shm_kernels.h"
#include "cpu/abs_max.h"
#include "cpu/features.h"

namespace tp::detail {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kInt8Max = 127.0f;
// Independent partial sums: loops the compiler vectorizes (a single running sum it
// may not reorder).
constexpr int64_t kLanes = 16;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Branch-free select forms (std::clamp / std::max pass references and stop the loops'
// vectorization); NaN passes through clamp as through at::clamp.
inline float clamp(float v, float bound) {
  v = v < -bound ? -bound : v;
  return v > bound ? bound : v;
}

// Conversions written so that the row loops vectorize, with the bits of c10's:
// bfloat16 rounds to nearest even (NaN -> 0x7fc0), as c10::BFloat16(float) does.
inline float bf16_round(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return v != v ? std::numeric_limits<float>::quiet_NaN() : r;  // c10's NaN: 0x7fc0
}

// float -> T -> float: the rounding a tensor of dtype T applies to a float32 result.
template <typename T>
inline float rounded(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return bf16_round(v);
  } else {
    return static_cast<float>(static_cast<T>(v));
  }
}

// A float already rounded to T, stored as T (exact).
template <typename T>
inline T store(float v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
  } else {
    return static_cast<T>(v);
  }
}

// float -> float8_e4m3fn bits, c10's conversion (fp8e4m3fn_from_fp32_value: round to
// nearest even, subnormals, NaN and |x| >= 464 -> 0x7f with the sign) with both of its
// branches computed and one selected, so that the row loop vectorizes.
inline uint8_t e4m3_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  constexpr uint32_t kMax = 1087u << 20;        // 464: NaN from here (and NaN itself)
  constexpr uint32_t kDenormMask = 141u << 23;  // 2^14
  float shifted_f;
  std::memcpy(&shifted_f, &bits, 4);
  float denorm_f = shifted_f + 16384.0f;  // fp32_from_bits(kDenormMask)
  uint32_t denorm;
  std::memcpy(&denorm, &denorm_f, 4);
  const uint32_t subnormal = denorm - kDenormMask;
  const uint32_t normal = (bits + (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + ((bits >> 20) & 1u)) >> 20;
  uint32_t r = bits < (121u << 23) ? subnormal : normal;
  r = bits >= kMax ? 0x7fu : r;
  return static_cast<uint8_t>((r & 0xffu) | (sign >> 24));
}

template <typename T>
float sum_of(const float* x, int64_t n, float shift) {
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) part[j] += (x[i + j] - shift) * (x[i + j] - shift);
  }
  float total = 0;
  for (; i < n; ++i) total += (x[i] - shift) * (x[i] - shift);
  for (int64_t j = 0; j < kLanes; ++j) total += part[j];
  return total;
}

float plain_sum(const float* x, int64_t n) {
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) part[j] += x[i + j];
  }
  float total = 0;
  for (; i < n; ++i) total += x[i];
  for (int64_t j = 0; j < kLanes; ++j) total += part[j];
  return total;
}

// Per-token quantization of one row of norm_out (as float32), with the operations of
// quant's per-token models (fp8: fake_quant_per_token, int8: quantize_per_token):
// amax / qmax (1 for an all-zero row), then x / scale (a division, as theirs), saturated,
// rounded to the code.
void quantize_row(const float* x, int64_t n, AllReduceFusionQuant quant, void* codes, float* scale_out) {
  // NaN when an element is NaN, as at::amax: a row holding a NaN takes scale 1 as quant's does.
  const float amax = cpu::abs_max(x, n);
  if (quant == AllReduceFusionQuant::kFp8PerToken) {
    const float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    auto* q = static_cast<uint8_t*>(codes);
    for (int64_t k = 0; k < n; ++k) q[k] = e4m3_bits(clamp(x[k] / scale, kE4m3Max));
    *scale_out = scale;
    return;
  }
  const float scale = amax > 0.0f ? amax / kInt8Max : 1.0f;
  auto* q = static_cast<int8_t*>(codes);
  // Round half to even, as at::round: |v| <= 127 after the clamp, and adding then
  // subtracting 1.5 * 2^23 rounds it to an integer in the default rounding mode (the
  // clamp first gives the same codes: every value past 127 rounds to at least 127).
  constexpr float kMagic = 12582912.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float v = clamp(x[k] / scale, kInt8Max);
    const float r = (v + kMagic) - kMagic;
    q[k] = static_cast<int8_t>(r == r ? r : 0.0f);  // a NaN's code is 0, as quant's conversion
  }
  *scale_out = scale;
}

template <typename T>
void finish_typed(const FusionRows& f, int64_t row, const float* acc) {
  const int64_t n = f.hidden;
  thread_local std::vector<float> h_buf, y_buf;
  if (static_cast<int64_t>(h_buf.size()) < n) {
    h_buf.resize(static_cast<size_t>(n));
    y_buf.resize(static_cast<size_t>(n));
  }
  float* __restrict h = h_buf.data();
  float* __restrict yf = y_buf.data();
  const T* __restrict res = f.residual_in ? static_cast<const T*>(f.residual_in) + row * n : nullptr;
  T* __restrict out = static_cast<T*>(f.residual_out) + row * n;
  // The all-reduce's result in T, then the residual added and rounded to T as a tensor add would.
  for (int64_t i = 0; i < n; ++i) h[i] = rounded<T>(acc[i]);
  if (res) {
    for (int64_t i = 0; i < n; ++i) h[i] = rounded<T>(h[i] + static_cast<float>(res[i]));
  }
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(h[i]);
  if (f.norm == AllReduceFusionNorm::kNone) return;
  const T* __restrict w = static_cast<const T*>(f.norm_weight);
  T* __restrict y = static_cast<T*>(f.norm_out) + row * n;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (f.norm == AllReduceFusionNorm::kLayerNorm) {
    const float mean = plain_sum(h, n) / static_cast<float>(n);
    const float rstd = 1.0f / std::sqrt(sum_of<T>(h, n, mean) / static_cast<float>(n) + f.eps);
    const T* __restrict b = static_cast<const T*>(f.norm_bias);
    for (int64_t i = 0; i < n; ++i) yf[i] = (h[i] - mean) * rstd * static_cast<float>(w[i]);
    if (b) {
      for (int64_t i = 0; i < n; ++i) yf[i] += static_cast<float>(b[i]);
    }
  } else {
    (void)inv_n;
    const float r = 1.0f / std::sqrt(sum_of<T>(h, n, 0.0f) / static_cast<float>(n) + f.eps);
    switch (f.norm) {
      case AllReduceFusionNorm::kRMS:
        for (int64_t i = 0; i < n; ++i) yf[i] = static_cast<float>(w[i]) * rounded<T>(h[i] * r);
        break;
      case AllReduceFusionNorm::kRMSUnitOffset:
        for (int64_t i = 0; i < n; ++i) yf[i] = h[i] * r * (static_cast<float>(w[i]) + 1.0f);
        break;
      case AllReduceFusionNorm::kRMSScaleFirst:
        for (int64_t i = 0; i < n; ++i) yf[i] = static_cast<float>(w[i]) * (h[i] * r);
        break;
      default: TORCH_INTERNAL_ASSERT(false, "all_reduce_fusion: unhandled norm ", to_string(f.norm));
    }
  }
  // norm_out in T; the quantizer reads it back as float (exact).
  for (int64_t i = 0; i < n; ++i) yf[i] = rounded<T>(yf[i]);
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(yf[i]);
  if (f.quant == AllReduceFusionQuant::kNone) return;
  quantize_row(yf, n, f.quant, static_cast<int8_t*>(f.quant_out) + row * n, f.scale_out + row);
}

// The parts' sum in fp32, in rank order (the shared-memory strategies' sum_ranks).
template <typename P>
void sum_parts(const void* const* parts, int64_t count, int64_t n, float* acc) {
  const P* __restrict first = static_cast<const P*>(parts[0]);
  for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<float>(first[i]);
  for (int64_t r = 1; r < count; ++r) {
    const P* __restrict src = static_cast<const P*>(parts[r]);
    for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<float>(src[i]);
  }
}

static_assert(static_cast<int32_t>(AllReduceFusionNorm::kLayerNorm) == static_cast<int32_t>(RowNorm::kLayerNorm) &&
                  static_cast<int32_t>(AllReduceFusionNorm::kRMSScaleFirst) ==
                      static_cast<int32_t>(RowNorm::kRMSScaleFirst) &&
                  static_cast<int32_t>(AllReduceFusionQuant::kInt8PerToken) ==
                      static_cast<int32_t>(RowQuant::kInt8PerToken),
              "RowNorm / RowQuant spell AllReduceFusionNorm / AllReduceFusionQuant value for value");

RowType row_type(c10::ScalarType t) { return t == c10::kFloat ? RowType::kFloat : RowType::kBFloat16; }

bool avx512_rows() {
  static const bool yes = cpu::isa() >= cpu::Isa::kAvx512;
  return yes;
}

}  // namespace

void FusionRows::finish_portable(int64_t row, const void* const* parts, int64_t count,
                                 c10::ScalarType part_dtype) const {
  thread_local std::vector<float> acc;
  if (static_cast<int64_t>(acc.size()) < hidden) acc.resize(static_cast<size_t>(hidden));
  switch (part_dtype) {
    case c10::kFloat: sum_parts<float>(parts, count, hidden, acc.data()); break;
    case c10::kBFloat16: sum_parts<c10::BFloat16>(parts, count, hidden, acc.data()); break;
    case c10::kHalf: sum_parts<c10::Half>(parts, count, hidden, acc.data()); break;
    default: TORCH_INTERNAL_ASSERT(false, "all_reduce_fusion: unsupported dtype ", part_dtype);
  }
  switch (dtype) {
    case c10::kFloat: finish_typed<float>(*this, row, acc.data()); return;
    case c10::kBFloat16: finish_typed<c10::BFloat16>(*this, row, acc.data()); return;
    case c10::kHalf: finish_typed<c10::Half>(*this, row, acc.data()); return;
    default: TORCH_INTERNAL_ASSERT(false, "all_reduce_fusion: unsupported dtype ", dtype);
  }
}

void FusionRows::finish(int64_t row, const void* const* parts, int64_t count, c10::ScalarType part_dtype) const {
  // The kernel's pairs: float32 rows (on a float32 or bf16 wire) and bf16 rows.
  const bool kernel = (dtype == c10::kFloat && (part_dtype == c10::kFloat || part_dtype == c10::kBFloat16)) ||
                      (dtype == c10::kBFloat16 && part_dtype == c10::kBFloat16);
  if (!kernel || !avx512_rows()) {
    finish_portable(row, parts, count, part_dtype);
    return;
  }
  thread_local std::vector<float> h, y;
  if (static_cast<int64_t>(h.size()) < hidden) {
    h.resize(static_cast<size_t>(hidden));
    y.resize(static_cast<size_t>(hidden));
  }
  const int64_t at = row * hidden * static_cast<int64_t>(c10::elementSize(dtype));
  RowKernelArgs a;
  a.hidden = hidden;
  a.type = row_type(dtype);
  a.part_type = row_type(part_dtype);
  a.norm = static_cast<RowNorm>(static_cast<int32_t>(norm));
  a.quant = static_cast<RowQuant>(static_cast<int32_t>(quant));
  a.eps = eps;
  a.parts = parts;
  a.count = count;
  a.residual_in = residual_in ? static_cast<const char*>(residual_in) + at : nullptr;
  a.norm_weight = norm_weight;
  a.norm_bias = norm_bias;
  a.residual_out = static_cast<char*>(residual_out) + at;
  if (norm != AllReduceFusionNorm::kNone) a.norm_out = static_cast<char*>(norm_out) + at;
  if (quant != AllReduceFusionQuant::kNone) {
    a.quant_out = static_cast<char*>(quant_out) + row * hidden;
    a.scale_out = scale_out + row;
  }
  a.avx512_bf16 = cpu::features().avx512bf16;
  a.scratch_h = h.data();
  a.scratch_y = y.data();
  finish_row_avx512(a);
}

int64_t FusionRows::packed_row_bytes() const {
  const int64_t t = static_cast<int64_t>(c10::elementSize(dtype)) * hidden;
  int64_t bytes = t;
  if (norm != AllReduceFusionNorm::kNone) bytes += t;
  if (quant != AllReduceFusionQuant::kNone) bytes += hidden + static_cast<int64_t>(sizeof(float));
  return round_up(bytes, 64);
}

void FusionRows::pack(int64_t row, void* dst) const {
  const size_t t = c10::elementSize(dtype) * static_cast<size_t>(hidden);
  auto* d = static_cast<char*>(dst);
  std::memcpy(d, static_cast<const char*>(residual_out) + row * t, t);
  d += t;
  if (norm == AllReduceFusionNorm::kNone) return;
  std::memcpy(d, static_cast<const char*>(norm_out) + row * t, t);
  d += t;
  if (quant == AllReduceFusionQuant::kNone) return;
  std::memcpy(d, static_cast<const char*>(quant_out) + row * hidden, static_cast<size_t>(hidden));
  std::memcpy(d + hidden, scale_out + row, sizeof(float));
}

void FusionRows::unpack(int64_t row, const void* src) const {
  const size_t t = c10::elementSize(dtype) * static_cast<size_t>(hidden);
  const auto* s = static_cast<const char*>(src);
  std::memcpy(static_cast<char*>(residual_out) + row * t, s, t);
  s += t;
  if (norm == AllReduceFusionNorm::kNone) return;
  std::memcpy(static_cast<char*>(norm_out) + row * t, s, t);
  s += t;
  if (quant == AllReduceFusionQuant::kNone) return;
  std::memcpy(static_cast<char*>(quant_out) + row * hidden, s, static_cast<size_t>(hidden));
  std::memcpy(scale_out + row, s + hidden, sizeof(float));
}

}  // namespace tp::detail
