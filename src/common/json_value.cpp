#include "common/json_value.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

namespace tp::detail {

namespace {

[[noreturn]] void wrong_kind(const std::string& what, JsonValue::Kind expected, const JsonValue& got) {
  fail(what, " must be ", JsonValue::kind_name(expected), "; found ", got.dump());
}

void append_quoted(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xF];
      out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

const char* JsonValue::kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNull: return "null";
    case Kind::kBool: return "a boolean";
    case Kind::kNumber: return "a number";
    case Kind::kString: return "a string";
    case Kind::kArray: return "an array";
    case Kind::kObject: return "an object";
  }
  return "?";
}

JsonValue JsonValue::parse(const char* begin, const char* end, const char* what) {
  JsonReader in(begin, end, what);
  JsonValue v = read(in, 0);
  in.skip_ws();
  if (!in.at_end()) in.fail_here("text after the JSON value");
  return v;
}

JsonValue JsonValue::read(JsonReader& in, int depth) {
  if (depth > kMaxJsonDepth) in.fail_here("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  JsonValue v;
  const char c = in.peek();
  if (c == '"') {
    v.kind_ = Kind::kString;
    v.text_ = in.string();
  } else if (c == '{') {
    v.kind_ = Kind::kObject;
    in.expect('{');
    if (in.peek() == '}') {
      in.expect('}');
      return v;
    }
    do {
      const size_t at = in.pos();
      std::string key = in.string();
      for (const auto& k : v.keys_) {
        if (k == key) fail("invalid JSON: duplicate key \"", key, "\" at byte ", at);
      }
      in.expect(':');
      v.keys_.push_back(std::move(key));
      v.items_.push_back(read(in, depth + 1));
    } while (in.next_or_close('}'));
  } else if (c == '[') {
    v.kind_ = Kind::kArray;
    in.expect('[');
    if (in.peek() == ']') {
      in.expect(']');
      return v;
    }
    do v.items_.push_back(read(in, depth + 1));
    while (in.next_or_close(']'));
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    v.kind_ = Kind::kNumber;
    v.text_ = in.number_text();
  } else if (in.consume_literal("true")) {
    v.kind_ = Kind::kBool;
    v.bool_ = true;
  } else if (in.consume_literal("false")) {
    v.kind_ = Kind::kBool;
  } else if (in.consume_literal("null")) {
    v.kind_ = Kind::kNull;
  } else {
    in.fail_here("expected a JSON value");
  }
  return v;
}

bool JsonValue::as_bool(const std::string& what) const {
  if (kind_ != Kind::kBool) wrong_kind(what, Kind::kBool, *this);
  return bool_;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  if (kind_ != Kind::kString) wrong_kind(what, Kind::kString, *this);
  return text_;
}

double JsonValue::as_double(const std::string& what) const {
  if (kind_ != Kind::kNumber) wrong_kind(what, Kind::kNumber, *this);
  double d = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), d);
  if (r.ec == std::errc::result_out_of_range || !std::isfinite(d)) fail(what, " = ", text_, " is out of range");
  if (r.ec != std::errc() || r.ptr != text_.data() + text_.size()) fail(what, " = ", text_, " is not a number");
  return d;
}

int64_t JsonValue::as_int(const std::string& what) const {
  if (kind_ != Kind::kNumber) wrong_kind(what, Kind::kNumber, *this);
  int64_t i = 0;
  const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), i);
  if (r.ec == std::errc() && r.ptr == text_.data() + text_.size()) return i;
  // "128.0", "1e3": integral values written as floating point.
  const double d = as_double(what);
  if (std::floor(d) != d || std::fabs(d) > 9007199254740992.0) fail(what, " must be an integer; found ", text_);
  return static_cast<int64_t>(d);
}

const std::vector<JsonValue>& JsonValue::as_array(const std::string& what) const {
  if (kind_ != Kind::kArray) wrong_kind(what, Kind::kArray, *this);
  return items_;
}

const std::vector<std::string>& JsonValue::keys(const std::string& what) const {
  if (kind_ != Kind::kObject) wrong_kind(what, Kind::kObject, *this);
  return keys_;
}

const std::vector<JsonValue>& JsonValue::values(const std::string& what) const {
  if (kind_ != Kind::kObject) wrong_kind(what, Kind::kObject, *this);
  return items_;
}

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return &items_[i];
  }
  return nullptr;
}

std::string JsonValue::dump() const {
  std::string out;
  switch (kind_) {
    case Kind::kNull: return "null";
    case Kind::kBool: return bool_ ? "true" : "false";
    case Kind::kNumber: return text_;
    case Kind::kString: append_quoted(out, text_); return out;
    case Kind::kArray:
      out = "[";
      for (size_t i = 0; i < items_.size(); ++i) out += (i ? ", " : "") + items_[i].dump();
      return out + "]";
    case Kind::kObject:
      out = "{";
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += ", ";
        append_quoted(out, keys_[i]);
        out += ": " + items_[i].dump();
      }
      return out + "}";
  }
  return out;
}

}  // namespace tp::detail
