#pragma once
// Timing helpers for tp-bench: medians after warm-up, and a plain-text table.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tp::bench {

/// How long to measure one thing.
struct TimingPolicy {
  int warmup = 3;
  int rounds = 5;            // reference and layer alternate this many times
  int max_iters = 50;        // per side, over all rounds
  double max_seconds = 1.0;  // aim for about this much measuring per side
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// A table printed with aligned columns.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tp::bench
