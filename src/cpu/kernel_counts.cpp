#include "cpu/kernel_counts.h"

#include <mutex>

namespace tp::cpu {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, int64_t> counts;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void count_kernel(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  ++r.counts[name];
}

std::map<std::string, int64_t> kernel_counts() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.counts;
}

std::string kernels_between(const std::map<std::string, int64_t>& before, const std::map<std::string, int64_t>& after) {
  std::string out;
  for (const auto& [name, count] : after) {
    const auto it = before.find(name);
    if (count > (it == before.end() ? 0 : it->second)) out += (out.empty() ? "" : "+") + name;
  }
  return out.empty() ? "-" : out;
}

}  // namespace tp::cpu
