#pragma once
// The kernel side of a quantized method: what its CPU (or CUDA) kernels read, derived
// from the registered tensors (panels, float scales, row sums, a CUDA layout). Made by
// finalize() and made again on the next call after any source tensor was written in
// place or replaced (load_state_dict, copy_, an optimizer step, clone()): the stamp of
// the sources (cpu/tensor_stamp.h) decides, never a flag someone must remember to set.
// Calls from several threads share one copy; a stale one is replaced under the lock.

#include <memory>
#include <mutex>
#include <utility>

#include "cpu/tensor_stamp.h"

namespace tp::cpu {

template <class Kernel>
class KernelCache {
 public:
  /// Makes the kernel now from sources stamped `sources` (finalize()).
  template <class Make>
  void rebuild(TensorStamp sources, const Make& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    kernel_ = make();
    made_from_ = std::move(sources);
  }

  /// The kernel for sources stamped `sources`: the cached one, or make()'s when stale.
  template <class Make>
  std::shared_ptr<const Kernel> get(TensorStamp sources, const Make& make) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kernel_ || made_from_ != sources) {
      kernel_ = nullptr;  // free the stale copy before making the new one
      kernel_ = make();
      made_from_ = std::move(sources);
    }
    return kernel_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const Kernel> kernel_;
  mutable TensorStamp made_from_;
};

}  // namespace tp::cpu
