// The shared-memory strategies' AVX-512 kernels (comm/all_reduce/shm_kernels.h) against the
// portable loops they replace, bit for bit: the ranks' sum, float32 and bf16 in and out,
// and the fused boundary's row epilogue on every norm, quantization, dtype and wire,
// hidden sizes around the vector width, 1-4 ranks' parts, and rows holding zeros,
// subnormals, infinities and NaN. (Where the CPU has no AVX-512 both sides take the
// portable loops, and the test says so.)

#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "comm/all_reduce/fusion_rows.h"
#include "comm/all_reduce/shm_kernels.h"
#include "cpu/features.h"
#include "support/test_util.h"

using tp::AllReduceFusionNorm;
using tp::AllReduceFusionQuant;
using tp::detail::FusionRows;

namespace {

// [rows, hidden] of dtype: normal values of every magnitude, and per row one kind of
// special value sprinkled in (none, zeros, fp32 subnormals, +-inf, NaN, -0).
at::Tensor values(int64_t rows, int64_t hidden, at::ScalarType dtype, uint64_t seed, bool specials) {
  at::Tensor x = tp::test::randn({rows, hidden}, seed);
  x = x * at::pow(10.0, at::arange(rows, at::kDouble).remainder(7).sub(3)).unsqueeze(1);
  x = x.to(at::kFloat);
  if (specials) {
    const float kinds[] = {0.0f, 1e-40f, -3e-39f, INFINITY, -INFINITY, NAN, -0.0f};
    for (int64_t r = 1; r < rows; ++r) {
      const float v = kinds[(r - 1) % 7];
      for (int64_t i = r % 5; i < hidden; i += 3 + r % 4) x[r][i] = v;
    }
  }
  return x.to(dtype).contiguous();
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

struct Outputs {
  at::Tensor residual_out, norm_out, quant_out, scale_out;
};

Outputs run(FusionRows rows, const std::vector<at::Tensor>& parts, bool portable) {
  const auto o = at::TensorOptions().dtype(rows.dtype);
  Outputs out;
  // Filled with a pattern, so an element no path writes would differ too.
  out.residual_out = at::full({rows.rows, rows.hidden}, 7, o);
  out.norm_out = at::full({rows.rows, rows.hidden}, 7, o);
  out.quant_out = at::full({rows.rows, rows.hidden}, 7, at::kByte);
  out.scale_out = at::full({rows.rows}, 7, at::kFloat);
  rows.residual_out = out.residual_out.data_ptr();
  if (rows.norm != AllReduceFusionNorm::kNone) rows.norm_out = out.norm_out.data_ptr();
  if (rows.quant != AllReduceFusionQuant::kNone) {
    rows.quant_out = out.quant_out.data_ptr();
    rows.scale_out = out.scale_out.data_ptr<float>();
  }
  std::vector<const void*> row_parts(parts.size());
  for (int64_t r = 0; r < rows.rows; ++r) {
    for (size_t q = 0; q < parts.size(); ++q) {
      row_parts[q] = static_cast<const char*>(parts[q].data_ptr()) + r * rows.hidden * parts[q].element_size();
    }
    const auto count = static_cast<int64_t>(parts.size());
    if (portable) {
      rows.finish_portable(r, row_parts.data(), count, parts[0].scalar_type());
    } else {
      rows.finish(r, row_parts.data(), count, parts[0].scalar_type());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the fused boundary's AVX-512 row epilogue equals its portable loops bit for bit", "[comm][fusion]") {
  if (tp::cpu::isa() < tp::cpu::Isa::kAvx512) {
    WARN("this CPU (or TP_CPU_ISA) has no AVX-512: both sides take the portable loops");
  }
  const std::vector<AllReduceFusionNorm> norms = {AllReduceFusionNorm::kNone, AllReduceFusionNorm::kRMS,
                                                  AllReduceFusionNorm::kRMSUnitOffset,
                                                  AllReduceFusionNorm::kRMSScaleFirst, AllReduceFusionNorm::kLayerNorm};
  uint64_t seed = 11;
  int64_t compared = 0;
  // (dtype, the parts' dtype): float32 and bf16 rows, and float32 rows on a bf16 wire.
  for (auto [dtype, part_dtype] : {std::pair{at::kFloat, at::kFloat}, std::pair{at::kBFloat16, at::kBFloat16},
                                   std::pair{at::kFloat, at::kBFloat16}}) {
    for (int64_t hidden : {1, 15, 16, 17, 200, 4099}) {
      for (int64_t world : {1, 2, 3, 4}) {
        for (auto norm : norms) {
          for (auto quant :
               {AllReduceFusionQuant::kNone, AllReduceFusionQuant::kFp8PerToken, AllReduceFusionQuant::kInt8PerToken}) {
            if (norm == AllReduceFusionNorm::kNone && quant != AllReduceFusionQuant::kNone) continue;
            // Special values everywhere: a NaN's int8 code is 0 and its row's scale 1 (as
            // quant's per-token quantizer), both ways.
            const bool specials = true;
            const int64_t m = 9;
            INFO("dtype " << dtype << " parts " << part_dtype << " hidden " << hidden << " world " << world << " norm "
                          << tp::to_string(norm) << " quant " << tp::to_string(quant) << " seed " << seed);
            std::vector<at::Tensor> parts;
            for (int64_t q = 0; q < world; ++q) parts.push_back(values(m, hidden, part_dtype, seed + q, specials));
            const at::Tensor residual = values(m, hidden, dtype, seed + 100, false);
            const at::Tensor weight = values(1, hidden, dtype, seed + 200, false).view({hidden});
            const at::Tensor bias = values(1, hidden, dtype, seed + 300, false).view({hidden});
            FusionRows rows;
            rows.rows = m;
            rows.hidden = hidden;
            rows.dtype = dtype;
            rows.norm = norm;
            rows.quant = quant;
            rows.eps = 1e-5f;
            if (seed % 3 != 0) rows.residual_in = residual.data_ptr();
            if (norm != AllReduceFusionNorm::kNone) rows.norm_weight = weight.data_ptr();
            if (norm == AllReduceFusionNorm::kLayerNorm && seed % 2 == 0) rows.norm_bias = bias.data_ptr();
            const Outputs fast = run(rows, parts, /*portable=*/false);
            const Outputs ref = run(rows, parts, /*portable=*/true);
            CHECK(same_bits(fast.residual_out, ref.residual_out));
            CHECK(same_bits(fast.norm_out, ref.norm_out));
            CHECK(same_bits(fast.quant_out, ref.quant_out));
            CHECK(same_bits(fast.scale_out, ref.scale_out));
            ++seed;
            ++compared;
          }
        }
      }
    }
  }
  CHECK(compared == 3 * 6 * 4 * 13);
}

TEST_CASE("the shared-memory sum's AVX-512 kernel equals c10's float32 sum and bf16 rounding bit for bit",
          "[comm][fusion]") {
  if (tp::cpu::isa() < tp::cpu::Isa::kAvx512) {
    WARN("this CPU (or TP_CPU_ISA) has no AVX-512: the kernel is not run here");
    return;
  }
  using tp::detail::RowType;
  const bool bf16_cvt = tp::cpu::features().avx512bf16;
  for (auto in_type : {at::kFloat, at::kBFloat16}) {
    for (auto out_type : {at::kFloat, at::kBFloat16}) {
      for (int64_t world : {1, 2, 3, 4}) {
        for (int64_t width : {1, 15, 16, 17, 1000}) {
          for (bool cvt : {false, true}) {
            if (cvt && !bf16_cvt) continue;
            // 8 rows of `width` (rows 1-7 with special values) flattened, summed from element 3.
            const int64_t lo = 3, n = 8 * width - lo;
            INFO("in " << in_type << " out " << out_type << " world " << world << " n " << n << " cvt " << cvt);
            std::vector<at::Tensor> parts;
            std::vector<const void*> ptrs;
            for (int64_t q = 0; q < world; ++q) {
              parts.push_back(values(8, width, in_type, 50 + q + width, /*specials=*/true).view({-1}));
              ptrs.push_back(parts.back().data_ptr());
            }
            // The portable loop: a float32 accumulator in rank order, then c10's conversion.
            at::Tensor want = at::empty({n}, out_type);
            for (int64_t i = 0; i < n; ++i) {
              float acc = parts[0][lo + i].item<float>();
              for (int64_t q = 1; q < world; ++q) acc += parts[q][lo + i].item<float>();
              if (out_type == at::kFloat) {
                want.data_ptr<float>()[i] = acc;
              } else {
                want.data_ptr<c10::BFloat16>()[i] = static_cast<c10::BFloat16>(acc);
              }
            }
            at::Tensor got = at::full({n}, 7, out_type);
            const auto row = [](at::ScalarType t) { return t == at::kFloat ? RowType::kFloat : RowType::kBFloat16; };
            tp::detail::sum_parts_avx512(ptrs.data(), world, lo, n, row(in_type), got.data_ptr(), row(out_type), cvt);
            CHECK(same_bits(got, want));
          }
        }
      }
    }
  }
}
