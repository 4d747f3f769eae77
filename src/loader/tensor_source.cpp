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

void check_read_into_args(const TensorSource& source, int64_t dim, Range range, const at::Tensor& dst) {
  check_read_args(source, dim, range);
  auto want = source.shape();
  if (!want.empty()) want[static_cast<size_t>(dim)] = range.size();
  TORCH_CHECK_VALUE(dst.defined() && dst.sizes() == c10::IntArrayRef(want), "reading tensor '", source.name(),
                    "' of shape ", shape_str(source.shape()), ": range ", range, " of dim ", dim, " is ",
                    shape_str(want), " but the destination is ",
                    dst.defined() ? shape_str(dst.sizes().vec()) : std::string("undefined"),
                    "; read_into writes a tensor of the slice's shape");
}

void TensorSource::read_into(int64_t dim, Range range, const at::Tensor& dst) const {
  check_read_into_args(*this, dim, range, dst);
  dst.copy_(read(dim, range));
}

void check_region_args(const TensorSource& source, const std::vector<Range>& region) {
  const auto s = source.shape();
  TORCH_CHECK_VALUE(region.size() == s.size(), "reading tensor '", source.name(), "' of shape ", shape_str(s),
                    ": a region of ", region.size(), " ranges; expected one per dimension (", s.size(), ")");
  for (size_t d = 0; d < s.size(); ++d) check_read_args(source, static_cast<int64_t>(d), region[d]);
}

void check_region_into_args(const TensorSource& source, const std::vector<Range>& region, const at::Tensor& dst) {
  check_region_args(source, region);
  std::vector<int64_t> want;
  for (const auto& r : region) want.push_back(r.size());
  TORCH_CHECK_VALUE(dst.defined() && dst.sizes() == c10::IntArrayRef(want), "reading tensor '", source.name(),
                    "' of shape ", shape_str(source.shape()), ": the region is ", shape_str(want),
                    " but the destination is ", dst.defined() ? shape_str(dst.sizes().vec()) : std::string("undefined"),
                    "; read_region_into writes a tensor of the region's shape");
}

void TensorSource::read_region_into(const std::vector<Range>& region, const at::Tensor& dst) const {
  check_region_into_args(*this, region, dst);
  dst.copy_(read_region(region));
}

at::Tensor TensorSource::view_region(const std::vector<Range>& region) const { return read_region(region); }

at::Tensor TensorSource::read_region(const std::vector<Range>& region) const {
  check_region_args(*this, region);
  const auto s = shape();
  if (s.empty()) return read(0, {0, 1});
  // Read along the dimension that keeps the smallest fraction, then narrow the others.
  size_t best = 0;
  for (size_t d = 1; d < s.size(); ++d) {
    if (region[d].size() * s[best] < region[best].size() * s[d]) best = d;
  }
  at::Tensor out = read(static_cast<int64_t>(best), region[best]);
  for (size_t d = 0; d < s.size(); ++d) {
    if (d != best) out = out.narrow(static_cast<int64_t>(d), region[d].begin, region[d].size());
  }
  // A narrowed slab is a view of the slab's memory: copy the box out so it owns just its bytes.
  const bool owns =
      out.is_contiguous() && out.storage().nbytes() == static_cast<size_t>(out.numel()) * out.element_size();
  return owns ? out : out.clone(at::MemoryFormat::Contiguous);
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

at::Tensor InMemorySource::read_region(const std::vector<Range>& region) const {
  check_region_args(*this, region);
  if (tensor_.dim() == 0) return tensor_.to(at::kCPU).clone();
  at::Tensor slice = tensor_;
  for (size_t d = 0; d < region.size(); ++d)
    slice = slice.narrow(static_cast<int64_t>(d), region[d].begin, region[d].size());
  return slice.is_cpu() ? slice.clone(at::MemoryFormat::Contiguous) : slice.to(at::kCPU).contiguous();
}

}  // namespace tp
