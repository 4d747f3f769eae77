#pragma once
// JsonReader: a small, strict, bounded JSON reader for the safetensors header and
// index, the all-reduce tuning table and (through JsonValue, common/json_value.h) a
// model's config.json (no torch, so the fuzz target builds without it).
// Recursion is limited to kMaxJsonDepth; every read is bounds-checked; errors are
// FormatError with the byte offset.

#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include <stdexcept>

namespace tp::detail {

/// Malformed input (JSON, or what a caller reads from it). The message names the
/// offending value and the byte offset.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Nesting allowed in skipped values (an index's "metadata").
constexpr int kMaxJsonDepth = 64;

/// Throws FormatError with the arguments streamed together.
template <typename... Args>
[[noreturn]] inline void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw FormatError(os.str());
}

/// The length (1 to 4) of the well-formed UTF-8 sequence that starts at p[0], n bytes
/// available; 0 if there is none there. Well-formed as RFC 3629 (and Rust's
/// str::from_utf8) define it: no overlong forms, no surrogates (U+D800..U+DFFF),
/// nothing past U+10FFFF, no missing or stray continuation bytes.
inline size_t utf8_sequence(const unsigned char* p, size_t n) {
  if (n == 0) return 0;
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong below U+10000
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong ASCII) or F5..FF
  }
  if (n < len || p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  }
  return len;
}

/// The offset of the first byte of the first ill-formed UTF-8 sequence in [p, p + n),
/// or n when all of it is well-formed.
inline size_t first_invalid_utf8(const char* p, size_t n) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  size_t i = 0;
  while (i < n) {
    const size_t len = utf8_sequence(u + i, n - i);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

// Recursive descent over [p_, end_). Every read is bounds-checked; positions in
// messages are byte offsets, counted from `base` at the text's first byte (the text's
// offset in its file, so that messages give file offsets). Strings must be
// well-formed UTF-8, as JSON text must be (RFC 8259); escapes must not produce
// surrogate halves.
class JsonReader {
 public:
  JsonReader(const char* begin, const char* end, const char* what, size_t base = 0)
      : begin_(begin), p_(begin), end_(end), what_(what), base_(base) {}

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool at_end() const { return p_ >= end_; }
  size_t pos() const { return base_ + static_cast<size_t>(p_ - begin_); }
  char peek() {
    skip_ws();
    if (p_ >= end_) fail_here("unexpected end of the JSON text");
    return *p_;
  }
  void expect(char c) {
    if (peek() != c) fail_here(std::string("expected '") + c + "', found " + found());
    ++p_;
  }
  // After an object member or array element: true on ',', false on `close`.
  bool next_or_close(char close) {
    const char c = peek();
    ++p_;
    if (c == ',') return true;
    if (c == close) return false;
    --p_;
    fail_here(std::string("expected ',' or '") + close + "', found " + found());
  }
  bool consume_literal(const char* lit) {
    skip_ws();
    const size_t n = std::strlen(lit);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, lit, n) != 0) return false;
    p_ += n;
    return true;
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (p_ >= end_) fail_here("unterminated string");
      const unsigned char c = static_cast<unsigned char>(*p_++);
      if (c == '"') return out;
      if (c < 0x20) fail_here("control character in a string (it must be escaped)");
      if (c >= 0x80) {
        --p_;
        const size_t len = utf8_sequence(reinterpret_cast<const unsigned char*>(p_), static_cast<size_t>(end_ - p_));
        if (len == 0) fail_here("invalid UTF-8 in a string (" + bytes_here(4) + "); JSON text must be UTF-8");
        out.append(p_, len);
        p_ += len;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (p_ >= end_) fail_here("unterminated escape in a string");
      const char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, code_point()); break;
        default: --p_; fail_here(std::string("invalid escape '\\") + e + "' in a string");
      }
    }
  }

  // A non-negative integer that fits int64 (shapes, offsets): no sign, fraction or exponent.
  uint64_t uint(const std::string& field) {
    skip_ws();
    const char* start = p_;
    uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const uint64_t digit = static_cast<uint64_t>(*p_ - '0');
      if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10)
        fail_here(field + " does not fit in a signed 64-bit integer");
      v = v * 10 + digit;
      ++p_;
    }
    if (p_ == start) fail_here(field + " must be a non-negative integer, found " + found());
    if (p_ - start > 1 && *start == '0') fail_here(field + " has a leading zero");
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) fail_here(field + " must be an integer");
    return v;
  }

  // A JSON number's text, checked against JSON's grammar (for callers that convert it).
  std::string number_text() {
    const char c = peek();
    if (c != '-' && (c < '0' || c > '9')) fail_here("expected a number, found " + found());
    const char* start = p_;
    number();
    return std::string(start, p_);
  }

  // Any JSON value, checked and discarded.
  void skip_value(int depth) {
    if (depth > kMaxJsonDepth) fail_here("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    const char c = peek();
    if (c == '"') {
      string();
    } else if (c == '{') {
      ++p_;
      if (peek() == '}') {
        ++p_;
        return;
      }
      do {
        string();
        expect(':');
        skip_value(depth + 1);
      } while (next_or_close('}'));
    } else if (c == '[') {
      ++p_;
      if (peek() == ']') {
        ++p_;
        return;
      }
      do skip_value(depth + 1);
      while (next_or_close(']'));
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number();
    } else if (!consume_literal("true") && !consume_literal("false") && !consume_literal("null")) {
      fail_here("expected a JSON value, found " + found());
    }
  }

  [[noreturn]] void fail_here(const std::string& msg) const {
    fail("invalid JSON in the ", what_, " at byte ", pos(), ": ", msg);
  }

 private:
  std::string found() const {
    if (p_ >= end_) return "the end of the text";
    const unsigned char c = static_cast<unsigned char>(*p_);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    return "byte " + std::to_string(c);
  }

  // Up to `n` bytes from here, in hex ("bytes 0xc0 0xaf").
  std::string bytes_here(size_t n) const {
    static const char* hex = "0123456789abcdef";
    std::string out = "bytes";
    for (const char* q = p_; q < end_ && q < p_ + n; ++q) {
      const auto b = static_cast<unsigned char>(*q);
      if (q > p_ && (b < 0x80 || b > 0xBF)) break;  // past the sequence
      out += std::string(" 0x") + hex[b >> 4] + hex[b & 15];
    }
    return out;
  }

  uint32_t hex4() {
    if (end_ - p_ < 4) fail_here("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = *p_++;
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<uint32_t>(h - 'A' + 10);
      else
        fail_here("invalid hex digit in a \\u escape");
    }
    return v;
  }

  uint32_t code_point() {
    const uint32_t hi = hex4();
    if (hi >= 0xDC00 && hi <= 0xDFFF) fail_here("lone low surrogate in a \\u escape");
    if (hi < 0xD800 || hi > 0xDBFF) return hi;
    if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') fail_here("high surrogate without its low half");
    p_ += 2;
    const uint32_t lo = hex4();
    if (lo < 0xDC00 || lo > 0xDFFF) fail_here("high surrogate followed by a non-surrogate");
    return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  void number() {
    auto digits = [&] {
      const char* s = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == s) fail_here("malformed number");
      return p_ - s;
    };
    if (*p_ == '-') ++p_;
    const char* int_start = p_;
    if (digits() > 1 && *int_start == '0') fail_here("number with a leading zero");
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      digits();
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      digits();
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const char* what_;
  size_t base_;
};

}  // namespace tp::detail
