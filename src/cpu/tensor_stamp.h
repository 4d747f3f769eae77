#pragma once
// What a kernel-side copy (a prepacked GEMM weight, INT4 panels, float scales, row
// sums) was made from: for each source tensor its storage, shape, strides, dtype and
// version counter. The registered tensors can be written in place at any time
// (load_state_dict, copy_, an optimizer step, clone()); a copy whose stamp no longer
// equals its sources' is stale and must be made again, never used.
//
// Inference tensors (made under c10::InferenceMode) have no version counter: an
// in-place write into one is not seen here (version -1), so the caller finalizes again.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace tp::cpu {

class TensorStamp {
 public:
  TensorStamp() = default;  // matches no tensors: a copy never made is stale

  /// The stamp of `tensors` now (an undefined tensor stamps as such).
  static TensorStamp of(std::initializer_list<at::Tensor> tensors) {
    TensorStamp s;
    s.made_ = true;
    for (const auto& t : tensors) s.keys_.push_back(key_of(t));
    return s;
  }

  bool operator==(const TensorStamp& o) const { return made_ && o.made_ && keys_ == o.keys_; }
  bool operator!=(const TensorStamp& o) const { return !(*this == o); }

 private:
  struct Key {
    const void* data = nullptr;
    int64_t version = -1;  // -1: undefined, or an inference tensor (no version counter)
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::ScalarType::Undefined;
    bool operator==(const Key& o) const {
      return data == o.data && version == o.version && sizes == o.sizes && strides == o.strides && dtype == o.dtype;
    }
  };
  static Key key_of(const at::Tensor& t) {
    Key k;
    if (!t.defined()) return k;
    k.data = t.const_data_ptr();
    k.version = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
    k.sizes = t.sizes().vec();
    k.strides = t.strides().vec();
    k.dtype = t.scalar_type();
    return k;
  }

  bool made_ = false;
  std::vector<Key> keys_;
};

}  // namespace tp::cpu
