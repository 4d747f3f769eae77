#include "models/json_value.h"

#include <cstdlib>

#include "common/json_reader.h"

namespace tp::detail {
namespace {

JsonValue parse_value(JsonReader& in, const std::string& text, int depth) {
  if (depth > kMaxJsonDepth) in.fail_here("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  JsonValue v;
  const char c = in.peek();
  if (c == '{') {
    v.kind = JsonValue::Kind::kObject;
    in.expect('{');
    if (in.peek() == '}') {
      in.expect('}');
      return v;
    }
    do {
      std::string key = in.string();
      in.expect(':');
      v.members.emplace_back(std::move(key), parse_value(in, text, depth + 1));
    } while (in.next_or_close('}'));
  } else if (c == '[') {
    v.kind = JsonValue::Kind::kArray;
    in.expect('[');
    if (in.peek() == ']') {
      in.expect(']');
      return v;
    }
    do v.items.push_back(parse_value(in, text, depth + 1));
    while (in.next_or_close(']'));
  } else if (c == '"') {
    v.kind = JsonValue::Kind::kString;
    v.text = in.string();
  } else if (in.consume_literal("true") || in.consume_literal("false")) {
    v.kind = JsonValue::Kind::kBool;
    v.boolean = c == 't';
  } else if (in.consume_literal("null")) {
    v.kind = JsonValue::Kind::kNull;
  } else {
    // A number: the reader checks JSON's grammar while skipping it; strtod converts.
    const size_t start = in.pos();
    in.skip_value(depth);
    v.kind = JsonValue::Kind::kNumber;
    v.text = text.substr(start, in.pos() - start);
    v.number = std::strtod(v.text.c_str(), nullptr);
  }
  return v;
}

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, value] : members)
    if (k == key) return &value;
  return nullptr;
}

JsonValue parse_json(const std::string& text, const char* what) {
  JsonReader in(text.data(), text.data() + text.size(), what);
  JsonValue root = parse_value(in, text, 0);
  in.skip_ws();
  if (!in.at_end()) in.fail_here("trailing characters after the JSON value");
  return root;
}

}  // namespace tp::detail
