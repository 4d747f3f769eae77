// The layer boundary's table (boundary_bench.h).

#include "boundary_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "bench_util.h"
#include "tp/comm/launch.h"

namespace tp::bench {
namespace {

std::string micros(double seconds) { return std::isnan(seconds) ? "-" : format("%.1f", seconds * 1e6); }

/// The unfused boundary as the layers run it without the fusion: the all-reduce, then
/// the residual add, tp::Norm's RMSNorm and quant's per-token quantization, each a
/// tensor operation (the same operations as models/norm.cpp and quant's per-token
/// models).
void unfused_boundary(const Communicator& comm, at::Tensor& sum, const at::Tensor& residual, const at::Tensor& weight,
                      AllReduceStrategy strategy, AllReduceFusionQuant quant) {
  comm.all_reduce(sum, strategy);
  const at::Tensor h = sum + residual;
  const at::Tensor f = h.to(at::kFloat);
  const at::Tensor y = weight * (f * at::rsqrt(f.pow(2).mean(-1, true) + 1e-5)).to(h.scalar_type());
  if (quant == AllReduceFusionQuant::kNone) return;
  const at::Tensor x = y.to(at::kFloat);
  const at::Tensor amax = x.abs().amax(-1, true);
  if (quant == AllReduceFusionQuant::kFp8PerToken) {
    const at::Tensor s = at::where(amax > 0, amax / 448.0, at::ones_like(amax));
    (void)(x / s).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn);
  } else {
    const at::Tensor s = at::where(amax > 0, amax / 127, at::ones_like(amax));
    (void)at::round(x / s).clamp(-127, 127).to(at::kChar);
  }
}

}  // namespace

std::string boundary_legend(const BoundaryConfig& c) {
  return std::string(c10::toString(c.dtype)) + " [M, " + std::to_string(c.hidden) +
         "] partial sums, residual + RMSNorm, quant " + to_string(c.quant) + ", " + std::to_string(c.repeat) +
         " repeats; bare = all_reduce, unfused = all_reduce then the residual add, RMSNorm (and quantization) as "
         "tensor operations, fused = all_reduce_fusion; us = median over repeats of the slowest rank's median, "
         "each call started in step with the peers; ranges over repeats";
}

/// The boundary table of one group: per token count and strategy, the slowest rank's
/// median of the bare all_reduce, the unfused boundary and the fused one (interleaved
/// call by call, so all three see the same machine), repeated `repeat` times: the
/// median of the repeats and their range.
std::string boundary_table(Communicator& comm, const BoundaryConfig& c) {
  const int64_t world = comm.world_size();
  const std::vector<AllReduceStrategy> strategies = {
      AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kSharedMemoryTwoShot,
      AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling};
  std::vector<double> mine;  // [repeat][tokens][strategy][bare, unfused, fused]
  const auto opts = at::TensorOptions().dtype(c.dtype);
  for (int64_t rep = 0; rep < c.repeat; ++rep) {
    for (int64_t m : c.tokens) {
      const at::Tensor partial = at::randn({m, c.hidden}, opts).div(world);
      const at::Tensor residual = at::randn({m, c.hidden}, opts);
      const at::Tensor weight = at::rand({c.hidden}, opts).add(0.5);
      const int64_t bytes = partial.numel() * partial.element_size();
      const int64_t iters = std::max<int64_t>(20, std::min<int64_t>(300, (int64_t{64} << 20) / bytes));
      for (auto strategy : strategies) {
        AllReduceFusionParams p;
        p.residual_in = residual;
        p.norm = AllReduceFusionNorm::kRMS;
        p.norm_weight = weight;
        p.eps = 1e-5;
        p.quant_out = c.quant;
        p.strategy = strategy;
        // Preallocated outputs, as a serving loop keeps them (the unfused path allocates its
        // intermediates, as the layers do).
        AllReduceFusionResult out;
        out.residual_out = at::empty_like(partial);
        out.norm_out = at::empty_like(partial);
        if (c.quant != AllReduceFusionQuant::kNone) {
          out.quant_out =
              at::empty({m, c.hidden}, c.quant == AllReduceFusionQuant::kFp8PerToken ? at::kFloat8_e4m3fn : at::kChar);
          out.scale_out = at::empty({m, 1}, at::kFloat);
        }
        std::vector<double> bare, unfused, fused;
        // Each call starts in step with the peers (an untimed one-element shared-memory
        // all-reduce, which releases the ranks within a microsecond or so; Gloo's barrier
        // releases them tens of microseconds apart): the unfused boundary ends with local
        // work, and without it the next call would time a slower peer finishing that.
        at::Tensor step = at::zeros({1});
        const auto timed = [&](std::vector<double>& into, int64_t i, const std::function<void()>& call) {
          comm.all_reduce(step, AllReduceStrategy::kSharedMemoryOneShot);
          const auto t0 = std::chrono::steady_clock::now();
          call();
          if (i >= 0) into.push_back(seconds_since(t0));
        };
        for (int64_t i = -5; i < iters; ++i) {  // 5 warm-up calls of each
          at::Tensor t = partial.clone();
          timed(bare, i, [&] { comm.all_reduce(t, strategy); });
          t = partial.clone();
          timed(unfused, i, [&] { unfused_boundary(comm, t, residual, weight, strategy, c.quant); });
          timed(fused, i, [&] { (void)comm.all_reduce_fusion(partial, p, out); });
        }
        mine.push_back(median(bare));
        mine.push_back(median(unfused));
        mine.push_back(median(fused));
      }
    }
  }
  const at::Tensor local = at::tensor(mine, at::kDouble).view({1, -1});
  const at::Tensor worst = std::get<0>(comm.all_gather(local, 0, std::vector<int64_t>(world, 1)).max(0));
  const int64_t per_rep = static_cast<int64_t>(c.tokens.size() * strategies.size() * 3);
  const auto at_rep = [&](int64_t rep, size_t ti, size_t si, int k) {
    return worst[rep * per_rep + static_cast<int64_t>((ti * strategies.size() + si) * 3 + k)].item<double>();
  };
  Table table({"world", "M", "strategy", "bare us", "unfused us", "fused us", "unfused/bare", "fused/bare",
               "bare range", "fused range"});
  for (size_t ti = 0; ti < c.tokens.size(); ++ti) {
    for (size_t si = 0; si < strategies.size(); ++si) {
      std::vector<double> v[3];
      for (int64_t rep = 0; rep < c.repeat; ++rep) {
        for (int k = 0; k < 3; ++k) v[k].push_back(at_rep(rep, ti, si, k));
      }
      const auto range = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        return micros(x.front()) + "-" + micros(x.back());
      };
      const double bare = median(v[0]), unfused = median(v[1]), fused = median(v[2]);
      table.add({std::to_string(world), std::to_string(c.tokens[ti]), to_string(strategies[si]), micros(bare),
                 micros(unfused), micros(fused), format("%.2f", unfused / bare), format("%.2f", fused / bare),
                 range(v[0]), range(v[2])});
    }
  }
  return table.str();
}

int run_boundary_rows(const std::string& shape, BoundaryConfig base, const std::vector<int64_t>& tp_sizes,
                      const std::vector<c10::ScalarType>& dtypes, bool verify_calls) {
  std::cout << "tp-bench --rows boundary: the all-reduce between a row layer and the next layer's input, shape '"
            << shape << "'\n  machine: " << machine_description()
            << "\n  load average (1, 5, 15 min) at the start: " << load_average() << "\n";
  CommunicatorOptions options;
  options.verify_calls = verify_calls;
  for (const auto dtype : dtypes) {
    base.dtype = dtype;
    std::cout << "\n" << boundary_legend(base) << "\n" << std::flush;
    for (const int64_t world : tp_sizes) {
      if (world < 2) continue;  // nothing to reduce
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            at::set_num_threads(1);  // the collectives' work is the ranks' own; ATen's pool would spin beside them
            const std::string text = boundary_table(comm, base);
            if (comm.rank() == 0) std::cout << "\n" << text << std::flush;
          },
          options);
    }
  }
  std::cout << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  return 0;
}

}  // namespace tp::bench
