#pragma once
// KVCache: the keys and values a decoder has seen, per layer, for incremental decoding.
// Each rank caches its own KV heads only (post-RoPE keys).

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tp {

/// Preallocated [batch, local kv heads, capacity, head_dim] buffers per layer.
/// Example: auto cache = model->make_cache(1, prompt_len + new_tokens);
struct KVCache {
  std::vector<at::Tensor> keys, values;
  int64_t length = 0;  ///< positions filled so far (the next token's position)

  int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
  /// Writes positions [length, length + k.size(2)) of layer `layer` and returns the
  /// filled part of its buffers (k, v) up to them. The caller advances `length` once
  /// every layer has written.
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
};

}  // namespace tp
