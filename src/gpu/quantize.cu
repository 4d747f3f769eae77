// Dynamic activation quantization (per token, per 1x128 group) and the int32 -> float
// epilogue of the W8A8 GEMM. Launchers declared in kernels.h.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include "gpu/convert.cuh"
#include "gpu/kernels.h"

namespace tp::cuda {

namespace {

constexpr int kQuantThreads = 256;

/// Max over the block; every thread gets the result.
__device__ float block_max(float v) {
  __shared__ float warp_max[kQuantThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kQuantThreads / 32; ++w) r = fmaxf(r, warp_max[w]);
  return r;
}

/// One block per (row, group): the group's amax, then its quantized values.
template <typename T, bool kFp8>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_groups_kernel(const T* __restrict__ x, int64_t cols, int64_t ld_x, int64_t group, void* __restrict__ q,
                           float* __restrict__ scales) {
  const int64_t groups_per_row = cols / group;
  const int64_t row = blockIdx.x / groups_per_row;
  const int64_t g = blockIdx.x % groups_per_row;
  const T* src = x + row * ld_x + g * group;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += kQuantThreads) amax = fmaxf(amax, fabsf(to_float(src[i])));
  amax = block_max(amax);
  constexpr float kQmax = kFp8 ? 448.0f : 127.0f;
  // An all-zero group gets scale 1 (its values quantize to 0 either way), so the
  // dequantization never multiplies by 0/0.
  const float scale = amax > 0.0f ? amax / kQmax : 1.0f;
  const float inv = 1.0f / scale;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  const int64_t base = row * cols + g * group;
  for (int64_t i = threadIdx.x; i < group; i += kQuantThreads) {
    const float v = to_float(src[i]) * inv;
    if constexpr (kFp8) {
      static_cast<__nv_fp8_storage_t*>(q)[base + i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else {
      const int iv = max(-127, min(127, __float2int_rn(v)));
      static_cast<int8_t*>(q)[base + i] = static_cast<int8_t>(iv);
    }
  }
}

template <typename T>
void quantize_groups_typed(const void* x, int64_t rows, int64_t cols, int64_t ld_x, int64_t group, QElem out, void* q,
                           float* scales, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / group);
  TORCH_CHECK(blocks < (int64_t{1} << 31), "quantize: ", rows, " rows x ", cols / group,
              " groups exceed one launch; split the batch");
  const auto* xt = static_cast<const T*>(x);
  if (out == QElem::kFp8E4M3) {
    quantize_groups_kernel<T, true><<<blocks, kQuantThreads, 0, stream>>>(xt, cols, ld_x, group, q, scales);
  } else {
    quantize_groups_kernel<T, false><<<blocks, kQuantThreads, 0, stream>>>(xt, cols, ld_x, group, q, scales);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
__global__ void scale_int32_kernel(const int32_t* __restrict__ acc, int64_t M, int64_t N, const float* __restrict__ xs,
                                   const float* __restrict__ ws, const T* __restrict__ bias, T* __restrict__ y) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    // int32 -> fp32 is exact below 2^24; a K=8192 int8 dot product can reach 2^27,
    // where fp32 keeps 24 significant bits: the same relative rounding as an fp32 GEMM.
    float v = static_cast<float>(acc[i]) * xs[m] * ws[n];
    if (bias != nullptr) v += to_float(bias[n]);
    y[i] = from_float<T>(v);
  }
}

template <typename T>
void scale_int32_typed(const int32_t* acc, int64_t M, int64_t N, const float* xs, const float* ws, const void* bias,
                       void* y, cudaStream_t stream) {
  const int64_t total = M * N;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, int64_t{1} << 16);
  scale_int32_kernel<T>
      <<<blocks, threads, 0, stream>>>(acc, M, N, xs, ws, static_cast<const T*>(bias), static_cast<T*>(y));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_quantize_groups(Elem in, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int64_t group, QElem out,
                            void* q, float* scales, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(group > 0 && cols % group == 0, "quantize: group ", group, " does not divide ", cols);
  if (rows == 0 || cols == 0) return;
  switch (in) {
    case Elem::kF32: return quantize_groups_typed<float>(x, rows, cols, ld_x, group, out, q, scales, stream);
    case Elem::kF16: return quantize_groups_typed<__half>(x, rows, cols, ld_x, group, out, q, scales, stream);
    case Elem::kBF16: return quantize_groups_typed<__nv_bfloat16>(x, rows, cols, ld_x, group, out, q, scales, stream);
  }
}

void launch_scale_int32(const int32_t* acc, int64_t M, int64_t N, const float* x_scale, const float* w_scale,
                        const void* bias, Elem out, void* y, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  switch (out) {
    case Elem::kF32: return scale_int32_typed<float>(acc, M, N, x_scale, w_scale, bias, y, stream);
    case Elem::kF16: return scale_int32_typed<__half>(acc, M, N, x_scale, w_scale, bias, y, stream);
    case Elem::kBF16: return scale_int32_typed<__nv_bfloat16>(acc, M, N, x_scale, w_scale, bias, y, stream);
  }
}

}  // namespace tp::cuda
