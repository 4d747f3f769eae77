#include "tp/models/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace tp {

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_INDEX(layer >= 0 && layer < static_cast<int64_t>(keys.size()), "KVCache: layer ", layer,
                    " of a cache for ", keys.size(), " layers");
  at::Tensor& kb = keys[layer];
  at::Tensor& vb = values[layer];
  const int64_t n = k.size(2), end = length + n;
  TORCH_CHECK_VALUE(end <= kb.size(2), "KVCache: ", end, " positions do not fit its capacity ", kb.size(2),
                    "; make the cache for the prompt plus every token to generate");
  TORCH_CHECK_VALUE(
      k.sizes() == v.sizes() && k.size(0) == kb.size(0) && k.size(1) == kb.size(1) && k.size(3) == kb.size(3),
      "KVCache: keys ", k.sizes(), " / values ", v.sizes(), " do not fit the buffers ", kb.sizes());
  at::NoGradGuard no_grad;
  kb.narrow(2, length, n).copy_(k);
  vb.narrow(2, length, n).copy_(v);
  return {kb.narrow(2, 0, end), vb.narrow(2, 0, end)};
}

}  // namespace tp
