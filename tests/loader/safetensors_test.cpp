// SafetensorsFile, the writer and open_checkpoint: round trips of every dtype,
// slices against at::narrow, sharded folders, and every kind of broken file.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cstring>

#include "support/loader_test_util.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors.h"
#include "tp/loader/safetensors_writer.h"

using namespace tp;
using Catch::Contains;
using test::bit_equal;
using test::random_tensor;
using test::TempDir;

namespace {

const at::ScalarType kAllDtypes[] = {at::kDouble, at::kFloat, at::kHalf,          at::kBFloat16,
                                     at::kLong,   at::kInt,   at::kShort,         at::kChar,
                                     at::kByte,   at::kBool,  at::kFloat8_e4m3fn, at::kFloat8_e5m2};

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.back() = last;
  return shape;
}

// A file from a raw header string and data bytes (for broken files).
std::string raw_file(const std::string& header, const std::string& data, int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

}  // namespace

TEST_CASE("safetensors round trip is bit-exact for every dtype", "[loader]") {
  TempDir dir;
  std::map<std::string, at::Tensor> tensors;
  uint64_t seed = 100;
  for (auto dtype : kAllDtypes) {
    const std::string name = std::string("t.") + c10::toString(dtype);
    tensors[name + ".matrix"] = random_tensor({5, 7}, dtype, ++seed);
    tensors[name + ".cube"] = random_tensor({2, 3, 4}, dtype, ++seed);
    tensors[name + ".scalar"] = random_tensor({}, dtype, ++seed);
    tensors[name + ".empty"] = random_tensor({0, 3}, dtype, ++seed);
  }
  const auto path = dir.file("all.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"note", "quote \" and \\ and \n"}});
  const auto file = SafetensorsFile::open(path);
  CHECK(file.metadata().at("format") == "pt");
  CHECK(file.metadata().at("note") == "quote \" and \\ and \n");
  REQUIRE(file.names().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO("tensor " << name << " dtype " << t.scalar_type() << " shape " << t.sizes());
    const auto source = file.source(name);
    CHECK(source->dtype() == t.scalar_type());
    CHECK(source->shape() == t.sizes().vec());
    CHECK(bit_equal(source->read_all(), t));
  }
  // Every tensor's data is 8-byte aligned (header padded), as the Python package does.
  const auto bytes = test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);
}

TEST_CASE("safetensors slices equal at::narrow of the whole tensor, along every dim", "[loader]") {
  TempDir dir;
  const auto path = dir.file("s.safetensors");
  std::map<std::string, at::Tensor> tensors;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kFloat8_e4m3fn, at::kLong}) {
    tensors[std::string("w.") + c10::toString(dtype)] = random_tensor({9, 6, 5}, dtype, 7);
  }
  save_safetensors(path, tensors);
  const auto file = SafetensorsFile::open(path);
  for (const auto& [name, t] : tensors) {
    const auto src = file.source(name);
    for (int64_t dim = 0; dim < 3; ++dim) {
      for (const Range r : {Range{0, t.size(dim)}, Range{1, 3}, Range{2, 2}, Range{t.size(dim) - 1, t.size(dim)}}) {
        INFO(name << " dim " << dim << " range " << r);
        const auto got = src->read(dim, r);
        CHECK(got.is_contiguous());
        CHECK(got.storage().nbytes() == static_cast<size_t>(got.numel()) * got.element_size());
        CHECK(bit_equal(got, t.narrow(dim, r.begin, r.size())));
      }
    }
    REQUIRE_THROWS_WITH(src->read(1, {4, 7}), Contains(name) && Contains("[4,7)"));
  }
}

TEST_CASE("read_into writes read()'s slice into its destination, converting the dtype, along every dim", "[loader]") {
  TempDir dir;
  const auto path = dir.file("into.safetensors");
  std::map<std::string, at::Tensor> tensors;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    tensors[std::string("w.") + c10::toString(dtype)] = random_tensor({9, 6, 5}, dtype, 11);
    // An odd element count before the next tensor: its bytes may sit off their alignment.
    tensors[std::string("odd.") + c10::toString(dtype)] = random_tensor({3}, dtype, 12);
  }
  tensors["w.Long"] = random_tensor({9, 6, 5}, at::kLong, 13);
  save_safetensors(path, tensors);
  const auto file = SafetensorsFile::open(path);
  for (const auto& [name, t] : tensors) {
    const auto src = file.source(name);
    const InMemorySource mem(name, t);
    for (int64_t dim = 0; dim < t.dim(); ++dim) {
      for (const Range r : {Range{0, t.size(dim)}, Range{1, 3}, Range{2, 2}, Range{t.size(dim) - 1, t.size(dim)}}) {
        const auto want = t.narrow(dim, r.begin, r.size());
        for (auto to : {t.scalar_type(), at::kFloat, at::kDouble}) {
          INFO(name << " dim " << dim << " range " << r << " into " << to);
          // A contiguous destination (the direct path), and a strided one (read, then copy).
          at::Tensor flat = at::full(want.sizes(), 7, at::TensorOptions().dtype(to));
          src->read_into(dim, r, flat);
          CHECK(bit_equal(flat, want.to(to)));
          at::Tensor wide = at::full(with_last(want.sizes().vec(), 2 * want.size(-1)), 7, flat.options());
          at::Tensor strided = wide.narrow(-1, 0, want.size(-1));
          src->read_into(dim, r, strided);
          CHECK(bit_equal(strided.contiguous(), want.to(to)));
          CHECK(wide.narrow(-1, want.size(-1), want.size(-1)).eq(7).all().item<bool>());
          at::Tensor via_default = at::full(want.sizes(), 7, flat.options());
          mem.read_into(dim, r, via_default);
          CHECK(bit_equal(via_default, want.to(to)));
        }
      }
    }
    auto bad_shape = t.sizes().vec();
    bad_shape[0] += 1;
    REQUIRE_THROWS_WITH(src->read_into(0, {0, t.size(0)}, at::empty(bad_shape, t.options())),
                        Contains(name) && Contains("destination"));
  }
}

TEST_CASE(
    "safetensors regions equal the narrowed whole tensor, read or written into place, and the in-memory and default "
    "readers agree",
    "[loader]") {
  TempDir dir;
  const auto path = dir.file("r.safetensors");
  std::map<std::string, at::Tensor> tensors;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kByte}) {
    tensors[std::string("w.") + c10::toString(dtype)] = random_tensor({5, 6, 4, 3}, dtype, 11);
  }
  save_safetensors(path, tensors);
  const auto file = SafetensorsFile::open(path);
  // A source that only has read(): TensorSource's default read_region.
  struct ReadOnly final : TensorSource {
    std::shared_ptr<const TensorSource> inner;
    const std::string& name() const override { return inner->name(); }
    std::vector<int64_t> shape() const override { return inner->shape(); }
    at::ScalarType dtype() const override { return inner->dtype(); }
    at::Tensor read(int64_t dim, Range range) const override { return inner->read(dim, range); }
  };
  const std::vector<std::vector<Range>> regions{
      {{0, 5}, {0, 6}, {0, 4}, {0, 3}},  // whole
      {{2, 3}, {1, 4}, {0, 4}, {0, 3}},  // one expert's rows: one contiguous run
      {{1, 4}, {0, 6}, {1, 3}, {0, 3}},  // a cut inside: strided runs
      {{4, 5}, {5, 6}, {3, 4}, {2, 3}},  // one element
      {{0, 5}, {2, 2}, {0, 4}, {0, 3}},  // empty
      {{3, 4}, {0, 6}, {0, 4}, {1, 2}},  // the last dim cut: runs of one element
  };
  for (const auto& [name, t] : tensors) {
    const auto src = file.source(name);
    const InMemorySource mem(name, t);
    ReadOnly plain;
    plain.inner = src;
    for (const auto& region : regions) {
      at::Tensor want = t;
      for (size_t d = 0; d < region.size(); ++d)
        want = want.narrow(static_cast<int64_t>(d), region[d].begin, region[d].size());
      INFO(name << " region " << region[0] << region[1] << region[2] << region[3]);
      for (const TensorSource* s : {static_cast<const TensorSource*>(src.get()), static_cast<const TensorSource*>(&mem),
                                    static_cast<const TensorSource*>(&plain)}) {
        const auto got = s->read_region(region);
        CHECK(got.is_contiguous());
        CHECK(got.storage().nbytes() == static_cast<size_t>(got.numel()) * got.element_size());
        CHECK(bit_equal(got, want));
        // read_region_into: into a contiguous destination of the dtype (the file's bytes
        // straight in), a view of a larger tensor, and another dtype (converted).
        const at::Tensor into = at::full(want.sizes(), 7, want.options());
        const auto version = into._version();
        s->read_region_into(region, into);
        CHECK(bit_equal(into, want));
        CHECK(into._version() > version);  // an in-place write, as LoadSession sees it
        const at::Tensor wide =
            at::full({want.size(0), want.size(1) + 2, want.size(2), want.size(3)}, 7, want.options());
        s->read_region_into(region, wide.narrow(1, 1, want.size(1)));
        CHECK(bit_equal(wide.narrow(1, 1, want.size(1)), want));
        CHECK(bit_equal(wide.narrow(1, 0, 1), at::full_like(wide.narrow(1, 0, 1), 7)));
        const at::Tensor as_double = at::empty(want.sizes(), want.options().dtype(at::kDouble));
        s->read_region_into(region, as_double);
        CHECK(bit_equal(as_double, want.to(at::kDouble)));
        // A transposed destination (the layout of experts stored [in, out]).
        const at::Tensor transposed =
            at::full({want.size(3), want.size(2), want.size(1), want.size(0)}, 7, want.options());
        s->read_region_into(region, transposed.permute({3, 2, 1, 0}));
        CHECK(bit_equal(transposed.permute({3, 2, 1, 0}), want));
        // view_region: the box's values, every other row of it too (an interleaved part),
        // and for the file a view of its mapping (no copy of the box).
        const at::Tensor view = s->view_region(region);
        CHECK(bit_equal(view, want));
        if (want.size(1) > 1) CHECK(bit_equal(view.slice(1, 1, want.size(1), 2), want.slice(1, 1, want.size(1), 2)));
        if (s == src.get() && want.numel() > 0) {  // the box at its place in one mapping, the tensor's strides
          const at::Tensor whole = s->view_region(regions[0]);
          int64_t offset = 0;
          for (size_t d = 0; d < region.size(); ++d) offset += region[d].begin * t.stride(static_cast<int64_t>(d));
          CHECK(static_cast<const char*>(view.data_ptr()) ==
                static_cast<const char*>(whole.data_ptr()) + offset * t.element_size());
          CHECK(view.strides() == t.strides());
        }
      }
    }
    REQUIRE_THROWS_WITH(src->read_region_into({{0, 5}, {0, 6}, {0, 4}, {0, 3}}, at::empty({5, 6, 4, 2}, t.options())),
                        Contains(name) && Contains("destination"));
    REQUIRE_THROWS_WITH(src->read_region({{0, 5}, {0, 7}, {0, 4}, {0, 3}}), Contains(name) && Contains("[0,7)"));
    REQUIRE_THROWS_WITH(src->read_region({{0, 5}, {0, 6}}), Contains(name) && Contains("one per dimension"));
  }
}

TEST_CASE("a safetensors source keeps its file mapped after the file object is gone", "[loader]") {
  TempDir dir;
  const auto w = random_tensor({4, 4}, at::kFloat, 1);
  save_safetensors(dir.file("a.safetensors"), {{"w", w}});
  std::shared_ptr<const TensorSource> src;
  { src = SafetensorsFile::open(dir.file("a.safetensors")).source("w"); }
  CHECK(bit_equal(src->read(0, {1, 3}), w.narrow(0, 1, 2)));
}

TEST_CASE("open_checkpoint reads a sharded folder, a single-file folder and a file", "[loader]") {
  TempDir dir;
  std::map<std::string, at::Tensor> tensors;
  for (int i = 0; i < 6; ++i)
    tensors["model.layers." + std::to_string(i) + ".w"] = random_tensor({16, 8}, at::kHalf, i);
  // 256 bytes per tensor, at most 600 per file: 3 files of 2 tensors.
  CHECK(save_sharded_safetensors(dir.str(), tensors, 600) == 3);
  CHECK(test::file_exists(dir.file("model-00003-of-00003.safetensors")));
  const auto sharded = open_checkpoint(dir.str());
  CHECK(sharded.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    CHECK(bit_equal(sharded.get(name).read(0, {3, 9}), t.narrow(0, 3, 6)));
  }
  TempDir single;
  save_safetensors(single.file("model.safetensors"), tensors);
  CHECK(open_checkpoint(single.str()).size() == tensors.size());
  CHECK(bit_equal(open_checkpoint(single.file("model.safetensors")).get("model.layers.2.w").read_all(),
                  tensors["model.layers.2.w"]));
  TempDir empty;
  REQUIRE_THROWS_WITH(open_checkpoint(empty.str()), Contains("neither model.safetensors.index.json nor"));
}

TEST_CASE("a sharded index naming a missing file or tensor is an error naming both", "[loader]") {
  TempDir dir;
  save_safetensors(dir.file("part1.safetensors"), {{"a", random_tensor({2}, at::kFloat, 1)}});
  test::write_bytes(
      dir.file("model.safetensors.index.json"),
      R"({"metadata": {"total_size": 8}, "weight_map": {"a": "part1.safetensors", "b": "part2.safetensors"}})");
  REQUIRE_THROWS_WITH(open_checkpoint(dir.str()),
                      Contains("'b'") && Contains("part2.safetensors") && Contains("does not exist"));
  test::write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"c": "part1.safetensors"}})");
  REQUIRE_THROWS_WITH(open_checkpoint(dir.str()),
                      Contains("'c'") && Contains("part1.safetensors") && Contains("has no such tensor"));
  test::write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"c": "../part1.safetensors"}})");
  REQUIRE_THROWS_WITH(open_checkpoint(dir.str()), Contains("not a plain file name"));
  test::write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"c": )");
  REQUIRE_THROWS_WITH(open_checkpoint(dir.str()), Contains("model.safetensors.index.json") && Contains("invalid JSON"));
}

TEST_CASE("a broken safetensors file is an error naming the file, the tensor and the numbers", "[loader]") {
  TempDir dir;
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<std::string> expect;
  };
  const std::string w16 = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::vector<Case> cases = {
      {"truncated inside the length", std::string("\x10\x00\x00", 3), {"3 bytes", "8-byte header length"}},
      {"truncated data",
       raw_file(w16, std::string(10, '\0')),
       {"'w'", "data_offsets [0, 16]", "data section of 10 bytes", "truncated"}},
      {"header length past the end",
       raw_file(w16, std::string(16, '\0'), 4096),
       {"header length 4096", "past the end of the file"}},
      {"absurd header length", raw_file("{}", "", int64_t{1} << 60), {"header length 1152921504606846976", "cap"}},
      {"invalid JSON",
       raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16})", std::string(16, '\0')),
       {"invalid JSON", "at byte"}},
      {"unknown dtype",
       raw_file(R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", std::string(1, '\0')),
       {"'w'", "unknown dtype 'F4'", "BF16"}},
      {"offsets out of range",
       raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", std::string(16, '\0')),
       {"'w'", "[8, 24]", "16 bytes"}},
      {"offsets end before begin",
       raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", std::string(16, '\0')),
       {"'w'", "[8, 4]"}},
      {"overlapping tensors",
       raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           std::string(12, '\0')),
       {"'a' [0, 8)", "'b' [4, 12)", "overlap"}},
      {"size not shape x dtype",
       raw_file(R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,16]}})", std::string(16, '\0')),
       {"'w'", "16 bytes", "[3, 2]", "needs 12"}},
      {"negative dim",
       raw_file(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", std::string(16, '\0')),
       {"'w' shape[0]", "non-negative integer"}},
      {"numel overflow",
       raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", ""),
       {"'w'", "overflows"}},
      {"duplicate tensor",
       raw_file(
           R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
           "ab"),
       {"'w' appears twice"}},
      {"unknown key with an invalid value",
       raw_file(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[1,}}})", "a"),
       {"invalid JSON"}},
      {"header starting with a space",
       raw_file(R"( {"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a"),
       {"must start with '{'"}},
      {"missing key", raw_file(R"({"w":{"dtype":"U8","shape":[1]}})", "a"), {"'w' is missing \"data_offsets\""}},
  };
  for (const auto& c : cases) {
    INFO("case: " << c.what);
    const auto path = dir.file("bad.safetensors");
    test::write_bytes(path, c.bytes);
    try {
      SafetensorsFile::open(path);
      FAIL("no error for " << c.what);
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      INFO("message: " << msg);
      CHECK_THAT(msg, Contains("'" + path + "'"));
      for (const auto& s : c.expect) CHECK_THAT(msg, Contains(s));
    }
  }
  REQUIRE_THROWS_WITH(SafetensorsFile::open(dir.file("nope.safetensors")),
                      Contains("nope.safetensors") && Contains("No such file"));
}

TEST_CASE("a missing tensor, or one whose shape does not fit the layer, is an error naming it", "[loader]") {
  TempDir dir;
  const auto path = dir.file("m.safetensors");
  save_safetensors(path, {{"fc.weight", random_tensor({6, 5}, at::kFloat, 3)}});
  const auto file = SafetensorsFile::open(path);
  REQUIRE_THROWS_WITH(file.source("fc.bias"), Contains(path) && Contains("no tensor 'fc.bias'"));
  const auto ckpt = open_checkpoint(path);
  ColumnParallelLinear wrong(ColumnParallelLinearOptions(4, 6).bias(false));
  REQUIRE_THROWS_WITH(wrong->load_weights(ckpt, "fc"),
                      Contains("'fc.weight'") && Contains("[6, 5]") && Contains("expected [6, 4]"));
  ColumnParallelLinear with_bias(ColumnParallelLinearOptions(5, 6));
  REQUIRE_THROWS_WITH(with_bias->load_weights(ckpt, "fc"), Contains("no tensor 'fc.bias'"));
  ColumnParallelLinear right(ColumnParallelLinearOptions(5, 6).bias(false));
  right->load_weights(ckpt, "fc");
  CHECK(at::equal(right->weight, ckpt.get("fc.weight").read_all()));
}
