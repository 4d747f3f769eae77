// The CUDA epilogue of all_reduce_fusion: one block per row (token). Launcher declared
// in fusion_epilogue_cuda.h.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "comm/nccl/fusion_epilogue_cuda.h"

namespace tp::detail {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_f(from_f<T>(v));
}

/// Sum (kMax: max) over the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, partial[w]) : r + partial[w];
  __syncthreads();  // partial is reused by the next reduction
  return r;
}

struct Args {
  int64_t hidden;
  int norm;   // AllReduceFusionNorm
  int quant;  // AllReduceFusionQuant
  float eps;
  const void* sum;
  const void* residual_in;
  const void* norm_weight;
  const void* norm_bias;
  void* residual_out;
  void* norm_out;
  void* quant_out;
  float* scale_out;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) fusion_epilogue_kernel(Args a) {
  const int64_t n = a.hidden, row = blockIdx.x;
  const T* sum = static_cast<const T*>(a.sum) + row * n;
  const T* res = a.residual_in ? static_cast<const T*>(a.residual_in) + row * n : nullptr;
  T* out = static_cast<T*>(a.residual_out) + row * n;
  float total = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float v = to_f(sum[i]);
    if (res) v = rounded<T>(v + to_f(res[i]));
    out[i] = from_f<T>(v);
    total += v;
  }
  if (a.norm == static_cast<int>(AllReduceFusionNorm::kNone)) return;
  // Each thread reads back only what it wrote: residual_out is h, exactly.
  const T* w = static_cast<const T*>(a.norm_weight);
  T* y = static_cast<T*>(a.norm_out) + row * n;
  float mean = 0.0f, r;
  if (a.norm == static_cast<int>(AllReduceFusionNorm::kLayerNorm)) {
    mean = block_reduce<false>(total) / static_cast<float>(n);
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const float d = to_f(out[i]) - mean;
      sq += d * d;
    }
    r = rsqrtf(block_reduce<false>(sq) / static_cast<float>(n) + a.eps);
  } else {
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const float h = to_f(out[i]);
      sq += h * h;
    }
    r = 1.0f / sqrtf(block_reduce<false>(sq) / static_cast<float>(n) + a.eps);
  }
  const T* nb = static_cast<const T*>(a.norm_bias);
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float h = to_f(out[i]), wi = to_f(w[i]);
    float v;
    switch (static_cast<AllReduceFusionNorm>(a.norm)) {
      case AllReduceFusionNorm::kRMS: v = wi * rounded<T>(h * r); break;
      case AllReduceFusionNorm::kRMSUnitOffset: v = h * r * (wi + 1.0f); break;
      case AllReduceFusionNorm::kRMSScaleFirst: v = wi * (h * r); break;
      default: v = (h - mean) * r * wi + (nb ? to_f(nb[i]) : 0.0f); break;
    }
    const T yi = from_f<T>(v);
    y[i] = yi;
    amax = fmaxf(amax, fabsf(to_f(yi)));
  }
  if (a.quant == static_cast<int>(AllReduceFusionQuant::kNone)) return;
  amax = block_reduce<true>(amax);
  const bool fp8 = a.quant == static_cast<int>(AllReduceFusionQuant::kFp8PerToken);
  const float qmax = fp8 ? 448.0f : 127.0f;
  const float scale = amax > 0.0f ? amax / qmax : 1.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float q = fminf(fmaxf(to_f(y[i]) / scale, -qmax), qmax);
    if (fp8) {
      static_cast<__nv_fp8_e4m3*>(a.quant_out)[row * n + i] = __nv_fp8_e4m3(q);
    } else {
      static_cast<int8_t*>(a.quant_out)[row * n + i] = static_cast<int8_t>(fminf(fmaxf(rintf(q), -127.0f), 127.0f));
    }
  }
  if (threadIdx.x == 0) a.scale_out[row] = scale;
}

}  // namespace

void launch_fusion_epilogue_cuda(const FusionRows& rows, const void* sum) {
  if (rows.rows == 0) return;
  const Args a{rows.hidden,
               static_cast<int>(rows.norm),
               static_cast<int>(rows.quant),
               rows.eps,
               sum,
               rows.residual_in,
               rows.norm_weight,
               rows.norm_bias,
               rows.residual_out,
               rows.norm_out,
               rows.quant_out,
               rows.scale_out};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(rows.rows));
  switch (rows.dtype) {
    case c10::kFloat: fusion_epilogue_kernel<float><<<grid, kThreads, 0, stream>>>(a); break;
    case c10::kHalf: fusion_epilogue_kernel<__half><<<grid, kThreads, 0, stream>>>(a); break;
    case c10::kBFloat16: fusion_epilogue_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a); break;
    default: TORCH_CHECK_TYPE(false, "all_reduce_fusion (CUDA): unsupported dtype ", rows.dtype);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace tp::detail
