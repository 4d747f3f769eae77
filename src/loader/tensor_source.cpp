#include "tp/loader/tensor_source.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "common/shape_str.h"

namespace tp {

using detail::shape_str;

at::Tensor TensorSource::read_all() const {
  const auto s = shape();
  if (s.empty()) return read(0, {0, 1});
  return read(0, {0, s[0]});
}

void check_read_args(const TensorSource& source, int64_t dim, Range range) {
  const auto s = source.shape();
  if (s.empty()) {
    TORCH_CHECK_VALUE(dim == 0 && range.begin == 0 && range.end == 1, "reading tensor '", source.name(),
                      "': it is 0-d, so the only valid read is dim 0, range [0,1); got dim ", dim, ", range ", range);
    return;
  }
  const int64_t ndim = static_cast<int64_t>(s.size());
  TORCH_CHECK_VALUE(dim >= 0 && dim < ndim, "reading tensor '", source.name(), "' of shape ", shape_str(s),
                    ": invalid dim ", dim, " (dim should be in the 0..", ndim - 1, " range)");
  TORCH_CHECK_VALUE(0 <= range.begin && range.begin <= range.end && range.end <= s[dim], "reading tensor '",
                    source.name(), "' of shape ", shape_str(s), ": range ", range, " of dim ", dim, " is outside [0,",
                    s[dim], ")");
}

InMemorySource::InMemorySource(std::string name, at::Tensor tensor)
    : name_(std::move(name)), tensor_(std::move(tensor)) {
  TORCH_CHECK_VALUE(tensor_.defined(), "InMemorySource '", name_, "': the tensor is undefined");
}

std::vector<int64_t> InMemorySource::shape() const { return tensor_.sizes().vec(); }

at::ScalarType InMemorySource::dtype() const { return tensor_.scalar_type(); }

at::Tensor InMemorySource::read(int64_t dim, Range range) const {
  check_read_args(*this, dim, range);
  if (tensor_.dim() == 0) return tensor_.to(at::kCPU).clone();
  // clone() so the slice owns its memory: a caller may keep it after the source dies,
  // and only the slice's bytes are copied.
  const auto slice = tensor_.narrow(dim, range.begin, range.size());
  return slice.is_cpu() ? slice.clone(at::MemoryFormat::Contiguous) : slice.to(at::kCPU).contiguous();
}

}  // namespace tp
