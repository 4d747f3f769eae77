#include "tp/loader/checkpoint.h"

#include <c10/util/Exception.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "loader/safetensors_format.h"
#include "tp/loader/safetensors.h"

namespace tp {

namespace {

// POSIX rather than std::filesystem: libtorch.so exports its own std::filesystem
// symbols, which the dynamic linker may bind instead of libstdc++'s (remove_all
// crashes through them); stat() has no such problem.
bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string read_small_file(const std::string& path) {
  struct stat st {};
  TORCH_CHECK_VALUE(::stat(path.c_str(), &st) == 0, "cannot read '", path, "': ", std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  // An index lists names, not data: anything this large is not an index.
  TORCH_CHECK_VALUE(size <= detail::kMaxHeaderBytes, "'", path, "' is ", size, " bytes, larger than the ",
                    detail::kMaxHeaderBytes, "-byte cap for an index");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot open '", path, "'");
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  TORCH_CHECK_VALUE(in.gcount() == static_cast<std::streamsize>(size), "short read of '", path, "'");
  return text;
}

Checkpoint open_sharded(const std::string& dir) {
  const std::string index_path = dir + "/" + kIndexName;
  const std::string text = read_small_file(index_path);
  std::map<std::string, std::string> weight_map;
  try {
    weight_map = detail::parse_safetensors_index(text.data(), text.size());
  } catch (const detail::FormatError& e) {
    TORCH_CHECK_VALUE(false, "checkpoint index '", index_path, "': ", e.what());
  }
  std::map<std::string, SafetensorsFile> files;  // each file mapped once
  Checkpoint checkpoint;
  for (const auto& [name, file_name] : weight_map) {
    auto it = files.find(file_name);
    if (it == files.end()) {
      const std::string file_path = dir + "/" + file_name;
      TORCH_CHECK_VALUE(exists(file_path), "checkpoint index '", index_path, "' puts tensor '", name, "' in '",
                        file_name, "', which does not exist in ", dir);
      it = files.emplace(file_name, SafetensorsFile::open(file_path)).first;
    }
    TORCH_CHECK_VALUE(it->second.contains(name), "checkpoint index '", index_path, "' puts tensor '", name, "' in '",
                      it->second.path(), "', but that file has no such tensor (", it->second.names().size(),
                      " tensors)");
    checkpoint.add(it->second.source(name));
  }
  return checkpoint;
}

}  // namespace

Checkpoint open_checkpoint(const std::string& path) {
  if (is_dir(path)) {
    if (exists(path + "/" + kIndexName)) return open_sharded(path);
    TORCH_CHECK_VALUE(exists(path + "/" + kSingleName), "checkpoint folder '", path, "' has neither ", kIndexName,
                      " nor ", kSingleName);
    Checkpoint checkpoint;
    SafetensorsFile::open(path + "/" + kSingleName).add_to(checkpoint);
    return checkpoint;
  }
  Checkpoint checkpoint;
  SafetensorsFile::open(path).add_to(checkpoint);
  return checkpoint;
}

Checkpoint::Checkpoint() : sources_(std::make_shared<Sources>()) {}

void Checkpoint::add(std::shared_ptr<const TensorSource> source) {
  TORCH_CHECK_VALUE(source != nullptr, "Checkpoint::add: null source");
  const std::string name = source->name();
  add(name, std::move(source));
}

void Checkpoint::add(const std::string& name, std::shared_ptr<const TensorSource> source) {
  TORCH_CHECK_VALUE(source != nullptr, "Checkpoint::add: null source for '", name, "'");
  TORCH_CHECK_VALUE(!sources_->count(name), "Checkpoint::add: a tensor named '", name, "' is already present");
  if (sources_.use_count() > 1) sources_ = std::make_shared<Sources>(*sources_);  // copies and views keep theirs
  sources_->emplace(name, std::move(source));
}

void Checkpoint::add(const std::string& name, const at::Tensor& tensor) {
  add(std::make_shared<InMemorySource>(name, tensor));
}

bool Checkpoint::contains(const std::string& name) const { return sources_->count(name) != 0; }

const TensorSource& Checkpoint::get(const std::string& name, const std::string& where) const {
  auto it = sources_->find(name);
  if (it != sources_->end()) {
    for (const auto& log : logs_) log->record(name);
    return *it->second;
  }
  // Name a few neighbours: a wrong prefix is the usual mistake.
  std::ostringstream near;
  size_t shown = 0;
  const auto dot = name.rfind('.');
  const std::string stem = dot == std::string::npos ? name : name.substr(0, dot);
  for (const auto& [n, _] : *sources_) {
    if (shown < 5 && n.rfind(stem.substr(0, stem.rfind('.') + 1), 0) == 0) near << (shown++ ? ", " : "") << n;
  }
  TORCH_CHECK_VALUE(false, where.empty() ? "" : where + ": ", "checkpoint has no tensor '", name, "' (",
                    sources_->size(), " tensors", shown ? "; similar: " + near.str() : std::string(), ")");
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(sources_->size());
  for (const auto& kv : *sources_) out.push_back(kv.first);
  return out;
}

std::vector<std::string> Checkpoint::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = sources_->lower_bound(prefix);
       it != sources_->end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->first);
  return out;
}

Checkpoint Checkpoint::recording(std::shared_ptr<ReadLog> log) const {
  TORCH_CHECK_VALUE(log != nullptr, "Checkpoint::recording: null log");
  Checkpoint view = *this;
  view.logs_.push_back(std::move(log));
  return view;
}

bool Checkpoint::may_stay_unread(const std::string& name) const {
  return std::any_of(logs_.begin(), logs_.end(), [&](const auto& log) { return log->allows_unread(name); });
}

}  // namespace tp
