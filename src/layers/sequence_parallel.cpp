#include "tp/layers/sequence_parallel.h"

#include <c10/util/Exception.h>

#include "tp/comm/differentiable.h"
#include "tp/shard/split.h"

namespace tp {

std::vector<Range> sequence_ranges(int64_t tokens, int64_t world) {
  TORCH_CHECK_VALUE(tokens >= 0 && world >= 1, "sequence_ranges: tokens=", tokens, " and world=", world,
                    "; expected tokens >= 0 and world >= 1");
  if (tokens == 0) return std::vector<Range>(world, Range{0, 0});
  return split(tokens, world, SplitPolicy{}, "tokens");
}

std::vector<int64_t> sequence_sizes(int64_t tokens, int64_t world) {
  std::vector<int64_t> sizes;
  for (const auto& r : sequence_ranges(tokens, world)) sizes.push_back(r.size());
  return sizes;
}

at::Tensor scatter_to_sequence_parallel(const at::Tensor& x, const Communicator& comm, int64_t dim) {
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1, "scatter_to_sequence_parallel: expected a tensor with a token dim");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TORCH_CHECK_INDEX(d >= 0 && d < x.dim(), "scatter_to_sequence_parallel: dim=", dim,
                    " is out of range for a tensor of shape ", x.sizes());
  return scatter_to_parallel(x, comm, d, sequence_sizes(x.size(d), comm.world_size()));
}

}  // namespace tp
