#include "quant/int4/cuda.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tp::cuda {

Int4Prepared prepare_int4(const at::Tensor& codes, const at::Tensor& scale_kn, const at::Tensor& zero_kn, int64_t group,
                          const at::Device& device) {
  TORCH_CHECK_VALUE(codes.dim() == 2 && codes.size(1) % 2 == 0, "prepare_int4: codes must be [N, K] with even K; got ",
                    codes.sizes());
  Int4Prepared p;
  p.group = group;
  p.packed = pack_int4(codes).to(device);
  p.scales = scale_kn.to(at::kFloat).t().contiguous().to(device);
  p.zeros = zero_kn.to(at::kFloat).t().contiguous().to(device);
  return p;
}

at::Tensor apply(const Int4Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  return weight_only_linear(x, p.packed, 4, p.scales, p.zeros, p.group, bias);
}

}  // namespace tp::cuda
