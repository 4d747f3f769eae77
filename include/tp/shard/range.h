#pragma once
// A half-open interval [begin, end) of elements along one dimension.

#include <cstdint>
#include <ostream>

namespace tp {

/// A half-open interval `[begin, end)` in elements of the dimension being split.
/// Example: `Range{256, 512}.size() == 256`.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  /// The same interval moved by `offset` elements.
  Range shifted(int64_t offset) const { return {begin + offset, end + offset}; }
  friend bool operator==(const Range& a, const Range& b) { return a.begin == b.begin && a.end == b.end; }
  friend bool operator!=(const Range& a, const Range& b) { return !(a == b); }
};

inline std::ostream& operator<<(std::ostream& os, const Range& r) {
  return os << '[' << r.begin << ',' << r.end << ')';
}

}  // namespace tp
