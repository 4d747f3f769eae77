#include "comm/all_reduce/fusion_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

namespace tp::detail {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kInt8Max = 127.0f;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// float -> T -> float: the rounding a tensor of dtype T applies to a float32 result.
template <typename T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// Per-token quantization of one row of norm_out (as float32), with the operations of
// quant's per-token models (fp8: fake_quant_per_token, int8: quantize_per_token):
// amax / qmax (1 for an all-zero row), then x / scale, saturated, rounded to the code.
void quantize_row(const float* x, int64_t n, AllReduceFusionQuant quant, void* codes, float* scale_out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (quant == AllReduceFusionQuant::kFp8PerToken) {
    const float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    auto* q = static_cast<c10::Float8_e4m3fn*>(codes);
    for (int64_t i = 0; i < n; ++i) q[i] = c10::Float8_e4m3fn(std::clamp(x[i] / scale, -kE4m3Max, kE4m3Max));
    *scale_out = scale;
    return;
  }
  const float scale = amax > 0.0f ? amax / kInt8Max : 1.0f;
  auto* q = static_cast<int8_t*>(codes);
  // nearbyint in the default rounding mode: half to even, as at::round.
  for (int64_t i = 0; i < n; ++i)
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / scale), -kInt8Max, kInt8Max));
  *scale_out = scale;
}

template <typename T>
void finish_typed(const FusionRows& f, int64_t row, const float* acc) {
  const int64_t n = f.hidden;
  thread_local std::vector<float> h_buf, y_buf;
  h_buf.resize(static_cast<size_t>(n));
  float* h = h_buf.data();
  const T* bias = static_cast<const T*>(f.bias);
  const T* res = f.residual_in ? static_cast<const T*>(f.residual_in) + row * n : nullptr;
  T* out = static_cast<T*>(f.residual_out) + row * n;
  // The all-reduce's result in T, then each addition rounded to T as a tensor add would.
  for (int64_t i = 0; i < n; ++i) {
    float v = rounded<T>(acc[i]);
    if (bias) v = rounded<T>(v + static_cast<float>(bias[i]));
    if (res) v = rounded<T>(v + static_cast<float>(res[i]));
    h[i] = v;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(h[i]);
  if (f.norm == AllReduceFusionNorm::kNone) return;
  const T* w = static_cast<const T*>(f.norm_weight);
  T* y = static_cast<T*>(f.norm_out) + row * n;
  if (f.norm == AllReduceFusionNorm::kLayerNorm) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += h[i];
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(h[i] - mean) * static_cast<double>(h[i] - mean);
    const float rstd = 1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(n)) + f.eps);
    const T* b = static_cast<const T*>(f.norm_bias);
    for (int64_t i = 0; i < n; ++i) {
      const float v = (h[i] - mean) * rstd * static_cast<float>(w[i]);
      y[i] = static_cast<T>(b ? v + static_cast<float>(b[i]) : v);
    }
  } else {
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(h[i]) * static_cast<double>(h[i]);
    const float r = 1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(n)) + f.eps);
    switch (f.norm) {
      case AllReduceFusionNorm::kRMS:
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<float>(w[i]) * rounded<T>(h[i] * r));
        break;
      case AllReduceFusionNorm::kRMSUnitOffset:
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(h[i] * r * (static_cast<float>(w[i]) + 1.0f));
        break;
      case AllReduceFusionNorm::kRMSScaleFirst:
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<float>(w[i]) * (h[i] * r));
        break;
      default: TORCH_INTERNAL_ASSERT(false, "all_reduce_fusion: unhandled norm ", to_string(f.norm));
    }
  }
  if (f.quant == AllReduceFusionQuant::kNone) return;
  y_buf.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y_buf[i] = static_cast<float>(y[i]);
  quantize_row(y_buf.data(), n, f.quant, static_cast<int8_t*>(f.quant_out) + row * n, f.scale_out + row);
}

}  // namespace

void FusionRows::finish(int64_t row, const float* acc) const {
  switch (dtype) {
    case c10::kFloat: finish_typed<float>(*this, row, acc); return;
    case c10::kBFloat16: finish_typed<c10::BFloat16>(*this, row, acc); return;
    case c10::kHalf: finish_typed<c10::Half>(*this, row, acc); return;
    default: TORCH_INTERNAL_ASSERT(false, "all_reduce_fusion: unsupported dtype ", dtype);
  }
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
