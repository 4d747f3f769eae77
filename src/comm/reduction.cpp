#include "tp/comm/reduction.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "tp/comm/differentiable.h"
#include "tp/shard/split.h"

namespace tp {
namespace {

// Every rank's extent along `dim` for a reduce-scatter given no sizes: tp::split's even
// rule, the first T % world ranks one more (tp::sequence_ranges, tp/layers/sequence_parallel.h).
std::vector<int64_t> even_sizes(int64_t total, int64_t world) {
  std::vector<int64_t> sizes(world, 0);
  if (total == 0) return sizes;
  const auto ranges = split(total, world, SplitPolicy{}, "tokens");
  for (int64_t r = 0; r < world; ++r) sizes[r] = ranges[r].size();
  return sizes;
}

int64_t wrapped(const char* what, const at::Tensor& x, int64_t dim) {
  TORCH_CHECK_VALUE(x.defined(), "Reduction ", what, ": the tensor is undefined");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TORCH_CHECK_INDEX(d >= 0 && d < x.dim(), "Reduction ", what, ": dim=", dim, " is out of range for a tensor of shape ",
                    x.sizes());
  return d;
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kNone: return "none";
    case ReduceOp::kAllReduce: return "all_reduce";
    case ReduceOp::kReduceScatter: return "reduce_scatter";
    case ReduceOp::kAllGather: return "all_gather";
  }
  return "?";
}

Reduction Reduction::none(Communicator group) {
  Reduction r;
  r.group = std::move(group);
  return r;
}

Reduction Reduction::all_reduce(Communicator group, AllReduceStrategy strategy, WirePrecision wire) {
  Reduction r = none(std::move(group));
  r.op = ReduceOp::kAllReduce;
  r.strategy = strategy;
  r.wire = wire;
  return r;
}

Reduction Reduction::reduce_scatter(Communicator group, int64_t dim, std::vector<int64_t> sizes) {
  Reduction r = none(std::move(group));
  r.op = ReduceOp::kReduceScatter;
  r.dim = dim;
  r.sizes = std::move(sizes);
  return r;
}

Reduction Reduction::all_gather(Communicator group, int64_t dim, std::vector<int64_t> sizes, bool partial_grad) {
  Reduction r = none(std::move(group));
  r.op = ReduceOp::kAllGather;
  r.dim = dim;
  r.sizes = std::move(sizes);
  r.partial_grad = partial_grad;
  return r;
}

at::Tensor Reduction::apply(const at::Tensor& x) const {
  TORCH_CHECK_VALUE(sizes.empty() || static_cast<int64_t>(sizes.size()) == group.world_size(), "Reduction ",
                    to_string(op), ": ", sizes.size(), " sizes for a group of ", group.world_size(),
                    " ranks; give one per rank, or none");
  switch (op) {
    case ReduceOp::kNone: TORCH_CHECK_VALUE(x.defined(), "Reduction none: the tensor is undefined"); return x;
    case ReduceOp::kAllReduce: return reduce_from_parallel(x, group, strategy, wire);
    case ReduceOp::kReduceScatter: {
      const int64_t d = wrapped("reduce_scatter", x, dim);
      return reduce_scatter_to_sequence_parallel(x, group, d,
                                                 sizes.empty() ? even_sizes(x.size(d), group.world_size()) : sizes);
    }
    case ReduceOp::kAllGather:
      return partial_grad ? gather_from_sequence_parallel(x, group, dim, sizes)
                          : gather_from_parallel(x, group, dim, sizes);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

at::Tensor Reduction::apply_consuming(at::Tensor x) const {
  const bool grad = at::GradMode::is_enabled() && x.requires_grad();
  if (op != ReduceOp::kAllReduce || grad) return apply(x);
  group.all_reduce(x, strategy, wire);  // in place: the caller's temporary
  return x;
}

std::ostream& operator<<(std::ostream& out, const Reduction& r) {
  out << to_string(r.op);
  if (r.op == ReduceOp::kNone) return out;
  out << "(";
  if (r.op == ReduceOp::kAllReduce) {
    out << to_string(r.strategy);
    if (r.wire != WirePrecision::kDefault) out << ", wire=" << to_string(r.wire);
  } else {
    out << "dim=" << r.dim;
    if (!r.sizes.empty()) {
      out << ", sizes=[";
      for (size_t i = 0; i < r.sizes.size(); ++i) out << (i ? "," : "") << r.sizes[i];
      out << "]";
    }
    if (r.partial_grad) out << ", partial_grad";
  }
  return out << ", world=" << r.group.world_size() << ")";
}

}  // namespace tp
