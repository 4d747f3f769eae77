// cpu/parallel.h's one non-template: tasks over ATen's threads, compiled with OpenMP.

#include "cpu/parallel.h"

#include <ATen/ThreadLocalState.h>

namespace tp::cpu {

void parallel_tasks(int64_t count, const std::function<void(int64_t)>& run) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < count; ++i) run(i);
    return;
  }
  const at::ThreadLocalState state;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    const at::ThreadLocalStateGuard guard(state);
    for (int64_t i = next++; i < count; i = next++) run(i);
  });
}

}  // namespace tp::cpu
