#pragma once
// ExpertLoRA: LoRA adapters on a mixture of experts' routed experts, as PEFT puts them on
// transformers' stacked expert tensors (its target_parameters: "experts.gate_up_proj",
// "experts.down_proj"; PEFT's ParamWrapper), cut by the MoE block's own placement.
//
// PEFT holds one adapter over all E experts of a projection [in -> out] as
//   lora_A [r * E, in]    expert e's A_e = rows e*r .. (e+1)*r
//   lora_B [out, r * E]   expert e's B_e = columns e, E + e, 2E + e, ... (rank index k at k*E + e)
// and adds scaling * x A_e^T B_e^T to the expert's projection (gate_up: out = 2 * intermediate,
// gate rows then up rows, or alternating where the experts' tensor alternates them: GPT-OSS).
//
//   projection   A_e                                  B_e
//   gate_up      whole on every rank of e's group     this rank's gate and up rows (its slice)
//   down         this rank's intermediate columns     whole on every rank of e's group
//
// as a column layer and a row layer split them: the gate_up adapter's output is this rank's
// rows of the expert's gate/up, the down adapter's a partial sum that joins the expert's
// (the block's one all-reduce still sums them). The mirrored factors' gradients are summed
// over the expert's group (a communicator of the group's ranks when the experts are also
// distributed over groups), the split ones are this rank's own. Only the experts this rank
// holds have factors here.
//
// Example (a CausalLM builds and loads these through tp/models/adapters.h):
//   const auto config = tp::LoRAConfig().rank(16).alpha(32);
//   moe->lora().add("math", config, config);                        // A random, B zeros
//   moe->lora().selection().select("math");

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tp/layers/lora/lora.h"
#include "tp/loader/checkpoint.h"

namespace tp {
namespace detail {
struct ExpertLoRABase;
struct ExpertLoRAStep;
}  // namespace detail

class ExpertLoRAImpl : public torch::nn::Module {
 public:
  /// Built by MoEParallelMLP from its placement; users reach it through `moe->lora()`.
  explicit ExpertLoRAImpl(std::shared_ptr<detail::ExpertLoRABase> base);

  /// A new adapter on the experts' gate_up and / or down projections (a config for each it
  /// is on, at least one; their ranks may differ, as PEFT's rank_pattern makes them),
  /// initialised as PEFT does (A Kaiming-uniform, rank 0's draw on every rank; B zeros).
  /// Collective.
  void add(const std::string& name, const std::optional<LoRAConfig>& gate_up, const std::optional<LoRAConfig>& down);
  /// A new adapter read from `checkpoint`: the gate_up projection's (config `gate_up`) from
  /// `gate_up_prefix + ".lora_A.weight"` / `".lora_B.weight"` in PEFT's [r * E, in] /
  /// [out, r * E] layout, the down projection's from `down_prefix`, this rank's experts'
  /// slices of each (a projection without a config: none). Strict and collective: a wrong
  /// shape or dtype, a non-finite value or a missing tensor fails on every rank, naming the
  /// tensor and the numbers. `interleaved_gate_up`: B's gate and up rows alternate, as the
  /// experts' own tensor's do (GPT-OSS; MoECheckpointLayout::interleaved_gate_up).
  void load(const Checkpoint& checkpoint, const std::string& name, const std::optional<LoRAConfig>& gate_up,
            const std::string& gate_up_prefix, const std::optional<LoRAConfig>& down, const std::string& down_prefix,
            bool interleaved_gate_up = false);
  /// The adapter's whole tensors in PEFT's layout under the names load reads (every rank's
  /// experts and slices, on every rank: collective).
  std::map<std::string, at::Tensor> gather(const std::string& name, const std::string& gate_up_prefix,
                                           const std::string& down_prefix, bool interleaved_gate_up = false) const;
  void remove(const std::string& name);

  /// The adapters, in the order they were added (parameters() lists theirs in it).
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return adapters_.count(name) > 0; }
  /// Adapter `name`'s config on `projection` ("gate_up" or "down"; nullopt where it has none).
  std::optional<LoRAConfig> config(const std::string& name, const std::string& projection) const;
  /// Adapter `name`'s local factors of `projection` ("gate_up" or "down"), stacked over the
  /// experts this rank holds: gate_up A [experts, r, hidden], B [experts, 2 * rows, r];
  /// down A [experts, r, rows], B [experts, hidden, r]. Undefined where it has none.
  at::Tensor lora_A(const std::string& name, const std::string& projection) const;
  at::Tensor lora_B(const std::string& name, const std::string& projection) const;

  /// The selection this block reads (a model shares one among all its layers).
  LoRASelection& selection() { return *selection_; }
  void share_selection(std::shared_ptr<LoRASelection> selection);

  /// MoEParallelMLP's hook: what one forward's tokens x [tokens, hidden] (the block's
  /// input `x_in` flattened; its first dimension the selection's rows) take.
  detail::ExpertLoRAStep step(const at::Tensor& x_in, int64_t tokens) const;

  void pretty_print(std::ostream& stream) const override;

 private:
  struct Adapter {
    std::optional<LoRAConfig> gate_up_config, down_config;
    at::Tensor gate_up_A, gate_up_B, down_A, down_B;  // undefined: not on that projection
  };
  Adapter& make(const std::string& name, const std::optional<LoRAConfig>& gate_up,
                const std::optional<LoRAConfig>& down);
  const Adapter& adapter(const std::string& name) const;
  void ensure_group() const;

  std::shared_ptr<detail::ExpertLoRABase> base_;
  std::map<std::string, Adapter> adapters_;
  std::shared_ptr<LoRASelection> selection_;
};

TORCH_MODULE(ExpertLoRA);

}  // namespace tp
