#pragma once
// Splitting a CPU kernel's work over ATen's threads. The kernels' dispatchers (never
// a *_avx2.cpp / *_avx512.cpp file: these inline templates must not be compiled with
// an ISA's flags) hand out units from a shared counter, a few at a time: a thread the
// OS preempts (2 shared cores run other work too) then delays the call by one grab,
// where a static split makes every call wait for its slowest thread's whole share.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

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

/// Runs run(i) for every i in [0, count) on ATen's threads, one task at a time from a
/// shared counter (tasks of different sizes), each thread with the caller's thread-local
/// state (inference mode, grad mode, ...); on the calling thread alone inside a parallel
/// region. Not a template: compiled once with OpenMP (cpu/parallel.cpp), so callers in
/// areas built without it (layers) get ATen's threads too.
void parallel_tasks(int64_t count, const std::function<void(int64_t)>& run);

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

/// Runs f(i, row) for every row i of the contiguous [M, K] float32, bfloat16 or
/// float16 CPU tensor x, row its K values as float32 (a reduced-precision row widened
/// exactly, as x.to(float) does, into a buffer per thread). In parallel only when
/// there are enough values to pay for a parallel region.
template <class F>
void for_each_row_as_float(const at::Tensor& x, const F& f) {
  const int64_t m = x.size(0), k = x.size(1);
  const auto dtype = x.scalar_type();
  const auto rows = [&](int64_t i0, int64_t i1) {
    std::vector<float> wide(dtype == at::kFloat ? 0 : static_cast<size_t>(k));
    for (int64_t i = i0; i < i1; ++i) {
      const float* xi = nullptr;
      if (dtype == at::kFloat) {
        xi = x.const_data_ptr<float>() + i * k;
      } else if (dtype == at::kBFloat16) {
        const c10::BFloat16* src = x.const_data_ptr<c10::BFloat16>() + i * k;
        for (int64_t c = 0; c < k; ++c) wide[static_cast<size_t>(c)] = static_cast<float>(src[c]);
        xi = wide.data();
      } else {
        const c10::Half* src = x.const_data_ptr<c10::Half>() + i * k;
        for (int64_t c = 0; c < k; ++c) wide[static_cast<size_t>(c)] = static_cast<float>(src[c]);
        xi = wide.data();
      }
      f(i, xi);
    }
  };
  if (m * k >= (int64_t{1} << 20)) {
    parallel_units(m, rows);
  } else {
    rows(0, m);
  }
}

}  // namespace tp::cpu
