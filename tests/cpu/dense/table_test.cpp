// The dense GEMM's backend table as data (cpu/dense/table.h): the built-in rows survive
// JSON, a file's rows are what the engine reads, and a malformed table is refused with
// a message naming the entry and the rule.

#include "support/tp_catch.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "cpu/dense/gemm.h"
#include "cpu/dense/table.h"
#include "support/loader_test_util.h"

using Catch::Matchers::Contains;
using tp::cpu::DenseBackend;
using tp::cpu::DenseProblem;
using tp::cpu::DenseTable;
using tp::cpu::Isa;

namespace {

// Every kind of problem the table keys on, at the M where the built-in rows change.
std::vector<DenseProblem> problem_grid() {
  std::vector<DenseProblem> out;
  for (const auto isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    for (const bool amd : {false, true})
      for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf})
        for (const bool native : {false, true})
          for (const bool amx : {false, true})
            for (const bool packs : {false, true})
              for (const int64_t m : {1, 2, 4, 5, 16, 17, 64, 65, 4096}) {
                DenseProblem p;
                p.m = m, p.n = 256, p.k = 256, p.dtype = dtype, p.isa = isa, p.amd = amd;
                p.native_bf16 = native && isa == Isa::kAvx512, p.amx_bf16 = amx && p.native_bf16 && !amd;
                p.onednn = true, p.mkl_packed = true, p.allow_packs = packs;
                out.push_back(p);
              }
  return out;
}

std::string entry_json(const std::string& rules, const std::string& key = R"("vendor": "intel", "isa": "avx512",
      "dtype": "float32", "bf16_arithmetic": false, "packs": true)") {
  return R"({"format": "tp-cpu-gemm-table", "version": 1, "entries": [{)" + key + R"(, "rules": [)" + rules + "]}]}";
}

}  // namespace

TEST_CASE("cpu_gemm table: the built-in rows survive JSON and every problem has a backend", "[cpu][cpu_kernels]") {
  const auto& builtin = DenseTable::builtin();
  const auto again = DenseTable::parse(builtin.to_json("a note"), "round trip");
  REQUIRE(again.to_json() == builtin.to_json());
  for (const auto& p : problem_grid()) {
    INFO("m " << p.m << " dtype " << p.dtype << " isa " << tp::cpu::to_string(p.isa) << " amd " << p.amd << " packs "
              << p.allow_packs << " bf16 arithmetic " << p.bf16_arithmetic());
    const auto b = builtin.select(p);
    REQUIRE(again.select(p) == b);
    REQUIRE(b == tp::cpu::select_dense_backend(p));
    REQUIRE(tp::cpu::dense_supports(b, p));
    if (p.dtype == at::kHalf || p.isa == Isa::kScalar) REQUIRE(b == DenseBackend::kAtLinear);
    if (p.dtype != at::kHalf && p.isa != Isa::kScalar) REQUIRE(builtin.find(p) != nullptr);
  }
}

TEST_CASE("cpu_gemm table: a file's rows are the choice, and the ISA's own entry wins over any", "[cpu][cpu_kernels]") {
  const std::string json = R"({"format": "tp-cpu-gemm-table", "version": 1, "note": "hand-written",
    "entries": [
      {"vendor": "intel", "isa": "any", "dtype": "float32", "packs": true,
       "rules": [{"max_m": 8, "backend": "onednn"}, {"max_m": null, "backend": "mkl_packed"}]},
      {"vendor": "intel", "isa": "avx2", "dtype": "float32", "packs": true,
       "rules": [{"max_m": null, "backend": "gemv"}]}]})";
  const auto t = DenseTable::parse(json, "hand-written");
  DenseProblem p;
  p.n = p.k = 64, p.dtype = at::kFloat, p.onednn = true, p.mkl_packed = true, p.isa = Isa::kAvx512;
  p.m = 8;
  REQUIRE(t.select(p) == DenseBackend::kOneDnn);
  p.m = 9;
  REQUIRE(t.select(p) == DenseBackend::kMklPacked);
  p.mkl_packed = false;  // a backend that cannot run here falls back to at::linear
  REQUIRE(t.select(p) == DenseBackend::kAtLinear);
  p.isa = Isa::kAvx2;
  REQUIRE(t.select(p) == DenseBackend::kGemv);
  p.amd = true;  // no entry for AMD in this table: at::linear
  REQUIRE(t.find(p) == nullptr);
  REQUIRE(t.select(p) == DenseBackend::kAtLinear);

  // Through a file, as TP_CPU_GEMM_TABLE reads it.
  const tp::test::TempDir dir;
  const std::string path = dir.file("dense_table.json");
  tp::test::write_bytes(path, json);
  REQUIRE(DenseTable::load(path).to_json() == t.to_json());
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(DenseTable::load(path), Contains("cannot be opened") && Contains("TP_CPU_GEMM_TABLE") &&
                                                  Contains("tp-cpu-gemm-bench --tune"));
}

TEST_CASE("cpu_gemm table: a malformed table is refused, naming the entry and the rule", "[cpu][cpu_kernels]") {
  const auto refused = [](const std::string& json) {
    try {
      DenseTable::parse(json, "t.json");
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    FAIL("accepted: " << json);
    return std::string();
  };
  CHECK_THAT(refused(entry_json(R"({"max_m": 4, "backend": "gemv"})")),
             Contains("t.json") && Contains("rules[0]") && Contains("max_m null"));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv"}, {"max_m": null, "backend": "panels"})")),
             Contains("must be the last rule"));
  CHECK_THAT(
      refused(entry_json(
          R"({"max_m": 8, "backend": "gemv"}, {"max_m": 8, "backend": "panels"}, {"max_m": null, "backend": "gemv"})")),
      Contains("rules[1]") && Contains("must be larger"));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "fastest"})")),
             Contains("rules[0].backend") && Contains("unknown CPU GEMM backend 'fastest'"));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "panels"})", R"("vendor": "amd", "isa": "any",
      "dtype": "float32", "packs": false)")),
             Contains("panels keeps a packed copy") && Contains("packs false"));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv"})", R"("vendor": "via", "isa": "any",
      "dtype": "float32", "packs": true)")),
             Contains("vendor \"via\""));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv"})", R"("vendor": "intel", "isa": "any",
      "dtype": "float32", "bf16_arithmetic": true, "packs": true)")),
             Contains("bf16_arithmetic is for bfloat16"));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv"})", R"("vendor": "intel", "isa": "any",
      "dtype": "float16", "packs": true)")),
             Contains("dtype \"float16\""));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv"})", R"("vendor": "intel", "dtype": "float32")")),
             Contains("missing \"packs\""));
  CHECK_THAT(refused(entry_json(R"({"max_m": null, "backend": "gemv", "speed": 1})")),
             Contains("unknown key \"speed\""));
  CHECK_THAT(refused(R"({"format": "tp-allreduce-table", "version": 1, "entries": []})"),
             Contains("expected \"tp-cpu-gemm-table\""));
  CHECK_THAT(refused(R"({"format": "tp-cpu-gemm-table", "version": 2, "entries": []})"), Contains("version 2"));
  const std::string one = R"({"vendor": "intel", "isa": "any", "dtype": "float32", "packs": true,
      "rules": [{"max_m": null, "backend": "gemv"}]})";
  CHECK_THAT(refused(R"({"format": "tp-cpu-gemm-table", "version": 1, "entries": [)" + one + "," + one + "]}"),
             Contains("appears twice"));
}

TEST_CASE("cpu_gemm table: the quantized kernels' crossovers are rows of it, by vendor and ISA", "[cpu][cpu_kernels]") {
  using tp::cpu::Crossover;
  // Built in: every vendor has both, at every ISA, and they survive JSON (the first case's
  // round trip covers the written form).
  for (const bool amd : {false, true})
    for (const auto isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      CHECK(DenseTable::builtin().crossover_min_m(Crossover::kBf16Dot, amd, isa) == 5);
      CHECK(DenseTable::builtin().crossover_min_m(Crossover::kW8a8Panels, amd, isa) == (amd ? 13 : 12));
    }
  const std::string dense = R"({"vendor": "amd", "isa": "any", "dtype": "float32", "packs": true,
      "rules": [{"max_m": null, "backend": "gemv"}]})";
  const auto table = [&](const std::string& crossovers) {
    return R"({"format": "tp-cpu-gemm-table", "version": 1, "entries": [)" + dense + crossovers + "]}";
  };
  const auto t = DenseTable::parse(table(R"(,
      {"vendor": "amd", "isa": "any", "crossover": "bf16_dot", "min_m": 3},
      {"vendor": "amd", "isa": "avx512", "crossover": "bf16_dot", "min_m": 9, "measured_ms": {"4": {"below": 1.0}}},
      {"vendor": "intel", "isa": "any", "crossover": "w8a8_panels", "min_m": 20})"),
                                   "hand-written");
  CHECK(t.crossover_min_m(Crossover::kBf16Dot, true, Isa::kAvx512) == 9);  // the ISA's own
  CHECK(t.crossover_min_m(Crossover::kBf16Dot, true, Isa::kAvx2) == 3);    // else any
  CHECK(t.crossover_min_m(Crossover::kBf16Dot, false, Isa::kAvx512) == -1);
  CHECK(t.crossover_min_m(Crossover::kW8a8Panels, false, Isa::kAvx512) == 20);
  CHECK(t.crossover_min_m(Crossover::kW8a8Panels, true, Isa::kAvx512) == -1);
  CHECK(DenseTable::parse(t.to_json(), "again").to_json() == t.to_json());
  auto put = t;
  put.put({"amd", "avx512", Crossover::kBf16Dot, 7, {}});
  CHECK(put.crossovers.size() == t.crossovers.size());
  CHECK(put.crossover_min_m(Crossover::kBf16Dot, true, Isa::kAvx512) == 7);

  const auto refused = [&](const std::string& crossovers) {
    try {
      DenseTable::parse(table(crossovers), "t.json");
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    FAIL("accepted: " << crossovers);
    return std::string();
  };
  CHECK_THAT(refused(R"(, {"vendor": "amd", "crossover": "fastest", "min_m": 3})"),
             Contains("t.json") && Contains("unknown crossover \"fastest\""));
  CHECK_THAT(refused(R"(, {"vendor": "amd", "crossover": "bf16_dot", "min_m": 0})"),
             Contains("bf16_dot") && Contains("min_m 0 must be at least 1"));
  CHECK_THAT(refused(R"(, {"vendor": "amd", "crossover": "bf16_dot"})"), Contains("missing \"min_m\""));
  CHECK_THAT(refused(R"(, {"vendor": "amd", "crossover": "bf16_dot", "min_m": 3, "dtype": "float32"})"),
             Contains("\"dtype\" in a crossover entry"));
  CHECK_THAT(refused(R"(, {"vendor": "amd", "isa": "any", "dtype": "float32", "packs": true, "min_m": 3,
      "rules": [{"max_m": null, "backend": "gemv"}]})"),
             Contains("\"min_m\" without \"crossover\""));
  CHECK_THAT(refused(R"(, {"vendor": "amd", "crossover": "bf16_dot", "min_m": 3},
      {"vendor": "amd", "isa": "any", "crossover": "bf16_dot", "min_m": 4})"),
             Contains("crossover bf16_dot (amd, any) appears twice"));
}

TEST_CASE("ScopedCrossover sets the crossover the kernels read while it lives", "[cpu][cpu_kernels]") {
  using tp::cpu::Crossover;
  const int64_t before = tp::cpu::crossover_min_m(Crossover::kBf16Dot);
  {
    const tp::cpu::ScopedCrossover forced(Crossover::kBf16Dot, 1);
    CHECK(tp::cpu::crossover_min_m(Crossover::kBf16Dot) == 1);
    {
      const tp::cpu::ScopedCrossover nested(Crossover::kBf16Dot, 40);
      CHECK(tp::cpu::crossover_min_m(Crossover::kBf16Dot) == 40);
    }
    CHECK(tp::cpu::crossover_min_m(Crossover::kBf16Dot) == 1);
    CHECK(tp::cpu::crossover_min_m(Crossover::kW8a8Panels) ==
          DenseTable::active().crossover_min_m(Crossover::kW8a8Panels, tp::cpu::features().amd, tp::cpu::isa()));
  }
  CHECK(tp::cpu::crossover_min_m(Crossover::kBf16Dot) == before);
  CHECK_THROWS_WITH(tp::cpu::ScopedCrossover(Crossover::kBf16Dot, 0), Contains("at least 1"));
  CHECK(tp::cpu::crossover_min_m(Crossover::kBf16Dot) == before);
}
