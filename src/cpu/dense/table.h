#pragma once
// The table the dense GEMM engine picks its backend from: for a kind of machine and
// problem (vendor, ISA, dtype, whether bf16 arithmetic is worth taking, whether a packed
// copy of W may be kept), which backend up to which M. Data, not code: printable
// (to_json), replaceable (TP_CPU_GEMM_TABLE=FILE), and written for the machine at hand
// by the bench that measures it (`tp-cpu-gemm-bench --tune FILE`). The built-in rows
// are the measurements of benchmarks/RESULTS.md ("The dense CPU GEMM's built-in
// table"); TP_CPU_GEMM forces one backend past any table.
//
// JSON layout (unknown keys are errors, "note" and "measured_ms" are informational):
//   {
//     "format": "tp-cpu-gemm-table", "version": 1, "note": "...",
//     "entries": [
//       { "vendor": "intel", "isa": "any", "dtype": "float32",
//         "bf16_arithmetic": false, "packs": true,
//         "rules": [ {"max_m": 1, "backend": "gemv"}, {"max_m": 64, "backend": "panels"},
//                    {"max_m": null, "backend": "at_linear"} ] }
//     ]
//   }
// A rule covers the M of at most max_m not covered by an earlier rule; null means no
// limit and must end the list. An entry for the ISA in use wins over one for "any".
// The same list holds the quantized kernels' crossovers (cpu/crossovers.h), one entry each:
//       { "vendor": "amd", "isa": "avx512", "crossover": "bf16_dot", "min_m": 5 }
// A table without one for this machine takes the built-in table's.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cpu/crossovers.h"
#include "cpu/dense/gemm.h"

namespace tp::cpu {

/// Problems of up to `max_m` rows (-1: no limit) not taken by an earlier rule.
struct DenseRule {
  int64_t max_m = -1;
  DenseBackend backend = DenseBackend::kAtLinear;
};

/// The rules for one kind of machine and problem.
struct DenseTableEntry {
  std::string vendor = "intel";  ///< "intel" (every non-AMD CPU) or "amd"
  std::string isa = "any";       ///< "avx2", "avx512" or "any"
  at::ScalarType dtype = at::kFloat;
  bool bf16_arithmetic = false;  ///< DenseProblem::bf16_arithmetic (bfloat16 entries only)
  bool packs = true;             ///< DenseProblem::allow_packs
  std::vector<DenseRule> rules;
  /// Informational: --tune's median milliseconds per M and backend (summed over its
  /// shapes), written by to_json; parse() skips it.
  std::map<int64_t, std::map<std::string, double>> measured_ms;

  DenseBackend backend_for(int64_t m) const;
};

/// From how many rows of x one quantized path takes over (cpu/crossovers.h), for a kind
/// of machine.
struct CrossoverEntry {
  std::string vendor = "intel";  ///< "intel" or "amd"
  std::string isa = "any";       ///< "avx2", "avx512" or "any"
  Crossover crossover = Crossover::kBf16Dot;
  int64_t min_m = 1;
  /// Informational: --tune's median milliseconds per M for each side ("below", "from").
  std::map<int64_t, std::map<std::string, double>> measured_ms;
};

struct DenseTable {
  std::vector<DenseTableEntry> entries;
  std::vector<CrossoverEntry> crossovers;
  std::string source = "built-in";  ///< for error messages

  /// The rows measured for tp (benchmarks/RESULTS.md); every kind of problem has one.
  static const DenseTable& builtin();
  /// TP_CPU_GEMM_TABLE's file when set (read once), else builtin().
  static const DenseTable& active();
  static DenseTable load(const std::string& path);
  static DenseTable parse(const std::string& json, const std::string& source);
  /// c10::ValueError naming `source` unless every entry is well formed: known vendor,
  /// ISA and dtype (float32 or bfloat16), bf16_arithmetic only for bfloat16, no
  /// duplicate key, rules with strictly increasing max_m ending in one without a limit.
  void validate() const;

  /// The entry for p (the ISA's own, else "any"); nullptr when the table has none.
  const DenseTableEntry* find(const DenseProblem& p) const;
  /// The backend for p: at_linear outside float32 / bfloat16 and on the portable ISA
  /// (ATen's own choice there), the entry's rule else, at_linear where that backend
  /// cannot run p (dense_supports) or the table has no entry for p.
  DenseBackend select(const DenseProblem& p) const;
  /// Replaces the entry with e's key, or adds e.
  void put(DenseTableEntry e);
  void put(CrossoverEntry e);
  /// `c`'s min_m for this vendor and ISA (the ISA's own entry, else "any"); -1 when the
  /// table has none.
  int64_t crossover_min_m(Crossover c, bool amd, Isa isa) const;

  std::string to_json(const std::string& note = "") const;
};

/// The table key's spellings: "intel" / "amd" for p.amd; to_string(p.isa); "float32" / "bfloat16".
const char* vendor_name(bool amd);
const char* dtype_name(at::ScalarType dtype);

}  // namespace tp::cpu
