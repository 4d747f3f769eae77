#pragma once
// Writing safetensors files: for tests, examples and the loading benchmark, and
// for saving weights computed at run time. Files load in the Python `safetensors`
// package and in torch as well as here.

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace tp {

/// Writes `tensors` (name -> tensor: any device, any strides; dtypes as
/// safetensors_dtype_name accepts) to `path`, in name order, with `metadata` as the
/// header's "__metadata__". The header is padded to a multiple of 8 bytes, so every
/// tensor's data is 8-byte aligned in the file. Written to `path + ".tmp"` and
/// renamed, so a crash never leaves a half-written file under `path`.
/// Example: tp::save_safetensors("fc.safetensors", {{"fc.weight", w}}, {{"format", "pt"}});
void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Writes a sharded checkpoint folder the way Hugging Face does: tensors (each
/// whole, in name order) packed into files of at most `max_file_bytes` of data
/// (a larger tensor gets a file of its own), named
/// `model-00001-of-0000N.safetensors`, plus `model.safetensors.index.json`.
/// Returns the number of files. The folder must exist.
int64_t save_sharded_safetensors(const std::string& dir, const std::map<std::string, at::Tensor>& tensors,
                                 int64_t max_file_bytes);

}  // namespace tp
