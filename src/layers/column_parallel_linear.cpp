#include "tp/layers/column_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/column_core.h"
#include "layers/layer_common.h"

namespace tp {

namespace {
constexpr const char* kLayer = "ColumnParallelLinear";
}

ColumnParallelLinearOptions::ColumnParallelLinearOptions(int64_t in_features, int64_t out_features)
    : in_features_(in_features), out_features_(out_features) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void ColumnParallelLinearImpl::reset() {
  TORCH_CHECK_VALUE(options.in_features() > 0 && options.out_features() > 0, kLayer,
                    ": in_features and out_features must be positive; got in_features=", options.in_features(),
                    ", out_features=", options.out_features());
  detail::check_common_options(kLayer, options.dtype());
  const auto method = make_quant_method(options.quant());
  const auto policy = detail::aligned_policy(kLayer, options.split(), *method, ShardMode::kColumn);
  auto plans = detail::with_layer_context(kLayer, [&] {
    return detail::plans_for_all_ranks(comm.world_size(), [&](int64_t r) {
      return plan_single("out_features", options.out_features(), comm.world_size(), r, policy);
    });
  });
  core_ = std::make_shared<detail::ColumnCore>(kLayer, comm, std::move(plans), options.in_features(), method,
                                               options.bias(),
                                               at::TensorOptions().dtype(options.dtype()).device(options.device()),
                                               *this);
  weight = core_->weight();
  bias = core_->bias();
  reset_parameters();
}

void ColumnParallelLinearImpl::reset_parameters() { core_->reset_parameters(); }

void ColumnParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::ColumnParallelLinear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", local_out=" << local_range()
         << ", bias=" << (options.bias() ? "true" : "false");
  if (options.gather_output()) stream << ", gather_output=true";
  if (core_->method().name() != "none") stream << ", quant=" << core_->method().name();
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) { return core_->forward(x, options.gather_output()); }

void ColumnParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  core_->load(checkpoint, {prefix});
}

Range ColumnParallelLinearImpl::local_range() const { return core_->plan().pieces.at(0).source; }

std::vector<Range> ColumnParallelLinearImpl::ranges() const {
  std::vector<Range> out;
  for (const auto& p : core_->plans()) out.push_back(p.pieces.at(0).source);
  return out;
}

}  // namespace tp
