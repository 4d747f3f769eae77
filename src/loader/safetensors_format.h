#pragma once
// The safetensors format, parsed without torch: this translation unit is also the
// fuzz target (tests/fuzz), built by clang with libFuzzer, ASan and UBSan.
//
// A file is: 8-byte little-endian header length N; N bytes of JSON; the data section.
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) and an optional "__metadata__" of strings.
// Everything is validated here, before any tensor is read: a file that passes
// cannot make a read leave its tensor's bytes. The rules are the reference
// implementation's (the Rust `safetensors` crate behind the Python package): the
// header is UTF-8 JSON, and the tensors, sorted by offset, tile the data section from
// its first byte to the end of the file.

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/json_reader.h"

namespace tp::detail {

// FormatError (common/json_reader.h): a malformed file or index. The message names
// the tensor and the numbers; the torch-facing caller prefixes the file name and
// throws c10::Error. No other exception type leaves the parser (std::bad_alloc
// aside, which the size caps make unreachable for any input under the header cap).

/// The dtypes torch can hold, by their safetensors names.
enum class StDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool, kF8E4M3, kF8E5M2 };

/// "F32", "BF16", ... as written in the header.
const char* st_dtype_name(StDtype dtype);
/// Bytes per element.
int64_t st_dtype_size(StDtype dtype);
/// The dtype named `name`; false when the name is not one of the supported ones.
bool st_dtype_from_name(const std::string& name, StDtype* out);

/// One tensor's header entry, validated.
struct StEntry {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // in the data section
  uint64_t end = 0;
};

/// A parsed, validated header.
struct StHeader {
  std::vector<StEntry> tensors;  // in file order of their data (sorted by begin)
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
  uint64_t data_size = 0;    // bytes from data_offset to the end of the file
};

/// The largest header accepted (the Rust reference implementation's cap is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

/// Parses and validates a whole file held in `data[0, size)` (typically a mapping).
/// Only the first 8 + N bytes are read; the rest only has its size checked.
StHeader parse_safetensors(const uint8_t* data, size_t size);

/// Parses a sharded checkpoint's `model.safetensors.index.json`: the "weight_map"
/// object (tensor name -> file name; every file name a plain name in the same
/// folder, never a path). "metadata" and any other keys are skipped (any JSON,
/// nesting at most 64 deep).
std::map<std::string, std::string> parse_safetensors_index(const char* text, size_t size);

/// The header JSON our writer produces for `tensors` (their offsets already set),
/// padded with spaces to a multiple of 8 bytes so the data section is aligned.
std::string format_safetensors_header(const std::vector<StEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

}  // namespace tp::detail
