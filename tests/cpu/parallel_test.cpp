// The work-splitting helpers every CPU kernel's dispatcher uses (src/cpu/parallel.h):
// each unit or row handed out exactly once, ranges on the unit boundaries asked for,
// nested calls kept on the calling thread, and rows widened exactly.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/parallel.h"
#include "support/test_util.h"

namespace {

// How often each of [0, n) was covered by the ranges f was called with; an empty or
// out-of-bounds range counts as a hit on every index (f runs on ATen's threads, where
// Catch's assertions must not be used).
template <class Run>
std::vector<int> coverage(int64_t n, const Run& run) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<bool> bad_range{false};
  run([&](int64_t b, int64_t e) {
    if (b < 0 || b >= e || e > n) {
      bad_range = true;
      return;
    }
    for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
  });
  std::vector<int> out;
  for (auto& h : hits) out.push_back(h.load() + (bad_range ? 1 : 0));
  return out;
}

}  // namespace

TEST_CASE("cpu parallel: round_up", "[cpu]") {
  CHECK(tp::cpu::round_up(0, 8) == 0);
  CHECK(tp::cpu::round_up(1, 8) == 8);
  CHECK(tp::cpu::round_up(8, 8) == 8);
  CHECK(tp::cpu::round_up(9, 8) == 16);
  CHECK(tp::cpu::round_up(5, 1) == 5);
}

TEST_CASE("cpu parallel: every unit and row is handed out once, rows on their unit boundaries", "[cpu]") {
  INFO("threads " << at::get_num_threads());
  for (const int64_t n : {0, 1, 5, 64, 1000, 4097}) {
    INFO("n " << n);
    CHECK(coverage(n, [&](const auto& f) { tp::cpu::parallel_units(n, f); }) == std::vector<int>(n, 1));
    for (const int64_t grab : {1, 3, 64})
      CHECK(coverage(n, [&](const auto& f) { tp::cpu::parallel_grabs(n, 4, grab, f); }) == std::vector<int>(n, 1));
    for (const int64_t unit : {1, 4, 16}) {
      INFO("unit " << unit);
      std::atomic<int> off_boundary{0};
      CHECK(coverage(n, [&](const auto& f) {
              tp::cpu::parallel_rows(n, unit, [&](int64_t b, int64_t e) {
                if (b % unit != 0 || (e % unit != 0 && e != n)) ++off_boundary;
                f(b, e);
              });
            }) == std::vector<int>(n, 1));
      CHECK(off_boundary.load() == 0);
    }
  }
}

TEST_CASE("cpu parallel: inside a parallel region the work stays on the calling thread in one call", "[cpu]") {
  std::atomic<int> calls{0}, wrong{0};
  at::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    tp::cpu::parallel_units(100, [&](int64_t b, int64_t e) {
      ++calls;
      if (b != 0 || e != 100) ++wrong;
    });
  });
  CHECK(wrong.load() == 0);
  CHECK(calls.load() >= 1);
}

TEST_CASE("cpu parallel: for_each_row_as_float gives each row once, widened exactly", "[cpu]") {
  // 3 x 5 stays on the calling thread; 1024 x 1025 (over 2^20 values) runs in parallel.
  for (const auto& [m, k] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {1024, 1025}}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO("M " << m << " K " << k << " " << c10::toString(dtype));
      const at::Tensor x = tp::test::randn({m, k}, 5).to(dtype).contiguous();
      const at::Tensor wide = x.to(at::kFloat);
      at::Tensor got = at::full({m, k}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
      std::vector<std::atomic<int>> seen(static_cast<size_t>(m));
      tp::cpu::for_each_row_as_float(x, [&](int64_t i, const float* row) {
        ++seen[static_cast<size_t>(i)];
        std::copy(row, row + k, got.data_ptr<float>() + i * k);
      });
      for (auto& s : seen) REQUIRE(s.load() == 1);
      REQUIRE(at::equal(got, wide));
    }
  }
}
