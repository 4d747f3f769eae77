#pragma once
// Private: what an ExpertLoRA is cut by (its MoE block's placement on this rank), and what
// one forward's tokens take from it (ExpertLoRAImpl::step), applied by ExpertShard::forward.
// tp/layers/moe/expert_lora.h says the layout.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/shard/range.h"

namespace tp::detail {

struct ExpertLoRABase {
  std::string layer;
  Communicator comm;                  // the block's
  int64_t ranks_per_group = 1;        // ranks that split each expert (comm's world / expert_parallel_size)
  std::optional<Communicator> group;  // this rank's expert group, made by the first add / load when it is neither
                                      // one rank nor the whole world
  int64_t hidden = 0, intermediate = 0, num_experts = 0;
  Range experts, rows;  // this rank's experts and its slice of each one's intermediate rows
  at::TensorOptions options;

  int64_t rank_in_group() const { return comm.rank() % ranks_per_group; }
  /// The communicator over which a mirrored factor's gradient is summed (nullptr: one rank).
  const Communicator* sum_group() const {
    if (ranks_per_group == 1) return nullptr;
    return ranks_per_group == comm.world_size() ? &comm : &*group;
  }
  /// This rank's gate rows then its up rows among the 2 * intermediate rows of a gate_up
  /// projection in PEFT's order (gate then up, or alternating: `interleaved`).
  at::Tensor gate_up_rows(bool interleaved) const;
};

struct ExpertLoRAStep {
  struct Active {
    double gate_up_scaling = 1.0, down_scaling = 1.0;
    at::Tensor gate_up_A, gate_up_B, down_A, down_B;  // stacked over this rank's experts; undefined: none
    at::Tensor tokens;                                // bool [tokens] that take it; undefined: every token
  };
  std::vector<Active> adapters;

  bool empty() const { return adapters.empty(); }
  /// y [n, 2 * rows] (this rank's gate | up rows of expert `expert`, an index among the
  /// rank's experts, for x [n, hidden], the block's tokens `token`) plus the adapters'.
  at::Tensor add_gate_up(int64_t expert, const at::Tensor& x, const at::Tensor& token, at::Tensor y) const;
  /// y [n, hidden] (the expert's partial output for h [n, rows]) plus the adapters' partial.
  at::Tensor add_down(int64_t expert, const at::Tensor& h, const at::Tensor& token, at::Tensor y) const;
};

}  // namespace tp::detail
