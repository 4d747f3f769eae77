// Typed GEMM entry points (gemm.h) over the cuBLASLt wrapper: shapes and dtypes are
// validated here, the MatmulSpec is built, and unsupported combinations fall back.

#include "gpu/gemm.h"

#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "gpu/cublaslt.h"
#include "gpu/kernels.h"

namespace tp::cuda {

namespace {

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDA_R_32F;
    case at::kHalf: return CUDA_R_16F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kFloat8_e4m3fn: return CUDA_R_8F_E4M3;
    case at::kChar: return CUDA_R_8I;
    case at::kInt: return CUDA_R_32I;
    default: TORCH_CHECK_TYPE(false, "tp::cuda: no cuBLASLt data type for ", t);
  }
}

Elem elem(at::ScalarType t, const char* what) {
  switch (t) {
    case at::kFloat: return Elem::kF32;
    case at::kHalf: return Elem::kF16;
    case at::kBFloat16: return Elem::kBF16;
    default: TORCH_CHECK_TYPE(false, what, ": dtype ", t, " is not supported; expected float32, float16 or bfloat16");
  }
}

/// x's leading shape with the last dimension replaced by n.
std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  auto s = x.sizes().vec();
  s.back() = n;
  return s;
}

/// A 2-D view with unit column stride and a row stride the GEMM can take.
at::Tensor rows_view(const at::Tensor& t, int64_t k) {
  auto r = t.reshape({-1, k});
  if (r.stride(1) != 1 || r.stride(0) < std::max<int64_t>(k, 1) || r.size(0) == 1) r = r.contiguous();
  return r;
}

void check_cuda_operand(const at::Tensor& t, const char* what, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.defined(), what, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == device, what, ": ", name, " is on ", t.device(),
                    " but the GEMM runs on ", device, "; move it there first");
}

// The quantized GEMMs' operands: x_q [M, K] and w_q [N, K] 2-D, everything on w_q's
// CUDA device. Returns that device.
at::Device check_quantized_operands(const char* what, const at::Tensor& x_q, const at::Tensor& x_scale,
                                    const at::Tensor& w_q, const at::Tensor& w_scale) {
  TORCH_CHECK_VALUE(w_q.defined() && w_q.dim() == 2 && x_q.defined() && x_q.dim() == 2, what,
                    ": x_q and w_q must be 2-D ([M, K] and [N, K])");
  const auto device = w_q.device();
  check_cuda_operand(x_q, what, "x_q", device);
  check_cuda_operand(w_q, what, "w_q", device);
  check_cuda_operand(x_scale, what, "x_scale", device);
  check_cuda_operand(w_scale, what, "w_scale", device);
  return device;
}

/// bias as a contiguous [n] tensor of `dtype`, validated.
at::Tensor bias_vector(const std::optional<at::Tensor>& bias, int64_t n, at::ScalarType dtype, const char* what,
                       const at::Device& device) {
  if (!bias || !bias->defined()) return {};
  check_cuda_operand(*bias, what, "bias", device);
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n, what, ": bias has shape ", bias->sizes(), "; expected [", n,
                    "] (one value per output feature)");
  return bias->to(dtype).contiguous();
}

MatmulSpec base_spec(int64_t M, int64_t N, int64_t K, int64_t ld_w, int64_t ld_x, int64_t ld_y) {
  MatmulSpec s;
  s.m = N;
  s.n = M;
  s.k = K;
  s.lda = ld_w;
  s.ldb = ld_x;
  s.ldd = ld_y;
  s.trans_a = true;
  s.trans_b = false;
  return s;
}

void set_alignments(MatmulSpec& s, const MatmulArgs& a) {
  s.align_a = pointer_alignment(a.a);
  s.align_b = pointer_alignment(a.b);
  s.align_d = pointer_alignment(a.d);
  s.align_bias = a.bias ? pointer_alignment(a.bias) : 256;
}

/// Runs with the bias epilogue when there is a bias and cuBLASLt has it; otherwise
/// without, then adds the bias. False when neither is supported.
bool matmul_with_bias(MatmulSpec spec, MatmulArgs args, const at::Tensor& bias, at::Tensor& y, const char* what) {
  if (bias.defined() && bias.scalar_type() == y.scalar_type()) {
    spec.bias = true;
    spec.bias_type = cuda_type(bias.scalar_type());
    args.bias = bias.data_ptr();
    set_alignments(spec, args);
    if (matmul(spec, args, what)) return true;
  }
  spec.bias = false;
  args.bias = nullptr;
  set_alignments(spec, args);
  if (!matmul(spec, args, what)) return false;
  if (bias.defined()) y.add_(bias);
  return true;
}

}  // namespace

const char* to_string(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::kPerTensor: return "per_tensor";
    case Fp8Scaling::kPerChannel: return "per_channel";
    case Fp8Scaling::kBlock: return "block128";
  }
  return "unknown";
}

// ---- bf16 / fp16 / fp32 -------------------------------------------------------------------

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  constexpr const char* what = "tp::cuda::linear";
  TORCH_CHECK_VALUE(w.defined() && w.dim() == 2, what, ": weight must be 2-D [out, in], got ", w.sizes());
  check_cuda_operand(x, what, "x", w.device());
  check_cuda_operand(w, what, "weight", w.device());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w.size(1), what, ": x has shape ", x.sizes(), " but weight is ",
                    w.sizes(), "; x's last dimension must equal the weight's in_features ", w.size(1));
  TORCH_CHECK_TYPE(x.scalar_type() == w.scalar_type(), what, ": x is ", x.scalar_type(), " but weight is ",
                   w.scalar_type());
  elem(x.scalar_type(), what);
  const c10::cuda::CUDAGuard guard(w.device());
  const int64_t N = w.size(0), K = w.size(1);
  const auto x2 = rows_view(x, K);
  const int64_t M = x2.size(0);
  const auto b = bias_vector(bias, N, x.scalar_type(), what, w.device());
  if (M == 0 || N == 0 || K == 0) {
    // Nothing for cuBLASLt to do (K = 0 is a sum over nothing: the bias alone).
    auto y = at::zeros({M, N}, x.options());
    if (b.defined()) y.add_(b);
    return y.view(out_shape(x, N));
  }
  const auto wc = (w.stride(1) == 1 && w.stride(0) >= K) ? w : w.contiguous();
  auto y = at::empty({M, N}, x.options());
  auto spec = base_spec(M, N, K, wc.stride(0), x2.stride(0), N);
  spec.a_type = spec.b_type = spec.d_type = cuda_type(x.scalar_type());
  spec.compute = CUBLAS_COMPUTE_32F;
  spec.scale_type = CUDA_R_32F;
  MatmulArgs args;
  args.a = wc.data_ptr();
  args.b = x2.data_ptr();
  args.d = y.data_ptr();
  if (!matmul_with_bias(spec, args, b, y, what)) {
    TORCH_WARN_ONCE("tp: cuBLASLt has no kernel for ", spec.describe(), " on this GPU; using at::linear");
    return at::linear(x, w, bias);
  }
  return y.view(out_shape(x, N));
}

// ---- dynamic activation quantization ----------------------------------------------------

std::pair<at::Tensor, at::Tensor> quantize_groups(const at::Tensor& x2d, at::ScalarType qtype, int64_t group) {
  constexpr const char* what = "tp::cuda::quantize_groups";
  TORCH_CHECK_VALUE(x2d.defined() && x2d.dim() == 2 && x2d.is_cuda(), what, ": expected a 2-D CUDA tensor, got ",
                    x2d.defined() ? x2d.sizes() : at::IntArrayRef{}, x2d.defined() ? " on " : "",
                    x2d.defined() ? x2d.device().str() : std::string("undefined"));
  TORCH_CHECK_TYPE(qtype == at::kChar || qtype == at::kFloat8_e4m3fn, what, ": qtype ", qtype,
                   " is not supported; expected int8 or float8_e4m3fn");
  const int64_t M = x2d.size(0), K = x2d.size(1);
  const int64_t g = group > 0 ? group : std::max<int64_t>(K, 1);
  TORCH_CHECK_VALUE(K == 0 || K % g == 0, what, ": group ", g, " does not divide the row length ", K);
  const c10::cuda::CUDAGuard guard(x2d.device());
  const auto xc = x2d.stride(1) == 1 ? x2d : x2d.contiguous();
  auto q = at::empty({M, K}, x2d.options().dtype(qtype));
  auto scale = at::empty({M, K == 0 ? 0 : K / g}, x2d.options().dtype(at::kFloat));
  if (M > 0 && K > 0) {
    launch_quantize_groups(elem(x2d.scalar_type(), what), xc.data_ptr(), M, K, xc.stride(0), g,
                           qtype == at::kChar ? QElem::kInt8 : QElem::kFp8E4M3, q.data_ptr(), scale.data_ptr<float>(),
                           c10::cuda::getCurrentCUDAStream().stream());
  }
  return {q, scale};
}

// ---- FP8 ------------------------------------------------------------------------------------

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// x_q [M, K] and w_q [N, K] dequantized to fp32 with their scales, and multiplied:
/// the path when cuBLASLt cannot (or must not) take the scaled GEMM.
at::Tensor fp8_fallback(const at::Tensor& x_q, const at::Tensor& x_scale, const at::Tensor& w_q,
                        const at::Tensor& w_scale, Fp8Scaling scaling, const at::Tensor& bias,
                        at::ScalarType out_dtype) {
  const int64_t M = x_q.size(0), N = w_q.size(0), K = x_q.size(1);
  at::Tensor x, w;
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      x = x_q.to(at::kFloat) * x_scale.reshape({});
      w = w_q.to(at::kFloat) * w_scale.reshape({});
      break;
    case Fp8Scaling::kPerChannel:
      x = x_q.to(at::kFloat) * x_scale.reshape({M, 1});
      w = w_q.to(at::kFloat) * w_scale.reshape({N, 1});
      break;
    case Fp8Scaling::kBlock:
      x = x_q.to(at::kFloat) * x_scale.repeat_interleave(128, 1).narrow(1, 0, K);
      w = w_q.to(at::kFloat) *
          w_scale.repeat_interleave(128, 0).narrow(0, 0, N).repeat_interleave(128, 1).narrow(1, 0, K);
      break;
  }
  auto y = at::linear(x, w);
  if (bias.defined()) y.add_(bias.to(at::kFloat));
  return y.to(out_dtype);
}

int32_t scale_mode(Fp8Scaling s, bool weight) {
  switch (s) {
    case Fp8Scaling::kPerTensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8Scaling::kPerChannel: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case Fp8Scaling::kBlock:
      return weight ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  }
  return -1;
}

}  // namespace

at::Tensor fp8_gemm(const at::Tensor& x_q, const at::Tensor& x_scale, const at::Tensor& w_q, const at::Tensor& w_scale,
                    Fp8Scaling scaling, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  constexpr const char* what = "tp::cuda::fp8_gemm";
  const auto device = check_quantized_operands(what, x_q, x_scale, w_q, w_scale);
  TORCH_CHECK_TYPE(x_q.scalar_type() == at::kFloat8_e4m3fn && w_q.scalar_type() == at::kFloat8_e4m3fn, what,
                   ": x_q is ", x_q.scalar_type(), " and w_q is ", w_q.scalar_type(), "; both must be float8_e4m3fn");
  TORCH_CHECK_TYPE(x_scale.scalar_type() == at::kFloat && w_scale.scalar_type() == at::kFloat, what,
                   ": scales must be float32, got x_scale ", x_scale.scalar_type(), " and w_scale ",
                   w_scale.scalar_type());
  const int64_t M = x_q.size(0), K = x_q.size(1), N = w_q.size(0);
  TORCH_CHECK_VALUE(w_q.size(1) == K, what, ": x_q is ", x_q.sizes(), " but w_q is ", w_q.sizes(),
                    "; the K dimensions differ");
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
      TORCH_CHECK_VALUE(x_scale.numel() == 1 && w_scale.numel() == 1, what,
                        ": per-tensor scaling needs one scale each; got x_scale ", x_scale.sizes(), " and w_scale ",
                        w_scale.sizes());
      break;
    case Fp8Scaling::kPerChannel:
      TORCH_CHECK_VALUE(x_scale.numel() == M && w_scale.numel() == N, what, ": per-channel scaling needs x_scale of ",
                        M, " (tokens) and w_scale of ", N, " (output features); got ", x_scale.sizes(), " and ",
                        w_scale.sizes());
      break;
    case Fp8Scaling::kBlock:
      TORCH_CHECK_VALUE(x_scale.dim() == 2 && x_scale.size(0) == M && x_scale.size(1) == ceil_div(K, 128) &&
                            w_scale.dim() == 2 && w_scale.size(0) == ceil_div(N, 128) &&
                            w_scale.size(1) == ceil_div(K, 128),
                        what, ": block scaling needs x_scale [", M, ", ", ceil_div(K, 128), "] and w_scale [",
                        ceil_div(N, 128), ", ", ceil_div(K, 128), "]; got ", x_scale.sizes(), " and ", w_scale.sizes());
      break;
  }
  const c10::cuda::CUDAGuard guard(device);
  const auto b = bias_vector(bias, N, out_dtype, what, device);
  if (M == 0 || N == 0 || K == 0) return fp8_fallback(x_q, x_scale, w_q, w_scale, scaling, b, out_dtype);

  // cuBLASLt's FP8 rules: TN layout (ours), 16-byte aligned leading dimensions (K % 16
  // for the fp8 operands, N % 8 for a 16-bit output); block scales need whole 128
  // blocks. Outside them, the fallback.
  const bool shape_ok = K % 16 == 0 && N % 16 == 0 &&
                        (scaling != Fp8Scaling::kBlock || (K % 128 == 0 && N % 128 == 0)) &&
                        (out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat);
  if (!shape_ok) {
    TORCH_WARN_ONCE("tp: FP8 GEMM M=", M, " N=", N, " K=", K, " (", to_string(scaling),
                    ") is outside cuBLASLt's FP8 shape rules (K and N multiples of 16; 128 for block scales); "
                    "using dequantize + fp32 GEMM");
    return fp8_fallback(x_q, x_scale, w_q, w_scale, scaling, b, out_dtype);
  }
  auto xq = x_q.contiguous();
  auto wq = w_q.contiguous();
  at::Tensor a_scale, b_scale;
  int64_t Mp = M;
  switch (scaling) {
    case Fp8Scaling::kPerTensor:
    case Fp8Scaling::kPerChannel:
      a_scale = w_scale.reshape({-1}).contiguous();
      b_scale = x_scale.reshape({-1}).contiguous();
      break;
    case Fp8Scaling::kBlock: {
      // cuBLASLt's layouts (as torch's _scaled_mm passes them on sm_90):
      // weight (A, 128x128 blocks): [N/128, roundup(K/128, 4)] row-major, K blocks
      //   contiguous, the row pitch padded to 16 bytes;
      // activations (B, 1x128 groups): [K/128, M'] row-major (token-contiguous), with
      //   M' = M rounded up to 4 (x_q padded with zero rows, which are sliced off).
      const int64_t kb = K / 128, kb4 = ceil_div(kb, 4) * 4;
      Mp = ceil_div(M, 4) * 4;
      a_scale = at::zeros({N / 128, kb4}, w_scale.options());
      a_scale.narrow(1, 0, kb).copy_(w_scale);
      b_scale = at::ones({kb, Mp}, x_scale.options());
      b_scale.narrow(1, 0, M).copy_(x_scale.t());
      if (Mp != M) xq = at::cat({xq, at::zeros({Mp - M, K}, xq.options())}, 0);
      break;
    }
  }
  auto y = at::empty({Mp, N}, x_q.options().dtype(out_dtype));
  auto spec = base_spec(Mp, N, K, K, K, N);
  spec.a_type = spec.b_type = CUDA_R_8F_E4M3;
  spec.d_type = cuda_type(out_dtype);
  spec.compute = CUBLAS_COMPUTE_32F;
  spec.scale_type = CUDA_R_32F;
  spec.a_scale_mode = scale_mode(scaling, true);
  spec.b_scale_mode = scale_mode(scaling, false);
  MatmulArgs args;
  args.a = wq.data_ptr();
  args.b = xq.data_ptr();
  args.d = y.data_ptr();
  args.a_scale = a_scale.data_ptr();
  args.b_scale = b_scale.data_ptr();
  if (!matmul_with_bias(spec, args, b, y, what)) {
    TORCH_WARN_ONCE("tp: cuBLASLt has no FP8 kernel for ", spec.describe(),
                    " on this GPU; using dequantize + fp32 GEMM (correct, slower)");
    return fp8_fallback(x_q, x_scale, w_q, w_scale, scaling, b, out_dtype);
  }
  return Mp == M ? y : y.narrow(0, 0, M);
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale, Fp8Scaling scaling,
                      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& input_scale) {
  constexpr const char* what = "tp::cuda::fp8_linear";
  TORCH_CHECK_VALUE(w_q.defined() && w_q.dim() == 2, what, ": w_q must be 2-D [N, K]");
  check_cuda_operand(x, what, "x", w_q.device());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w_q.size(1), what, ": x has shape ", x.sizes(), " but the weight is ",
                    w_q.sizes());
  elem(x.scalar_type(), what);
  const c10::cuda::CUDAGuard guard(w_q.device());
  const int64_t K = w_q.size(1), N = w_q.size(0);
  const auto x2 = rows_view(x, K);
  const int64_t M = x2.size(0);
  at::Tensor q, scale;
  switch (scaling) {
    case Fp8Scaling::kPerTensor: {
      if (input_scale && input_scale->defined()) {
        TORCH_CHECK_VALUE(input_scale->numel() == 1, what, ": input_scale must hold one value; got ",
                          input_scale->sizes());
        scale = input_scale->to(x2.device(), at::kFloat).reshape({1});
      } else {
        // One scale for the whole activation, computed on the device (no host sync,
        // so it can be captured in a CUDA graph).
        const auto amax = x2.abs().amax().to(at::kFloat);
        scale = at::where(amax > 0, amax / 448.0, at::ones_like(amax)).reshape({1});
      }
      q = (x2.to(at::kFloat) / scale).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn);
      break;
    }
    case Fp8Scaling::kPerChannel: {
      std::tie(q, scale) = quantize_groups(x2, at::kFloat8_e4m3fn, 0);
      scale = scale.reshape({M});
      break;
    }
    case Fp8Scaling::kBlock: {
      const int64_t kp = ceil_div(K, 128) * 128;
      // A K that is not a multiple of 128 is quantized with zero padding, so the last
      // group's scale covers exactly the weight block's columns.
      const auto xp = kp == K ? x2 : at::constant_pad_nd(x2, {0, kp - K});
      std::tie(q, scale) = quantize_groups(xp, at::kFloat8_e4m3fn, 128);
      if (kp != K) q = q.narrow(1, 0, K);
      break;
    }
  }
  // FP8 GEMMs write bf16 (or fp16); an fp32 x gets a bf16 GEMM output converted back.
  const auto out_dtype = x.scalar_type() == at::kHalf ? at::kHalf : at::kBFloat16;
  std::optional<at::Tensor> gemm_bias;
  if (bias && bias->defined() && bias->scalar_type() == out_dtype) gemm_bias = bias;
  auto y = fp8_gemm(q, scale, w_q, w_scale, scaling, gemm_bias, out_dtype).to(x.scalar_type());
  if (bias && bias->defined() && !gemm_bias) y.add_(bias->to(x.scalar_type()));
  return y.view(out_shape(x, N));
}

// ---- INT8 W8A8 ------------------------------------------------------------------------------

at::Tensor int8_gemm(const at::Tensor& x_q, const at::Tensor& x_scale, const at::Tensor& w_q, const at::Tensor& w_scale,
                     const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  constexpr const char* what = "tp::cuda::int8_gemm";
  const auto device = check_quantized_operands(what, x_q, x_scale, w_q, w_scale);
  TORCH_CHECK_TYPE(x_q.scalar_type() == at::kChar && w_q.scalar_type() == at::kChar, what, ": x_q is ",
                   x_q.scalar_type(), " and w_q is ", w_q.scalar_type(), "; both must be int8");
  const int64_t M = x_q.size(0), K = x_q.size(1), N = w_q.size(0);
  TORCH_CHECK_VALUE(w_q.size(1) == K, what, ": x_q is ", x_q.sizes(), " but w_q is ", w_q.sizes(),
                    "; the K dimensions differ");
  TORCH_CHECK_VALUE(x_scale.numel() == M && w_scale.numel() == N, what, ": needs x_scale of ", M,
                    " (per token) and w_scale of ", N, " (per output feature); got ", x_scale.sizes(), " and ",
                    w_scale.sizes());
  const auto oe = elem(out_dtype, what);
  const c10::cuda::CUDAGuard guard(device);
  const auto b = bias_vector(bias, N, out_dtype, what, device);
  const auto xs = x_scale.to(at::kFloat).reshape({M}).contiguous();
  const auto ws = w_scale.to(at::kFloat).reshape({N}).contiguous();
  auto y = at::empty({M, N}, x_q.options().dtype(out_dtype));
  if (M == 0 || N == 0) return y;
  at::Tensor acc;
  const auto xq = x_q.contiguous(), wq = w_q.contiguous();
  if (K > 0 && K % 4 == 0 && N % 4 == 0) {
    // IMMA kernels want 4-byte aligned rows of the int8 operands.
    acc = at::empty({M, N}, x_q.options().dtype(at::kInt));
    auto spec = base_spec(M, N, K, K, K, N);
    spec.a_type = spec.b_type = CUDA_R_8I;
    spec.d_type = CUDA_R_32I;
    spec.compute = CUBLAS_COMPUTE_32I;
    spec.scale_type = CUDA_R_32I;
    MatmulArgs args;
    args.a = wq.data_ptr();
    args.b = xq.data_ptr();
    args.d = acc.data_ptr();
    set_alignments(spec, args);
    if (!matmul(spec, args, what)) {
      TORCH_WARN_ONCE("tp: cuBLASLt has no int8 kernel for ", spec.describe(), " on this GPU; using a fallback");
      acc = at::Tensor();
    }
  }
  if (!acc.defined()) {
    if (M > 16 && K > 0 && K % 8 == 0 && N % 8 == 0) {
      acc = at::_int_mm(xq, wq.t());  // its shape rules: M > 16, K and N multiples of 8
    } else {
      // Exact: int8 products and their fp32 sums stay integers while |sum| < 2^24
      // (K <= 1040); beyond, fp32 rounding matches an fp32 GEMM's.
      acc = at::linear(xq.to(at::kFloat), wq.to(at::kFloat)).round().to(at::kInt);
    }
  }
  launch_scale_int32(acc.data_ptr<int32_t>(), M, N, xs.data_ptr<float>(), ws.data_ptr<float>(),
                     b.defined() ? b.data_ptr() : nullptr, oe, y.data_ptr(),
                     c10::cuda::getCurrentCUDAStream().stream());
  return y;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                       const std::optional<at::Tensor>& bias) {
  constexpr const char* what = "tp::cuda::int8_linear";
  TORCH_CHECK_VALUE(w_q.defined() && w_q.dim() == 2, what, ": w_q must be 2-D [N, K]");
  check_cuda_operand(x, what, "x", w_q.device());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w_q.size(1), what, ": x has shape ", x.sizes(), " but the weight is ",
                    w_q.sizes());
  const c10::cuda::CUDAGuard guard(w_q.device());
  const int64_t K = w_q.size(1), N = w_q.size(0);
  const auto x2 = rows_view(x, K);
  auto [q, scale] = quantize_groups(x2, at::kChar, 0);
  auto y = int8_gemm(q, scale.reshape({x2.size(0)}), w_q, w_scale, bias, x.scalar_type());
  return y.view(out_shape(x, N));
}

}  // namespace tp::cuda
