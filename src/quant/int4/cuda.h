#pragma once
// INT4 group-wise weights on CUDA: the GEMV kernel's layout.
// `prepare` once in finalize() (layout changes, checks that need the host), `apply`
// per forward, over the format-free GEMM entry points of src/gpu/gemm.h. Compiled
// only in CUDA builds; the method includes it under TP_WITH_CUDA.

#include <optional>

#include <ATen/core/Tensor.h>

#include "gpu/gemm.h"

namespace tp::cuda {

/// An INT4 group-wise weight in the GEMV kernel's layout (src/gpu/kernels.h).
struct Int4Prepared {
  at::Tensor packed;  // [N, K/2] uint8
  at::Tensor scales;  // [N, K/g] fp32
  at::Tensor zeros;   // [N, K/g] fp32, in code units
  int64_t group = 128;
};
/// From unpacked codes [N, K] (0..15), and scale / zero as [K/g, N] (GPTQ/AWQ order,
/// as src/quant/int4/packing.h unpacks them), moved to `device`.
Int4Prepared prepare_int4(const at::Tensor& codes, const at::Tensor& scale_kn, const at::Tensor& zero_kn, int64_t group,
                          const at::Device& device);
at::Tensor apply(const Int4Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias);

}  // namespace tp::cuda
