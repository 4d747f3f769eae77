#include "tp/loader/safetensors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "loader/safetensors_format.h"

namespace tp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so is this reader");

namespace {

// The read-only mapping of one file; unmapped when the last owner goes.
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TORCH_CHECK_VALUE(fd >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const int err = errno;
      ::close(fd);
      TORCH_CHECK_VALUE(false, "safetensors file '", path, "' is not a regular file",
                        err ? std::string(": ") + std::strerror(err) : std::string());
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);  // the mapping keeps the file open
      TORCH_CHECK(p != MAP_FAILED, "cannot map safetensors file '", path, "' (", size_,
                  " bytes): ", std::strerror(err));
      base_ = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const uint8_t* data() const { return base_; }
  size_t size() const { return size_; }

  // Drops this process's page-table entries for [p, p + n): the pages stay in the
  // page cache but stop counting towards our RSS. Safe while other threads read the
  // same pages (PROT_READ + MAP_PRIVATE has no private copies to lose: a later
  // access faults the page back in from the cache).
  void release(const uint8_t* p, size_t n) const {
    static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(p) & ~(page - 1), reinterpret_cast<uintptr_t>(base_));
    const uintptr_t hi = std::min((reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1),
                                  (reinterpret_cast<uintptr_t>(base_) + size_ + page - 1) & ~(page - 1));
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advisory: failure is harmless
  }

 private:
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

at::ScalarType to_scalar_type(detail::StDtype d) {
  using detail::StDtype;
  switch (d) {
    case StDtype::kF64: return at::kDouble;
    case StDtype::kF32: return at::kFloat;
    case StDtype::kF16: return at::kHalf;
    case StDtype::kBF16: return at::kBFloat16;
    case StDtype::kI64: return at::kLong;
    case StDtype::kI32: return at::kInt;
    case StDtype::kI16: return at::kShort;
    case StDtype::kI8: return at::kChar;
    case StDtype::kU64: return at::kUInt64;
    case StDtype::kU32: return at::kUInt32;
    case StDtype::kU16: return at::kUInt16;
    case StDtype::kU8: return at::kByte;
    case StDtype::kBool: return at::kBool;
    case StDtype::kF8E4M3: return at::kFloat8_e4m3fn;
    case StDtype::kF8E5M2: return at::kFloat8_e5m2;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled safetensors dtype");
}

// Copy granularity: after each chunk of the file span, its mapped pages are
// released, so mapped pages never add more than this to the resident set.
constexpr size_t kChunkBytes = size_t{16} << 20;

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const Mapping> mapping;
  detail::StHeader header;
  std::map<std::string, size_t> index;  // name -> position in header.tensors
};

namespace {

class SafetensorsSource final : public TensorSource {
 public:
  SafetensorsSource(std::shared_ptr<const SafetensorsFile::Impl> file, const detail::StEntry& entry)
      : file_(std::move(file)), entry_(entry), dtype_(to_scalar_type(entry.dtype)) {}
  const std::string& name() const override { return entry_.name; }
  std::vector<int64_t> shape() const override { return entry_.shape; }
  at::ScalarType dtype() const override { return dtype_; }

  at::Tensor read(int64_t dim, Range range) const override {
    check_read_args(*this, dim, range);
    const auto& shape = entry_.shape;
    const size_t item = static_cast<size_t>(detail::st_dtype_size(entry_.dtype));
    const uint8_t* tensor = file_->mapping->data() + file_->header.data_offset + entry_.begin;
    if (shape.empty()) {
      at::Tensor out = at::empty({}, at::TensorOptions().dtype(dtype_));
      std::memcpy(out.data_ptr(), tensor, item);
      return out;
    }
    // The tensor as [outer, shape[dim], inner]: the slice is `outer` runs of
    // range.size() * inner elements, one every shape[dim] * inner elements.
    size_t outer = 1, inner = item;
    for (int64_t i = 0; i < dim; ++i) outer *= static_cast<size_t>(shape[i]);
    for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= static_cast<size_t>(shape[i]);
    auto out_shape = shape;
    out_shape[dim] = range.size();
    at::Tensor out = at::empty(out_shape, at::TensorOptions().dtype(dtype_));
    const size_t run = static_cast<size_t>(range.size()) * inner;
    const size_t stride = static_cast<size_t>(shape[dim]) * inner;
    if (run == 0 || outer == 0) return out;
    copy_runs(tensor + static_cast<size_t>(range.begin) * inner, outer, stride, run,
              static_cast<uint8_t*>(out.data_ptr()));
    return out;
  }

  at::Tensor read_region(const std::vector<Range>& region) const override {
    check_region_args(*this, region);
    if (entry_.shape.empty()) return read(0, {0, 1});
    std::vector<int64_t> out_shape;
    for (const auto& r : region) out_shape.push_back(r.size());
    at::Tensor out = at::empty(out_shape, at::TensorOptions().dtype(dtype_));
    copy_region(region, static_cast<uint8_t*>(out.data_ptr()));
    return out;
  }

  // The box's bytes straight into a contiguous CPU destination of the tensor's dtype;
  // any other destination takes read_region and a copy (converting on the way).
  void read_region_into(const std::vector<Range>& region, const at::Tensor& dst) const override {
    check_region_into_args(*this, region, dst);
    if (entry_.shape.empty() || !dst.is_cpu() || !dst.is_contiguous() || dst.scalar_type() != dtype_) {
      dst.copy_(view_region(region));  // any layout or dtype: ATen's copy from the mapping
      return;
    }
    copy_region(region, static_cast<uint8_t*>(dst.data_ptr()));
    // Written behind ATen's back: bump the version counter as an in-place write does, so
    // whoever watches it (LoadSession's unfilled check, the kernels' packed copies) sees it.
    if (!dst.is_inference()) dst.unsafeGetTensorImpl()->bump_version();
  }

  // The box as a strided tensor over the mapped bytes (at::from_blob); its deleter keeps
  // the file mapped and releases the box's span of pages. Bytes not aligned to their
  // element (safetensors does not promise it) and 0-d tensors take read_region.
  at::Tensor view_region(const std::vector<Range>& region) const override {
    check_region_args(*this, region);
    const auto& shape = entry_.shape;
    const size_t item = static_cast<size_t>(detail::st_dtype_size(entry_.dtype));
    const uint8_t* tensor = file_->mapping->data() + file_->header.data_offset + entry_.begin;
    const bool empty = std::any_of(region.begin(), region.end(), [](const Range& r) { return r.size() == 0; });
    if (shape.empty() || empty || reinterpret_cast<uintptr_t>(tensor) % item != 0) return read_region(region);
    std::vector<int64_t> sizes(shape.size()), strides(shape.size());
    int64_t stride = 1, first = 0, last = 0;  // elements
    for (size_t d = shape.size(); d-- > 0;) {
      sizes[d] = region[d].size();
      strides[d] = stride;
      first += region[d].begin * stride;
      last += (region[d].end - 1) * stride;
      stride *= shape[d];
    }
    const uint8_t* begin = tensor + static_cast<size_t>(first) * item;
    const size_t span = static_cast<size_t>(last - first + 1) * item;
    std::shared_ptr<const SafetensorsFile::Impl> file = file_;
    return at::from_blob(
        const_cast<uint8_t*>(begin), sizes, strides,  // read only: the callers copy from it
        [file, begin, span](void*) { file->mapping->release(begin, span); }, at::TensorOptions().dtype(dtype_));
  }

  // From the mapped file into `dst` through a tensor over the mapped bytes (at::from_blob:
  // no copy), so the only copy is into the destination, converting the dtype on the way
  // (ATen's copy_, spread over the intra-op threads). Every kChunkBytes of the file span
  // are released once copied. A non-contiguous destination, or mapped bytes not aligned
  // to their element (safetensors does not promise it), take read() and a copy.
  void read_into(int64_t dim, Range range, const at::Tensor& dst) const override {
    check_read_into_args(*this, dim, range, dst);
    const auto& shape = entry_.shape;
    const size_t item = static_cast<size_t>(detail::st_dtype_size(entry_.dtype));
    const uint8_t* tensor = file_->mapping->data() + file_->header.data_offset + entry_.begin;
    if (dst.numel() == 0) return;
    if (shape.empty() || !dst.is_cpu() || !dst.is_contiguous() || reinterpret_cast<uintptr_t>(tensor) % item != 0) {
      dst.copy_(read(dim, range));
      return;
    }
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < dim; ++i) outer *= shape[i];
    for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
    const int64_t run = range.size() * inner, stride = shape[dim] * inner;  // elements
    const uint8_t* first = tensor + static_cast<size_t>(range.begin * inner) * item;
    const Mapping& map = *file_->mapping;
    const auto options = at::TensorOptions().dtype(dtype_);
    auto* base = const_cast<uint8_t*>(first);  // read only: copy_ never writes its source
    if (outer == 1 || run == stride) {         // one contiguous block
      const int64_t total = outer * run, step = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / item));
      const at::Tensor out = dst.view({total});
      for (int64_t off = 0; off < total; off += step) {
        const int64_t n = std::min(step, total - off);
        out.narrow(0, off, n).copy_(at::from_blob(base + static_cast<size_t>(off) * item, {n}, options));
        map.release(first + static_cast<size_t>(off) * item, static_cast<size_t>(n) * item);
      }
      return;
    }
    // `outer` runs of `run` elements, `stride` apart: a strided view, a chunk of rows at a time.
    const size_t row_bytes = static_cast<size_t>(stride) * item;
    const int64_t rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row_bytes));
    const at::Tensor out = dst.view({outer, run});
    for (int64_t r = 0; r < outer; r += rows_per_chunk) {
      const int64_t rows = std::min(rows_per_chunk, outer - r);
      uint8_t* src = base + static_cast<size_t>(r) * row_bytes;
      out.narrow(0, r, rows).copy_(at::from_blob(src, {rows, run}, {stride, 1}, options));
      map.release(src, static_cast<size_t>(rows - 1) * row_bytes + static_cast<size_t>(run) * item);
    }
  }

 private:
  // The box `region` of a non-0-d tensor, its bytes in row-major order, into `dst`.
  void copy_region(const std::vector<Range>& region, uint8_t* dst) const {
    const auto& shape = entry_.shape;
    const size_t ndim = shape.size(), item = static_cast<size_t>(detail::st_dtype_size(entry_.dtype));
    for (const auto& r : region) {
      if (r.size() == 0) return;
    }
    // The dimensions after the last one the region cuts are taken whole, so each run of
    // contiguous bytes is region[last].size() rows of everything after it; the runs are
    // visited in file order (an odometer over the dimensions before `last`).
    size_t last = ndim - 1;
    while (last > 0 && region[last].begin == 0 && region[last].end == shape[last]) --last;
    std::vector<size_t> stride(ndim, item);  // bytes between neighbours along each dim
    for (size_t d = ndim - 1; d-- > 0;) stride[d] = stride[d + 1] * static_cast<size_t>(shape[d + 1]);
    const size_t run = static_cast<size_t>(region[last].size()) * stride[last];
    const uint8_t* tensor = file_->mapping->data() + file_->header.data_offset + entry_.begin;
    const uint8_t* base = tensor + static_cast<size_t>(region[last].begin) * stride[last];
    std::vector<int64_t> index(last);
    for (size_t d = 0; d < last; ++d) index[d] = region[d].begin;
    const Mapping& map = *file_->mapping;
    const uint8_t* span = nullptr;  // the first mapped byte copied and not yet released
    const uint8_t* done = nullptr;  // the end of the last run copied
    while (true) {
      const uint8_t* src = base;
      for (size_t d = 0; d < last; ++d) src += static_cast<size_t>(index[d]) * stride[d];
      std::memcpy(dst, src, run);
      dst += run;
      done = src + run;
      if (!span) span = src;
      if (static_cast<size_t>(done - span) >= kChunkBytes) {
        map.release(span, static_cast<size_t>(done - span));
        span = nullptr;
      }
      size_t d = last;
      while (d > 0 && ++index[d - 1] == region[d - 1].end) {
        index[d - 1] = region[d - 1].begin;
        --d;
      }
      if (d == 0) break;
    }
    if (span) map.release(span, static_cast<size_t>(done - span));
  }

  // `count` runs of `run` bytes, `stride` apart, into dst back to back; the mapped
  // span already copied is released every kChunkBytes.
  void copy_runs(const uint8_t* src, size_t count, size_t stride, size_t run, uint8_t* dst) const {
    const Mapping& map = *file_->mapping;
    if (count == 1 || stride == run) {  // one contiguous block
      const size_t total = run * count;
      for (size_t off = 0; off < total; off += kChunkBytes) {
        const size_t n = std::min(kChunkBytes, total - off);
        std::memcpy(dst + off, src + off, n);
        map.release(src + off, n);
      }
      return;
    }
    const uint8_t* span = src;
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(dst + i * run, src + i * stride, run);
      const uint8_t* done = src + i * stride + run;
      if (static_cast<size_t>(done - span) >= kChunkBytes || i + 1 == count) {
        map.release(span, static_cast<size_t>(done - span));
        span = done;
      }
    }
  }

  std::shared_ptr<const SafetensorsFile::Impl> file_;
  detail::StEntry entry_;
  at::ScalarType dtype_;
};

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->mapping = std::make_shared<const Mapping>(path);
  try {
    impl->header = detail::parse_safetensors(impl->mapping->data(), impl->mapping->size());
  } catch (const detail::FormatError& e) {
    TORCH_CHECK_VALUE(false, "safetensors file '", path, "': ", e.what());
  }
  for (size_t i = 0; i < impl->header.tensors.size(); ++i) impl->index.emplace(impl->header.tensors[i].name, i);
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return impl_->path; }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->header.metadata; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->index.size());
  for (const auto& kv : impl_->index) out.push_back(kv.first);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return impl_->index.count(name) != 0; }

std::shared_ptr<const TensorSource> SafetensorsFile::source(const std::string& name) const {
  const auto it = impl_->index.find(name);
  TORCH_CHECK_VALUE(it != impl_->index.end(), "safetensors file '", impl_->path, "' has no tensor '", name, "' (",
                    impl_->index.size(), " tensors)");
  return std::make_shared<SafetensorsSource>(impl_, impl_->header.tensors[it->second]);
}

void SafetensorsFile::add_to(Checkpoint& checkpoint) const {
  for (const auto& entry : impl_->header.tensors) checkpoint.add(std::make_shared<SafetensorsSource>(impl_, entry));
}

at::ScalarType safetensors_dtype(const std::string& name) {
  detail::StDtype d{};
  TORCH_CHECK_VALUE(detail::st_dtype_from_name(name, &d), "unknown safetensors dtype '", name,
                    "' (supported: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2)");
  return to_scalar_type(d);
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (int i = 0; i <= static_cast<int>(detail::StDtype::kF8E5M2); ++i) {
    const auto d = static_cast<detail::StDtype>(i);
    if (to_scalar_type(d) == dtype) return detail::st_dtype_name(d);
  }
  TORCH_CHECK_VALUE(
      false, "dtype ", dtype,
      " has no safetensors equivalent (supported: float64, float32, float16, "
      "bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8, bool, float8_e4m3fn, float8_e5m2)");
}

}  // namespace tp
