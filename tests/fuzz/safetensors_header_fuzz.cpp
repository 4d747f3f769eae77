// libFuzzer entry for the safetensors header parser and the sharded-checkpoint
// index parser (src/loader/safetensors_format.cpp). Each input is tried both as a
// whole safetensors file and as an index. A FormatError is the expected way to
// refuse; any other exception, a crash, or a sanitizer report is a finding.
//
// Built two ways: by tools/fuzz.sh with clang -fsanitize=fuzzer,address,undefined,
// and by the normal build with replay_main.cpp, which replays tests/fuzz/corpus
// as a CTest.

#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/safetensors_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tp::detail;
  try {
    const StHeader header = parse_safetensors(data, size);
    // A header that passes must describe bytes inside the input: check what the
    // reader will rely on.
    for (const auto& e : header.tensors) {
      if (e.begin > e.end || e.end > header.data_size || header.data_offset + header.data_size != size)
        __builtin_trap();
    }
    // Our own writer's output must parse again (names and metadata round-trip).
    const std::string again = format_safetensors_header(header.tensors, header.metadata);
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(static_cast<uint64_t>(again.size()) >> (8 * i));
    file += again;
    file.append(header.data_size, '\0');
    const StHeader reparsed = parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size());
    if (reparsed.tensors.size() != header.tensors.size() || reparsed.metadata != header.metadata) __builtin_trap();
    for (size_t i = 0; i < reparsed.tensors.size(); ++i) {
      const auto& a = header.tensors[i];
      const auto& b = reparsed.tensors[i];
      if (a.name != b.name || a.shape != b.shape || a.dtype != b.dtype || a.begin != b.begin || a.end != b.end)
        __builtin_trap();
    }
  } catch (const FormatError&) {}
  try {
    parse_safetensors_index(reinterpret_cast<const char*>(data), size);
  } catch (const FormatError&) {}
  return 0;
}
