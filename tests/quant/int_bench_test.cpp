// Hidden (run it by name): apply() time of the INT8 / INT4 layers on a 4096 x 11008
// layer (K = 4096, N = 11008) against at::linear in float32 and bfloat16, at M = 1, 16
// and 256, torch threads = 2, median of timed repetitions after warm-up. Prints a
// table; asserts nothing about speed (the numbers go into the report and tp-bench).
//   build/tests/tp_tests "[int_bench]"

#include "tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "test_util.h"
#include "tp/layers/column_parallel_linear.h"

using namespace tp;

namespace {

double median_ms(const std::function<at::Tensor()>& f, double budget_ms) {
  for (int i = 0; i < 3; ++i) f();  // warm-up
  std::vector<double> t;
  double total = 0;
  while ((t.size() < 5 || total < budget_ms) && t.size() < 200) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    t.push_back(ms);
    total += ms;
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

TEST_CASE("int formats: apply() time against at::linear on 4096 x 11008", "[.][int_bench]") {
  at::set_num_threads(2);
  const int64_t k = 4096, n = 11008;
  const double budget = 1500;
  const auto w = test::randn({n, k}, 1) / 64;
  const auto w_bf16 = w.to(at::kBFloat16);
  struct Row {
    std::string name;
    at::ScalarType dtype;
    QuantConfig config;
  };
  const std::vector<Row> rows = {
      {"int8_weight_only fp32", at::kFloat, {QuantFormat::kInt8WeightOnly}},
      {"int8_weight_only bf16", at::kBFloat16, {QuantFormat::kInt8WeightOnly}},
      {"int4_gptq g128 fp32", at::kFloat, {QuantFormat::kInt4Gptq, 128, true}},
      {"int4_gptq g128 bf16", at::kBFloat16, {QuantFormat::kInt4Gptq, 128, true}},
      {"int8_w8a8 fp32", at::kFloat, {QuantFormat::kInt8W8A8}},
      {"int8_w8a8 bf16", at::kBFloat16, {QuantFormat::kInt8W8A8}},
  };
  std::printf("%-24s %6s %10s %10s %10s %10s\n", "format", "M", "ms", "fp32 ms", "x fp32", "x bf16");
  for (int64_t m : {1, 16, 256}) {
    const auto x = test::randn({m, k}, 2);
    const auto x_bf16 = x.to(at::kBFloat16);
    const double fp32 = median_ms([&] { return at::linear(x, w); }, budget);
    const double bf16 = median_ms([&] { return at::linear(x_bf16, w_bf16); }, budget);
    std::printf("%-24s %6lld %10.3f %10.3f %10.2f %10.2f\n", "at::linear fp32", static_cast<long long>(m), fp32, fp32,
                1.0, bf16 / fp32);
    std::printf("%-24s %6lld %10.3f %10.3f %10.2f %10.2f\n", "at::linear bf16", static_cast<long long>(m), bf16, fp32,
                fp32 / bf16, 1.0);
    for (const auto& row : rows) {
      ColumnParallelLinear fc(ColumnParallelLinearOptions(k, n).bias(false).dtype(row.dtype).quant(row.config));
      const auto xr = x.to(row.dtype);
      const double ms = median_ms([&] { return fc->forward(xr); }, budget);
      std::printf("%-24s %6lld %10.3f %10.3f %10.2f %10.2f\n", row.name.c_str(), static_cast<long long>(m), ms, fp32,
                  fp32 / ms, bf16 / ms);
    }
    std::fflush(stdout);
  }
}
