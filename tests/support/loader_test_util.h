#pragma once
// Helpers for the loader tests: a temporary folder removed at scope exit, raw
// file writing, and bitwise tensor comparison (floats with NaN payloads and fp8
// included).

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

namespace tp::test {

/// A fresh folder under $TMPDIR (or /tmp); removed, with its files, when it goes.
/// POSIX, not std::filesystem: libtorch.so exports std::filesystem symbols that
/// the dynamic linker binds instead of libstdc++'s, and remove_all crashes there.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/tp_loader_test_XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("TempDir: mkdtemp failed for " + templ);
    path_ = templ;
  }
  ~TempDir() {
    // The tests write flat folders: files only.
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") ::unlink((path_ + "/" + name).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// `name` inside the folder.
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The tensor's bytes, as a flat uint8 tensor.
inline at::Tensor bytes_of(const at::Tensor& t) {
  const auto c = t.contiguous();
  if (c.numel() == 0) return at::empty({0}, at::kByte);
  return at::from_blob(c.data_ptr(), {static_cast<int64_t>(c.nbytes())}, at::kByte).clone();
}

/// Same dtype, shape and bytes.
inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(bytes_of(a), bytes_of(b));
}

/// Random bytes viewed as `dtype` (bool: 0/1 only, the values torch allows).
inline at::Tensor random_tensor(at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  if (dtype == at::kBool) return at::randint(0, 2, shape, g, at::kByte).to(at::kBool);
  auto raw = at::randint(0, 256, {numel * item}, g, at::TensorOptions().dtype(at::kByte));
  return raw.view(dtype).view(shape).clone();
}

}  // namespace tp::test
