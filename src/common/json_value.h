#pragma once
// JsonValue: a parsed JSON document, for files read as a whole (a model's
// config.json). Built on JsonReader (strict grammar, bounded nesting, byte offsets in
// errors); no torch. Objects keep their members in file order; a duplicate key is an
// error (RFC 8259 leaves it open, and a silently dropped duplicate is a wrong value).

#include <cstdint>
#include <string>
#include <vector>

#include "common/json_reader.h"

namespace tp::detail {

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  /// Parses one JSON value spanning [begin, end) (whitespace around it allowed);
  /// FormatError naming `what` and the byte offset otherwise.
  static JsonValue parse(const char* begin, const char* end, const char* what);
  static JsonValue parse(const std::string& text, const char* what) {
    return parse(text.data(), text.data() + text.size(), what);
  }

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  /// The value; FormatError if it is of another kind. `what` names it in the message.
  bool as_bool(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  double as_double(const std::string& what) const;
  /// An integral number that fits int64 ("128", also "128.0" and "1e3"); else FormatError.
  int64_t as_int(const std::string& what) const;
  const std::vector<JsonValue>& as_array(const std::string& what) const;

  /// Object members in file order (keys()[i] holds values()[i]); FormatError if not an object.
  const std::vector<std::string>& keys(const std::string& what) const;
  const std::vector<JsonValue>& values(const std::string& what) const;
  /// The member `key` of an object, or nullptr when absent (or when this is not an object).
  const JsonValue* find(const std::string& key) const;

  /// The value as JSON text (numbers as written), for messages.
  std::string dump() const;
  /// "null", "a boolean", "a number", "a string", "an array", "an object".
  static const char* kind_name(Kind kind);

 private:
  static JsonValue read(JsonReader& in, int depth);

  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string text_;  // a string's value, or a number's text
  std::vector<JsonValue> items_;
  std::vector<std::string> keys_;
};

}  // namespace tp::detail
