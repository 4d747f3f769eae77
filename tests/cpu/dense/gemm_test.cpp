// The unquantized method's CPU GEMM backends (src/cpu/dense/gemm.h): each
// one forced, at edge shapes, against a float64 reference from the same weights; the
// per-ISA kernels called directly for every ISA this CPU has; the selection table; the
// re-pack when the weight changes; autograd falling back to at::linear.

#include "support/tp_catch.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "cpu/dense/backends.h"
#include "cpu/dense/gemm.h"
#include "cpu/dense/kernels.h"
#include "cpu/features.h"
#include "support/cpu_kernel_check.h"
#include "support/test_util.h"

using tp::cpu::DenseBackend;
using tp::cpu::DenseGemm;
using tp::cpu::DenseProblem;
using tp::cpu::Isa;
using tp::test::isas_here;

namespace {

// Worst-case bound of a float32 dot product of length k in any summation order
// (Higham, Accuracy and Stability of Numerical Algorithms, 3.1): |fl(x.w) - x.w| <=
// gamma_k * sum |x_i w_i|, gamma_k = k u / (1 - k u), u = 2^-24; the inputs are exact
// in float64, so this is the whole error of a float32 result. A bfloat16 result is
// then rounded once more: + 2^-8 |x.w|. Checked element by element, so a wrong or
// missing term (a kernel's tail, a row of the wrong tile) is far outside it.
void require_within_bound(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w,
                          const std::optional<at::Tensor>& bias = std::nullopt) {
  const auto x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  auto ref = at::matmul(x64, w64.t());
  auto abs_ref = at::matmul(x64.abs(), w64.abs().t());
  const int64_t k = x.size(-1);
  const double u = std::ldexp(1.0, -24);
  const double gamma = (k + 1) * u / (1.0 - (k + 1) * u);  // + 1: the bias add
  if (bias) {
    ref = ref + bias->to(at::kDouble);
    abs_ref = abs_ref + bias->to(at::kDouble).abs();
  }
  auto bound = gamma * abs_ref + 1e-30;
  if (y.scalar_type() == at::kBFloat16) bound = (1.0 + std::ldexp(1.0, -8)) * bound + std::ldexp(1.0, -8) * ref.abs();
  REQUIRE(y.sizes() == ref.sizes());
  const auto excess = ((y.to(at::kDouble) - ref).abs() - bound).max().item<double>();
  INFO("max(|y - ref| - bound) = " << excess << ", max |ref| = " << ref.abs().max().item<double>());
  REQUIRE(excess <= 0.0);
  // Not trivially within the bound: the result has the reference's magnitude.
  REQUIRE(y.to(at::kDouble).abs().max().item<double>() > 0.5 * ref.abs().max().item<double>());
}

using GemvF32 = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                         int64_t);
using GemvBf16 = void (*)(const float*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t,
                          int64_t);

GemvF32 f32_kernel(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return tp::cpu::gemv_f32_avx512;
    case Isa::kAvx2: return tp::cpu::gemv_f32_avx2;
    case Isa::kScalar: break;
  }
  return tp::cpu::gemv_f32_scalar;
}
GemvBf16 bf16_kernel(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return tp::cpu::gemv_bf16_avx512;
    case Isa::kAvx2: return tp::cpu::gemv_bf16_avx2;
    case Isa::kScalar: break;
  }
  return tp::cpu::gemv_bf16_scalar;
}

struct Shape {
  int64_t n, k;
};
// N and K off every tile (4 rows; 8 / 16 lanes; the 16-row bf16 tile), a single
// element, K one vector, and a Llama-sized K.
const std::vector<Shape> kEdgeShapes{{1, 1}, {5, 7}, {3, 8}, {17, 16}, {33, 17}, {67, 129}, {130, 1000}, {19, 4096}};
const std::vector<int64_t> kMs{1, 3, 16, 17};

const std::vector<DenseBackend> kBackends{DenseBackend::kAtLinear, DenseBackend::kOneDnn, DenseBackend::kMklPacked,
                                          DenseBackend::kPanels,   DenseBackend::kGemv,   DenseBackend::kBf16Tiles};

}  // namespace

TEST_CASE("cpu_gemm: each per-ISA kernel matches float64 on strided operands and writes only columns n0 to n1 - 1",
          "[quant][cpu_kernels]") {
  uint64_t seed = 100;
  for (const Isa isa : isas_here()) {
    for (const auto& s : kEdgeShapes) {
      for (const int64_t m : kMs) {
        for (const bool bf16 : {false, true}) {
          INFO("isa " << tp::cpu::to_string(isa) << " M=" << m << " N=" << s.n << " K=" << s.k
                      << (bf16 ? " bf16" : " f32") << " seed " << seed);
          // Padded rows: ld_x = K + 3, ld_w = K + 5, ld_y = N + 2; outputs outside
          // [n0, n1) keep a NaN sentinel.
          const auto x_pad = tp::test::randn({m, s.k + 3}, seed++).to(at::kFloat);
          auto w_pad = tp::test::randn({s.n, s.k + 5}, seed++).to(bf16 ? at::kBFloat16 : at::kFloat);
          const auto x = x_pad.narrow(1, 0, s.k), w = w_pad.narrow(1, 0, s.k);
          auto y = at::full({m, s.n + 2}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
          const int64_t n0 = s.n > 2 ? 1 : 0, n1 = s.n > 2 ? s.n - 1 : s.n;
          if (bf16) {
            bf16_kernel(isa)(x_pad.data_ptr<float>(), m, s.k, s.k + 3,
                             reinterpret_cast<const uint16_t*>(w_pad.data_ptr<at::BFloat16>()), s.k + 5,
                             y.data_ptr<float>(), s.n + 2, n0, n1);
          } else {
            f32_kernel(isa)(x_pad.data_ptr<float>(), m, s.k, s.k + 3, w_pad.data_ptr<float>(), s.k + 5,
                            y.data_ptr<float>(), s.n + 2, n0, n1);
          }
          require_within_bound(y.narrow(1, n0, n1 - n0), x, w.narrow(0, n0, n1 - n0).to(at::kFloat));
          const auto outside = at::cat({y.narrow(1, 0, n0), y.narrow(1, n1, s.n + 2 - n1)}, 1);
          REQUIRE(outside.isnan().all().item<bool>());
        }
      }
    }
  }
}

TEST_CASE("cpu_gemm: each per-ISA panels kernel matches float64 at every chunking, pairing and K blocking",
          "[quant][cpu_kernels]") {
  // float32 and bfloat16 panels (the latter widened exactly: the same float32 bound).
  // M: one row, a 3-row chunk, AVX2's 4 + 4 (8), one full AVX-512 chunk (16) and AVX2's
  // 6 + 5 + 5 (AVX2's chunks of 4-6 rows run in its assembly tile), 17 = 9 + 8, and from
  // 24 rows AVX-512's chunks on panel pairs: 24 = 12 + 12, 33 = 3 x 11, 40 = 4 x 10 and
  // 70 = 12 + 12 + 12 + 12 + 11 + 11, which all but the first chunk of a task run in the
  // AVX-512 assembly tile (40 x 4096 floats of x is past Intel's 512 KiB K block, so K
  // comes in blocks whose sums add into y while the next task's panels are prefetched). N off the 16 columns of a panel and odd panel counts (a pair and a single
  // one); K off the 4 interleaved streams and odd (the tile's single last step).
  uint64_t seed = 300;
  for (const Isa isa : isas_here()) {
    if (isa == Isa::kScalar) continue;
    for (const auto& s : std::vector<Shape>{{1, 1}, {5, 7}, {17, 16}, {33, 17}, {67, 129}, {19, 4096}, {48, 3000}}) {
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        const auto w_pad = tp::test::randn({s.n, s.k + 5}, seed++).to(dtype);
        const auto w = w_pad.narrow(1, 0, s.k);  // strided rows, as a sliced parameter
        const auto panels = tp::cpu::panels_pack(w, isa);
        REQUIRE(panels.sizes() == c10::IntArrayRef({(s.n + 15) / 16, s.k, 16}));
        REQUIRE(panels.scalar_type() == dtype);
        for (const int64_t m : {1, 3, 8, 16, 17, 24, 33, 40, 70}) {
          INFO("isa " << tp::cpu::to_string(isa) << " " << c10::toString(dtype) << " M=" << m << " N=" << s.n
                      << " K=" << s.k);
          const auto x = tp::test::randn({m, s.k}, seed++).to(dtype);
          // The K block of Intel and of AMD, and 16 KiB: blocks of 256 k from M = 16.
          for (const int64_t x_block : {tp::cpu::kPanelXBlockBytes, tp::cpu::kPanelXBlockBytesAmd, int64_t{16} << 10}) {
            INFO("x block " << x_block << " bytes");
            const auto y = tp::cpu::panels_linear(x, panels, s.n, isa, x_block);
            REQUIRE(y.scalar_type() == at::kFloat);
            require_within_bound(y, x.to(at::kFloat), w.to(at::kFloat));
          }
        }
      }
    }
  }
}

TEST_CASE("cpu_gemm: each per-ISA bf16 widening is exact on strided blocks", "[quant][cpu_kernels]") {
  using Widen = void (*)(const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t);
  for (const Isa isa : isas_here()) {
    const Widen widen = isa == Isa::kAvx512 ? tp::cpu::bf16_to_f32_avx512
                        : isa == Isa::kAvx2 ? tp::cpu::bf16_to_f32_avx2
                                            : tp::cpu::bf16_to_f32_scalar;
    for (const int64_t cols : {1, 7, 8, 15, 16, 17, 33, 100}) {
      INFO("isa " << tp::cpu::to_string(isa) << " cols " << cols);
      const auto src = tp::test::randn({5, cols + 3}, 40 + cols).to(at::kBFloat16);
      auto dst = at::full({5, cols + 2}, -7.0f, at::kFloat);
      widen(reinterpret_cast<const uint16_t*>(src.data_ptr<at::BFloat16>()), 5, cols, cols + 3, dst.data_ptr<float>(),
            cols + 2);
      REQUIRE(at::equal(dst.narrow(1, 0, cols), src.narrow(1, 0, cols).to(at::kFloat)));
      REQUIRE((dst.narrow(1, cols, 2) == -7.0f).all().item<bool>());
    }
  }
}

TEST_CASE("cpu_gemm: every backend forced matches float64 within float32 accumulation bounds (float32)",
          "[quant][cpu_kernels]") {
  c10::InferenceMode inference;
  uint64_t seed = 1000;
  for (const auto& s : kEdgeShapes) {
    const auto w = tp::test::randn({s.n, s.k}, seed++).to(at::kFloat);
    const auto bias = tp::test::randn({s.n}, seed++).to(at::kFloat);
    DenseGemm gemm;
    gemm.prepare(w);
    for (const int64_t m : kMs) {
      const auto x = tp::test::randn({m, s.k}, seed++).to(at::kFloat);
      for (const auto backend : kBackends) {
        const auto p = tp::cpu::dense_problem(m, s.n, s.k, at::kFloat);
        if (!tp::cpu::dense_supports(backend, p)) continue;
        INFO(tp::cpu::to_string(backend) << " M=" << m << " N=" << s.n << " K=" << s.k);
        require_within_bound(gemm.linear(x, std::nullopt, backend), x, w);
        require_within_bound(gemm.linear(x, bias, backend), x, w, bias);
        REQUIRE(gemm.counts().at(backend) >= 2);
      }
    }
  }
}

TEST_CASE("cpu_gemm: every backend forced matches float64 within bounds (bfloat16)", "[quant][cpu_kernels]") {
  c10::InferenceMode inference;
  uint64_t seed = 2000;
  for (const auto& s : kEdgeShapes) {
    const auto w = tp::test::randn({s.n, s.k}, seed++).to(at::kBFloat16);
    const auto bias = tp::test::randn({s.n}, seed++).to(at::kBFloat16);
    DenseGemm gemm;
    gemm.prepare(w);
    for (const int64_t m : kMs) {
      const auto x = tp::test::randn({m, s.k}, seed++).to(at::kBFloat16);
      for (const auto backend : kBackends) {
        INFO(tp::cpu::to_string(backend) << " M=" << m << " N=" << s.n << " K=" << s.k);
        const auto y = gemm.linear(x, bias, backend);
        REQUIRE(y.scalar_type() == at::kBFloat16);
        // ATen's and oneDNN's bf16 GEMMs may round the output of each K block to
        // bf16 (at::linear on CPUs without bf16 arithmetic); the own paths round once.
        if (backend == DenseBackend::kGemv || backend == DenseBackend::kBf16Tiles ||
            (backend == DenseBackend::kPanels && tp::cpu::isa() != Isa::kScalar)) {
          require_within_bound(y, x, w, bias);
        } else {
          const auto ref = at::addmm(bias.to(at::kDouble), x.to(at::kDouble), w.to(at::kDouble).t());
          REQUIRE(tp::test::relative_error(y, ref) <= tp::test::tolerance(at::kBFloat16));
        }
      }
    }
  }
}

TEST_CASE("cpu_gemm: backends threaded over N agree with float64, in InferenceMode too", "[quant][cpu_kernels]") {
  // Shapes that split into several tasks of ATen's pool, whose threads do not share the
  // caller's InferenceMode.
  const int threads = at::get_num_threads();
  at::set_num_threads(std::max(2, threads));
  for (const bool inference : {false, true}) {
    std::optional<c10::InferenceMode> guard;
    if (inference) guard.emplace();
    at::NoGradGuard no_grad;
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const auto w = tp::test::randn({1100, 1000}, 71).to(dtype);
      DenseGemm gemm;
      gemm.prepare(w);
      for (const int64_t m : {1, 5, 40}) {
        const auto x = tp::test::randn({m, 1000}, 72 + m).to(dtype);
        for (const auto backend : {DenseBackend::kGemv, DenseBackend::kBf16Tiles, DenseBackend::kMklPacked,
                                   DenseBackend::kOneDnn, DenseBackend::kPanels}) {
          INFO(tp::cpu::to_string(backend)
               << " " << c10::toString(dtype) << " M=" << m << (inference ? " inference" : ""));
          const auto y = gemm.linear(x, std::nullopt, backend);
          if (dtype == at::kFloat || backend == DenseBackend::kGemv || backend == DenseBackend::kBf16Tiles ||
              (backend == DenseBackend::kPanels && tp::cpu::isa() != Isa::kScalar)) {
            require_within_bound(y, x, w);
          } else {
            REQUIRE(tp::test::relative_error(y, at::matmul(x.to(at::kDouble), w.to(at::kDouble).t())) <=
                    tp::test::tolerance(at::kBFloat16));
          }
        }
      }
    }
  }
  at::set_num_threads(threads);
}

TEST_CASE("cpu_gemm: batched inputs keep their leading dimensions", "[quant][cpu_kernels]") {
  c10::InferenceMode inference;
  const auto w = tp::test::randn({37, 40}, 7).to(at::kFloat);
  const auto x = tp::test::randn({2, 3, 40}, 8).to(at::kFloat);
  DenseGemm gemm;
  gemm.prepare(w);
  for (const auto backend :
       {DenseBackend::kAtLinear, DenseBackend::kOneDnn, DenseBackend::kGemv, DenseBackend::kPanels}) {
    INFO(tp::cpu::to_string(backend));
    const auto y = gemm.linear(x, std::nullopt, backend);
    REQUIRE(y.sizes() == c10::IntArrayRef({2, 3, 37}));
    require_within_bound(y.reshape({6, 37}), x.reshape({6, 40}), w);
  }
  // No rows: at::linear, an empty result of the right shape.
  const auto empty = at::empty({0, 40}, at::kFloat);
  REQUIRE(gemm.backend_for(empty) == DenseBackend::kAtLinear);
  REQUIRE(gemm.linear(empty, std::nullopt).sizes() == c10::IntArrayRef({0, 37}));
}

TEST_CASE("cpu_gemm: a packed weight is re-packed when the weight changes", "[quant][cpu_kernels]") {
  at::NoGradGuard no_grad;
  for (const auto backend : {DenseBackend::kOneDnn, DenseBackend::kMklPacked, DenseBackend::kPanels}) {
    if (!tp::cpu::dense_supports(backend, tp::cpu::dense_problem(5, 24, 48, at::kFloat))) continue;
    INFO(tp::cpu::to_string(backend));
    auto w = tp::test::randn({24, 48}, 11).to(at::kFloat);
    const auto x = tp::test::randn({5, 48}, 12).to(at::kFloat);
    DenseGemm gemm;
    gemm.prepare(w);
    require_within_bound(gemm.linear(x, std::nullopt, backend), x, w);
    const int64_t packs = gemm.packs();
    REQUIRE(packs >= 1);
    (void)gemm.linear(x, std::nullopt, backend);  // same weight: no new pack
    REQUIRE(gemm.packs() == packs);

    w.copy_(tp::test::randn({24, 48}, 13));  // as load_state_dict writes it
    REQUIRE(gemm.packs() == packs);          // nothing is re-packed before it is used
    require_within_bound(gemm.linear(x, std::nullopt, backend), x, w);
    REQUIRE(gemm.packs() == packs + 1);
    w.narrow(0, 3, 4).add_(1.0);  // an optimizer step through a view
    require_within_bound(gemm.linear(x, std::nullopt, backend), x, w);
    REQUIRE(gemm.packs() == packs + 2);
  }
}

TEST_CASE("cpu_gemm: prepare() packs at most the one copy the table uses", "[quant][cpu_kernels]") {
  c10::InferenceMode inference;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& s : std::vector<Shape>{{256, 512}, {2048, 2048}}) {
      const auto w = tp::test::randn({s.n, s.k}, 51).to(dtype);
      DenseGemm gemm;
      gemm.prepare(w);
      INFO(c10::toString(dtype) << " " << s.n << "x" << s.k << ": " << gemm.packed_bytes() << " packed bytes");
      REQUIRE(gemm.packs() <= 1);
      // One copy: oneDNN's blocked W and the 16-column panels (N rounded up to 16) are
      // W's size.
      const int64_t w_bytes = w.numel() * w.element_size();
      REQUIRE(gemm.packed_bytes() <= w_bytes + 16 * s.k * 4);
    }
  }
}

TEST_CASE("cpu_gemm: bind() packs nothing until a packed backend runs", "[quant][cpu_kernels]") {
  at::NoGradGuard no_grad;
  auto w = at::empty({40, 24}, at::kFloat);  // as create_weights registers it
  DenseGemm gemm;
  gemm.bind(w);
  REQUIRE(gemm.packs() == 0);
  REQUIRE(gemm.packed_bytes() == 0);
  w.copy_(tp::test::randn({40, 24}, 61));  // reset_parameters / load fill it later
  const auto x = tp::test::randn({6, 24}, 62).to(at::kFloat);
  require_within_bound(gemm.linear(x, std::nullopt, DenseBackend::kOneDnn), x, w);
  REQUIRE(gemm.packs() == 1);
}

TEST_CASE("cpu_gemm: an inference-tensor weight edited in place is re-packed by prepare()", "[quant][cpu_kernels]") {
  c10::InferenceMode inference;
  auto w = tp::test::randn({24, 48}, 21).to(at::kFloat);
  REQUIRE(w.is_inference());
  const auto x = tp::test::randn({5, 48}, 22).to(at::kFloat);
  DenseGemm gemm;
  gemm.prepare(w);
  require_within_bound(gemm.linear(x, std::nullopt, DenseBackend::kOneDnn), x, w);
  w.copy_(tp::test::randn({24, 48}, 23));
  gemm.prepare(w);  // what the layers' load_weights does after writing the weight
  require_within_bound(gemm.linear(x, std::nullopt, DenseBackend::kOneDnn), x, w);
  // A new tensor (another storage) is noticed without prepare().
  DenseGemm other;
  other.prepare(w);
  (void)other.linear(x, std::nullopt, DenseBackend::kOneDnn);
  REQUIRE(other.packs() >= 1);
}

TEST_CASE("cpu_gemm: a call that needs autograd runs at::linear and its gradients are at::linear's",
          "[quant][cpu_kernels]") {
  auto w = tp::test::randn({9, 20}, 31).to(at::kFloat).requires_grad_();
  const auto x = tp::test::randn({3, 20}, 32).to(at::kFloat).requires_grad_();
  DenseGemm gemm;
  gemm.prepare(w);
  for (const auto backend : kBackends) {
    INFO(tp::cpu::to_string(backend));
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    const auto before = gemm.counts();
    auto y = gemm.linear(x, std::nullopt, backend);
    const auto after = gemm.counts();
    REQUIRE(after.at(DenseBackend::kAtLinear) ==
            (before.count(DenseBackend::kAtLinear) ? before.at(DenseBackend::kAtLinear) + 1 : 1));
    REQUIRE(y.requires_grad());
    y.sum().backward();
    REQUIRE(at::allclose(w.grad(), x.sum(0, true).expand({9, 20}).detach()));
    REQUIRE(at::allclose(x.grad(), w.sum(0, true).expand({3, 20}).detach()));
  }
  // Without grad mode the same weight takes the table's backend.
  at::NoGradGuard no_grad;
  REQUIRE(gemm.backend_for(x.detach()) == tp::cpu::select_dense_backend(tp::cpu::dense_problem(3, 9, 20, at::kFloat)));
}

TEST_CASE("cpu_gemm: the table", "[quant][cpu_kernels]") {
  // A pure function of the problem: machines described, not detected.
  DenseProblem p;
  p.n = 4096, p.k = 4096, p.threads = 2, p.onednn = true, p.mkl_packed = true;
  // native_bf16 on Intel stands for AMX unless `amx` says otherwise.
  auto pick = [&](int64_t m, at::ScalarType dtype, Isa isa, bool native_bf16, bool amd = false,
                  std::optional<bool> amx = std::nullopt) {
    p.m = m, p.dtype = dtype, p.isa = isa, p.native_bf16 = native_bf16, p.amd = amd;
    p.amx_bf16 = amx.value_or(native_bf16 && !amd);
    p.onednn = dtype == at::kFloat || native_bf16;
    return tp::cpu::select_dense_backend(p);
  };
  // Decode: own GEMV wherever a vector ISA is allowed, in both dtypes; with the packed
  // copy, float32 on Intel and bf16 without bf16 arithmetic on AMD (AVX2: a Zen 3) take
  // the panels from M = 2, and bf16 without it on Intel (AVX2, or AVX512_BF16 without
  // AMX) from M = 1; elsewhere gemv runs to M = 4.
  for (const auto isa : {Isa::kAvx2, Isa::kAvx512}) {
    REQUIRE(pick(1, at::kFloat, isa, isa == Isa::kAvx512, true) == DenseBackend::kGemv);
    REQUIRE(pick(4, at::kFloat, isa, isa == Isa::kAvx512, true) == DenseBackend::kGemv);
    REQUIRE(pick(1, at::kFloat, isa, isa == Isa::kAvx512) == DenseBackend::kGemv);
    for (const int64_t m : {2, 4}) REQUIRE(pick(m, at::kFloat, isa, isa == Isa::kAvx512) == DenseBackend::kPanels);
  }
  for (const int64_t m : {1, 2, 4}) {
    INFO("bf16 M=" << m);
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx512, true) == DenseBackend::kGemv);        // AMX
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx512, true, true) == DenseBackend::kGemv);  // AMD's AVX512_BF16
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx512, true, false, false) == DenseBackend::kPanels);
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx2, false) == DenseBackend::kPanels);
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx2, false, true) ==
            (m == 1 ? DenseBackend::kGemv : DenseBackend::kPanels));  // AMD without bf16 arithmetic
  }
  // The portable kernels are never chosen: at::linear serves the scalar ISA.
  REQUIRE(pick(1, at::kFloat, Isa::kScalar, false) == DenseBackend::kAtLinear);
  // float32 on Intel: the panels kernel for 4 < M <= 64, then at::linear (one packed
  // copy per layer: not oneDNN's too); on AMD, where MKL's SGEMM trails, the panels
  // kernel for every M past gemv's.
  for (const auto isa : {Isa::kAvx2, Isa::kAvx512}) {
    for (const int64_t m : {5, 16, 17, 64})
      REQUIRE(pick(m, at::kFloat, isa, isa == Isa::kAvx512) == DenseBackend::kPanels);
    for (const int64_t m : {65, 256}) REQUIRE(pick(m, at::kFloat, isa, isa == Isa::kAvx512) == DenseBackend::kAtLinear);
    for (const int64_t m : {5, 16, 64, 65, 256, 4096})
      REQUIRE(pick(m, at::kFloat, isa, isa == Isa::kAvx512, true) == DenseBackend::kPanels);
    REQUIRE(pick(4, at::kFloat, isa, isa == Isa::kAvx512, true) == DenseBackend::kGemv);
  }
  // Small weights too: the panels are W's size, with no fixed overhead.
  p.n = 40, p.k = 24;
  REQUIRE(pick(32, at::kFloat, Isa::kAvx2, false) == DenseBackend::kPanels);
  p.n = 4096, p.k = 4096;
  // No packed copies allowed (TP_CPU_GEMM_PACK=0): the unpacked backends only.
  p.allow_packs = false;
  REQUIRE(pick(4, at::kFloat, Isa::kAvx512, true) == DenseBackend::kGemv);
  REQUIRE(pick(16, at::kFloat, Isa::kAvx512, true) == DenseBackend::kGemv);
  REQUIRE(pick(32, at::kFloat, Isa::kAvx512, true) == DenseBackend::kAtLinear);
  REQUIRE(pick(32, at::kFloat, Isa::kAvx2, false) == DenseBackend::kAtLinear);
  // AMD: gemv at every M (MKL's SGEMM is slower there even at M = 256).
  for (const int64_t m : {5, 32, 256}) REQUIRE(pick(m, at::kFloat, Isa::kAvx2, false, true) == DenseBackend::kGemv);
  REQUIRE(pick(64, at::kBFloat16, Isa::kAvx512, true) == DenseBackend::kAtLinear);
  REQUIRE(pick(64, at::kBFloat16, Isa::kAvx512, true, true) == DenseBackend::kAtLinear);
  for (const int64_t m : {2, 16}) REQUIRE(pick(m, at::kBFloat16, Isa::kAvx2, false, true) == DenseBackend::kGemv);
  p.allow_packs = true;
  // bf16 with bf16 arithmetic (AMX, or AMD's AVX512_BF16): oneDNN's packed weight from
  // M = 5.
  for (const int64_t m : {5, 8, 16, 32, 256})
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx512, true) == DenseBackend::kOneDnn);
  REQUIRE(pick(4, at::kBFloat16, Isa::kAvx512, true, true) == DenseBackend::kGemv);
  for (const int64_t m : {5, 16, 256})
    REQUIRE(pick(m, at::kBFloat16, Isa::kAvx512, true, true) == DenseBackend::kOneDnn);
  // bf16 without it never reaches ATen's / oneDNN's bf16 GEMMs: the panels kernel to
  // M = 64 (gemv to 16 where no packed copy may be kept), then bf16_tiles; on AMD the
  // panels at every M. Intel's AVX512_BF16 without AMX counts as without.
  for (const bool packs : {true, false}) {
    p.allow_packs = packs;
    for (const bool avx512_bf16 : {false, true}) {
      const auto b = avx512_bf16 ? pick(2, at::kBFloat16, Isa::kAvx512, true, false, false)
                                 : pick(2, at::kBFloat16, Isa::kAvx2, false);
      REQUIRE(b == (packs ? DenseBackend::kPanels : DenseBackend::kGemv));
    }
    for (const int64_t m : {8, 16, 32, 64, 96, 256, 2048}) {
      for (const bool avx512_bf16 : {false, true}) {
        const auto b = avx512_bf16 ? pick(m, at::kBFloat16, Isa::kAvx512, true, false, false)
                                   : pick(m, at::kBFloat16, Isa::kAvx2, false);
        INFO("M=" << m << " packs " << packs << " AVX512_BF16 without AMX " << avx512_bf16 << " -> "
                  << tp::cpu::to_string(b));
        const auto small = packs ? DenseBackend::kPanels : DenseBackend::kGemv;
        REQUIRE(b == (m <= (packs ? 64 : 16) ? small : DenseBackend::kBf16Tiles));
      }
      // AMD (AVX2: a Zen 3): the panels at every M, as for float32 there.
      INFO("AMD M=" << m << " packs " << packs);
      const auto amd = pick(m, at::kBFloat16, Isa::kAvx2, false, true);
      if (packs) REQUIRE(amd == DenseBackend::kPanels);
      if (!packs) REQUIRE(amd == (m <= 16 ? DenseBackend::kGemv : DenseBackend::kBf16Tiles));
    }
  }
  p.allow_packs = true;
  // Other dtypes: at::linear.
  REQUIRE(pick(1, at::kDouble, Isa::kAvx2, false) == DenseBackend::kAtLinear);
  REQUIRE(pick(64, at::kHalf, Isa::kAvx512, true) == DenseBackend::kAtLinear);
}

TEST_CASE("cpu_gemm: MKL's packed SGEMM is available wherever LibTorch exports it", "[quant][cpu_kernels]") {
  // Its self-check failing would silently drop the backend (and skip it in every test above).
  INFO("exported: " << tp::cpu::mkl_packed_exported());
  REQUIRE(tp::cpu::mkl_packed_available() == tp::cpu::mkl_packed_exported());
}

TEST_CASE("cpu_gemm: backend names parse and an unknown one is an error naming the valid ones",
          "[quant][cpu_kernels]") {
  for (const auto b : kBackends) REQUIRE(tp::cpu::parse_dense_backend(tp::cpu::to_string(b)) == b);
  REQUIRE(tp::cpu::parse_dense_backend("OneDNN") == DenseBackend::kOneDnn);
  REQUIRE_THROWS_WITH(tp::cpu::parse_dense_backend("mkl"),
                      Catch::Contains("unknown CPU GEMM backend 'mkl'") &&
                          Catch::Contains("at_linear, onednn, mkl_packed, panels, gemv or bf16_tiles"));
}
