#include "layers/moe/expert.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/layer_common.h"
#include "layers/linear_function.h"
#include "layers/loading/strict_load.h"
#include "layers/lora/lora_base.h"
#include "layers/moe/expert_lora_step.h"
#include "tp/layers/lora/lora.h"
#include "tp/loader/load_shard.h"

namespace tp::detail {

bool is_expert_activation(const std::string& name) {
  return name == "silu" || name == "gelu" || name == "gelu_tanh" || name == "swiglu_oai";
}

at::Tensor ExpertActivation::operator()(const at::Tensor& gate, const at::Tensor& up) const {
  if (name == "swiglu_oai") {
    // GPT-OSS, operation for operation as transformers' GptOssExperts computes it.
    const at::Tensor g = gate.clamp_max(limit);
    const at::Tensor u = up.clamp(-limit, limit);
    return (u + 1) * (g * at::sigmoid(g * alpha));
  }
  if (name == "gelu") return at::gelu(gate) * up;
  if (name == "gelu_tanh") return at::gelu(gate, "tanh") * up;
  return at::silu(gate) * up;
}

ExpertShard::ExpertShard(torch::nn::Module& parent, const std::string& name, int64_t hidden, int64_t intermediate,
                         Range range, const QuantConfig& quant, bool bias, bool adds_down_bias,
                         const at::TensorOptions& options)
    : hidden_(hidden),
      intermediate_(intermediate),
      range_(range),
      adds_down_bias_(adds_down_bias),
      gate_up_(make_quant_method(quant)),
      down_(make_quant_method(quant)) {
  auto expert = module_ = parent.register_module(name, std::make_shared<torch::nn::Module>("tp::MoEExpert"));
  auto gate_up = expert->register_module("gate_up", std::make_shared<torch::nn::Module>("tp::ExpertGateUp"));
  auto down = expert->register_module("down", std::make_shared<torch::nn::Module>("tp::ExpertDown"));
  const int64_t r = range.size();
  gate_up_->create_weights(*gate_up, 2 * r, hidden, options);
  down_->create_weights(*down, hidden, r, options);
  if (bias) {
    gate_up_bias_ = gate_up->register_parameter("bias", at::empty({2 * r}, options));
    down_bias_ = down->register_parameter("bias", at::empty({hidden}, options));
  }
}

int64_t ExpertShard::stored_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : module_->parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

void ExpertShard::reset_parameters() {
  gate_up_->reset_parameters(hidden_);
  down_->reset_parameters(intermediate_);
  reset_bias(gate_up_bias_, hidden_);
  reset_bias(down_bias_, intermediate_);
}

at::Tensor ExpertShard::forward(const at::Tensor& x, const ExpertActivation& act, const ExpertLoRAStep* lora,
                                int64_t expert, const at::Tensor& token) const {
  const int64_t r = range_.size();
  at::Tensor gate_up = parallel_linear(gate_up_, x, gate_up_bias_, /*add_bias=*/true, 2 * r, hidden_);
  if (lora != nullptr) gate_up = lora->add_gate_up(expert, x, token, gate_up);
  if (gate_up_lora_ && gate_up_lora_->active()) gate_up = gate_up_lora_->add_to(x, gate_up);
  const at::Tensor h = act(gate_up.narrow(-1, 0, r), gate_up.narrow(-1, r, r));
  at::Tensor y = parallel_linear(down_, h, down_bias_, adds_down_bias_, hidden_, r);
  if (lora != nullptr) y = lora->add_down(expert, h, token, y);
  if (down_lora_ && down_lora_->active()) y = down_lora_->add_to(h, y);
  return y;
}

void ExpertShard::make_lora(const std::string& layer, const Communicator& comm, const std::vector<Range>& ranges,
                            const at::TensorOptions& options) {
  auto gate_up = std::make_shared<LoRABase>();
  gate_up->layer = layer + " shared_expert gate/up";
  gate_up->comm = comm;
  gate_up->in_features = hidden_;
  for (const Range& range : ranges)
    gate_up->plans.push_back(make_segment_plan({{"gate", intermediate_}, {"up", intermediate_}}, {range, range}));
  gate_up->input_parallel = true;  // ExpertShard::forward's x is the block's copy_to_parallel'd input
  gate_up->options = options;
  auto down = std::make_shared<LoRABase>();
  down->layer = layer + " shared_expert down";
  down->comm = comm;
  down->row = true;
  down->in_features = intermediate_;
  down->in_ranges = ranges;
  down->plans = {plan_single("linear", hidden_, 1, 0)};
  down->options = options;
  gate_up_lora_ = std::make_shared<LoRAImpl>(std::move(gate_up));
  down_lora_ = std::make_shared<LoRAImpl>(std::move(down));
  module_->named_children()["gate_up"]->register_module("lora", gate_up_lora_);
  module_->named_children()["down"]->register_module("lora", down_lora_);
}

at::Tensor ExpertShard::gate_up_weight() const { return gate_up_->weight(); }

at::Tensor ExpertShard::down_weight() const { return down_->weight(); }

void ExpertShard::load(const Checkpoint& checkpoint, const ExpertPrefixes& p, const std::string& what) {
  const int64_t r = range_.size();
  gate_up_->load(checkpoint, {{p.gate, range_, 0, intermediate_}, {p.up, range_, r, intermediate_}}, ShardMode::kColumn,
                 what);
  gate_up_->finalize();
  down_->load(checkpoint, {{p.down, range_, 0, intermediate_}}, ShardMode::kRow, what);
  down_->finalize();
  if (!gate_up_bias_.defined()) return;
  at::NoGradGuard no_grad;
  const std::pair<const std::string*, int64_t> halves[] = {{&p.gate, 0}, {&p.up, r}};
  for (const auto& [prefix, offset] : halves) {
    const auto& source = checkpoint.get(*prefix + ".bias", what);
    check_bias(what, source, intermediate_);
    gate_up_bias_.narrow(0, offset, r).copy_(load_shard(source, ShardMode::kColumn, range_, {}, what));
  }
  const auto& source = checkpoint.get(p.down + ".bias", what);
  check_bias(what, source, hidden_);
  down_bias_.copy_(source.read_all());
}

std::vector<at::Tensor> ExpertShard::local_pieces(const std::string& what) const {
  TORCH_CHECK_VALUE(gate_up_->trainable(), what, ": gather_weights needs unquantized experts; these are ",
                    gate_up_->name(), ", whose weights are frozen (they are still the checkpoint's)");
  at::NoGradGuard no_grad;
  const int64_t r = range_.size();
  const at::Tensor gu = gate_up_->weight(), d = down_->weight();
  std::vector<at::Tensor> out{gu.narrow(0, 0, r), gu.narrow(0, r, r), d};
  if (gate_up_bias_.defined()) {
    out.push_back(gate_up_bias_.narrow(0, 0, r));
    out.push_back(gate_up_bias_.narrow(0, r, r));
    out.push_back(down_bias_);
  }
  return out;
}

}  // namespace tp::detail
