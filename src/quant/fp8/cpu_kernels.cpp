// The FP8 CPU GEMM: decode a chunk of weight rows, multiply it (see cpu_kernels.h
// for why not an ATen op).

#include "quant/fp8/cpu_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <array>

namespace tp::detail {

namespace {

// Every E4M3 bit pattern as a float, decoded once by c10's own conversion (so the
// kernel agrees bit for bit with tensor.to(float), NaN patterns included).
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

// Weight rows per chunk: ~8 MB of float32 (the decoded chunk is read M times by the
// GEMM, so it should stay in L2/L3), at least 16 rows.
int64_t chunk_rows(int64_t n, int64_t k) {
  const int64_t budget_floats = (8 << 20) / 4;
  return std::clamp<int64_t>(budget_floats / std::max<int64_t>(k, 1), 16, std::max<int64_t>(n, 16));
}

}  // namespace

at::Tensor fp8_linear_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t group) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous());
  TORCH_INTERNAL_ASSERT(w.dim() == 2 && w.scalar_type() == at::kFloat8_e4m3fn && w.size(1) == x.size(1));
  TORCH_INTERNAL_ASSERT(group >= 1);
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const int64_t groups = (k + group - 1) / group;
  TORCH_INTERNAL_ASSERT(scale.dim() == 2 && scale.size(0) == n && scale.size(1) == groups &&
                        scale.scalar_type() == at::kFloat);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  if (k == 0) return y.zero_();
  const at::Tensor wc = w.contiguous();
  const at::Tensor sc = scale.contiguous();
  const auto* w_bits = reinterpret_cast<const uint8_t*>(wc.data_ptr());
  const float* s = sc.data_ptr<float>();
  const auto& table = e4m3_table();
  const int64_t rows = std::min(chunk_rows(n, k), n);
  at::Tensor chunk = at::empty({rows, k}, x.options());
  float* buffer = chunk.data_ptr<float>();
  // Chunk by chunk: the rows are decoded in parallel (with their scales folded in),
  // then one BLAS call with ATen's own threading multiplies the chunk. Few, large
  // BLAS calls: per-thread small GEMMs inside a parallel region were measured 10-100x
  // slower on a loaded 2-core VM (every call paid for OpenMP barriers).
  for (int64_t n0 = 0; n0 < n; n0 += rows) {
    const int64_t nr = std::min(rows, n - n0);
    at::parallel_for(0, nr, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* src = w_bits + (n0 + r) * k;
        const float* row_scale = s + (n0 + r) * groups;
        float* dst = buffer + r * k;
        for (int64_t g = 0; g < groups; ++g) {
          const float sg = row_scale[g];
          const int64_t k1 = std::min(k, (g + 1) * group);
          for (int64_t c = g * group; c < k1; ++c) dst[c] = table[src[c]] * sg;
        }
      }
    });
    y.narrow(1, n0, nr).copy_(at::mm(x, chunk.narrow(0, 0, nr).t()));
  }
  return y;
}

}  // namespace tp::detail
