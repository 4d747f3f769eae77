#include "tp/loader/read_log.h"

#include <algorithm>

namespace tp {

ReadLog::ReadLog(std::vector<std::string> allow_unread) : allow_unread_(std::move(allow_unread)) {}

void ReadLog::record(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  read_.insert(name);
}

bool ReadLog::was_read(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return read_.count(name) != 0;
}

std::vector<std::string> ReadLog::read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {read_.begin(), read_.end()};
}

bool ReadLog::allows_unread(const std::string& name) const {
  return std::any_of(allow_unread_.begin(), allow_unread_.end(),
                     [&](const std::string& pattern) { return glob_match(pattern, name); });
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative matching with one backtrack point (the last '*'): linear in practice,
  // O(|pattern| * |name|) at worst, never exponential.
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace tp
