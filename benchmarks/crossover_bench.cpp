// tp-cpu-gemm-bench --crossovers (crossover_bench.h). Each side is a layer's forward, so
// what is timed includes the activations' quantization and packing a real call pays.

#include "crossover_bench.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "bench_util.h"
#include "cpu/crossovers.h"
#include "cpu/features.h"
#include "cpu/kernel_counts.h"
#include "machine_limits.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quantize.h"

namespace tp::bench {
namespace {

struct Governed {
  cpu::Crossover crossover;
  std::vector<std::string> formats;  // the formats whose kernels it picks
  std::vector<int64_t> ms;           // the M measured around it
};

const std::vector<Governed>& governed() {
  static const std::vector<Governed> g = {
      {cpu::Crossover::kBf16Dot,
       {"int8_weight_only", "int4_gptq:g128", "fp8_channel", "fp8_block", "mxfp4"},
       {1, 2, 3, 4, 5, 6, 8, 12, 16}},
      {cpu::Crossover::kW8a8Panels, {"int8_w8a8"}, {2, 4, 6, 8, 10, 11, 12, 13, 14, 16, 24, 32}},
  };
  return g;
}

}  // namespace

std::vector<cpu::CrossoverEntry> measure_crossovers(int64_t n, int64_t k, double seconds) {
  std::vector<cpu::CrossoverEntry> out;
  const at::Tensor w = at::randn({n, k}, at::kFloat) / std::sqrt(static_cast<double>(k));
  Table table({"crossover", "M", "below ms", "from ms", "below kernels", "from kernels"});
  for (const auto& g : governed()) {
    const int64_t past = g.ms.back() + 1;
    std::vector<ColumnParallelLinear> layers;
    for (const auto& fmt : g.formats) {
      const QuantConfig config = parse_quant_config(fmt);
      Checkpoint ckpt;
      add_to_checkpoint(ckpt, "fc", quantize_weight(w, config));
      layers.emplace_back(ColumnParallelLinearOptions(k, n).bias(false).dtype(at::kBFloat16).quant(config));
      layers.back()->load_weights(ckpt, "fc");
    }
    std::map<int64_t, std::map<std::string, double>> measured;
    bool changes = false;
    for (const int64_t m : g.ms) {
      std::fprintf(stderr, "[tp-cpu-gemm-bench] crossover %s M=%lld\n", cpu::to_string(g.crossover),
                   static_cast<long long>(m));
      const at::Tensor x = at::randn({m, k}, at::kFloat).to(at::kBFloat16);
      const auto all = [&] {
        for (auto& layer : layers) (void)layer->forward(x);
      };
      std::string kernels[2];
      for (int side = 0; side < 2; ++side) {
        const cpu::ScopedCrossover forced(g.crossover, side == 0 ? past : 1);
        const auto before = cpu::kernel_counts();
        all();
        kernels[side] = cpu::kernels_between(before, cpu::kernel_counts());
      }
      changes = changes || kernels[0] != kernels[1];
      const auto ms = alternating_medians_ms({[&] {
                                                const cpu::ScopedCrossover forced(g.crossover, past);
                                                all();
                                              },
                                              [&] {
                                                const cpu::ScopedCrossover forced(g.crossover, 1);
                                                all();
                                              }},
                                             seconds);
      measured[m] = {{"below", ms[0]}, {"from", ms[1]}};
      table.add({cpu::to_string(g.crossover), std::to_string(m), format("%.3f", ms[0]), format("%.3f", ms[1]),
                 kernels[0], kernels[1]});
    }
    if (!changes) {
      std::printf("crossover %s: changes no kernel here (%s); not measured into the table\n",
                  cpu::to_string(g.crossover), cpu_description().c_str());
      continue;
    }
    // The smallest M from which the GEMM side is no slower at every larger M measured.
    int64_t min_m = past;
    for (auto it = measured.rbegin(); it != measured.rend(); ++it) {
      if (it->second.at("from") > it->second.at("below")) break;
      min_m = it->first;
    }
    cpu::CrossoverEntry e;
    e.vendor = cpu::vendor_name(cpu::features().amd);
    e.isa = cpu::to_string(cpu::isa());
    e.crossover = g.crossover;
    e.min_m = min_m;
    e.measured_ms = measured;
    std::printf("crossover %s: from M = %lld%s\n", cpu::to_string(g.crossover), static_cast<long long>(min_m),
                min_m == past ? " (the GEMM side never won at the M measured)" : "");
    out.push_back(std::move(e));
  }
  std::printf("%s", table.str().c_str());
  return out;
}

}  // namespace tp::bench
