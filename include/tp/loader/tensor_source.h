#pragma once
// TensorSource: a checkpoint tensor that can be read one slice at a time.
//
// Loading goes through sources so a rank reads only its shard: peak memory while
// loading is the shard, not the tensor. Sources are backed by an in-memory tensor
// (here), and by safetensors files (tp/loader/safetensors.h); a Checkpoint
// (tp/loader/checkpoint.h) names them.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/shard/range.h"

namespace tp {

/// A named tensor whose shape and dtype are known without reading it, and whose
/// slices along one dimension can be read on their own.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  /// The name used in error messages ("model.layers.0.mlp.up_proj.weight").
  virtual const std::string& name() const = 0;
  virtual std::vector<int64_t> shape() const = 0;
  virtual at::ScalarType dtype() const = 0;
  /// Elements `range` of dimension `dim`, all of every other dimension, as a new
  /// contiguous CPU tensor that owns its memory. A 0-d tensor is read with dim = 0
  /// and range [0, 1). Out-of-range arguments are an error naming the tensor.
  virtual at::Tensor read(int64_t dim, Range range) const = 0;
  /// Elements `region[d]` of every dimension d (one range per dimension: a box of the
  /// tensor), as a new contiguous CPU tensor that owns its memory: one expert's slice of
  /// a fused [experts, rows, cols] tensor is region {[e, e+1), rows, [0, cols)}. The
  /// default reads the box's extent along its most selective dimension with read() and
  /// narrows the rest (transiently more than the box); sources over files override it to
  /// copy only the box's bytes. A 0-d tensor takes an empty region.
  virtual at::Tensor read_region(const std::vector<Range>& region) const;
  /// read_region(region) written into `dst` (a tensor of the box's shape, in any dtype, on
  /// any device; e.g. a view of the parameter it belongs to). The default reads, then
  /// copies; sources over files override it to copy the box's bytes from the mapped file
  /// straight into a contiguous CPU `dst` of the tensor's dtype.
  virtual void read_region_into(const std::vector<Range>& region, const at::Tensor& dst) const;
  /// The box `region` as a read-only CPU tensor that may alias the source's own storage
  /// (sources over files: a strided view of the mapped file, no copy), for a caller that
  /// copies it at once into a destination of any layout and dtype (every other row,
  /// transposed, converted) and then drops it; the mapped pages it covers are released when
  /// the last reference goes. Never write to it. The default returns read_region(region).
  virtual at::Tensor view_region(const std::vector<Range>& region) const;
  /// read(dim, range) written into `dst` (a tensor of the slice's shape, in any dtype:
  /// converted on the way; on any device), e.g. a narrow of the parameter it belongs to.
  /// The default reads, then copies; sources over files override it to copy from the
  /// mapped file straight into a contiguous CPU `dst`, with no intermediate tensor,
  /// releasing the mapped pages as they go. A shape that is not the slice's is an error
  /// naming the tensor.
  virtual void read_into(int64_t dim, Range range, const at::Tensor& dst) const;

  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  /// The whole tensor.
  at::Tensor read_all() const;
};

/// A source over a tensor already in memory (tests, benchmarks, weights computed at
/// run time). `read` copies only the requested slice.
class InMemorySource final : public TensorSource {
 public:
  InMemorySource(std::string name, at::Tensor tensor);
  const std::string& name() const override { return name_; }
  std::vector<int64_t> shape() const override;
  at::ScalarType dtype() const override;
  at::Tensor read(int64_t dim, Range range) const override;
  at::Tensor read_region(const std::vector<Range>& region) const override;

 private:
  std::string name_;
  at::Tensor tensor_;  // kept on its own device; read() returns CPU tensors
};

/// Checks `dim`/`range` against `source` and throws a c10::Error naming the tensor.
/// For implementers of TensorSource.
void check_read_args(const TensorSource& source, int64_t dim, Range range);
/// The same for read_into's destination: a defined tensor of the slice's shape.
void check_read_into_args(const TensorSource& source, int64_t dim, Range range, const at::Tensor& dst);
/// The same for a region: one range per dimension, each inside it.
void check_region_args(const TensorSource& source, const std::vector<Range>& region);
/// The same for read_region_into's destination: a defined tensor of the box's shape.
void check_region_into_args(const TensorSource& source, const std::vector<Range>& region, const at::Tensor& dst);

}  // namespace tp
