// Weight-only INT8 / INT4 entry points (gemm.h): validation, then the GEMV kernel for
// decode batches or dequantize + cuBLASLt for larger ones.

#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "gpu/gemm.h"
#include "gpu/kernels.h"

namespace tp::cuda {

namespace {

/// The largest batch the GEMV kernel takes: past it, re-reading the weight for
/// every 16 rows costs more than one dequantize and a tensor-core GEMM.
constexpr int64_t kGemvMaxM = 16;

Elem elem(at::ScalarType t, const char* what) {
  switch (t) {
    case at::kFloat: return Elem::kF32;
    case at::kHalf: return Elem::kF16;
    case at::kBFloat16: return Elem::kBF16;
    default: TORCH_CHECK_TYPE(false, what, ": dtype ", t, " is not supported; expected float32, float16 or bfloat16");
  }
}

/// Validates the weight-only tensors; returns K (logical).
int64_t check_weight(const at::Tensor& qweight, int bits, const at::Tensor& scales,
                     const std::optional<at::Tensor>& zeros, int64_t group, const char* what) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, what, ": bits=", bits, "; expected 4 or 8");
  TORCH_CHECK_VALUE(qweight.defined() && qweight.dim() == 2 && qweight.is_cuda(), what,
                    ": qweight must be a 2-D CUDA tensor");
  TORCH_CHECK_TYPE(qweight.scalar_type() == (bits == 8 ? at::kChar : at::kByte), what, ": qweight is ",
                   qweight.scalar_type(), "; bits=", bits, " expects ", bits == 8 ? "int8 [N, K]" : "uint8 [N, K/2]");
  const int64_t N = qweight.size(0);
  const int64_t K = bits == 8 ? qweight.size(1) : 2 * qweight.size(1);
  TORCH_CHECK_VALUE(group > 0 && K % group == 0, what, ": group=", group, " does not divide K=", K);
  const int64_t groups = K / group;
  TORCH_CHECK_VALUE(scales.defined() && scales.device() == qweight.device() && scales.dim() == 2 &&
                        scales.size(0) == N && scales.size(1) == groups,
                    what, ": scales must be [", N, ", ", groups, "] on ", qweight.device(), "; got ",
                    scales.defined() ? scales.sizes() : at::IntArrayRef{});
  if (zeros && zeros->defined()) {
    TORCH_CHECK_VALUE(zeros->device() == qweight.device() && zeros->sizes() == scales.sizes(), what,
                      ": zeros must match scales' shape ", scales.sizes(), "; got ", zeros->sizes());
  }
  return K;
}

}  // namespace

at::Tensor pack_int4(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.defined() && q.dim() == 2 && q.size(1) % 2 == 0, "tp::cuda::pack_int4: expected [N, K] ",
                    "codes with an even K; got ", q.defined() ? q.sizes() : at::IntArrayRef{});
  const auto codes = q.to(at::kInt);
  TORCH_CHECK_VALUE(q.numel() == 0 || (codes.min().item<int>() >= 0 && codes.max().item<int>() <= 15),
                    "tp::cuda::pack_int4: codes must lie in 0..15");
  const auto lo = codes.slice(1, 0, q.size(1), 2);
  const auto hi = codes.slice(1, 1, q.size(1), 2);
  return (lo + hi * 16).to(at::kByte).contiguous();
}

at::Tensor dequantize_weight_only(const at::Tensor& qweight, int bits, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& zeros, int64_t group, at::ScalarType dtype) {
  constexpr const char* what = "tp::cuda::dequantize_weight_only";
  const int64_t K = check_weight(qweight, bits, scales, zeros, group, what);
  const auto e = elem(dtype, what);
  const c10::cuda::CUDAGuard guard(qweight.device());
  const int64_t N = qweight.size(0);
  const auto qc = qweight.contiguous();
  const auto sc = scales.to(at::kFloat).contiguous();
  const auto zc = zeros && zeros->defined() ? zeros->to(at::kFloat).contiguous() : at::Tensor();
  auto w = at::empty({N, K}, qweight.options().dtype(dtype));
  launch_dequantize_weight(qc.data_ptr(), bits, sc.data_ptr<float>(), zc.defined() ? zc.data_ptr<float>() : nullptr, N,
                           K, group, e, w.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
  return w;
}

at::Tensor weight_only_linear(const at::Tensor& x, const at::Tensor& qweight, int bits, const at::Tensor& scales,
                              const std::optional<at::Tensor>& zeros, int64_t group,
                              const std::optional<at::Tensor>& bias) {
  constexpr const char* what = "tp::cuda::weight_only_linear";
  const int64_t K = check_weight(qweight, bits, scales, zeros, group, what);
  TORCH_CHECK_VALUE(x.defined() && x.is_cuda() && x.device() == qweight.device(), what, ": x must be on ",
                    qweight.device());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == K, what, ": x has shape ", x.sizes(), " but the weight has K=", K);
  const auto e = elem(x.scalar_type(), what);
  const c10::cuda::CUDAGuard guard(qweight.device());
  const int64_t N = qweight.size(0);
  auto shape = x.sizes().vec();
  shape.back() = N;
  auto x2 = x.reshape({-1, K});
  const int64_t M = x2.size(0);
  if (M >= 1 && M <= kGemvMaxM && K % 32 == 0 && group % 32 == 0 && N > 0) {
    // 16-byte rows for the vector loads: contiguous with K % 32 == 0 guarantees it.
    x2 = x2.contiguous();
    const auto qc = qweight.contiguous();
    const auto sc = scales.to(at::kFloat).contiguous();
    const auto zc = zeros && zeros->defined() ? zeros->to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor b;
    if (bias && bias->defined()) {
      TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N && bias->device() == qweight.device(), what,
                        ": bias must be [", N, "] on ", qweight.device(), "; got ", bias->sizes());
      b = bias->to(x.scalar_type()).contiguous();
    }
    auto y = at::empty({M, N}, x.options());
    launch_weight_only_gemv(e, x2.data_ptr(), M, K, x2.stride(0), qc.data_ptr(), bits, sc.data_ptr<float>(),
                            zc.defined() ? zc.data_ptr<float>() : nullptr, group, b.defined() ? b.data_ptr() : nullptr,
                            y.data_ptr(), N, c10::cuda::getCurrentCUDAStream().stream());
    return y.view(shape);
  }
  // Large batches: the GEMM is compute-bound, so one dequantized copy of the weight
  // (in x's dtype) and a tensor-core GEMM beat re-reading packed codes per tile.
  const auto w = dequantize_weight_only(qweight, bits, scales, zeros, group, x.scalar_type());
  return tp::cuda::linear(x, w, bias);
}

}  // namespace tp::cuda
