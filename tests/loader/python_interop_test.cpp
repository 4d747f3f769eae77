// Interop with the Python `safetensors` package (PyPI), both ways, across every
// dtype including bf16 and fp8: its files load bit-exactly here, and ours load
// bit-exactly there (load_file, safe_open, get_slice). The Python side is
// tests/loader/safetensors_interop.py, run with TP_PYTHON (the project's venv);
// a missing interpreter or package fails the test, it never passes silently.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/loader_test_util.h"
#include "tp/loader/safetensors.h"
#include "tp/loader/safetensors_writer.h"

using namespace tp;

namespace {

// Runs the interop script; returns its exit status, its output in `log`.
int run_python(const std::string& mode, const test::TempDir& dir, std::string* log) {
  const std::string python = TP_PYTHON, script = std::string(TP_LOADER_TEST_DIR) + "/safetensors_interop.py";
  if (!test::file_exists(python)) {
    *log = "no Python interpreter at " + python + ": run tools/setup.sh (it creates .venv with requirements.txt)";
    return -1;
  }
  const std::string out = dir.file("python.log");
  const std::string cmd = "'" + python + "' '" + script + "' " + mode + " '" + dir.str() + "' > '" + out + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  *log = test::read_bytes(out);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) shape.push_back(std::stoll(item));
  return shape;
}

}  // namespace

TEST_CASE("files written by Python safetensors load bit-exactly, every dtype", "[loader][python]") {
  test::TempDir dir;
  std::string log;
  const int rc = run_python("write", dir, &log);
  INFO("python output:\n" << log);
  REQUIRE(rc == 0);
  const auto file = SafetensorsFile::open(dir.file("python.safetensors"));
  CHECK(file.metadata().at("writer") == "python");
  std::ifstream manifest(dir.file("manifest.txt"));
  std::string name, dtype, shape;
  int64_t count = 0;
  while (manifest >> name >> dtype) {
    // A 0-d tensor's shape field is empty: the rest of the line.
    std::getline(manifest, shape);
    shape.erase(0, shape.find_first_not_of(' '));
    INFO("tensor " << name << " " << dtype << " [" << shape << "]");
    const auto source = file.source(name);
    CHECK(source->dtype() == safetensors_dtype(dtype));
    CHECK(source->shape() == parse_shape(shape));
    const auto got = source->read_all();
    const auto expected = test::read_bytes(dir.file(name + ".bin"));
    const auto got_bytes = test::bytes_of(got);
    CHECK(std::string(static_cast<const char*>(got_bytes.data_ptr()), got_bytes.numel()) == expected);
    ++count;
  }
  CHECK(count == 60);  // 15 dtypes x 4 shapes
  CHECK(file.names().size() == 60);
}

TEST_CASE("files written by tp load bit-exactly in Python safetensors, every dtype", "[loader][python]") {
  test::TempDir dir;
  std::map<std::string, at::Tensor> tensors;
  std::ofstream manifest(dir.file("manifest.txt"));
  uint64_t seed = 500;
  for (const char* st : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
                         "F8_E4M3", "F8_E5M2"}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{6, 5}, {2, 3, 4}, {}, {0, 2}}) {
      const bool empty = !shape.empty() && shape[0] == 0;
      const std::string name =
          std::string("cpp.") + st + "." + std::to_string(shape.size()) + "d" + (empty ? ".empty" : "");
      const auto t = test::random_tensor(shape, safetensors_dtype(st), ++seed);
      tensors[name] = t;
      const auto bytes = test::bytes_of(t);
      test::write_bytes(dir.file(name + ".bin"),
                        std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
      manifest << name << " " << st << " ";
      for (size_t i = 0; i < shape.size(); ++i) manifest << (i ? "," : "") << shape[i];
      manifest << "\n";
    }
  }
  manifest.close();
  save_safetensors(dir.file("cpp.safetensors"), tensors, {{"writer", "tp"}, {"note", "from C++"}});
  std::string log;
  const int rc = run_python("check", dir, &log);
  INFO("python output:\n" << log);
  CHECK(rc == 0);
}

TEST_CASE("files the safetensors format forbids are refused here and by the Python package alike", "[loader][python]") {
  // Each file broken in one way the format's rules forbid (the Rust reference: the
  // header is UTF-8 JSON, the tensors tile the data section from byte 0 to the end).
  // The "ok_" files are their valid neighbours: both readers accept them, tp exactly as
  // strict as the official reader and no stricter (issue 30: an unknown key inside an
  // entry, more than 64 dimensions). The "spec_" files the format forbids but the
  // official reader accepts: tp keeps to the format (a header must start with '{').
  test::TempDir dir;
  const auto file = [](const std::string& header, const std::string& data, int64_t length = -1) {
    const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
    return out + header + data;
  };
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string header = "{" + a + "}";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string ones_69;  // [2, 1, 1, ...]: 70 dimensions
  for (int i = 0; i < 69; ++i) ones_69 += ",1";
  const std::map<std::string, std::string> files = {
      {"ok_plain", file(padded, std::string(8, '\x01'))},
      {"ok_utf8_name", file("{\"\xc3\xa9\xf0\x9f\x98\x80" + a.substr(2) + "}", std::string(8, '\x01'))},
      {"ok_empty_tensor_at_end",
       file("{" + a + R"(,"z":{"dtype":"F16","shape":[0],"data_offsets":[8,8]}})", std::string(8, '\x01'))},
      {"ok_unknown_entry_key",
       file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":{"y":[1,null]}}})", std::string(8, '\x01'))},
      {"ok_70_dims",
       file(R"({"a":{"dtype":"F32","shape":[2)" + ones_69 + R"(],"data_offsets":[0,8]}})", std::string(8, '\x01'))},
      {"spec_leading_space", file(" " + header, std::string(8, '\x01'))},
      {"bad_header_length_one_short", file(padded, std::string(8, '\x01'), static_cast<int64_t>(padded.size()) - 1)},
      {"bad_header_length_one_long", file(padded, std::string(8, '\x01'), static_cast<int64_t>(padded.size()) + 1)},
      {"bad_trailing_bytes", file(header, std::string(12, '\x01'))},
      {"bad_hole",
       file(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           std::string(12, '\x01'))},
      {"bad_leading_gap", file(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\x01'))},
      {"bad_empty_inside_another",
       file("{" + a + R"(,"z":{"dtype":"F16","shape":[0],"data_offsets":[4,4]}})", std::string(8, '\x01'))},
      {"bad_utf8_name", file("{\"a\xff" + a.substr(2) + "}", std::string(8, '\x01'))},
      {"bad_utf8_surrogate_name", file("{\"a\xed\xa0\x80" + a.substr(2) + "}", std::string(8, '\x01'))},
      {"bad_utf8_overlong_name", file("{\"a\xc0\xaf" + a.substr(2) + "}", std::string(8, '\x01'))},
      {"bad_utf8_metadata", file(R"({"__metadata__":{"k":")"
                                 "\xe2\x82"
                                 R"("},)" +
                                     a + "}",
                                 std::string(8, '\x01'))},
      {"bad_lone_surrogate_escape", file(R"({"a\ud800)" + a.substr(2) + "}", std::string(8, '\x01'))},
  };
  for (const auto& [name, bytes] : files) test::write_bytes(dir.file(name + ".safetensors"), bytes);
  std::string log;
  const int rc = run_python("refuse", dir, &log);
  INFO("python output:\n" << log);
  REQUIRE(rc == 0);
  for (const auto& [name, bytes] : files) {
    INFO("file " << name);
    const bool expect_ok = name.rfind("ok_", 0) == 0, spec_only = name.rfind("spec_", 0) == 0;
    const bool python_ok = log.find("accepted " + name + ".safetensors") != std::string::npos;
    const bool python_refused = log.find("refused " + name + ".safetensors") != std::string::npos;
    REQUIRE(python_ok != python_refused);
    CHECK(python_ok == (expect_ok || spec_only));
    std::string ours;
    try {
      SafetensorsFile::open(dir.file(name + ".safetensors"));
    } catch (const c10::Error& e) {
      ours = e.what_without_backtrace();
    }
    INFO("tp: " << ours);
    CHECK(ours.empty() == expect_ok);
  }
}
