#include "layers/parallel_autograd.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <numeric>

namespace tp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A Communicator kept in an autograd context (saved_data holds IValues only).
struct CommHolder : torch::CustomClassHolder {
  explicit CommHolder(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
};

void save_comm(AutogradContext* ctx, const Communicator& comm) {
  ctx->saved_data["comm"] = c10::IValue::make_capsule(c10::make_intrusive<CommHolder>(comm));
}

const Communicator& saved_comm(AutogradContext* ctx) {
  return static_cast<CommHolder*>(ctx->saved_data.at("comm").toCapsule().get())->comm;
}

at::Tensor summed(const at::Tensor& t, const Communicator& comm) {
  at::Tensor out = t.contiguous().clone();
  comm.all_reduce(out, AllReduceStrategy::kAuto, WirePrecision::kNative);  // exact sums: never a bf16 wire
  return out;
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm) {
    save_comm(ctx, comm);
    return x.clone();  // a new tensor: an output must not alias an input unmarked
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], saved_comm(ctx)), at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const Communicator& comm) {
    return summed(x, comm);
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

struct ReduceScatterDim0 : torch::autograd::Function<ReduceScatterDim0> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm,
                            std::vector<int64_t> sizes) {
    save_comm(ctx, comm);
    ctx->saved_data["sizes"] = sizes;
    return comm.reduce_scatter(x.contiguous(), 0, sizes).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto sizes = ctx->saved_data.at("sizes").toIntVector();
    return {saved_comm(ctx).all_gather(grad[0].contiguous(), 0, sizes), at::Tensor(), at::Tensor()};
  }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm,
                            std::vector<int64_t> sizes) {
    const int64_t rank = comm.rank();
    ctx->saved_data["offset"] = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
    ctx->saved_data["width"] = sizes[rank];
    return comm.all_gather(x.contiguous(), -1, sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t offset = ctx->saved_data.at("offset").toInt(), width = ctx->saved_data.at("width").toInt();
    return {grad[0].narrow(-1, offset, width).contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// Whether a call records a node: without one (inference, no_grad, no input that needs
// a gradient) the forward collective runs alone.
bool records(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

at::Tensor copy_to_parallel(const at::Tensor& x, const Communicator& comm) {
  if (comm.world_size() == 1 || !records(x)) return x;
  return CopyToParallel::apply(x, comm);
}

at::Tensor reduce_from_parallel(const at::Tensor& x, const Communicator& comm) {
  if (comm.world_size() == 1) return x;
  if (!records(x)) return summed(x, comm);
  return ReduceFromParallel::apply(x, comm);
}

at::Tensor reduce_scatter_dim0(const at::Tensor& x, const Communicator& comm, const std::vector<int64_t>& sizes) {
  if (comm.world_size() == 1) return x;
  if (!records(x)) return comm.reduce_scatter(x.contiguous(), 0, sizes).clone();
  return ReduceScatterDim0::apply(x, comm, sizes);
}

at::Tensor gather_last_dim(const at::Tensor& x, const Communicator& comm, const std::vector<int64_t>& sizes) {
  if (comm.world_size() == 1) return x;
  if (!records(x)) return comm.all_gather(x.contiguous(), -1, sizes);
  return GatherLastDim::apply(x, comm, sizes);
}

}  // namespace tp::detail
