// Replays fuzz inputs through the same entry as the libFuzzer target, without
// libFuzzer: `tp_fuzz_replay DIR_OR_FILE...`. Exits non-zero if an input is
// unreadable or none was found; a parser bug aborts (as it would under the fuzzer).
//
// `tp_fuzz_replay --verdicts DIR_OR_FILE...` also holds each seed to what its name
// promises (tests/fuzz/make_corpus.py): `valid_*` parses as a safetensors file,
// `bad_*` is refused with a message, `index_valid*` parses as a sharded index and
// `index_bad_*` is refused; it prints each refusal and exits 1 on a broken promise.
// Inputs named otherwise (the fuzzer's own finds) are only replayed.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "loader/safetensors_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Whether `bytes` keeps the promise of its file name; prints the verdict.
bool keeps_promise(const std::string& name, const std::string& bytes) {
  const bool index = starts_with(name, "index_");
  const bool expect_ok = starts_with(name, "valid_") || starts_with(name, "index_valid");
  const bool expect_bad = starts_with(name, "bad_") || starts_with(name, "index_bad_");
  if (!expect_ok && !expect_bad) return true;
  std::string error;
  try {
    if (index) {
      tp::detail::parse_safetensors_index(bytes.data(), bytes.size());
    } else {
      tp::detail::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
  } catch (const tp::detail::FormatError& e) {
    error = e.what();
    if (error.empty()) error = "(an empty message)";
  }
  if (expect_ok && !error.empty()) {
    std::fprintf(stderr, "tp_fuzz_replay: %s should be accepted but was refused: %s\n", name.c_str(), error.c_str());
    return false;
  }
  if (expect_bad && error.empty()) {
    std::fprintf(stderr, "tp_fuzz_replay: %s should be refused but was accepted\n", name.c_str());
    return false;
  }
  if (expect_bad && error == "(an empty message)") {
    std::fprintf(stderr, "tp_fuzz_replay: %s was refused without a message\n", name.c_str());
    return false;
  }
  if (expect_bad) std::printf("refused %s: %s\n", name.c_str(), error.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  int first = 1;
  const bool verdicts = argc > 1 && std::string(argv[1]) == "--verdicts";
  if (verdicts) ++first;
  for (int i = first; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "tp_fuzz_replay: no inputs found in the arguments\n");
    return 1;
  }
  bool broken = false;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "tp_fuzz_replay: cannot read %s\n", f.c_str());
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (verdicts && !keeps_promise(f.filename().string(), bytes)) broken = true;
  }
  std::printf("tp_fuzz_replay: %zu inputs replayed, none crashed%s\n", files.size(),
              verdicts ? (broken ? "; some broke their name's promise" : "; each kept its name's promise") : "");
  return broken ? 1 : 0;
}
