#include "quant/int4/cpu_kernels.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "cpu/bf16_dot.h"
#include "cpu/bf16_panel_gemm.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "cpu/panel_gemm.h"

namespace tp::detail {

namespace {

cpu::PanelDecodeFn decoder(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::kAvx512: return int4_decode_panels_avx512;
    case cpu::Isa::kAvx2: return int4_decode_panels_avx2;
    case cpu::Isa::kScalar: break;
  }
  return int4_decode_panels_scalar;
}

}  // namespace

int64_t Int4CpuWeight::bytes() const { return codes.defined() ? codes.nbytes() + scales.nbytes() + zeros.nbytes() : 0; }

Int4CpuView int4_cpu_view(const Int4CpuWeight& w) {
  Int4CpuView v;
  v.codes = reinterpret_cast<const uint32_t*>(w.codes.const_data_ptr<int32_t>());
  if (w.scales.scalar_type() == at::kHalf) {
    v.scales_f16 = reinterpret_cast<const uint16_t*>(w.scales.const_data_ptr<at::Half>());
  } else {
    v.scales_f32 = w.scales.const_data_ptr<float>();
  }
  v.zeros = w.zeros.const_data_ptr<uint8_t>();
  v.n = w.n;
  v.k = w.k;
  v.group = w.group;
  v.panels = w.panels;
  return v;
}

Int4CpuWeight int4_cpu_pack(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero, int64_t group) {
  TORCH_CHECK_VALUE(codes.dim() == 2 && !at::isFloatingType(codes.scalar_type()),
                    "int4_cpu_pack: 'codes' must be an integer [N, K] tensor; got ", codes.sizes(), " ",
                    codes.scalar_type());
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK_VALUE(group > 0 && group % 8 == 0 && k % group == 0, "int4_cpu_pack: in_features K=", k,
                    " and group size ", group, ": the group must be a multiple of 8 that divides K");
  const int64_t groups = k / group;
  TORCH_CHECK_VALUE(
      scale.dim() == 2 && scale.size(0) == groups && scale.size(1) == n && at::isFloatingType(scale.scalar_type()),
      "int4_cpu_pack: 'scale' must be a floating [K/g, N] = [", groups, ", ", n, "] tensor; got ", scale.sizes(), " ",
      scale.scalar_type());
  TORCH_CHECK_VALUE(zero.dim() == 2 && zero.size(0) == groups && zero.size(1) == n,
                    "int4_cpu_pack: 'zero' must be [K/g, N] = [", groups, ", ", n, "]; got ", zero.sizes());
  const auto q = codes.cpu().to(at::kInt);
  if (q.numel() > 0) {
    TORCH_CHECK_VALUE(q.min().item<int>() >= 0 && q.max().item<int>() <= 15,
                      "int4_cpu_pack: 'codes' must lie in 0..15; got ", q.min().item<int>(), "..", q.max().item<int>());
  }
  const auto z = zero.cpu().to(at::kDouble);
  if (z.numel() > 0) {
    TORCH_CHECK_VALUE(at::equal(z, z.round()) && z.min().item<double>() >= 0 && z.max().item<double>() <= 255,
                      "int4_cpu_pack: 'zero' must hold integers in 0..255; got ", z.min().item<double>(), "..",
                      z.max().item<double>());
  }
  const auto s32 = scale.cpu().to(at::kFloat);
  // float16 scales halve the scale stream, and (finite) let the decoders fold the zero
  // point into one exact FMA; keep float32 unless every value round-trips.
  const bool f16 = at::equal(s32.to(at::kHalf).to(at::kFloat), s32) && at::isfinite(s32).all().item<bool>();

  Int4CpuWeight w;
  w.n = n;
  w.k = k;
  w.group = group;
  w.panels = (n + cpu::kPanelWidth - 1) / cpu::kPanelWidth;
  // Columns past N stay zero (code 0, zero 0, scale 0: they decode to 0).
  w.codes = at::zeros({w.panels, k / 8, cpu::kPanelWidth}, at::kInt);
  w.scales = at::zeros({w.panels, groups, cpu::kPanelWidth}, f16 ? at::kHalf : at::kFloat);
  w.zeros = at::zeros({w.panels, groups, cpu::kPanelWidth}, at::kByte);
  const auto qc = q.contiguous();
  const int32_t* src = qc.const_data_ptr<int32_t>();
  auto* words = reinterpret_cast<uint32_t*>(w.codes.mutable_data_ptr<int32_t>());
  cpu::parallel_over_panels(w.panels, 1, k, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t c = p0 * cpu::kPanelWidth; c < std::min(n, p1 * cpu::kPanelWidth); ++c) {
      uint32_t* dst = words + (c / cpu::kPanelWidth) * (k / 8) * cpu::kPanelWidth + c % cpu::kPanelWidth;
      const int32_t* row = src + c * k;
      for (int64_t b = 0; b < k / 8; ++b) {
        uint32_t word = 0;
        for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(row[8 * b + i]) << (4 * i);
        dst[b * cpu::kPanelWidth] = word;
      }
    }
  });
  // scales, zeros: [G, N] -> [panels, G, 16].
  const auto per_panel = [&](const at::Tensor& t, const at::Tensor& dst) {
    const int64_t pad = w.panels * cpu::kPanelWidth - n;
    dst.copy_(at::constant_pad_nd(t, {0, pad}).view({groups, w.panels, cpu::kPanelWidth}).permute({1, 0, 2}));
  };
  per_panel(f16 ? s32.to(at::kHalf) : s32, w.scales);
  per_panel(z.to(at::kByte), w.zeros);
  return w;
}

Int4CpuWeight int4_cpu_concat(std::vector<Int4CpuWeight> parts) {
  TORCH_INTERNAL_ASSERT(!parts.empty(), "int4_cpu_concat: no parts");
  if (parts.size() == 1) return std::move(parts.front());
  Int4CpuWeight w;
  w.k = parts.front().k;
  w.group = parts.front().group;
  bool f16 = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& p = parts[i];
    TORCH_INTERNAL_ASSERT(p.k == w.k && p.group == w.group && (i + 1 == parts.size() || p.n % cpu::kPanelWidth == 0),
                          "int4_cpu_concat: part ", i, " is [", p.n, ", ", p.k, "] g", p.group);
    w.n += p.n;
    w.panels += p.panels;
    f16 = f16 && p.scales.scalar_type() == at::kHalf;
  }
  std::vector<at::Tensor> codes, scales, zeros;
  for (auto& p : parts) {
    codes.push_back(std::move(p.codes));
    scales.push_back(f16 ? std::move(p.scales) : p.scales.to(at::kFloat));  // float16 -> float32 is exact
    zeros.push_back(std::move(p.zeros));
  }
  w.codes = at::cat(codes, 0);
  w.scales = at::cat(scales, 0);
  w.zeros = at::cat(zeros, 0);
  return w;
}

void int4_decode_panels_scalar(const void* view, int64_t p, int64_t np, int64_t k0, int64_t kc, float* buf,
                               int64_t ld_buf) {
  const auto& w = *static_cast<const Int4CpuView*>(view);
  const int64_t groups = w.k / w.group;
  for (int64_t j = 0; j < np; ++j) {
    const uint32_t* codes = w.codes + (p + j) * (w.k / 8) * cpu::kPanelWidth;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t kabs = k0 + kk, g = kabs / w.group, meta = ((p + j) * groups + g) * cpu::kPanelWidth;
      const uint32_t* line = codes + (kabs / 8) * cpu::kPanelWidth;
      const int shift = static_cast<int>(4 * (kabs % 8));
      float* out = buf + kk * ld_buf + cpu::kPanelWidth * j;
      for (int64_t c = 0; c < cpu::kPanelWidth; ++c) {
        const float q = static_cast<float>((line[c] >> shift) & 15u);
        const float zero = static_cast<float>(w.zeros[meta + c]);
        const float s = w.scales_f16 ? static_cast<float>(c10::Half(w.scales_f16[meta + c], c10::Half::from_bits()))
                                     : w.scales_f32[meta + c];
        out[c] = (q - zero) * s;
      }
    }
  }
}

void int4_prescale_x(const float* x, int64_t m, int64_t ld_x, int64_t k, int64_t group, float* xs, float* sum_x) {
  // 16^-i for nibble i (powers of two: the products are exact); nibble 7 is shifted down.
  constexpr float kScale[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
  const int64_t groups = k / group;
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * ld_x;
    float* xsr = xs + r * k;
    for (int64_t g = 0; g < groups; ++g) {
      double sum = 0;
      for (int64_t kk = g * group; kk < (g + 1) * group; kk += 8) {
        for (int i = 0; i < 8; ++i) {
          sum += xr[kk + i];
          xsr[kk + i] = xr[kk + i] * kScale[i];
        }
      }
      sum_x[r * groups + g] = static_cast<float>(sum);
    }
  }
}

void int4_pair_x_bf16(const uint16_t* x, int64_t m, int64_t ld_x, int64_t k, int64_t group, uint32_t* xq,
                      float* sum_x) {
  const int64_t groups = k / group;
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* xr = x + r * ld_x;
    uint32_t* xqr = xq + r * (k / 2);
    for (int64_t b = 0; b < k / 8; ++b)
      for (int64_t i = 0; i < 4; ++i)
        xqr[4 * b + i] = static_cast<uint32_t>(xr[8 * b + i]) | (static_cast<uint32_t>(xr[8 * b + 4 + i]) << 16);
    for (int64_t g = 0; g < groups; ++g) {
      double sum = 0;
      for (int64_t kk = g * group; kk < (g + 1) * group; ++kk)
        sum += static_cast<float>(c10::BFloat16(xr[kk], c10::BFloat16::from_bits()));
      sum_x[r * groups + g] = static_cast<float>(sum);
    }
  }
}

void int4_cpu_linear(const float* x, int64_t m, int64_t ld_x, const Int4CpuWeight& w, float* y, int64_t ld_y,
                     cpu::Isa isa) {
  cpu::check_isa(isa, "int4_cpu_linear");
  TORCH_INTERNAL_ASSERT(w.codes.defined(), "int4_cpu_linear: the weight is not packed");
  if (m == 0 || w.n == 0) return;
  if (w.k == 0) {
    for (int64_t r = 0; r < m; ++r) std::fill(y + r * ld_y, y + r * ld_y + w.n, 0.0f);
    return;
  }
  const Int4CpuView v = int4_cpu_view(w);
  const bool small = isa != cpu::Isa::kScalar && m <= kInt4SmallM;
  cpu::count_kernel(std::string(small ? "int4 rows/" : "int4 panel/") +
                    to_string(isa));  // the benchmarks' kernel column
  if (small) {
    std::vector<float> xs(m * w.k), sum_x(m * (w.k / w.group));
    int4_prescale_x(x, m, ld_x, w.k, w.group, xs.data(), sum_x.data());
    const auto rows = isa == cpu::Isa::kAvx512 ? int4_rows_avx512 : int4_rows_avx2;
    // Chunks in whole steps of the rows kernel's widest panel group.
    cpu::parallel_over_panels(w.panels, m, w.k, isa == cpu::Isa::kAvx512 ? 4 : 2, [&](int64_t p0, int64_t p1) {
      rows(xs.data(), m, w.k, sum_x.data(), w.k / w.group, v, y, ld_y, p0, p1);
    });
    return;
  }
  cpu::panel_gemm_parallel(x, m, ld_x, cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, y, ld_y, w.panels, isa);
}

at::Tensor int4_cpu_linear(const at::Tensor& x, const Int4CpuWeight& w, cpu::Isa isa) {
  if (cpu::panel_amx_bf16_applies(x, isa) && w.codes.defined() && w.n > 0) {
    cpu::count_kernel("int4 panel/amx");  // the benchmarks' kernel column
    const Int4CpuView v = int4_cpu_view(w);
    return cpu::panel_linear_amx_bf16(x, cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, w.panels, "int4_cpu_linear");
  }
  if (cpu::bf16_dot_applies(x, isa) && w.codes.defined()) {
    cpu::count_kernel("int4 panel/avx512_bf16");  // the benchmarks' kernel column
    const Int4CpuView v = int4_cpu_view(w);
    cpu::Bf16PanelWeight pw;
    pw.n = w.n;
    pw.k = w.k;
    pw.group = w.group;
    pw.zeros = true;
    pw.decode = &int4_bf16_decode_avx512;
    pw.weight = &v;
    return cpu::bf16_panel_linear(x, pw, "int4_cpu_linear");
  }
  if (x.scalar_type() == at::kBFloat16 && isa == cpu::Isa::kAvx512 && cpu::features().avx512bf16 && w.codes.defined() &&
      w.n > 0 && w.k > 0 && x.dim() >= 1 && x.size(-1) == w.k && x.numel() > 0 && x.numel() / w.k <= kInt4SmallM) {
    // bf16 layers at M <= 4: the rows kernel on bf16 dot products (cpu_kernels.h).
    cpu::check_isa(isa, "int4_cpu_linear");
    cpu::count_kernel("int4 rows/avx512_bf16");  // the benchmarks' kernel column
    const at::Tensor x2 = x.reshape({-1, w.k}).contiguous();
    const int64_t m = x2.size(0), groups = w.k / w.group;
    std::vector<uint32_t> xq(static_cast<size_t>(m * (w.k / 2)));
    std::vector<float> sum_x(static_cast<size_t>(m * groups));
    int4_pair_x_bf16(reinterpret_cast<const uint16_t*>(x2.const_data_ptr<at::BFloat16>()), m, w.k, w.k, w.group,
                     xq.data(), sum_x.data());
    at::Tensor y = at::empty({m, w.n}, x.options().dtype(at::kFloat));
    float* out = y.data_ptr<float>();
    const Int4CpuView v = int4_cpu_view(w);
    cpu::parallel_over_panels(w.panels, m, w.k, 4, [&](int64_t p0, int64_t p1) {
      int4_rows_bf16_avx512(xq.data(), m, w.k / 2, sum_x.data(), groups, v, out, w.n, p0, p1);
    });
    auto shape = x.sizes().vec();
    shape.back() = w.n;
    return y.to(at::kBFloat16).view(shape);
  }
  return cpu::linear_through_f32(x, w.n, w.k, "int4_cpu_linear", [&](const float* x2, int64_t m, float* y) {
    int4_cpu_linear(x2, m, w.k, w, y, w.n, isa);
  });
}

at::Tensor int4_cpu_decode(const Int4CpuWeight& w, cpu::Isa isa) {
  cpu::check_isa(isa, "int4_cpu_decode");
  const Int4CpuView v = int4_cpu_view(w);
  return cpu::panel_decode_all(cpu::PanelWeight{w.n, w.k, decoder(isa), &v}, w.panels, isa);
}

}  // namespace tp::detail
