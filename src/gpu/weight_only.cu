// Weight-only INT8 / INT4 (group-wise) kernels: a GEMV that dequantizes in registers
// for decode-sized batches (M <= 16, memory-bound: the weight is read once, 16 bytes
// per load, and every x row reuses it), and a dequantize kernel that feeds a
// cuBLASLt GEMM for larger M. Layout: kernels.h. Launchers declared there.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include "gpu/convert.cuh"
#include "gpu/kernels.h"

namespace tp::cuda {

namespace {

/// Loads kN consecutive elements of x (16-byte aligned) as floats, 16 bytes at a time.
template <typename T, int kN>
__device__ __forceinline__ void load_x(const T* __restrict__ p, float (&out)[kN]) {
  constexpr int kPerVec = 16 / sizeof(T);
  static_assert(kN % kPerVec == 0, "x chunk must be whole 16-byte vectors");
#pragma unroll
  for (int v = 0; v < kN / kPerVec; ++v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + v * kPerVec);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerVec; ++i) out[v * kPerVec + i] = to_float(e[i]);
  }
}

constexpr int kGemvWarps = 4;  // output features per block

/// One warp per output feature n; lanes stride over the row's 16-byte weight chunks
/// (16 int8 or 32 int4 values, always inside one quant group since group % chunk == 0).
template <typename T, int kBits, int kMaxM>
__global__ void __launch_bounds__(kGemvWarps * 32)
    weight_only_gemv_kernel(const T* __restrict__ x, int M, int64_t K, int64_t ld_x,
                            const uint8_t* __restrict__ qweight, const float* __restrict__ scales,
                            const float* __restrict__ zeros, int64_t group, const T* __restrict__ bias,
                            T* __restrict__ y, int64_t N) {
  constexpr int kElems = kBits == 8 ? 16 : 32;  // weight values per 16-byte load
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t{blockIdx.x} * kGemvWarps + threadIdx.x / 32;
  if (n >= N) return;  // whole warp leaves together: no shuffle below misses a lane
  const int64_t row_bytes = K * kBits / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(qweight + n * row_bytes);
  const int64_t groups = K / group;
  const float default_zero = kBits == 8 ? 0.0f : 8.0f;

  float acc[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) acc[m] = 0.0f;

  const int64_t chunks = K / kElems;
  for (int64_t c = lane; c < chunks; c += 32) {
    // The weight is streamed once: read-only path, no reuse to keep in L1.
    const uint4 raw = __ldg(wrow + c);
    const int64_t g = (c * kElems) / group;
    const float s = scales[n * groups + g];
    const float z = zeros != nullptr ? zeros[n * groups + g] : default_zero;
    float w[kElems];
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if constexpr (kBits == 8) {
        w[i] = (static_cast<float>(static_cast<int8_t>(bytes[i])) - z) * s;
      } else {
        w[2 * i] = (static_cast<float>(bytes[i] & 0xF) - z) * s;
        w[2 * i + 1] = (static_cast<float>(bytes[i] >> 4) - z) * s;
      }
    }
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m < M) {
        float xv[kElems];
        load_x<T, kElems>(x + m * ld_x + c * kElems, xv);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kElems; ++i) dot = fmaf(w[i], xv[i], dot);
        acc[m] += dot;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m < M) {
      float v = acc[m];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) {
        if (bias != nullptr) v += to_float(bias[n]);
        y[m * N + n] = from_float<T>(v);
      }
    }
  }
}

template <typename T, int kBits, int kMaxM>
void gemv_launch(const void* x, int64_t M, int64_t K, int64_t ld_x, const void* qweight, const float* scales,
                 const float* zeros, int64_t group, const void* bias, void* y, int64_t N, cudaStream_t stream) {
  const int64_t blocks = (N + kGemvWarps - 1) / kGemvWarps;
  weight_only_gemv_kernel<T, kBits, kMaxM><<<blocks, kGemvWarps * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<int>(M), K, ld_x, static_cast<const uint8_t*>(qweight), scales, zeros,
      group, static_cast<const T*>(bias), static_cast<T*>(y), N);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/// Picks the smallest compiled M tile that holds M (registers scale with it).
template <typename T, int kBits>
void gemv_dispatch_m(const void* x, int64_t M, int64_t K, int64_t ld_x, const void* qweight, const float* scales,
                     const float* zeros, int64_t group, const void* bias, void* y, int64_t N, cudaStream_t stream) {
  if (M <= 1) return gemv_launch<T, kBits, 1>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
  if (M <= 4) return gemv_launch<T, kBits, 4>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
  if (M <= 8) return gemv_launch<T, kBits, 8>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
  return gemv_launch<T, kBits, 16>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
}

template <typename T>
void gemv_dispatch_bits(const void* x, int64_t M, int64_t K, int64_t ld_x, const void* qweight, int bits,
                        const float* scales, const float* zeros, int64_t group, const void* bias, void* y, int64_t N,
                        cudaStream_t stream) {
  if (bits == 8) return gemv_dispatch_m<T, 8>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
  return gemv_dispatch_m<T, 4>(x, M, K, ld_x, qweight, scales, zeros, group, bias, y, N, stream);
}

template <typename T, int kBits>
__global__ void dequantize_kernel(const uint8_t* __restrict__ qweight, const float* __restrict__ scales,
                                  const float* __restrict__ zeros, int64_t N, int64_t K, int64_t group,
                                  T* __restrict__ w) {
  const int64_t total = N * K;
  const int64_t groups = K / group;
  const float default_zero = kBits == 8 ? 0.0f : 8.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    float q;
    if constexpr (kBits == 8) {
      q = static_cast<float>(reinterpret_cast<const int8_t*>(qweight)[i]);
    } else {
      const uint8_t b = qweight[n * (K / 2) + k / 2];
      q = static_cast<float>((k % 2 == 0) ? (b & 0xF) : (b >> 4));
    }
    const int64_t gi = n * groups + k / group;
    const float z = zeros != nullptr ? zeros[gi] : default_zero;
    w[i] = from_float<T>((q - z) * scales[gi]);
  }
}

template <typename T>
void dequantize_typed(const void* qweight, int bits, const float* scales, const float* zeros, int64_t N, int64_t K,
                      int64_t group, void* w, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((N * K + threads - 1) / threads, int64_t{1} << 16);
  const auto* q = static_cast<const uint8_t*>(qweight);
  if (bits == 8) {
    dequantize_kernel<T, 8><<<blocks, threads, 0, stream>>>(q, scales, zeros, N, K, group, static_cast<T*>(w));
  } else {
    dequantize_kernel<T, 4><<<blocks, threads, 0, stream>>>(q, scales, zeros, N, K, group, static_cast<T*>(w));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_weight_only_gemv(Elem t, const void* x, int64_t M, int64_t K, int64_t ld_x, const void* qweight, int bits,
                             const float* scales, const float* zeros, int64_t group, const void* bias, void* y,
                             int64_t N, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(M >= 1 && M <= 16 && K % 32 == 0 && group % 32 == 0 && (bits == 4 || bits == 8),
                        "weight_only_gemv: M=", M, " K=", K, " group=", group, " bits=", bits);
  if (N == 0) return;
  switch (t) {
    case Elem::kF32:
      return gemv_dispatch_bits<float>(x, M, K, ld_x, qweight, bits, scales, zeros, group, bias, y, N, stream);
    case Elem::kF16:
      return gemv_dispatch_bits<__half>(x, M, K, ld_x, qweight, bits, scales, zeros, group, bias, y, N, stream);
    case Elem::kBF16:
      return gemv_dispatch_bits<__nv_bfloat16>(x, M, K, ld_x, qweight, bits, scales, zeros, group, bias, y, N, stream);
  }
}

void launch_dequantize_weight(const void* qweight, int bits, const float* scales, const float* zeros, int64_t N,
                              int64_t K, int64_t group, Elem t, void* w, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(group > 0 && K % group == 0 && (bits == 4 || bits == 8) && (bits == 8 || K % 2 == 0),
                        "dequantize_weight: K=", K, " group=", group, " bits=", bits);
  if (N == 0 || K == 0) return;
  switch (t) {
    case Elem::kF32: return dequantize_typed<float>(qweight, bits, scales, zeros, N, K, group, w, stream);
    case Elem::kF16: return dequantize_typed<__half>(qweight, bits, scales, zeros, N, K, group, w, stream);
    case Elem::kBF16: return dequantize_typed<__nv_bfloat16>(qweight, bits, scales, zeros, N, K, group, w, stream);
  }
}

}  // namespace tp::cuda
