#include "cpu/dense/table.h"

#include <c10/util/Exception.h>

#include <set>
#include <sstream>
#include <tuple>

#include "common/env.h"
#include "common/table_document.h"

namespace tp::cpu {
namespace {

constexpr DenseBackend kAt = DenseBackend::kAtLinear;
constexpr DenseBackend kGemv = DenseBackend::kGemv;
constexpr DenseBackend kPanels = DenseBackend::kPanels;
constexpr DenseBackend kOneDnn = DenseBackend::kOneDnn;
constexpr DenseBackend kTiles = DenseBackend::kBf16Tiles;

// The built-in rows, one per kind of machine and problem. Every figure behind them is in
// benchmarks/RESULTS.md, "The dense CPU GEMM's built-in table" (tp-cpu-gemm-bench on
// Sapphire / Emerald Rapids and Zen 4 VMs, natively and capped to AVX2). The rules
// they follow:
// - gemv (one streaming pass over W) for decode; where a packed copy is kept and the
//   panels kernel wins from M = 2 (float32 on Intel, bf16 without bf16 arithmetic on
//   AMD) gemv at M = 1 only, and bf16 without it on Intel not at all;
// - then the panels kernel, to M = 64 on Intel and at every M on AMD (MKL's SGEMM
//   trails there at every M); past it at::linear (float32) or bf16_tiles (bfloat16
//   without bf16 arithmetic, where ATen's bf16 GEMM is 2-6x slower than float32);
// - bf16 arithmetic worth taking (AMX; AMD's AVX512_BF16): gemv to M = 4, oneDNN's
//   packed weight above (on Intel AMX from M = 5 since 2026-12-03, where it had been
//   at::linear to M = 16);
// - with no packed copy allowed (TP_CPU_GEMM_PACK=0): gemv to M = 16 (W blocks reused
//   from L2) and at every M on AMD's float32, then at::linear or bf16_tiles.
// MKL's packed SGEMM is in no row (the panels kernel beats it wherever it was); it
// stays for forcing and comparison.
DenseTable make_builtin() {
  DenseTable t;
  auto add = [&](const char* vendor, at::ScalarType dtype, bool bf16_arithmetic, bool packs,
                 std::vector<DenseRule> rules) {
    DenseTableEntry e;
    e.vendor = vendor;
    e.dtype = dtype;
    e.bf16_arithmetic = bf16_arithmetic;
    e.packs = packs;
    e.rules = std::move(rules);
    t.entries.push_back(std::move(e));
  };
  const auto f32 = at::kFloat, bf16 = at::kBFloat16;
  add("intel", f32, false, true, {{1, kGemv}, {64, kPanels}, {-1, kAt}});
  add("intel", f32, false, false, {{16, kGemv}, {-1, kAt}});
  add("amd", f32, false, true, {{4, kGemv}, {-1, kPanels}});
  add("amd", f32, false, false, {{-1, kGemv}});
  add("intel", bf16, true, true, {{4, kGemv}, {-1, kOneDnn}});
  add("intel", bf16, true, false, {{4, kGemv}, {-1, kAt}});
  add("amd", bf16, true, true, {{4, kGemv}, {-1, kOneDnn}});
  add("amd", bf16, true, false, {{4, kGemv}, {-1, kAt}});
  add("intel", bf16, false, true, {{64, kPanels}, {-1, kTiles}});
  add("intel", bf16, false, false, {{16, kGemv}, {-1, kTiles}});
  add("amd", bf16, false, true, {{1, kGemv}, {-1, kPanels}});
  add("amd", bf16, false, false, {{16, kGemv}, {-1, kTiles}});
  // The quantized kernels' crossovers, measured on the Zen 4 VM by tp-cpu-gemm-bench
  // --crossovers (benchmarks/RESULTS.md, 2026-12-07, "issue 47, part 5"). Intel without AMX
  // was not measured: it takes the same bf16_dot and the W8A8 value first estimated (12).
  for (const char* vendor : {"intel", "amd"}) {
    t.crossovers.push_back({vendor, "any", Crossover::kBf16Dot, 5, {}});
    t.crossovers.push_back({vendor, "any", Crossover::kW8a8Panels, std::string(vendor) == "amd" ? 13 : 12, {}});
  }
  t.validate();
  return t;
}

std::tuple<std::string, std::string, int> key_of(const CrossoverEntry& e) {
  return {e.vendor, e.isa, static_cast<int>(e.crossover)};
}

std::tuple<std::string, std::string, int, bool, bool> key_of(const DenseTableEntry& e) {
  return {e.vendor, e.isa, static_cast<int>(e.dtype), e.bf16_arithmetic, e.packs};
}

std::string describe(const DenseTableEntry& e) {
  return "(" + e.vendor + ", " + e.isa + ", " + dtype_name(e.dtype) +
         (e.dtype == at::kBFloat16 ? (e.bf16_arithmetic ? ", bf16 arithmetic" : ", no bf16 arithmetic") : "") +
         (e.packs ? ", packs" : ", no packs") + ")";
}

bool parse_bool(detail::JsonReader& in, const std::string& where) {
  if (in.consume_literal("true")) return true;
  if (in.consume_literal("false")) return false;
  in.fail_here(where + " must be true or false");
}

DenseRule parse_rule(detail::JsonReader& in, const std::string& where) {
  DenseRule rule;
  bool have_max = false, have_backend = false;
  in.expect('{');
  if (in.peek() == '}') detail::fail(where, ": empty rule (expected max_m and backend)");
  do {
    const std::string key = in.string();
    in.expect(':');
    if (key == "max_m") {
      have_max = true;
      rule.max_m = in.consume_literal("null") ? -1 : static_cast<int64_t>(in.uint(where + ".max_m"));
    } else if (key == "backend") {
      have_backend = true;
      const std::string name = in.string();
      try {
        rule.backend = parse_dense_backend(name);
      } catch (const c10::Error& e) {
        detail::fail(where, ".backend: ", e.what_without_backtrace());
      }
    } else {
      detail::fail(where, ": unknown key \"", key, "\" (expected max_m and backend)");
    }
  } while (in.next_or_close('}'));
  if (!have_max) detail::fail(where, ": missing \"max_m\" (a row count, or null for no limit)");
  if (!have_backend) detail::fail(where, ": missing \"backend\"");
  return rule;
}

// One entry of either kind: a crossover when it has "crossover", a backend rule list else.
void parse_entry(detail::JsonReader& in, const std::string& where, DenseTable& table) {
  DenseTableEntry e;
  CrossoverEntry c;
  std::set<std::string> have;
  in.expect('{');
  if (in.peek() == '}') detail::fail(where, ": empty entry (expected vendor, isa, dtype, packs and rules)");
  do {
    const std::string key = in.string();
    in.expect(':');
    have.insert(key);
    if (key == "vendor") {
      e.vendor = c.vendor = in.string();
    } else if (key == "isa") {
      e.isa = c.isa = in.string();
    } else if (key == "dtype") {
      const std::string d = in.string();
      if (d == "float32") {
        e.dtype = at::kFloat;
      } else if (d == "bfloat16") {
        e.dtype = at::kBFloat16;
      } else {
        detail::fail(where, ".dtype \"", d, "\": expected float32 or bfloat16");
      }
    } else if (key == "bf16_arithmetic") {
      e.bf16_arithmetic = parse_bool(in, where + ".bf16_arithmetic");
    } else if (key == "packs") {
      e.packs = parse_bool(in, where + ".packs");
    } else if (key == "rules") {
      in.expect('[');
      if (in.peek() == ']') {
        in.expect(']');
      } else {
        do {
          e.rules.push_back(parse_rule(in, where + ".rules[" + std::to_string(e.rules.size()) + "]"));
        } while (in.next_or_close(']'));
      }
    } else if (key == "crossover") {
      const std::string name = in.string();
      try {
        c.crossover = parse_crossover(name);
      } catch (const c10::Error& err) {
        detail::fail(where, ".crossover: ", err.what_without_backtrace());
      }
    } else if (key == "min_m") {
      c.min_m = static_cast<int64_t>(in.uint(where + ".min_m"));
    } else if (key == "measured_ms") {
      in.skip_value(0);  // informational
    } else {
      detail::fail(where, ": unknown key \"", key,
                   "\" (expected vendor, isa, dtype, bf16_arithmetic, packs, rules, measured_ms; or vendor, isa, "
                   "crossover, min_m)");
    }
  } while (in.next_or_close('}'));
  if (have.count("crossover")) {
    for (const char* dense : {"dtype", "bf16_arithmetic", "packs", "rules"})
      if (have.count(dense)) detail::fail(where, ": \"", dense, "\" in a crossover entry");
    for (const char* required : {"vendor", "min_m"})
      if (!have.count(required)) detail::fail(where, ": missing \"", required, "\"");
    table.crossovers.push_back(std::move(c));
    return;
  }
  if (have.count("min_m")) detail::fail(where, ": \"min_m\" without \"crossover\"");
  for (const char* required : {"vendor", "dtype", "packs", "rules"})
    if (!have.count(required)) detail::fail(where, ": missing \"", required, "\"");
  table.entries.push_back(std::move(e));
}

}  // namespace

const char* vendor_name(bool amd) { return amd ? "amd" : "intel"; }

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "other";
}

DenseBackend DenseTableEntry::backend_for(int64_t m) const {
  for (const DenseRule& r : rules)
    if (r.max_m < 0 || m <= r.max_m) return r.backend;
  return kAt;  // unreachable for a validated entry (its last rule has no limit)
}

const DenseTable& DenseTable::builtin() {
  static const DenseTable table = make_builtin();
  return table;
}

const DenseTable& DenseTable::active() {
  static const DenseTable table = [] {
    const auto path = detail::env_value("TP_CPU_GEMM_TABLE");
    return path ? load(*path) : builtin();
  }();
  return table;
}

DenseTable DenseTable::parse(const std::string& json, const std::string& source) {
  DenseTable t;
  t.source = source;
  try {
    detail::read_table_document(json, "CPU GEMM table", "tp-cpu-gemm-table",
                                [&](detail::JsonReader& in, const std::string& where) { parse_entry(in, where, t); });
  } catch (const detail::FormatError& e) {
    TORCH_CHECK_VALUE(false, "CPU GEMM table ", source, ": ", e.what());
  }
  t.validate();
  return t;
}

DenseTable DenseTable::load(const std::string& path) {
  return parse(detail::read_table_file(path, "CPU GEMM table",
                                       "check TP_CPU_GEMM_TABLE; write one with tp-cpu-gemm-bench --tune " + path),
               path);
}

void DenseTable::validate() const {
  TORCH_CHECK_VALUE(!entries.empty(), "CPU GEMM table ", source, ": no entries");
  std::set<std::tuple<std::string, std::string, int>> crossovers_seen;
  for (size_t i = 0; i < crossovers.size(); ++i) {
    const CrossoverEntry& c = crossovers[i];
    const std::string where = "crossover " + std::string(to_string(c.crossover)) + " (" + c.vendor + ", " + c.isa + ")";
    const auto fail = [&](const auto&... what) { TORCH_CHECK_VALUE(false, "CPU GEMM table ", source, ": ", what...); };
    if (c.vendor != "intel" && c.vendor != "amd") fail(where, ": vendor \"", c.vendor, "\"; expected intel or amd");
    if (c.isa != "any" && c.isa != "avx2" && c.isa != "avx512")
      fail(where, ": isa \"", c.isa, "\"; expected avx2, avx512 or any");
    if (c.min_m < 1) fail(where, ": min_m ", c.min_m, " must be at least 1");
    if (!crossovers_seen.insert(key_of(c)).second) fail(where, " appears twice");
  }
  std::set<std::tuple<std::string, std::string, int, bool, bool>> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const DenseTableEntry& e = entries[i];
    const std::string where = "entries[" + std::to_string(i) + "] " + describe(e);
    const auto fail = [&](const auto&... what) { TORCH_CHECK_VALUE(false, "CPU GEMM table ", source, ": ", what...); };
    if (e.vendor != "intel" && e.vendor != "amd") fail(where, ": vendor \"", e.vendor, "\"; expected intel or amd");
    if (e.isa != "any" && e.isa != "avx2" && e.isa != "avx512")
      fail(where, ": isa \"", e.isa, "\"; expected avx2, avx512 or any");
    if (e.dtype != at::kFloat && e.dtype != at::kBFloat16) fail(where, ": dtype must be float32 or bfloat16");
    if (e.bf16_arithmetic && e.dtype != at::kBFloat16) fail(where, ": bf16_arithmetic is for bfloat16 entries only");
    if (!seen.insert(key_of(e)).second) fail(where, " appears twice");
    if (e.rules.empty()) fail(where, ": rules is empty");
    for (size_t k = 0; k < e.rules.size(); ++k) {
      const DenseRule& r = e.rules[k];
      const bool last = k + 1 == e.rules.size();
      if (!last && r.max_m < 0)
        fail(where, ".rules[", k, "]: max_m null (no limit) must be the last rule; ", e.rules.size() - k - 1,
             " rule(s) follow it");
      if (last && r.max_m >= 0)
        fail(where, ".rules[", k, "]: the last rule must have max_m null (no limit), not ", r.max_m,
             ", so that every M has a backend");
      if (k > 0 && !last && r.max_m <= e.rules[k - 1].max_m)
        fail(where, ".rules[", k, "]: max_m ", r.max_m, " must be larger than the previous rule's ",
             e.rules[k - 1].max_m);
      if (!e.packs && (r.backend == kPanels || r.backend == kOneDnn || r.backend == DenseBackend::kMklPacked))
        fail(where, ".rules[", k, "]: ", to_string(r.backend),
             " keeps a packed copy of W, but this entry is for packs false (TP_CPU_GEMM_PACK=0)");
    }
  }
}

const DenseTableEntry* DenseTable::find(const DenseProblem& p) const {
  const DenseTableEntry* any = nullptr;
  const bool bf16_arithmetic = p.dtype == at::kBFloat16 && p.bf16_arithmetic();
  for (const DenseTableEntry& e : entries) {
    if (e.vendor != vendor_name(p.amd) || e.dtype != p.dtype || e.bf16_arithmetic != bf16_arithmetic ||
        e.packs != p.allow_packs)
      continue;
    if (e.isa == to_string(p.isa)) return &e;
    if (e.isa == "any") any = &e;
  }
  return any;
}

DenseBackend DenseTable::select(const DenseProblem& p) const {
  if (p.dtype != at::kFloat && p.dtype != at::kBFloat16) return kAt;
  // The portable ISA (TP_CPU_ISA=scalar, or a CPU without AVX2): ATen's own choice.
  if (p.isa == Isa::kScalar) return kAt;
  const DenseTableEntry* e = find(p);
  if (e == nullptr) return kAt;
  const DenseBackend b = e->backend_for(p.m);
  return dense_supports(b, p) ? b : kAt;
}

void DenseTable::put(CrossoverEntry e) {
  for (auto& old : crossovers) {
    if (key_of(old) == key_of(e)) {
      old = std::move(e);
      return;
    }
  }
  crossovers.push_back(std::move(e));
}

int64_t DenseTable::crossover_min_m(Crossover c, bool amd, Isa isa) const {
  int64_t any = -1;
  for (const CrossoverEntry& e : crossovers) {
    if (e.crossover != c || e.vendor != vendor_name(amd)) continue;
    if (e.isa == to_string(isa)) return e.min_m;
    if (e.isa == "any") any = e.min_m;
  }
  return any;
}

void DenseTable::put(DenseTableEntry e) {
  for (auto& old : entries) {
    if (key_of(old) == key_of(e)) {
      old = std::move(e);
      return;
    }
  }
  entries.push_back(std::move(e));
}

std::string DenseTable::to_json(const std::string& note) const {
  std::ostringstream out;
  detail::write_table_head(out, "tp-cpu-gemm-table", note);
  for (size_t i = 0; i < entries.size(); ++i) {
    const DenseTableEntry& e = entries[i];
    out << (i ? "," : "") << "\n    {\"vendor\": " << detail::json_quoted(e.vendor)
        << ", \"isa\": " << detail::json_quoted(e.isa) << ", \"dtype\": \"" << dtype_name(e.dtype)
        << "\", \"bf16_arithmetic\": " << (e.bf16_arithmetic ? "true" : "false")
        << ", \"packs\": " << (e.packs ? "true" : "false") << ",\n     \"rules\": [";
    for (size_t k = 0; k < e.rules.size(); ++k) {
      out << (k ? ", " : "")
          << "{\"max_m\": " << (e.rules[k].max_m < 0 ? std::string("null") : std::to_string(e.rules[k].max_m))
          << ", \"backend\": \"" << to_string(e.rules[k].backend) << "\"}";
    }
    out << "]";
    detail::write_measured(out, "measured_ms", e.measured_ms, "%.4f");
    out << "}";
  }
  for (const CrossoverEntry& c : crossovers) {
    out << ",\n    {\"vendor\": " << detail::json_quoted(c.vendor) << ", \"isa\": " << detail::json_quoted(c.isa)
        << ", \"crossover\": \"" << to_string(c.crossover) << "\", \"min_m\": " << c.min_m;
    detail::write_measured(out, "measured_ms", c.measured_ms, "%.4f");
    out << "}";
  }
  out << "\n  ]\n}\n";
  return out.str();
}

}  // namespace tp::cpu
