#include "tp/layers/moe_parallel_mlp.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>

#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"
#include "tp/loader/load_shard.h"
#include "tp/shard/split.h"

namespace tp {

namespace {

constexpr const char* kLayer = "MoEParallelMLP";

at::Tensor activation(const std::string& name, const at::Tensor& x) {
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_tanh") return at::gelu(x, "tanh");
  return at::silu(x);
}

std::string expert_name(const std::string& prefix, int64_t e, const std::string& part) {
  return prefix + ".experts." + std::to_string(e) + "." + part + ".weight";
}

// `name`'s source, checked to be [rows, cols] of a floating dtype.
const TensorSource& checked(const Checkpoint& checkpoint, const std::string& name, int64_t rows, int64_t cols) {
  const auto& source = checkpoint.get(name, kLayer);
  TORCH_CHECK_VALUE(c10::IntArrayRef(source.shape()) == c10::IntArrayRef({rows, cols}), kLayer, ": tensor '", name,
                    "' has shape ", c10::IntArrayRef(source.shape()), "; expected [", rows, ", ", cols, "]");
  TORCH_CHECK_TYPE(at::isFloatingType(source.dtype()) && !at::isFloat8Type(source.dtype()), kLayer, ": tensor '", name,
                   "' has dtype ", source.dtype(), "; quantized experts are not supported yet");
  return source;
}

}  // namespace

MoEParallelMLPOptions::MoEParallelMLPOptions(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts,
                                             int64_t top_k)
    : hidden_size_(hidden_size), intermediate_size_(intermediate_size), num_experts_(num_experts), top_k_(top_k) {}

MoEParallelMLPImpl::MoEParallelMLPImpl(MoEParallelMLPOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void MoEParallelMLPImpl::reset() {
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    const auto& o = options;
    TORCH_CHECK_VALUE(o.hidden_size() > 0 && o.intermediate_size() > 0 && o.num_experts() > 0, kLayer,
                      ": hidden_size, intermediate_size and num_experts must be positive; got ", o.hidden_size(), ", ",
                      o.intermediate_size(), ", ", o.num_experts());
    TORCH_CHECK_VALUE(o.top_k() >= 1 && o.top_k() <= o.num_experts(), kLayer, ": top_k=", o.top_k(),
                      " must be in [1, num_experts=", o.num_experts(), "]");
    TORCH_CHECK_VALUE(o.activation() == "silu" || o.activation() == "gelu" || o.activation() == "gelu_tanh", kLayer,
                      ": activation \"", o.activation(), "\"; expected silu, gelu or gelu_tanh");
    if (o.expert_parallel()) {
      experts_ = split_for_rank(o.num_experts(), comm.world_size(), comm.rank(), {}, std::string(kLayer) + " experts");
      range_ = {0, o.intermediate_size()};
    } else {
      experts_ = {0, o.num_experts()};
      range_ = split_for_rank(o.intermediate_size(), comm.world_size(), comm.rank(), {},
                              std::string(kLayer) + " intermediate_size");
    }
    const auto t = at::TensorOptions(o.dtype()).device(o.device());
    const int64_t local = experts_.size();
    router_weight = register_parameter("router_weight", at::empty({o.num_experts(), o.hidden_size()}, t));
    gate_up_weight = register_parameter("gate_up_weight", at::empty({local, 2 * range_.size(), o.hidden_size()}, t));
    down_weight = register_parameter("down_weight", at::empty({local, o.hidden_size(), range_.size()}, t));
    reset_parameters();
  });
}

void MoEParallelMLPImpl::reset_parameters() {
  // As torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) (each rank draws its own slices).
  at::NoGradGuard no_grad;
  const double h = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  const double i = 1.0 / std::sqrt(static_cast<double>(options.intermediate_size()));
  router_weight.uniform_(-h, h);
  gate_up_weight.uniform_(-h, h);
  down_weight.uniform_(-i, i);
}

void MoEParallelMLPImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::MoEParallelMLP(hidden_size=" << options.hidden_size()
         << ", intermediate_size=" << options.intermediate_size() << ", experts=" << options.num_experts()
         << ", top_k=" << options.top_k()
         << (options.expert_parallel() ? ", expert_parallel, local_experts=" : ", local_intermediate=")
         << (options.expert_parallel() ? experts_ : range_) << ", rank=" << comm.rank() << "/" << comm.world_size()
         << ")";
}

std::pair<at::Tensor, at::Tensor> MoEParallelMLPImpl::route(const at::Tensor& x) const {
  // transformers' TopKRouter: the softmax in float32 whatever the dtype, top-k, the
  // weights renormalised in float32, cast back only where the model does.
  const at::Tensor logits = at::linear(x, router_weight);
  const at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  auto [weights, experts] = at::topk(probs, options.top_k(), -1);
  if (options.normalize_top_k()) weights = weights / weights.sum(-1, /*keepdim=*/true);
  if (options.weights_in_input_dtype()) weights = weights.to(logits.scalar_type());
  return {weights, experts};
}

at::Tensor MoEParallelMLPImpl::forward(const at::Tensor& x_in) {
  TORCH_CHECK_VALUE(x_in.defined() && x_in.dim() >= 1 && x_in.size(-1) == options.hidden_size(), kLayer,
                    ": input of shape ", x_in.defined() ? x_in.sizes() : c10::IntArrayRef{}, "; expected [..., ",
                    options.hidden_size(), "]");
  const at::Tensor x = x_in.reshape({-1, options.hidden_size()});
  const int64_t tokens = x.size(0), k = options.top_k(), local = range_.size();
  auto [weights, experts] = route(x);
  // The weights are mirrored; each rank's partial output depends on them: their gradient
  // is the sum of every rank's part (copy_to_parallel's backward), as the input's is. The
  // sum is taken in the dtype the product is computed in (float32 weights times float64
  // outputs are float64): the cast back to the weights' dtype then rounds once, as one
  // device's gradient does, not once per rank.
  weights = weights.to(at::promote_types(weights.scalar_type(), x.scalar_type()));
  weights = copy_to_parallel(weights, comm);
  const at::Tensor xp = copy_to_parallel(x, comm);
  at::Tensor out = at::zeros_like(x);
  if (local > 0 && experts_.size() > 0 && tokens > 0) {
    // Grouped: the (token, slot) pairs sorted by expert, one GEMM pair per expert that
    // has tokens (ascending, as transformers adds them).
    const at::Tensor flat = experts.reshape({-1});
    const at::Tensor order = at::argsort(flat, /*stable=*/true);
    const auto counts = at::bincount(flat, {}, options.num_experts()).cpu();
    const auto* count = counts.data_ptr<int64_t>();
    int64_t begin = 0;
    for (int64_t e = 0; e < options.num_experts(); ++e) {
      const int64_t n = count[e];
      const int64_t start = begin;
      begin += n;
      if (n == 0 || e < experts_.begin || e >= experts_.end) continue;  // no token, or another rank's expert
      const at::Tensor pairs = order.narrow(0, start, n);
      const int64_t le = e - experts_.begin;
      const at::Tensor token = at::floor_divide(pairs, k), slot = at::remainder(pairs, k);
      const at::Tensor gate_up = at::linear(xp.index_select(0, token), gate_up_weight[le]);
      const at::Tensor h =
          activation(options.activation(), gate_up.narrow(-1, 0, local)) * gate_up.narrow(-1, local, local);
      const at::Tensor y = at::linear(h, down_weight[le]) * weights.index({token, slot}).unsqueeze(-1);
      out = out.index_add(0, token, y.to(out.scalar_type()));
    }
  }
  return reduce_from_parallel(out, comm).reshape(x_in.sizes());
}

void MoEParallelMLPImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix,
                                      const MoECheckpointLayout& layout) {
  run_collectively(comm, std::string(kLayer) + ".load_weights", [&] {
    at::NoGradGuard no_grad;
    const int64_t hidden = options.hidden_size(), inter = options.intermediate_size(), local = range_.size();
    const std::string router = prefix + "." + layout.router_name() + ".weight";
    router_weight.copy_(checked(checkpoint, router, options.num_experts(), hidden).read_all());
    // Every expert's tensors are checked (a missing one is an error on every rank); only
    // this rank's experts, and only its slices of them, are read.
    for (int64_t e = 0; e < options.num_experts(); ++e) {
      const auto& gate = checked(checkpoint, expert_name(prefix, e, layout.gate_name()), inter, hidden);
      const auto& up = checked(checkpoint, expert_name(prefix, e, layout.up_name()), inter, hidden);
      const auto& down = checked(checkpoint, expert_name(prefix, e, layout.down_name()), hidden, inter);
      if (e < experts_.begin || e >= experts_.end) continue;
      const int64_t le = e - experts_.begin;
      gate_up_weight[le].narrow(0, 0, local).copy_(load_shard(gate, ShardMode::kColumn, range_, {}, kLayer));
      gate_up_weight[le].narrow(0, local, local).copy_(load_shard(up, ShardMode::kColumn, range_, {}, kLayer));
      down_weight[le].copy_(load_shard(down, ShardMode::kRow, range_, {}, kLayer));
    }
  });
}

std::map<std::string, at::Tensor> MoEParallelMLPImpl::gather_weights(const std::string& prefix,
                                                                     const MoECheckpointLayout& layout) const {
  at::NoGradGuard no_grad;
  // Expert parallel: the experts along dim 0; else every expert's slices, [E, I, H] along
  // dim 1 for gate and up, [E, H, I] along dim 2 for down.
  const bool ep = options.expert_parallel();
  std::vector<int64_t> sizes;
  for (const auto& r : split(ep ? options.num_experts() : options.intermediate_size(), comm.world_size()))
    sizes.push_back(r.size());
  const int64_t local = range_.size();
  const auto gather = [&](const at::Tensor& t, int64_t dim) {
    return comm.world_size() == 1 ? t.clone() : comm.all_gather(t.contiguous(), ep ? 0 : dim, sizes);
  };
  const at::Tensor gate = gather(gate_up_weight.narrow(1, 0, local), 1);
  const at::Tensor up = gather(gate_up_weight.narrow(1, local, local), 1);
  const at::Tensor down = gather(down_weight, 2);
  std::map<std::string, at::Tensor> out{{prefix + "." + layout.router_name() + ".weight", router_weight.clone()}};
  for (int64_t e = 0; e < options.num_experts(); ++e) {
    out[expert_name(prefix, e, layout.gate_name())] = gate[e].contiguous();
    out[expert_name(prefix, e, layout.up_name())] = up[e].contiguous();
    out[expert_name(prefix, e, layout.down_name())] = down[e].contiguous();
  }
  return out;
}

}  // namespace tp
