#include "lora_bench.h"

#include <ATen/ATen.h>

#include <iostream>
#include <string>

#include "bench_util.h"
#include "machine_limits.h"
#include "tp/tp.h"

namespace tp::bench {

namespace {

constexpr int kSides = 3;  // 0, 1 and 4 adapters
const char* const kAdapters[] = {"a0", "a1", "a2", "a3"};

struct Block {
  QKVParallelLinear qkv{nullptr};
  RowParallelLinear o{nullptr};
  GateUpParallelLinear gate_up{nullptr};
  RowParallelLinear down{nullptr};

  Block(const BlockShape& s, c10::ScalarType dtype, const Communicator& comm) {
    qkv = QKVParallelLinear(QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads).dtype(dtype), comm);
    o = RowParallelLinear(RowParallelLinearOptions(s.heads * s.head_dim, s.hidden)
                              .bias(false)
                              .split(qkv->attention_output_split())
                              .dtype(dtype),
                          comm);
    gate_up = GateUpParallelLinear(GateUpParallelLinearOptions(s.hidden, s.intermediate).dtype(dtype), comm);
    down = RowParallelLinear(RowParallelLinearOptions(s.intermediate, s.hidden).bias(false).dtype(dtype), comm);
  }
  template <class F>
  void each(F&& f) {
    f(qkv->lora());
    f(o->lora());
    f(gate_up->lora());
    f(down->lora());
  }
  int64_t base_bytes() const {
    int64_t n = 0;
    for (const auto* m :
         {static_cast<const torch::nn::Module*>(qkv.get()), static_cast<const torch::nn::Module*>(o.get()),
          static_cast<const torch::nn::Module*>(gate_up.get()), static_cast<const torch::nn::Module*>(down.get())})
      for (const auto& p : m->named_parameters(/*recurse=*/false)) n += p.value().numel() * p.value().element_size();
    return n;
  }
};

}  // namespace

int run_lora_rows(const LoraBenchConfig& c) {
  const auto& s = c.shape;
  std::cout << "tp-bench --rows lora: shape '" << s.name << "' (hidden " << s.hidden << ", intermediate "
            << s.intermediate << ", heads " << s.heads << "/" << s.kv_heads << " x " << s.head_dim
            << "), adapters of rank " << c.rank << " on qkv, o, gate_up and down\n  machine: " << cpu_description()
            << "\n  load average (1, 5, 15 min) at the start: " << load_average()
            << "\n  time: the four layers' forwards (each on its own input, as the block row), median of "
            << c.iterations
            << " alternating rounds after 2 warm-up rounds, the slowest rank's; +x: over the same layers without "
               "adapters; limit: the adapters' bytes over the base's (a memory-bound forward's cost)\n";
  for (const auto dtype : c.dtypes) {
    Table table({"dtype", "TP", "M", "base ms", "1 adapter ms", "+1", "4 adapters ms", "+4", "limit"});
    for (const int64_t world : c.tp_sizes) {
      std::vector<std::vector<std::string>> rows;
      run_ranks_in_threads(world, [&](Communicator& comm) {
        at::set_num_threads(std::max<int64_t>(1, at::get_num_threads() / world));
        at::manual_seed(static_cast<int64_t>(c.seed));
        Block block(s, dtype, comm);
        int64_t adapter_bytes = 0;
        block.each([&](LoRAImpl& lora) {
          for (const char* name : kAdapters) lora.add(name, LoRAConfig().rank(c.rank).alpha(2.0 * c.rank));
          at::NoGradGuard no_grad;
          for (auto p : lora.parameters()) p.normal_(0.0, 0.02);  // B away from zeros: the output is exercised
          for (const auto& seg : lora.segment_names())
            adapter_bytes += (lora.lora_A("a0", seg).numel() + lora.lora_B("a0", seg).numel()) *
                             lora.lora_A("a0", seg).element_size();
        });
        const double limit = static_cast<double>(adapter_bytes) / static_cast<double>(block.base_bytes());
        const int64_t r = comm.rank();
        const Range heads = block.o->local_range(), inter = block.down->local_range();
        for (const int64_t m : c.tokens) {
          const auto opts = at::TensorOptions().dtype(dtype);
          const at::Tensor h = at::randn({m, s.hidden}, opts);
          const at::Tensor attn = at::randn({m, heads.size()}, opts), mid = at::randn({m, inter.size()}, opts);
          std::vector<std::string> per_row;
          for (int64_t i = 0; i < m; ++i) per_row.push_back(kAdapters[i % 4]);
          const auto select = [&](int side) {
            block.each([&](LoRAImpl& lora) {
              if (side == 0)
                lora.selection().clear();
              else if (side == 1)
                lora.selection().select(kAdapters[0]);
              else
                lora.selection().select_rows(per_row);
            });
          };
          at::NoGradGuard no_grad;
          std::vector<double> times[kSides];
          const int64_t rounds = m <= 16 ? 4 * c.iterations : c.iterations;  // short calls: more rounds
          for (int64_t round = -2; round < rounds; ++round) {
            for (int side = 0; side < kSides; ++side) {
              select(side);
              comm.barrier();
              const auto t0 = std::chrono::steady_clock::now();
              (void)block.qkv->forward(h);
              (void)block.o->forward(attn);
              (void)block.gate_up->forward(h);
              (void)block.down->forward(mid);
              if (round >= 0) times[side].push_back(seconds_since(t0) * 1e3);
            }
          }
          const at::Tensor mine = at::tensor({median(times[0]), median(times[1]), median(times[2])}, at::kDouble);
          const at::Tensor worst =
              std::get<0>(comm.all_gather(mine.view({1, -1}), 0, std::vector<int64_t>(world, 1)).max(0));
          if (r == 0) {
            const double b = worst[0].item<double>(), one = worst[1].item<double>(), four = worst[2].item<double>();
            rows.push_back({c10::toString(dtype), std::to_string(world), std::to_string(m), format("%.2f", b),
                            format("%.2f", one), format("%+.1f%%", 100.0 * (one / b - 1.0)), format("%.2f", four),
                            format("%+.1f%%", 100.0 * (four / b - 1.0)), format("%.1f%%", 100.0 * limit)});
          }
        }
      });
      for (auto& row : rows) table.add(std::move(row));
    }
    std::cout << "\n" << table.str() << std::flush;
  }
  std::cout << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  return 0;
}

}  // namespace tp::bench
