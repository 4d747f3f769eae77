// The safetensors reader is strict: the tensors cover the data section exactly (no
// holes, no bytes before the first tensor or after the last), and the header is valid
// UTF-8 (names, metadata, escapes). Each refusal names the file, the byte offsets and
// the rule. Issue 14, failure 6: a header length one byte short used to be read with
// every tensor shifted by one byte.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cstring>

#include "support/loader_test_util.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors.h"
#include "tp/loader/safetensors_writer.h"

using namespace tp;
using Catch::Contains;
using test::TempDir;

namespace {

// A file from a raw header string and data bytes.
std::string raw_file(const std::string& header, const std::string& data, int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// The file's 8-byte header length, rewritten.
void set_header_length(const std::string& path, uint64_t n) {
  std::string bytes = test::read_bytes(path);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  test::write_bytes(path, bytes);
}

uint64_t header_length(const std::string& path) {
  const std::string bytes = test::read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return n;
}

}  // namespace

TEST_CASE("a header length one byte short is refused, not read shifted by a byte (issue 14, failure 6)", "[loader]") {
  TempDir dir;
  const auto path = dir.file("w.safetensors");
  const at::Tensor w = at::arange(4, at::kFloat);  // [0, 1, 2, 3]
  save_safetensors(path, {{"w", w}});
  const uint64_t n = header_length(path);
  CHECK(at::equal(SafetensorsFile::open(path).source("w")->read_all(), w));

  set_header_length(path, n - 1);
  const std::string msg = open_error(path);
  INFO("message: " << msg);
  REQUIRE(!msg.empty());
  CHECK_THAT(msg, Contains("'" + path + "'"));
  CHECK_THAT(msg, Contains("cover"));
  CHECK_THAT(msg, Contains("1 byte"));
  CHECK_THAT(msg, Contains("file bytes"));
  CHECK_THAT(msg, Contains("header length"));  // the hint: the usual cause

  // One byte long: the header then swallows the first data byte.
  set_header_length(path, n + 1);
  CHECK_THAT(open_error(path), Contains("'" + path + "'") && Contains("trailing bytes after the header object"));
  // And through open_checkpoint (what Python's tp.open_checkpoint calls).
  REQUIRE_THROWS_WITH(open_checkpoint(path), Contains("'" + path + "'"));
}

TEST_CASE("safetensors data must be covered exactly: holes, leading and trailing bytes are refused", "[loader]") {
  TempDir dir;
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<std::string> expect;
  };
  const std::string a4 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::vector<Case> cases = {
      {"a hole between two tensors",
       raw_file("{" + a4 + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", std::string(12, 'x')),
       {"hole", "[4, 8)", "between 'a' and 'b'", "file bytes"}},
      {"bytes before the first tensor",
       raw_file(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x')),
       {"[0, 4)", "before 'b'"}},
      {"bytes after the last tensor",
       raw_file("{" + a4 + "}", std::string(7, 'x')),
       {"3 bytes", "[4, 7)", "after 'a'", "the end of the file"}},
      {"data but no tensors", raw_file("{}", std::string(5, 'x')), {"no tensors", "5 bytes"}},
      {"an empty tensor inside another one's bytes",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
           std::string(8, 'x')),
       {"'e'", "inside 'a'"}},
  };
  for (const auto& c : cases) {
    INFO("case: " << c.what);
    const auto path = dir.file("bad.safetensors");
    test::write_bytes(path, c.bytes);
    const std::string msg = open_error(path);
    INFO("message: " << msg);
    REQUIRE(!msg.empty());
    CHECK_THAT(msg, Contains("'" + path + "'"));
    for (const auto& s : c.expect) CHECK_THAT(msg, Contains(s));
  }
  // Empty tensors at the edges of others are fine (the Python package accepts them too).
  const auto ok = dir.file("ok.safetensors");
  test::write_bytes(ok, raw_file(R"({"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + a4 +
                                     R"(,"z1":{"dtype":"I8","shape":[0,3],"data_offsets":[4,4]}})",
                                 std::string(4, '\0')));
  CHECK(SafetensorsFile::open(ok).names().size() == 3);
}

TEST_CASE("invalid UTF-8 in tensor names and metadata is refused at open, naming the byte offset", "[loader]") {
  TempDir dir;
  const std::string tail = R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  struct Case {
    const char* what;
    std::string name;  // the raw bytes of the tensor name in the header
  };
  const std::vector<Case> bad = {
      {"a lone continuation byte", "w\x80"},
      {"a truncated 2-byte sequence", "w\xc3"},
      {"an overlong encoding of '/'", "w\xc0\xaf"},
      {"an overlong 3-byte encoding", "w\xe0\x80\xaf"},
      {"an encoded surrogate (U+D800)", "w\xed\xa0\x80"},
      {"past U+10FFFF", "w\xf4\x90\x80\x80"},
      {"a 5-byte lead", "w\xf8\x88\x80\x80\x80"},
      {"0xFF", "w\xff"},
      {"a truncated 4-byte sequence at the string's end", "w\xf0\x9f\x98"},
  };
  for (const auto& c : bad) {
    INFO("case: " << c.what);
    const auto path = dir.file("bad.safetensors");
    test::write_bytes(path, raw_file("{\"" + c.name + tail, "x"));
    const std::string msg = open_error(path);
    INFO("message: " << msg);
    CHECK_THAT(msg, Contains("'" + path + "'") && Contains("UTF-8") && Contains("at byte 11"));
  }
  // In a metadata key and value, and after valid multi-byte characters.
  const auto path = dir.file("meta.safetensors");
  test::write_bytes(path, raw_file("{\"__metadata__\":{\"k\":\"\xc3\xa9\xe2\x82\xac\xff\"}}", ""));
  CHECK_THAT(open_error(path), Contains("UTF-8") && Contains("at byte 35"));
  test::write_bytes(path, raw_file("{\"__metadata__\":{\"k\xed\xbf\xbf\":\"v\"}}", ""));
  CHECK_THAT(open_error(path), Contains("UTF-8"));

  // Escapes: a lone surrogate half is no character either.
  for (const std::string esc : {"\\ud800", "\\udc00", "\\ud83dx", "\\ud83d\\u0041"}) {
    INFO("escape " << esc);
    test::write_bytes(path, raw_file("{\"w" + esc + tail, "x"));
    CHECK_THAT(open_error(path), Contains("surrogate"));
  }

  // Valid UTF-8, every length, and the largest code point, round-trip.
  const std::string good = "w\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf";
  test::write_bytes(path, raw_file("{\"" + good + tail, "x"));
  CHECK(SafetensorsFile::open(path).names() == std::vector<std::string>{good});
  test::write_bytes(path, raw_file(R"({"w\u00e9\ud83d\ude00)" + tail, "x"));
  CHECK(SafetensorsFile::open(path).names() == std::vector<std::string>{"w\xc3\xa9\xf0\x9f\x98\x80"});
}

TEST_CASE("a sharded index with invalid UTF-8 is refused, and the writer refuses names it could not read back",
          "[loader]") {
  TempDir dir;
  save_safetensors(dir.file("part1.safetensors"), {{"a", at::ones({2})}});
  test::write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": {\"a\xfe\": \"part1.safetensors\"}}");
  REQUIRE_THROWS_WITH(open_checkpoint(dir.str()), Contains("model.safetensors.index.json") && Contains("UTF-8"));

  REQUIRE_THROWS_WITH(save_safetensors(dir.file("w.safetensors"), {{"bad\xff", at::ones({1})}}),
                      Contains("UTF-8") && Contains("tensor name"));
  REQUIRE_THROWS_WITH(save_safetensors(dir.file("w.safetensors"), {{"ok", at::ones({1})}}, {{"k", "\xc0\x80"}}),
                      Contains("UTF-8") && Contains("metadata"));
  CHECK(!test::file_exists(dir.file("w.safetensors")));
}
