#pragma once
// ExpertShard: this rank's slice of one expert of a mixture of experts (or of its shared
// expert): gate/up rows and down columns of the intermediate range it holds, each through
// the format's QuantMethod, registered on a child module of the MoE block.
//
//   module  "<name>"  (experts.<e> or shared_expert)
//             gate_up.*   [gate rows | up rows] of this rank's slice, the format's tensors
//             down.*      this rank's columns of the down projection
//
// forward is this rank's partial output, down(act(gate(x)) * up(x)) over its slice: the
// slices of an expert's group sum to the expert's output (the down bias is added by one
// rank of the group only, as RowParallelLinear adds its bias).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/range.h"

namespace torch::nn {
class Module;
}

namespace tp {
class LoRAImpl;
}

namespace tp::detail {

struct ExpertLoRAStep;

/// The expert MLP's activation between its gate and up halves (MoEParallelMLPOptions).
struct ExpertActivation {
  std::string name = "silu";  // "silu", "gelu", "gelu_tanh", "swiglu_oai"
  double alpha = 1.702, limit = 7.0;
  at::Tensor operator()(const at::Tensor& gate, const at::Tensor& up) const;
};

/// Whether `name` is an activation ExpertActivation computes.
bool is_expert_activation(const std::string& name);

/// Where an expert's tensors are in a checkpoint: the prefixes of its gate, up and down
/// projections (the format's tensors are "<prefix>.<suffix>": ".weight", ".bias", ...).
struct ExpertPrefixes {
  std::string gate, up, down;
};

class ExpertShard {
 public:
  /// Registers "<name>" on `parent` (children gate_up and down) for this rank's slice
  /// `range` of an expert with `intermediate` rows and `hidden` columns. `adds_down_bias`:
  /// this rank adds the down projection's bias (one rank of the expert's group).
  ExpertShard(torch::nn::Module& parent, const std::string& name, int64_t hidden, int64_t intermediate, Range range,
              const QuantConfig& quant, bool bias, bool adds_down_bias, const at::TensorOptions& options);

  /// x [tokens, hidden] -> this rank's partial output [tokens, hidden]. `lora`: the
  /// adapters on the routed experts (ExpertLoRA), this expert's factors at index `expert`
  /// of them, x being the block's tokens `token`.
  at::Tensor forward(const at::Tensor& x, const ExpertActivation& act, const ExpertLoRAStep* lora = nullptr,
                     int64_t expert = 0, const at::Tensor& token = {}) const;
  void reset_parameters();
  /// Reads this rank's slices of the expert's tensors under `prefixes` (through the
  /// format's QuantMethod: shapes, dtypes and scales checked by it) and repacks them.
  /// `what` names the layer in errors.
  void load(const Checkpoint& checkpoint, const ExpertPrefixes& prefixes, const std::string& what);

  /// This rank's pieces, for gathering the whole expert: gate rows [r, hidden], up rows
  /// [r, hidden], down columns [hidden, r], then (with biases) gate and up bias [r] and
  /// down bias [hidden]. Unquantized experts only (an error naming the format otherwise).
  std::vector<at::Tensor> local_pieces(const std::string& what) const;

  /// LoRA adapters on this slice as on a column layer (gate_up: segments gate and up) and a
  /// row layer (down): the shared expert's (PEFT's shared_expert.gate_proj / up_proj /
  /// down_proj), registered as "<name>.gate_up.lora" and "<name>.down.lora". `comm` splits
  /// the expert over `ranges` (every rank's slice).
  void make_lora(const std::string& layer, const Communicator& comm, const std::vector<Range>& ranges,
                 const at::TensorOptions& options);
  LoRAImpl* gate_up_lora() const { return gate_up_lora_.get(); }
  LoRAImpl* down_lora() const { return down_lora_.get(); }
  /// The stored weights of this slice ([2 r, hidden] gate | up rows, [hidden, r]; merging).
  at::Tensor gate_up_weight() const;
  at::Tensor down_weight() const;

  /// Bytes of every tensor this slice stores (the format's codes and scales, biases):
  /// what one pass over it reads.
  int64_t stored_bytes() const;

  const QuantMethod& method() const { return *gate_up_; }
  Range range() const { return range_; }
  bool has_bias() const { return gate_up_bias_.defined(); }

 private:
  int64_t hidden_, intermediate_;
  Range range_;
  bool adds_down_bias_;
  std::shared_ptr<QuantMethod> gate_up_, down_;
  at::Tensor gate_up_bias_;  // [2 r] or undefined
  at::Tensor down_bias_;     // [hidden] or undefined
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<LoRAImpl> gate_up_lora_, down_lora_;
};

}  // namespace tp::detail
