// libFuzzer entry for the safetensors header parser and the sharded-checkpoint
// index parser (src/loader/safetensors_format.cpp). Each input is tried both as a
// whole safetensors file and as an index. A FormatError is the expected way to
// refuse; any other exception, a crash, a sanitizer report, or an accepted input
// that breaks one of the format's rules (checked here independently: bytes inside the
// input, tensors tiling the data section exactly, UTF-8 names and metadata, a header
// our writer reproduces) is a finding.
//
// Built two ways: by tools/fuzz.sh with clang -fsanitize=fuzzer,address,undefined,
// and by the normal build with replay_main.cpp, which replays tests/fuzz/corpus
// as a CTest.

#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/safetensors_format.h"

namespace {

// An independent UTF-8 check (decode, then reject overlongs, surrogates and values
// past U+10FFFF), so the parser's own validator is not its own judge.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j < len; ++j) {
      const auto d = static_cast<unsigned char>(s[i + j]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

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
    // The format's rules: sorted by offset, the tensors tile the data section exactly;
    // names and metadata are UTF-8.
    uint64_t covered = 0;
    for (const auto& e : header.tensors) {
      if (e.begin != covered || !valid_utf8(e.name)) __builtin_trap();
      covered = e.end;
    }
    if (covered != header.data_size) __builtin_trap();
    for (const auto& [k, v] : header.metadata) {
      if (!valid_utf8(k) || !valid_utf8(v)) __builtin_trap();
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
    for (const auto& [name, file] : parse_safetensors_index(reinterpret_cast<const char*>(data), size)) {
      if (!valid_utf8(name) || !valid_utf8(file)) __builtin_trap();
    }
  } catch (const FormatError&) {}
  return 0;
}
