#include "bench_util.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace tp::bench {

std::string Table::str() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::ostringstream os;
  for (size_t r = 0; r < rows_.size(); ++r) {
    for (size_t i = 0; i < rows_[r].size(); ++i) {
      // First column left-aligned (names), numbers right-aligned.
      const auto& cell = rows_[r][i];
      const std::string pad(width[i] - cell.size(), ' ');
      os << (i ? "  " : "") << (i == 0 ? cell + pad : pad + cell);
    }
    os << '\n';
    if (r == 0) {
      for (size_t i = 0; i < width.size(); ++i) os << (i ? "  " : "") << std::string(width[i], '-');
      os << '\n';
    }
  }
  return os.str();
}

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

int64_t proc_status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  TORCH_CHECK(false, "no ", field, " in /proc/self/status");
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

std::string machine_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "unknown";
  return a + " " + b + " " + c;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += format("\\u%04x", c);
        else
          out += c;
    }
  }
  return out + "\"";
}

Progress::Progress(int64_t total, double quiet_seconds)
    : total_(total),
      quiet_seconds_(quiet_seconds),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::step(const std::string& what) {
  ++done_;
  const double elapsed = seconds_since(start_);
  if (!tty_ && elapsed < quiet_seconds_) return;
  std::string line = format("[%lld/%lld] %s  (%.0f s", (long long)done_, (long long)total_, what.c_str(), elapsed);
  if (done_ > 1 && elapsed > 1.0) line += format(", ~%.0f s left", elapsed / (done_ - 1) * (total_ - done_ + 1));
  line += ")";
  if (tty_) {
    std::cerr << "\r\033[K" << line << std::flush;
  } else {
    std::cerr << "  " << line << "\n" << std::flush;
  }
  shown_ = true;
}

void Progress::finish() {
  if (tty_ && shown_) std::cerr << "\r\033[K" << std::flush;
  shown_ = false;
}

std::vector<double> alternating_medians_ms(const std::vector<std::function<void()>>& sides, double seconds) {
  for (const auto& f : sides)
    for (int i = 0; i < 2; ++i) f();  // warm-up
  std::vector<std::vector<double>> samples(sides.size());
  const auto start = std::chrono::steady_clock::now();
  const double budget = seconds * static_cast<double>(sides.size());
  for (int round = 0; round < 200; ++round) {
    for (size_t s = 0; s < sides.size(); ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      sides[s]();
      samples[s].push_back(seconds_since(t0) * 1e3);
    }
    if (round >= 4 && seconds_since(start) > budget) break;
  }
  std::vector<double> out;
  for (auto& s : samples) out.push_back(median(s));
  return out;
}

}  // namespace tp::bench
