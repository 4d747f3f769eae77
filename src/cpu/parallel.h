#pragma once
// Splitting a CPU kernel's work over ATen's threads. The kernels' dispatchers (never
// a *_avx2.cpp / *_avx512.cpp file: these inline templates must not be compiled with
// an ISA's flags) hand out units from a shared counter, a few at a time: a thread the
// OS preempts (2 shared cores run other work too) then delays the call by one grab,
// where a static split makes every call wait for its slowest thread's whole share.

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace tp::cpu {

/// a rounded up to a multiple of b (a >= 0, b >= 1).
inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/// Runs f(u0, u1) over [0, units) on up to `threads` of ATen's threads, each taking
/// `grab` units at a time; on the calling thread alone inside a parallel region.
template <class F>
void parallel_grabs(int64_t units, int64_t threads, int64_t grab, const F& f) {
  threads = std::min(threads, units);
  if (threads <= 1 || at::in_parallel_region()) {
    if (units > 0) f(0, units);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t u = next.fetch_add(grab); u < units; u = next.fetch_add(grab)) f(u, std::min(units, u + grab));
  });
}

/// Runs f(u0, u1) over [0, units) on all of ATen's threads, ~32 grabs per thread.
template <class F>
void parallel_units(int64_t units, const F& f) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), units);
  parallel_grabs(units, threads, std::max<int64_t>(1, units / (std::max<int64_t>(threads, 1) * 32)), f);
}

/// Runs f(n0, n1) over the rows [0, n) in ranges that start at multiples of
/// `unit_rows` (a multiple of every row tile of the kernel, so no range splits one).
template <class F>
void parallel_rows(int64_t n, int64_t unit_rows, const F& f) {
  parallel_units((n + unit_rows - 1) / unit_rows,
                 [&](int64_t b, int64_t e) { f(b * unit_rows, std::min(n, e * unit_rows)); });
}

}  // namespace tp::cpu
