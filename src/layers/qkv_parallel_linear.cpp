#include "tp/layers/qkv_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/column_core.h"
#include "layers/layer_common.h"

namespace tp {

namespace {
constexpr const char* kLayer = "QKVParallelLinear";
}

QKVParallelLinearOptions::QKVParallelLinearOptions(int64_t hidden_size, int64_t head_dim, int64_t num_heads,
                                                   int64_t num_kv_heads)
    : hidden_size_(hidden_size), head_dim_(head_dim), num_heads_(num_heads), num_kv_heads_(num_kv_heads) {}

QKVParallelLinearImpl::QKVParallelLinearImpl(QKVParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void QKVParallelLinearImpl::reset() {
  TORCH_CHECK_VALUE(options.hidden_size() > 0 && options.head_dim() > 0 && options.num_heads() > 0 &&
                        options.num_kv_heads() > 0,
                    kLayer, ": sizes must be positive; got hidden_size=", options.hidden_size(),
                    ", head_dim=", options.head_dim(), ", num_heads=", options.num_heads(),
                    ", num_kv_heads=", options.num_kv_heads());
  detail::check_common_options(kLayer, options.dtype());
  const auto method = make_quant_method(options.quant());
  const auto policy = detail::aligned_policy(kLayer, options.split(), *method, ShardMode::kColumn);
  const int64_t world = comm.world_size();
  auto plan_of_rank = [&](int64_t r) {
    return plan_heads(options.num_heads(), options.num_kv_heads(), options.head_dim(), world, r, policy);
  };
  head_plan_ = detail::with_layer_context(kLayer, [&] { return plan_of_rank(comm.rank()); });
  auto plans = detail::with_layer_context(kLayer, [&] {
    return detail::plans_for_all_ranks(world, [&](int64_t r) { return plan_of_rank(r).qkv_plan(); });
  });
  core_ = std::make_shared<detail::ColumnCore>(kLayer, comm, std::move(plans), options.hidden_size(),
                                               options.quant(), options.bias(),
                                               at::TensorOptions().dtype(options.dtype()).device(options.device()),
                                               *this);
  weight = named_parameters(/*recurse=*/false)["weight"];
  bias = options.bias() ? named_parameters(false)["bias"] : at::Tensor();
  reset_parameters();
}

void QKVParallelLinearImpl::reset_parameters() { core_->reset_parameters(); }

void QKVParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::QKVParallelLinear(hidden_size=" << options.hidden_size() << ", head_dim=" << options.head_dim()
         << ", num_heads=" << options.num_heads() << ", num_kv_heads=" << options.num_kv_heads()
         << ", local_q_heads=" << head_plan_.q_heads << ", local_kv_heads=" << head_plan_.kv_heads;
  if (head_plan_.kv_replicas > 1) stream << ", kv_replicas=" << head_plan_.kv_replicas;
  stream << ", bias=" << (options.bias() ? "true" : "false");
  if (options.gather_output()) stream << ", gather_output=true";
  if (core_->method().name() != "none") stream << ", quant=" << core_->method().name();
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

at::Tensor QKVParallelLinearImpl::forward(const at::Tensor& x) { return core_->forward(x, options.gather_output()); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> QKVParallelLinearImpl::split(const at::Tensor& y) const {
  auto parts = core_->split(y, options.gather_output());
  return {parts[0], parts[1], parts[2]};
}

void QKVParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  core_->load(checkpoint, {prefix + ".q_proj", prefix + ".k_proj", prefix + ".v_proj"});
}

SplitPolicy QKVParallelLinearImpl::attention_output_split() const {
  std::vector<double> weights;
  for (const auto& plan : core_->plans()) weights.push_back(static_cast<double>(plan.pieces.at(0).size()));
  SplitPolicy policy;
  policy.granularity = options.head_dim();
  // All ranks owning zero query heads cannot happen (num_heads > 0), so the weights are valid.
  policy.weights = std::move(weights);
  return policy;
}

}  // namespace tp
