// The differentiable collectives (tp/comm/differentiable.h) as torch::autograd::Functions.
//
// Each backward is the partner function, called through the same public entry
// points: under create_graph the backward is itself differentiable (double
// backward), and otherwise grad mode is off there and the partner is the plain
// collective. The Communicator and the sizes travel to the backward in a capsule of
// the context's saved_data (an IValue cannot hold a C++ object otherwise).
// Materialized gradients (the default) turn an undefined incoming gradient into
// zeros, so a rank whose output got no gradient still takes part in the collective.

#include "tp/comm/differentiable.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <utility>

namespace tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a backward needs besides the gradient.
struct Saved : torch::CustomClassHolder {
  Communicator comm;
  int64_t dim = 0;
  std::vector<int64_t> sizes;
  AllReduceStrategy strategy = AllReduceStrategy::kAuto;
  WirePrecision wire = WirePrecision::kDefault;
};

void save(AutogradContext* ctx, Communicator comm, int64_t dim = 0, std::vector<int64_t> sizes = {},
          AllReduceStrategy strategy = AllReduceStrategy::kAuto, WirePrecision wire = WirePrecision::kDefault) {
  auto s = c10::make_intrusive<Saved>();
  s->comm = std::move(comm);
  s->dim = dim;
  s->sizes = std::move(sizes);
  s->strategy = strategy;
  s->wire = wire;
  ctx->saved_data["tp"] = at::IValue::make_capsule(std::move(s));
}

c10::intrusive_ptr<Saved> saved(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data.at("tp").toCapsule());
}

bool wants_autograd(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

int64_t wrap_dim(const char* op, const at::Tensor& x, int64_t dim) {
  TORCH_CHECK_VALUE(x.defined(), op, ": the tensor is undefined");
  const int64_t n = x.dim();
  TORCH_CHECK_INDEX(n > 0 && dim >= -n && dim < n, op, ": dim=", dim, " is out of range for a tensor of shape ",
                    x.sizes(), " (dim should be in the ", -n, "..", n - 1, " range)");
  return dim < 0 ? dim + n : dim;
}

int64_t offset_of(const std::vector<int64_t>& sizes, int64_t rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

// Sizes that split x.size(dim) over the ranks: one per rank, none negative, adding up.
void check_split(const char* op, const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes,
                 const Communicator& comm) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(sizes.size()) == comm.world_size(), op, ": sizes has ", sizes.size(),
                    " entries but world_size is ", comm.world_size(), "; pass one extent per rank");
  int64_t total = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    TORCH_CHECK_VALUE(sizes[r] >= 0, op, ": sizes[", r, "]=", sizes[r], " is negative (sizes=", c10::IntArrayRef(sizes),
                      ")");
    total += sizes[r];
  }
  TORCH_CHECK_VALUE(total == x.size(dim), op, ": sizes ", c10::IntArrayRef(sizes), " add up to ", total,
                    " but the tensor has extent ", x.size(dim), " along dim ", dim, " (shape ", x.sizes(), ")");
}

// ---- the plain collectives (no autograd) -------------------------------------------------

at::Tensor plain_all_reduce(const at::Tensor& x, const Communicator& comm, AllReduceStrategy strategy,
                            WirePrecision wire) {
  at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
  comm.all_reduce(y, strategy, wire);
  return y;
}

at::Tensor plain_gather(const at::Tensor& x, const Communicator& comm, int64_t dim, const std::vector<int64_t>& sizes) {
  return comm.all_gather(x.contiguous(), dim, sizes);
}

at::Tensor plain_scatter(const at::Tensor& x, const Communicator& comm, int64_t dim,
                         const std::vector<int64_t>& sizes) {
  return x.narrow(dim, offset_of(sizes, comm.rank()), sizes[comm.rank()]);
}

at::Tensor plain_reduce_scatter(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                const std::vector<int64_t>& sizes) {
  return comm.reduce_scatter(x.contiguous(), dim, sizes);
}

// ---- the autograd functions -----------------------------------------------------------

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm) {
    save(ctx, comm);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {reduce_from_parallel(grads[0], s->comm), at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm,
                            AllReduceStrategy strategy, WirePrecision wire) {
    save(ctx, comm);
    return plain_all_reduce(x, comm, strategy, wire);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {copy_to_parallel(grads[0], s->comm), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct GatherFromParallel : torch::autograd::Function<GatherFromParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm, int64_t dim,
                            std::vector<int64_t> sizes) {
    at::Tensor y = plain_gather(x, comm, dim, sizes);
    save(ctx, comm, dim, std::move(sizes));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {scatter_to_parallel(grads[0], s->comm, s->dim, s->sizes).contiguous(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

struct ScatterToParallel : torch::autograd::Function<ScatterToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm, int64_t dim,
                            std::vector<int64_t> sizes) {
    // A copy, not a view of x: a custom function's output that aliases its input
    // would refuse later in-place use.
    at::Tensor y = plain_scatter(x, comm, dim, sizes).clone(at::MemoryFormat::Contiguous);
    save(ctx, comm, dim, std::move(sizes));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {gather_from_parallel(grads[0], s->comm, s->dim, s->sizes), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct GatherFromSequenceParallel : torch::autograd::Function<GatherFromSequenceParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm, int64_t dim,
                            std::vector<int64_t> sizes) {
    at::Tensor y = plain_gather(x, comm, dim, sizes);
    save(ctx, comm, dim, std::move(sizes));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {reduce_scatter_to_sequence_parallel(grads[0], s->comm, s->dim, s->sizes), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

struct ReduceScatterToSequenceParallel : torch::autograd::Function<ReduceScatterToSequenceParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Communicator& comm, int64_t dim,
                            std::vector<int64_t> sizes) {
    at::Tensor y = plain_reduce_scatter(x, comm, dim, sizes);
    save(ctx, comm, dim, std::move(sizes));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = saved(ctx);
    return {gather_from_sequence_parallel(grads[0], s->comm, s->dim, s->sizes), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_parallel(const at::Tensor& x, const Communicator& comm) {
  TORCH_CHECK_VALUE(x.defined(), "copy_to_parallel: the tensor is undefined");
  if (comm.world_size() == 1 || !wants_autograd(x)) return x;
  return CopyToParallel::apply(x, comm);
}

at::Tensor reduce_from_parallel(const at::Tensor& x, const Communicator& comm, AllReduceStrategy strategy,
                                WirePrecision wire) {
  TORCH_CHECK_VALUE(x.defined(), "reduce_from_parallel: the tensor is undefined");
  if (comm.world_size() == 1) {
    // Still the communicator's call: it validates the strategy and counts it in
    // all_reduce_counts at world 1 as at any other size (the data is untouched).
    at::Tensor alias = x;
    comm.all_reduce(alias, strategy, wire);
    return x;
  }
  if (!wants_autograd(x)) return plain_all_reduce(x, comm, strategy, wire);
  return ReduceFromParallel::apply(x, comm, strategy, wire);
}

std::vector<int64_t> exchange_sizes(const at::Tensor& x, const Communicator& comm, int64_t dim) {
  const int64_t d = wrap_dim("exchange_sizes", x, dim);
  if (comm.world_size() == 1) return {x.size(d)};
  const auto mine = at::full({1}, x.size(d), at::TensorOptions().dtype(at::kLong).device(x.device()));
  const auto all = comm.all_gather(mine, 0, std::vector<int64_t>(comm.world_size(), 1)).cpu().contiguous();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

at::Tensor gather_from_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                const std::vector<int64_t>& sizes) {
  const int64_t d = wrap_dim("gather_from_parallel", x, dim);
  if (comm.world_size() == 1) return x;
  auto all = sizes.empty() ? exchange_sizes(x, comm, d) : sizes;
  if (!wants_autograd(x)) return plain_gather(x, comm, d, all);
  return GatherFromParallel::apply(x, comm, d, std::move(all));
}

at::Tensor scatter_to_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                               const std::vector<int64_t>& sizes) {
  const int64_t d = wrap_dim("scatter_to_parallel", x, dim);
  check_split("scatter_to_parallel", x, d, sizes, comm);
  if (comm.world_size() == 1) return x;
  if (!wants_autograd(x)) return plain_scatter(x, comm, d, sizes);
  return ScatterToParallel::apply(x, comm, d, sizes);
}

at::Tensor gather_from_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                         const std::vector<int64_t>& sizes) {
  const int64_t d = wrap_dim("gather_from_sequence_parallel", x, dim);
  if (comm.world_size() == 1) return x;
  auto all = sizes.empty() ? exchange_sizes(x, comm, d) : sizes;
  if (!wants_autograd(x)) return plain_gather(x, comm, d, all);
  return GatherFromSequenceParallel::apply(x, comm, d, std::move(all));
}

at::Tensor reduce_scatter_to_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim,
                                               const std::vector<int64_t>& sizes) {
  const int64_t d = wrap_dim("reduce_scatter_to_sequence_parallel", x, dim);
  check_split("reduce_scatter_to_sequence_parallel", x, d, sizes, comm);
  if (comm.world_size() == 1) return x;
  if (!wants_autograd(x)) return plain_reduce_scatter(x, comm, d, sizes);
  return ReduceScatterToSequenceParallel::apply(x, comm, d, sizes);
}

}  // namespace tp
