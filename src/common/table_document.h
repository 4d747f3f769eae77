#pragma once
// The document a tuning table is stored in: the AllReduce table
// (tp/comm/all_reduce_table.h) and the dense CPU GEMM's (cpu/dense/table.h), both
//   {"format": "<name>", "version": 1, "note": "...", "entries": [ ... ]}
// One reader and one writer, so the two refuse the same mistakes in the same words and
// print alike; each table reads and writes its own entries. Errors are FormatError (common/json_reader.h), for the table to
// name its source.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>

#include <c10/util/Exception.h>

#include "common/json_reader.h"

namespace tp::detail {

/// Reads the whole document in `json`, calling parse_entry(in, "entries[i]") once per
/// entry, in order. `format` is the name "format" must have; "note" is skipped; any
/// other key, a missing "format" or "entries", another version or trailing text fails.
template <typename ParseEntry>
void read_table_document(const std::string& json, const char* what, const std::string& format,
                         ParseEntry&& parse_entry) {
  JsonReader in(json.data(), json.data() + json.size(), what);
  bool have_format = false, have_entries = false;
  size_t entries = 0;
  in.expect('{');
  if (in.peek() == '}') {
    in.expect('}');
  } else {
    do {
      const std::string key = in.string();
      in.expect(':');
      if (key == "format") {
        have_format = true;
        const std::string f = in.string();
        if (f != format) fail("\"format\" is \"", f, "\"; expected \"", format, "\"");
      } else if (key == "version") {
        const uint64_t v = in.uint("version");
        if (v != 1) fail("version ", v, " is not supported (this build reads version 1)");
      } else if (key == "note") {
        in.skip_value(0);
      } else if (key == "entries") {
        have_entries = true;
        in.expect('[');
        if (in.peek() == ']') {
          in.expect(']');
        } else {
          do {
            parse_entry(in, "entries[" + std::to_string(entries++) + "]");
          } while (in.next_or_close(']'));
        }
      } else {
        fail("unknown top-level key \"", key, "\" (expected format, version, note, entries)");
      }
    } while (in.next_or_close('}'));
  }
  in.skip_ws();
  if (!in.at_end()) in.fail_here("trailing text after the table");
  if (!have_format) fail("missing \"format\": \"", format, "\"");
  if (!have_entries) fail("missing \"entries\"");
}

/// The bytes of the file at `path`; nullopt when it cannot be opened.
inline std::optional<std::string> read_whole_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file.good()) return std::nullopt;
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// s as a JSON string: quotes and backslashes escaped, control characters dropped.
inline std::string json_quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    q += c;
  }
  return q + "\"";
}

/// The document up to the opening of "entries" (no "note" when it is empty).
inline void write_table_head(std::ostream& out, const std::string& format, const std::string& note) {
  out << "{\n  \"format\": " << json_quoted(format) << ",\n  \"version\": 1,\n";
  if (!note.empty()) out << "  \"note\": " << json_quoted(note) << ",\n";
  out << "  \"entries\": [";
}

/// An entry's informational timings as `,\n     "<key>": {"<size>": {"<name>": t, ...}, ...}`,
/// each time printed by printf's `number_format`; nothing when there are none.
inline void write_measured(std::ostream& out, const char* key,
                           const std::map<int64_t, std::map<std::string, double>>& measured,
                           const char* number_format) {
  if (measured.empty()) return;
  out << ",\n     \"" << key << "\": {";
  bool first = true;
  for (const auto& [size, by_name] : measured) {
    out << (first ? "" : ",") << "\n       \"" << size << "\": {";
    first = false;
    bool first_name = true;
    for (const auto& [name, t] : by_name) {
      char num[64];
      std::snprintf(num, sizeof(num), number_format, t);
      out << (first_name ? "" : ", ") << json_quoted(name) << ": " << num;
      first_name = false;
    }
    out << "}";
  }
  out << "}";
}

/// The table `json` holds: read_table_document with `parse_entry(in, where)` returning
/// each Table entry, then Table::validate(). A malformed document is a c10::ValueError
/// "<what> <source>: <why>".
template <typename Table, typename ParseEntry>
Table parse_table(const std::string& json, const std::string& source, const char* what, const std::string& format,
                  ParseEntry&& parse_entry) {
  Table t;
  t.source = source;
  try {
    read_table_document(json, what, format,
                        [&](JsonReader& in, const std::string& where) { t.entries.push_back(parse_entry(in, where)); });
  } catch (const FormatError& e) {
    TORCH_CHECK_VALUE(false, what, " ", source, ": ", e.what());
  }
  t.validate();
  return t;
}

/// The text of the table file at `path`; a c10::ValueError "<what> <path>: cannot be
/// opened (<hint>)" when it cannot be.
inline std::string read_table_file(const std::string& path, const char* what, const std::string& hint) {
  auto text = read_whole_file(path);
  TORCH_CHECK_VALUE(text.has_value(), what, " ", path, ": cannot be opened (", hint, ")");
  return std::move(*text);
}

}  // namespace tp::detail
