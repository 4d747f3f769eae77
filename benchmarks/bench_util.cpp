#include "bench_util.h"

#include <cstdarg>
#include <cstdio>
#include <sstream>

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
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

}  // namespace tp::bench
