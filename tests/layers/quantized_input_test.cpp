// A column layer handed its input already quantized per token (forward_quantized, from
// the fused boundary's quant_out / scale_out) gives forward's output bit for bit, at TP
// 1-4, for the formats whose GEMM quantizes its input per token; and every layer or mode
// that cannot take codes says so (input_quant none, forward_quantized refused by name).

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"

using namespace tp;
using Catch::Contains;
using tp::test::randn;

namespace {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

// The fused boundary's normed and quantized output for `x` (mirrored): rank 0's partial
// sum is x, the others' are zero, so the reduced row is x on every rank.
AllReduceFusionResult quantized(Communicator& comm, const at::Tensor& x, TokenQuant quant) {
  AllReduceFusionParams p;
  p.norm = AllReduceFusionNorm::kRMS;
  p.norm_weight = randn({x.size(-1)}, 77).mul(0.3).add(1.0).to(x.scalar_type());
  p.quant_out = quant == TokenQuant::kInt8 ? AllReduceFusionQuant::kInt8PerToken : AllReduceFusionQuant::kFp8PerToken;
  return comm.all_reduce_fusion(comm.rank() == 0 ? x : at::zeros_like(x), p);
}

}  // namespace

TEST_CASE("forward_quantized of the fused boundary's codes is forward of its norm, bit for bit, at TP 1-4",
          "[layers][fusion]") {
  const int64_t hidden = 200;  // not a multiple of 16 (the kernels' tails)
  for (const auto& [format, quant] : {std::pair{QuantFormat::kInt8W8A8, TokenQuant::kInt8},
                                      std::pair{QuantFormat::kFp8PerChannel, TokenQuant::kFp8E4m3}}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t world = 1; world <= 4; ++world) {
        // Catch's assertions are not thread-safe: each rank records its outcomes, checked after.
        std::vector<std::vector<std::string>> failures(static_cast<size_t>(world));
        run_ranks_in_threads(world, [&](Communicator& comm) {
          at::NoGradGuard no_grad;
          auto& failed = failures[static_cast<size_t>(comm.rank())];
          ColumnParallelLinear column(
              ColumnParallelLinearOptions(hidden, 90).quant(QuantConfig{format}).dtype(dtype).bias(true), comm);
          GateUpParallelLinear gate_up(GateUpParallelLinearOptions(hidden, 130).quant(QuantConfig{format}).dtype(dtype),
                                       comm);
          // 12 heads of 8 and one KV head (its rows replicated on every rank).
          QKVParallelLinear qkv(
              QKVParallelLinearOptions(hidden, 8, 12, 1).quant(QuantConfig{format}).dtype(dtype).bias(true), comm);
          uint64_t seed = 900;
          const auto random_bias = [&](torch::nn::Module& m) {
            for (auto& t : m.named_parameters()) {
              if (t.key() == "bias") t.value().copy_(randn(t.value().sizes(), seed++).to(dtype));
            }
          };
          random_bias(*column);
          random_bias(*gate_up);
          random_bias(*qkv);
          // M = 1 (decode), 4 (below the bf16 dot kernels' rows), 16 and 70 (past them);
          // rows of every magnitude, one of zeros (scale 1), one with an inf and one with a NaN.
          for (int64_t m : {1, 4, 16, 70}) {
            at::Tensor x = randn({m, hidden}, 31 + static_cast<uint64_t>(m));
            x = x * at::pow(10.0, at::arange(m, at::kDouble).remainder(7).sub(3)).unsqueeze(1);
            if (m > 2) x[2].zero_();
            if (m > 3) x[3][5] = std::numeric_limits<double>::infinity();  // NaN after the norm
            if (m > 4) x[4][7] = std::numeric_limits<double>::quiet_NaN();
            x = x.to(dtype).reshape({1, m, hidden});
            const auto r = quantized(comm, x, quant);
            const std::string where = "rank " + std::to_string(comm.rank()) + " M " + std::to_string(m) + ": ";
            if (column->input_quant(r.norm_out) != quant || gate_up->input_quant(r.norm_out) != quant ||
                qkv->input_quant(r.norm_out) != quant)
              failed.push_back(where + "input_quant is not the format's");
            if (!same_bits(column->forward_quantized(r.quant_out, r.scale_out), column->forward(r.norm_out)))
              failed.push_back(where + "ColumnParallelLinear differs");
            if (!same_bits(gate_up->forward_quantized(r.quant_out, r.scale_out), gate_up->forward(r.norm_out)))
              failed.push_back(where + "GateUpParallelLinear differs");
            if (!same_bits(qkv->forward_quantized(r.quant_out, r.scale_out), qkv->forward(r.norm_out)))
              failed.push_back(where + "QKVParallelLinear differs");
          }
        });
        INFO(to_string(QuantConfig{format}) << " " << dtype << " TP " << world);
        for (const auto& rank : failures) {
          for (const auto& f : rank) FAIL_CHECK(f);
        }
      }
    }
  }
}

TEST_CASE("a layer that cannot take pre-quantized input says so, by name", "[layers][fusion]") {
  Communicator comm;
  const at::Tensor x = randn({3, 64}, 5).to(at::kBFloat16);
  const at::Tensor codes = at::zeros({3, 64}, at::kChar), scales = at::ones({3, 1});
  // No per-token quantization in the format (unquantized, weight-only, static or grouped FP8).
  for (const char* format : {"none", "int8_weight_only", "fp8_tensor", "fp8_block", "int4_gptq:g64"}) {
    INFO(format);
    ColumnParallelLinear layer(
        ColumnParallelLinearOptions(64, 128).quant(parse_quant_config(format)).dtype(at::kBFloat16), comm);
    CHECK(layer->input_quant(x) == TokenQuant::kNone);
    at::NoGradGuard no_grad;
    CHECK_THROWS_WITH(layer->forward_quantized(codes, scales), Contains("pre-quantized"));
  }
  // Invariant numerics (unquantized layers only) and sequence parallelism keep their own paths.
  const QuantConfig w8a8{QuantFormat::kInt8W8A8};
  ColumnParallelLinear invariant(
      ColumnParallelLinearOptions(64, 128).dtype(at::kBFloat16).numerics(Numerics::kInvariant), comm);
  CHECK(invariant->input_quant(x) == TokenQuant::kNone);
  ColumnParallelLinear sp(ColumnParallelLinearOptions(64, 128).quant(w8a8).dtype(at::kBFloat16).sequence_parallel(true),
                          comm);
  CHECK(sp->input_quant(x) == TokenQuant::kNone);
  {
    at::NoGradGuard no_grad;
    CHECK_THROWS_WITH(invariant->forward_quantized(codes, scales), Contains("invariant/column"));
    CHECK_THROWS_WITH(sp->forward_quantized(codes, scales), Contains("sequence parallelism"));
  }
  // Wrong codes: dtype, width, scale count.
  ColumnParallelLinear layer(ColumnParallelLinearOptions(64, 128).quant(w8a8).dtype(at::kBFloat16).bias(true), comm);
  at::NoGradGuard no_grad;
  CHECK(layer->input_quant(x) == TokenQuant::kInt8);
  CHECK_THROWS_WITH(layer->forward_quantized(codes.to(at::kFloat8_e4m3fn), scales), Contains("Char"));
  CHECK_THROWS_WITH(layer->forward_quantized(at::zeros({3, 32}, at::kChar), scales), Contains("in_features = 64"));
  CHECK_THROWS_WITH(layer->forward_quantized(codes, at::ones({2, 1})), Contains("one float32 scale per token"));
}

TEST_CASE("forward_quantized has no backward: refused while autograd would record", "[layers][fusion]") {
  Communicator comm;
  ColumnParallelLinear layer(
      ColumnParallelLinearOptions(64, 128).quant(QuantConfig{QuantFormat::kInt8W8A8}).dtype(at::kFloat).bias(true),
      comm);
  const at::Tensor codes = at::zeros({3, 64}, at::kChar), scales = at::ones({3, 1});
  CHECK_THROWS_WITH(layer->forward_quantized(codes, scales), Contains("no backward"));
}
