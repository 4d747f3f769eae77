#include "tp/comm/all_reduce_table.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>

#include <c10/util/Exception.h>

#include "common/table_document.h"

namespace tp {
namespace {

constexpr AllReduceStrategy kPg = AllReduceStrategy::kProcessGroup;
constexpr AllReduceStrategy kOne = AllReduceStrategy::kSharedMemoryOneShot;
constexpr AllReduceStrategy kTwo = AllReduceStrategy::kSharedMemoryTwoShot;
constexpr AllReduceStrategy kRd = AllReduceStrategy::kRecursiveDoubling;
constexpr int64_t kKiB = 1024;

bool is_shared_memory(AllReduceStrategy s) { return s == kOne || s == kTwo; }

// The built-in table, from `tp-allreduce-bench --from-env 1 --tune` on the development
// VM (2 hardware threads, AMD EPYC, torch 2.11, 2026-11-30), ranks as processes over
// loopback; benchmarks/RESULTS.md ("AllReduce strategies and the built-in table") has
// the runs. The VM was shared with four other build sessions (load average 7-12 on 2
// threads), so single timings moved by 2x and more; where one run's winner flipped
// against its neighbours and against the other runs, the table keeps the consistent
// choice (noted per entry). A rule's limit is the geometric midpoint between the last
// size its strategy won and the next measured size, as --tune writes it.
AllReduceTable make_builtin() {
  AllReduceTable t;
  t.source = "built-in";
  auto add = [&](int64_t world, bool same_host, std::vector<AllReduceRule> rules) {
    AllReduceTableEntry e;
    e.world_size = world;
    e.same_host = same_host;
    e.rules = std::move(rules);
    t.entries.push_back(std::move(e));
  };
  // Ranks on one host: shared memory at every size (Gloo's loopback ring was 3-60x
  // slower up to 1 MiB). World 2, sizes 1 KiB..64 MiB by 2x: one-shot up to 64 KiB
  // (one synchronisation round), two-shot 128 KiB..1 MiB, one-shot again from 2 MiB
  // (chunked through 2 MiB buffers, one round per chunk beats two on 2 threads).
  add(2, true, {{92681, kOne}, {1482910, kTwo}, {-1, kOne}});
  // World 3, by 4x: one-shot at 1-4 KiB, two-shot 16 KiB..1 MiB, one-shot at 4 MiB;
  // the single 16 MiB sample where Gloo won (33 vs 70 ms) is not followed.
  add(3, true, {{8192, kOne}, {2097152, kTwo}, {-1, kOne}});
  // World 4 (4 processes on 2 threads), by 4x: one-shot at 1-4 KiB, two-shot 16 KiB..
  // 1 MiB, a tie at 4 MiB, one-shot at 16-64 MiB.
  add(4, true, {{8192, kOne}, {8388608, kTwo}, {-1, kOne}});
  // Ranks on several hosts (measured over loopback with distinct TP_COMM_HOST_IDs):
  // at world 2 neither won consistently (both are one exchange), so the process group;
  // at world 4 recursive doubling (2 rounds) took about half of the ring's (6 steps)
  // time up to 64 KiB in two runs, and lost badly beyond (Gloo's point-to-point path
  // pays millisecond-scale waits per round on this VM; see RESULTS.md).
  add(2, false, {{-1, kPg}});
  add(4, false, {{131072, kRd}, {-1, kPg}});
  t.validate();
  return t;
}

/// The FormatError of the JSON reader, as the error a user sees.
AllReduceRule parse_rule(detail::JsonReader& in, const std::string& where) {
  AllReduceRule rule;
  bool have_max = false, have_strategy = false;
  in.expect('{');
  if (in.peek() != '}') {
    do {
      const std::string key = in.string();
      in.expect(':');
      if (key == "max_bytes") {
        have_max = true;
        rule.max_bytes = in.consume_literal("null") ? -1 : static_cast<int64_t>(in.uint(where + ".max_bytes"));
      } else if (key == "strategy") {
        have_strategy = true;
        const std::string name = in.string();
        try {
          rule.strategy = parse_all_reduce_strategy(name);
        } catch (const c10::Error& e) {
          detail::fail(where, ".strategy: ", e.what_without_backtrace());
        }
      } else {
        detail::fail(where, ": unknown key \"", key, "\" (expected max_bytes and strategy)");
      }
    } while (in.next_or_close('}'));
  } else {
    in.expect('}');
  }
  if (!have_max) detail::fail(where, ": missing \"max_bytes\" (a byte count, or null for no limit)");
  if (!have_strategy) detail::fail(where, ": missing \"strategy\"");
  return rule;
}

AllReduceTableEntry parse_entry(detail::JsonReader& in, const std::string& where) {
  AllReduceTableEntry e;
  bool have_world = false, have_same_host = false, have_rules = false;
  in.expect('{');
  if (in.peek() == '}') detail::fail(where, ": empty entry (expected world_size, same_host and rules)");
  do {
    const std::string key = in.string();
    in.expect(':');
    if (key == "device") {
      e.device = in.string();
    } else if (key == "world_size") {
      have_world = true;
      e.world_size = static_cast<int64_t>(in.uint(where + ".world_size"));
    } else if (key == "same_host") {
      have_same_host = true;
      if (in.consume_literal("true")) {
        e.same_host = true;
      } else if (in.consume_literal("false")) {
        e.same_host = false;
      } else {
        in.fail_here(where + ".same_host must be true or false");
      }
    } else if (key == "rules") {
      have_rules = true;
      in.expect('[');
      if (in.peek() == ']') {
        in.expect(']');
      } else {
        do {
          e.rules.push_back(parse_rule(in, where + ".rules[" + std::to_string(e.rules.size()) + "]"));
        } while (in.next_or_close(']'));
      }
    } else if (key == "measured_us") {
      in.skip_value(0);  // informational
    } else {
      detail::fail(where, ": unknown key \"", key, "\" (expected device, world_size, same_host, rules, measured_us)");
    }
  } while (in.next_or_close('}'));
  if (!have_world) detail::fail(where, ": missing \"world_size\"");
  if (!have_same_host) detail::fail(where, ": missing \"same_host\"");
  if (!have_rules) detail::fail(where, ": missing \"rules\"");
  return e;
}

}  // namespace

AllReduceStrategy AllReduceTableEntry::strategy_for(int64_t bytes) const {
  for (const AllReduceRule& r : rules) {
    if (r.max_bytes < 0 || bytes <= r.max_bytes) return r.strategy;
  }
  return kPg;  // unreachable for a validated entry (its last rule has no limit)
}

const AllReduceTable& AllReduceTable::builtin() {
  static const AllReduceTable table = make_builtin();
  return table;
}

AllReduceTable AllReduceTable::parse(const std::string& json, const std::string& source) {
  return detail::parse_table<AllReduceTable>(json, source, "all-reduce table", "tp-allreduce-table", parse_entry);
}

AllReduceTable AllReduceTable::load(const std::string& path) {
  return parse(detail::read_table_file(path, "all-reduce table",
                                       "check CommunicatorOptions::all_reduce_table or TP_ALLREDUCE_TABLE; write one "
                                       "with tp-allreduce-bench --tune " +
                                           path),
               path);
}

void AllReduceTable::validate() const {
  TORCH_CHECK_VALUE(!entries.empty(), "all-reduce table ", source, ": no entries");
  std::set<std::tuple<std::string, int64_t, bool>> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const AllReduceTableEntry& e = entries[i];
    const std::string where = "entries[" + std::to_string(i) + "] (world_size " + std::to_string(e.world_size) +
                              ", same_host " + (e.same_host ? "true" : "false") + ")";
    TORCH_CHECK_VALUE(e.device == "cpu", "all-reduce table ", source, ": ", where, ": device \"", e.device,
                      "\" is not supported; expected \"cpu\" (device tensors take process_group)");
    TORCH_CHECK_VALUE(e.world_size >= 1, "all-reduce table ", source, ": ", where, ": world_size must be at least 1");
    TORCH_CHECK_VALUE(seen.insert({e.device, e.world_size, e.same_host}).second, "all-reduce table ", source, ": ",
                      where, " appears twice");
    TORCH_CHECK_VALUE(!e.rules.empty(), "all-reduce table ", source, ": ", where, ": rules is empty");
    for (size_t k = 0; k < e.rules.size(); ++k) {
      const AllReduceRule& r = e.rules[k];
      const bool last = k + 1 == e.rules.size();
      TORCH_CHECK_VALUE(r.strategy != AllReduceStrategy::kAuto, "all-reduce table ", source, ": ", where, ".rules[", k,
                        "]: strategy \"auto\" is not allowed in a table (name an algorithm)");
      TORCH_CHECK_VALUE(e.same_host || !is_shared_memory(r.strategy), "all-reduce table ", source, ": ", where,
                        ".rules[", k, "]: ", r.strategy,
                        " needs every rank on one host, but this entry is for same_host false");
      TORCH_CHECK_VALUE(last || r.max_bytes >= 0, "all-reduce table ", source, ": ", where, ".rules[", k,
                        "]: max_bytes null (no limit) must be the last rule; ", e.rules.size() - k - 1,
                        " rule(s) follow it");
      TORCH_CHECK_VALUE(!last || r.max_bytes < 0, "all-reduce table ", source, ": ", where, ".rules[", k,
                        "]: the last rule must have max_bytes null (no limit), not ", r.max_bytes,
                        ", so that every size has a strategy");
      TORCH_CHECK_VALUE(k == 0 || last || r.max_bytes > e.rules[k - 1].max_bytes, "all-reduce table ", source, ": ",
                        where, ".rules[", k, "]: max_bytes ", r.max_bytes, " must be larger than the previous rule's ",
                        e.rules[k - 1].max_bytes);
    }
  }
}

const AllReduceTableEntry* AllReduceTable::find(int64_t world, bool same_host) const {
  const AllReduceTableEntry* best = nullptr;  // the largest world <= `world`
  const AllReduceTableEntry* smallest = nullptr;
  for (const AllReduceTableEntry& e : entries) {
    if (e.device != "cpu" || e.same_host != same_host) continue;
    if (e.world_size == world) return &e;
    if (e.world_size < world && (best == nullptr || e.world_size > best->world_size)) best = &e;
    if (smallest == nullptr || e.world_size < smallest->world_size) smallest = &e;
  }
  return best != nullptr ? best : smallest;
}

std::string AllReduceTable::to_json(const std::string& note) const {
  std::ostringstream out;
  detail::write_table_head(out, "tp-allreduce-table", note);
  for (size_t i = 0; i < entries.size(); ++i) {
    const AllReduceTableEntry& e = entries[i];
    out << (i ? "," : "") << "\n    {\"device\": " << detail::json_quoted(e.device)
        << ", \"world_size\": " << e.world_size << ", \"same_host\": " << (e.same_host ? "true" : "false")
        << ",\n     \"rules\": [";
    for (size_t k = 0; k < e.rules.size(); ++k) {
      out << (k ? ", " : "") << "{\"max_bytes\": "
          << (e.rules[k].max_bytes < 0 ? std::string("null") : std::to_string(e.rules[k].max_bytes))
          << ", \"strategy\": \"" << to_string(e.rules[k].strategy) << "\"}";
    }
    out << "]";
    detail::write_measured(out, "measured_us", e.measured_us, "%.2f");
    out << "}";
  }
  out << "\n  ]\n}\n";
  return out.str();
}

}  // namespace tp
