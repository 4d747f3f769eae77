// A small, strict JSON reader for exactly what safetensors needs, and the format's
// validation. Hand-written rather than a JSON library so that the code a hostile
// file reaches is short, bounded (no recursion past kMaxDepth, nothing allocated
// beyond the input's size) and fuzzed as one unit (tests/fuzz).

#include "loader/safetensors_format.h"

#include "common/json_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

namespace tp::detail {
namespace {

struct DtypeInfo {
  StDtype dtype;
  const char* name;
  int64_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::kF64, "F64", 8},   {StDtype::kF32, "F32", 4},        {StDtype::kF16, "F16", 2},
    {StDtype::kBF16, "BF16", 2}, {StDtype::kI64, "I64", 8},        {StDtype::kI32, "I32", 4},
    {StDtype::kI16, "I16", 2},   {StDtype::kI8, "I8", 1},          {StDtype::kU64, "U64", 8},
    {StDtype::kU32, "U32", 4},   {StDtype::kU16, "U16", 2},        {StDtype::kU8, "U8", 1},
    {StDtype::kBool, "BOOL", 1}, {StDtype::kF8E4M3, "F8_E4M3", 1}, {StDtype::kF8E5M2, "F8_E5M2", 1},
};

// A name as it appears in a message: quoted, control bytes escaped, long names cut.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

// {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}: each key exactly once. Other
// keys are skipped, as the official reader does (its entry type ignores unknown fields).
StEntry parse_entry(JsonReader& in, std::string name) {
  StEntry entry;
  entry.name = std::move(name);
  const std::string who = "tensor " + quoted(entry.name);
  bool have_dtype = false, have_shape = false, have_offsets = false;
  in.expect('{');
  if (in.peek() == '}') in.fail_here(who + " has an empty entry; it needs dtype, shape and data_offsets");
  do {
    const std::string key = in.string();
    in.expect(':');
    if (key == "dtype") {
      if (have_dtype) in.fail_here(who + " has two \"dtype\" keys");
      have_dtype = true;
      const std::string dtype = in.string();
      if (!st_dtype_from_name(dtype, &entry.dtype)) {
        std::string known;
        for (const auto& d : kDtypes) known += std::string(known.empty() ? "" : ", ") + d.name;
        fail(who, " has unknown dtype ", quoted(dtype), " (supported: ", known, ")");
      }
    } else if (key == "shape") {
      if (have_shape) in.fail_here(who + " has two \"shape\" keys");
      have_shape = true;
      in.expect('[');
      if (in.peek() == ']') {
        in.expect(']');  // 0-d: a scalar
      } else {
        do {
          entry.shape.push_back(
              static_cast<int64_t>(in.uint(who + " shape[" + std::to_string(entry.shape.size()) + "]")));
        } while (in.next_or_close(']'));
      }
    } else if (key == "data_offsets") {
      if (have_offsets) in.fail_here(who + " has two \"data_offsets\" keys");
      have_offsets = true;
      in.expect('[');
      entry.begin = in.uint(who + " data_offsets[0]");
      in.expect(',');
      entry.end = in.uint(who + " data_offsets[1]");
      in.expect(']');
    } else {
      in.skip_value(0);
    }
  } while (in.next_or_close('}'));
  if (!have_dtype || !have_shape || !have_offsets)
    fail(who, " is missing ", !have_dtype ? "\"dtype\"" : !have_shape ? "\"shape\"" : "\"data_offsets\"");
  return entry;
}

// The entry's size against its offsets and the data section.
void check_entry(const StEntry& e, uint64_t data_size) {
  const std::string who = "tensor " + quoted(e.name);
  int64_t numel = 1;
  for (size_t i = 0; i < e.shape.size(); ++i) {
    if (__builtin_mul_overflow(numel, e.shape[i], &numel)) fail(who, ": the number of elements overflows 64 bits");
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, st_dtype_size(e.dtype), &nbytes))
    fail(who, ": ", numel, " elements of ", st_dtype_name(e.dtype), " overflow 64 bits of bytes");
  std::string shape = "[";
  for (size_t i = 0; i < e.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(e.shape[i]);
  shape += "]";
  if (e.begin > e.end) fail(who, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  if (e.end > data_size)
    fail(who, ": data_offsets [", e.begin, ", ", e.end, "] run past the data section of ", data_size,
         " bytes (a truncated file?)");
  if (e.end - e.begin != static_cast<uint64_t>(nbytes))
    fail(who, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin, " bytes but shape ", shape, " of ",
         st_dtype_name(e.dtype), " needs ", nbytes, " (", numel, " x ", st_dtype_size(e.dtype), ")");
}

// "data bytes [b, e) (file bytes [D + b, D + e))".
std::string span(const StHeader& h, uint64_t b, uint64_t e) {
  std::ostringstream out;
  out << "data bytes [" << b << ", " << e << "), file bytes [" << h.data_offset + b << ", " << h.data_offset + e << ")";
  return out.str();
}

std::string byte_count(uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// The format's rule (as the reference implementation enforces it): sorted by offsets,
// the tensors tile the data section from its first byte to the end of the file, each
// beginning where the one before ends. No hole, no overlap, no byte before the first
// or after the last: a file that breaks it is corrupt or misread (a header length off
// by one reads every tensor shifted). `h.tensors` is sorted by (begin, end).
void check_coverage(const StHeader& h) {
  const char* rule = "the tensors must cover the data section exactly, each beginning where the one before ends";
  uint64_t covered = 0;
  const StEntry* last = nullptr;  // the tensor that ends at `covered` (the last non-empty one)
  for (const auto& e : h.tensors) {
    if (e.begin > covered) {
      fail("the ", byte_count(e.begin - covered), " at ", span(h, covered, e.begin), " lie ",
           last ? "between " + quoted(last->name) + " and " + quoted(e.name)
                : "before " + quoted(e.name) + ", the first tensor,",
           " and belong to no tensor (a hole): ", rule);
    }
    if (e.begin < covered) {
      if (e.begin == e.end)
        fail("tensor ", quoted(e.name), " is empty at data offset ", e.begin, ", inside ", quoted(last->name), " [",
             last->begin, ", ", last->end, "): ", rule);
      fail("tensors ", quoted(last->name), " [", last->begin, ", ", last->end, ") and ", quoted(e.name), " [", e.begin,
           ", ", e.end, ") overlap in the data section (", span(h, e.begin, std::min(e.end, last->end)), "): ", rule);
    }
    if (e.end > covered || !last) last = &e;
    covered = e.end;
  }
  if (covered == h.data_size) return;
  if (!last)
    fail("the header lists no tensors but the data section has ", byte_count(h.data_size), " (",
         span(h, 0, h.data_size), "): ", rule, " (a wrong header length?)");
  fail("the ", byte_count(h.data_size - covered), " at ", span(h, covered, h.data_size), ", after ", quoted(last->name),
       ", belong to no tensor: ", rule,
       ", to the end of the file (a header length that is off, or bytes appended to the file?)");
}

}  // namespace

const char* st_dtype_name(StDtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

int64_t st_dtype_size(StDtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 1;
}

bool st_dtype_from_name(const std::string& name, StDtype* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

StHeader parse_safetensors(const uint8_t* data, size_t size) {
  if (size < 8) fail("the file is ", size, " bytes, shorter than the 8-byte header length (truncated?)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian, whatever the host
  if (n > kMaxHeaderBytes)
    fail("header length ", n, " is larger than the ", kMaxHeaderBytes,
         "-byte cap (corrupt, or not a safetensors file)");
  if (n > size - 8)
    fail("header length ", n, " runs past the end of the file (", size, " bytes; ", 8 + n,
         " needed for the header alone: truncated?)");
  if (n < 2) fail("header length ", n, " is too short for a JSON object");
  StHeader header;
  header.data_offset = 8 + n;
  header.data_size = size - 8 - n;
  const char* text = reinterpret_cast<const char*>(data + 8);
  // Offsets in messages are file offsets: the header's first byte is byte 8.
  const std::string what = "header (file bytes [8, " + std::to_string(8 + n) + "))";
  JsonReader in(text, text + n, what.c_str(), 8);
  if (*text != '{')
    in.fail_here("the header must start with '{' (the safetensors format says so; the official reader is laxer)");
  std::set<std::string> seen;
  bool have_metadata = false;
  in.expect('{');
  if (in.peek() != '}') {
    do {
      std::string key = in.string();
      in.expect(':');
      if (key == "__metadata__") {
        if (have_metadata) in.fail_here("two \"__metadata__\" keys");
        have_metadata = true;
        if (in.consume_literal("null")) continue;
        in.expect('{');
        if (in.peek() == '}') {
          in.expect('}');
          continue;
        }
        do {
          std::string k = in.string();
          in.expect(':');
          if (in.peek() != '"') in.fail_here("__metadata__ value of " + quoted(k) + " must be a string");
          std::string v = in.string();
          if (!header.metadata.emplace(std::move(k), std::move(v)).second) in.fail_here("duplicate __metadata__ key");
        } while (in.next_or_close('}'));
        continue;
      }
      if (key.empty()) in.fail_here("a tensor with an empty name");
      if (!seen.insert(key).second) in.fail_here("tensor " + quoted(key) + " appears twice");
      header.tensors.push_back(parse_entry(in, std::move(key)));
    } while (in.next_or_close('}'));
  } else {
    in.expect('}');
  }
  in.skip_ws();  // writers pad the header with spaces to align the data
  if (!in.at_end()) in.fail_here("trailing bytes after the header object");

  for (const auto& e : header.tensors) check_entry(e, header.data_size);
  std::sort(header.tensors.begin(), header.tensors.end(), [](const StEntry& a, const StEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;  // a total order: the result is reproducible
  });
  check_coverage(header);
  return header;
}

std::map<std::string, std::string> parse_safetensors_index(const char* text, size_t size) {
  JsonReader in(text, text + size, "index");
  std::map<std::string, std::string> weight_map;
  bool have_map = false;
  in.expect('{');
  if (in.peek() != '}') {
    do {
      const std::string key = in.string();
      in.expect(':');
      if (key != "weight_map") {
        in.skip_value(1);
        continue;
      }
      if (have_map) in.fail_here("two \"weight_map\" keys");
      have_map = true;
      in.expect('{');
      if (in.peek() == '}') {
        in.expect('}');
        continue;
      }
      do {
        std::string name = in.string();
        in.expect(':');
        if (in.peek() != '"') in.fail_here("weight_map value of " + quoted(name) + " must be a file name string");
        std::string file = in.string();
        if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
            file.find('\\') != std::string::npos || file.find('\0') != std::string::npos)
          fail("weight_map maps tensor ", quoted(name), " to ", quoted(file),
               ", which is not a plain file name in the checkpoint's folder");
        if (!weight_map.emplace(name, std::move(file)).second)
          in.fail_here("tensor " + quoted(name) + " appears twice in weight_map");
      } while (in.next_or_close('}'));
    } while (in.next_or_close('}'));
  } else {
    in.expect('}');
  }
  in.skip_ws();
  if (!in.at_end()) in.fail_here("trailing bytes after the index object");
  if (!have_map) fail("the index has no \"weight_map\" object");
  return weight_map;
}

std::string format_safetensors_header(const std::vector<StEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  auto json_string = [](const std::string& s) {
    std::string out = "\"";
    for (const char ch : s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += ch;
      } else if (c < 0x20) {
        static const char* hex = "0123456789abcdef";
        out += "\\u00";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += ch;
      }
    }
    return out + "\"";
  };
  std::string out = "{";
  bool first = true;
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      out += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
      first = false;
    }
    out += "}";
  }
  for (const auto& e : tensors) {
    out += (out.size() > 1 ? "," : "") + json_string(e.name) + ":{\"dtype\":\"" + st_dtype_name(e.dtype) +
           "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) out += (i ? "," : "") + std::to_string(e.shape[i]);
    out += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  out += "}";
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

}  // namespace tp::detail
