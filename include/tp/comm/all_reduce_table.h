#pragma once
// The tuning table kAuto reads: for a kind of group (device, world size, ranks on one
// host), which all-reduce strategy to take up to which message size.
//
// A calibration run (`tp-allreduce-bench --tune FILE`) measures every strategy on
// the group at hand and writes one; a communicator loads it from
// CommunicatorOptions::all_reduce_table or TP_ALLREDUCE_TABLE. Without one, the
// built-in table (measured on the development machine) applies.
//
// JSON layout (unknown keys are errors, except the informational ones noted):
//   {
//     "format": "tp-allreduce-table", "version": 1,
//     "note": "...",                                   (informational, optional)
//     "entries": [
//       { "device": "cpu", "world_size": 2, "same_host": true,
//         "rules": [ {"max_bytes": 131072, "strategy": "shm_one_shot"},
//                    {"max_bytes": null,   "strategy": "shm_two_shot"} ],
//         "measured_us": { ... } }                     (informational, optional)
//     ]
//   }
// A rule covers messages of at most max_bytes bytes (the tensor as handed in) not
// covered by an earlier rule; null means no limit and must end the list.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tp/comm/all_reduce_strategy.h"

namespace tp {

/// Messages up to `max_bytes` (inclusive; -1: no limit) not taken by an earlier rule.
struct AllReduceRule {
  int64_t max_bytes = -1;
  AllReduceStrategy strategy = AllReduceStrategy::kProcessGroup;
};

/// The rules for one kind of group.
struct AllReduceTableEntry {
  std::string device = "cpu";  ///< only "cpu" for now (device tensors take process_group)
  int64_t world_size = 2;
  bool same_host = true;  ///< shared-memory strategies only where this is true
  std::vector<AllReduceRule> rules;
  /// Informational: the calibration's median microseconds per message size (bytes)
  /// and strategy name, written by to_json; load() skips it.
  std::map<int64_t, std::map<std::string, double>> measured_us;

  /// The strategy for a message of `bytes` bytes.
  AllReduceStrategy strategy_for(int64_t bytes) const;
};

/// A tuning table: entries for several world sizes and topologies.
/// Example: auto table = tp::AllReduceTable::load("allreduce.json");
struct AllReduceTable {
  std::vector<AllReduceTableEntry> entries;
  /// Where it came from ("built-in", or the file), for error messages and logs.
  std::string source = "built-in";

  /// The table built from measurements on the development VM (see the comment in
  /// src/comm/all_reduce/table.cpp for the numbers).
  static const AllReduceTable& builtin();
  /// Reads and validates a JSON table; errors name the file and what is wrong.
  static AllReduceTable load(const std::string& path);
  /// Parses JSON text; `source` names it in errors.
  static AllReduceTable parse(const std::string& json, const std::string& source);
  /// Throws c10::ValueError naming `source` unless every entry is well formed: a known
  /// device, world_size >= 1, no duplicate (device, world_size, same_host), rules with
  /// strictly increasing max_bytes ending in one without a limit, no "auto", and no
  /// shared-memory strategy where same_host is false.
  void validate() const;

  /// The entry for (cpu, world, same_host): that world size if present, else the
  /// largest smaller one, else the smallest; nullptr when none has that same_host.
  const AllReduceTableEntry* find(int64_t world, bool same_host) const;

  /// JSON in the layout above; `note` (if any) goes into "note".
  std::string to_json(const std::string& note = "") const;
};

}  // namespace tp
