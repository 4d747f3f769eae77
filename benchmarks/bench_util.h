#pragma once
// Helpers shared by the benchmarks: medians after warm-up, a plain-text table,
// process memory from /proc, JSON/CSV escaping, and a progress line on stderr.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tp::bench {

/// How long to measure one thing.
struct TimingPolicy {
  int warmup = 3;
  int rounds = 5;            // the sides of a case alternate this many times
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

/// Medians (ms) of `sides` timed in alternating rounds (so a change in the machine's load
/// hits every side alike) after two warm-up calls each: at
/// least 5 rounds, then until about `seconds` per side have passed (200 rounds at most).
std::vector<double> alternating_medians_ms(const std::vector<std::function<void()>>& sides, double seconds);

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

/// A field of /proc/self/status in KiB ("VmRSS", "VmHWM"); an error if absent.
int64_t proc_status_kib(const char* field);

/// Resets the kernel's peak RSS (VmHWM) to the current RSS (Linux >= 4.0), so the
/// next VmHWM is this phase's peak. Returns false where /proc/self/clear_refs is
/// not writable (then VmHWM is the process's lifetime peak).
bool reset_peak_rss();

/// "AMD EPYC 7B13, 2 hardware threads" from /proc/cpuinfo.
std::string machine_description();

/// The first three fields of /proc/loadavg ("1.02 0.87 0.60"): how busy the machine was.
std::string load_average();

/// `s` as a JSON string literal, quotes included.
std::string json_string(const std::string& s);

/// A progress line on stderr: "[3/20] qkv TP=2 M=64  12 s". On a terminal the line
/// is rewritten in place and cleared by finish(); otherwise one line per step, and
/// only once the run has taken more than `quiet_seconds` (short runs stay quiet).
class Progress {
 public:
  explicit Progress(int64_t total, double quiet_seconds = 2.0);
  void step(const std::string& what);
  void finish();

 private:
  int64_t total_ = 0, done_ = 0;
  double quiet_seconds_ = 2.0;
  bool tty_ = false, shown_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tp::bench
