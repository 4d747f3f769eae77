#include "tp/loader/safetensors_writer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "common/json_reader.h"
#include "loader/safetensors_format.h"
#include "tp/loader/safetensors.h"

namespace tp {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n == 0) return;
  TORCH_CHECK(std::fwrite(data, 1, n, f) == n, "writing '", path, "': ", std::strerror(errno));
}

detail::StDtype st_dtype(at::ScalarType dtype) {
  detail::StDtype d{};
  const bool ok = detail::st_dtype_from_name(safetensors_dtype_name(dtype), &d);
  TORCH_INTERNAL_ASSERT(ok);
  return d;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // The header is UTF-8 JSON: a name or metadata string that is not UTF-8 would make a
  // file no reader accepts (this one included).
  const auto check_utf8 = [&](const std::string& s, const char* what) {
    const size_t bad = detail::first_invalid_utf8(s.data(), s.size());
    if (bad == s.size()) return;
    std::string shown;  // ASCII only: the message itself must be valid text
    for (size_t i = 0; i < s.size() && i < 200; ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      shown += c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : std::string(buf);
    }
    TORCH_CHECK_VALUE(false, "save_safetensors('", path, "'): the ", what, " '", shown,
                      "' is not valid UTF-8 (at its byte ", bad, "); the safetensors header is UTF-8 JSON");
  };
  for (const auto& [k, v] : metadata) {
    check_utf8(k, "metadata key");
    check_utf8(v, "metadata value");
  }
  for (const auto& kv : tensors) check_utf8(kv.first, "tensor name");
  std::vector<detail::StEntry> entries;
  std::vector<at::Tensor> data;  // CPU, contiguous: no copy when the input already is
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK_VALUE(!name.empty() && name != "__metadata__", "save_safetensors('", path, "'): invalid tensor name '",
                      name, "'");
    TORCH_CHECK_VALUE(t.defined(), "save_safetensors('", path, "'): tensor '", name, "' is undefined");
    detail::StEntry e;
    e.name = name;
    e.dtype = st_dtype(t.scalar_type());
    e.shape = t.sizes().vec();
    e.begin = offset;
    e.end = offset + static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
    offset = e.end;
    entries.push_back(std::move(e));
    data.push_back(t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous());
  }
  const std::string header = detail::format_safetensors_header(entries, metadata);
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  TORCH_CHECK_VALUE(f != nullptr, "save_safetensors: cannot create '", tmp, "': ", std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  write_all(f.get(), len, 8, tmp);
  write_all(f.get(), header.data(), header.size(), tmp);
  for (const auto& t : data) write_all(f.get(), t.data_ptr(), t.nbytes(), tmp);
  TORCH_CHECK(std::fclose(f.release()) == 0, "save_safetensors: closing '", tmp, "': ", std::strerror(errno));
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: renaming '", tmp, "' to '", path,
              "': ", std::strerror(errno));
}

int64_t save_sharded_safetensors(const std::string& dir, const std::map<std::string, at::Tensor>& tensors,
                                 int64_t max_file_bytes) {
  TORCH_CHECK_VALUE(max_file_bytes > 0, "save_sharded_safetensors: max_file_bytes must be positive; got ",
                    max_file_bytes);
  std::vector<std::map<std::string, at::Tensor>> groups(1);
  int64_t in_group = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t n = static_cast<int64_t>(t.nbytes());
    if (!groups.back().empty() && in_group + n > max_file_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().emplace(name, t);
    in_group += n;
    total += n;
  }
  const int64_t count = static_cast<int64_t>(groups.size());
  std::string weight_map;
  for (int64_t i = 0; i < count; ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i + 1),
                  static_cast<long long>(count));
    save_safetensors(dir + "/" + file, groups[i], {{"format", "pt"}});
    for (const auto& kv : groups[i])
      weight_map +=
          std::string(weight_map.empty() ? "" : ",\n") + "    \"" + json_escape(kv.first) + "\": \"" + file + "\"";
  }
  const std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) +
                            "},\n  \"weight_map\": {\n" + weight_map + "\n  }\n}\n";
  const std::string path = dir + "/model.safetensors.index.json";
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  TORCH_CHECK_VALUE(f != nullptr, "save_sharded_safetensors: cannot create '", path, "': ", std::strerror(errno));
  write_all(f.get(), index.data(), index.size(), path);
  TORCH_CHECK(std::fclose(f.release()) == 0, "save_sharded_safetensors: closing '", path, "'");
  return count;
}

}  // namespace tp
