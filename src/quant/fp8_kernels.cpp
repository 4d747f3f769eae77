// The tiled FP8 CPU GEMM (see fp8_kernels.h for why not an ATen op).

#include "quant/fp8_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <array>
#include <vector>

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

// Weight rows per tile: the float tile (rows * K * 4 bytes) should stay in L2 while
// BLAS reads it M times. Decode-bound small M gets small tiles (more parallel work);
// large M wants wider tiles for an efficient GEMM.
int64_t tile_rows(int64_t m, int64_t k) {
  const int64_t budget_floats = m >= 32 ? (512 << 10) / 4 : (256 << 10) / 4;
  return std::clamp<int64_t>(budget_floats / std::max<int64_t>(k, 1), 8, 256);
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
  const int64_t rows = tile_rows(m, k);
  const int64_t tiles = (n + rows - 1) / rows;
  // One tile per task: each thread decodes its rows into its own buffer and runs a
  // single-threaded GEMM on it (ATen runs nested BLAS calls serially), so decode and
  // GEMM share the thread's cache and no two threads touch the same output columns.
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buffer(static_cast<size_t>(rows * k));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * rows;
      const int64_t nr = std::min(rows, n - n0);
      for (int64_t r = 0; r < nr; ++r) {
        const uint8_t* src = w_bits + (n0 + r) * k;
        const float* row_scale = s + (n0 + r) * groups;
        float* dst = buffer.data() + r * k;
        for (int64_t g = 0; g < groups; ++g) {
          const float sg = row_scale[g];
          const int64_t k1 = std::min(k, (g + 1) * group);
          for (int64_t c = g * group; c < k1; ++c) dst[c] = table[src[c]] * sg;
        }
      }
      const at::Tensor tile = at::from_blob(buffer.data(), {nr, k}, at::TensorOptions().dtype(at::kFloat));
      y.narrow(1, n0, nr).copy_(at::mm(x, tile.t()));
    }
  });
  return y;
}

}  // namespace tp::detail
