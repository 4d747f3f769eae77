#pragma once
// SafetensorsFile: a .safetensors file, mapped read-only, validated at open, whose
// tensors are served as TensorSources that read one slice at a time.
//
// A slice read copies only that slice's bytes from the mapping straight into the
// new tensor: one contiguous copy for a dim-0 range, one strided run per row for a
// range of a later dim. Mapped pages are released as the copy goes, so a rank's
// peak memory while loading is its shard plus a few MiB, not the file.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/loader/checkpoint.h"

namespace tp {

/// One safetensors file. Copies share the mapping; the file stays mapped while the
/// SafetensorsFile or any source from it lives.
/// Example:
///   auto file = tp::SafetensorsFile::open("model.safetensors");
///   at::Tensor rows = file.source("lm_head.weight")->read(0, {0, 1024});
class SafetensorsFile {
 public:
  /// Maps and validates `path` as the format's rules (and the Python package) demand:
  /// header length within the file and under 100 MiB, strict JSON in well-formed UTF-8
  /// (names, metadata and escapes), known dtypes, each tensor's bytes matching shape x
  /// dtype size, and the tensors covering the data section exactly: sorted by offset,
  /// each begins where the one before ends, the first at the data section's first byte,
  /// the last ending at the end of the file (no holes, overlaps or trailing bytes).
  /// Anything else is a c10::ValueError naming the file, the tensor, the byte offsets
  /// (in the file) and the rule broken.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const;
  /// The header's "__metadata__" (string -> string; empty when absent).
  const std::map<std::string, std::string>& metadata() const;
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// The tensor `name`; an error naming the file and the tensor if absent.
  std::shared_ptr<const TensorSource> source(const std::string& name) const;
  /// Adds every tensor of the file to `checkpoint`.
  void add_to(Checkpoint& checkpoint) const;

  struct Impl;

 private:
  explicit SafetensorsFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// The torch dtype of a safetensors dtype name ("BF16" -> kBFloat16); an error
/// listing the supported names otherwise.
at::ScalarType safetensors_dtype(const std::string& name);
/// The safetensors name of a torch dtype; an error for dtypes the format lacks.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace tp
