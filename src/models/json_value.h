#pragma once
// A JSON document as a tree, over common/json_reader.h's strict reader: enough for
// config.json (interim, until tp::ModelConfig reads it).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tp::detail {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;     // kString; kNumber: the literal as written
  std::vector<JsonValue> items;                         // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in file order

  bool is_null() const { return kind == Kind::kNull; }
  /// The member `key` of an object, or nullptr (also for a non-object).
  const JsonValue* find(const std::string& key) const;
};

/// Parses `text`; a FormatError (from json_reader.h) names `what` and the byte offset.
JsonValue parse_json(const std::string& text, const char* what);

}  // namespace tp::detail
