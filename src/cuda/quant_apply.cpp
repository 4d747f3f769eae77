#include "cuda/quant_apply.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tp::cuda {

Fp8Prepared prepare_fp8(QuantFormat format, const at::Tensor& weight, const at::Tensor& scale_rows,
                        const std::optional<at::Tensor>& input_scale, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.scalar_type() == at::kFloat8_e4m3fn, "prepare_fp8: weight must be ",
                    "float8_e4m3fn [N, K]; got ", weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const auto rows = scale_rows.to(weight.device(), at::kFloat).reshape({N, -1});
  Fp8Prepared p;
  p.weight = weight.contiguous();
  if (N == 0 || K == 0) {  // a rank that owns no rows or columns: its GEMM is zeros
    p.dequantized = at::zeros({N, K}, weight.options().dtype(dtype));
    return p;
  }
  switch (format) {
    case QuantFormat::kFp8PerTensor:
      p.scaling = Fp8Scaling::kPerTensor;
      // The method stores the one scale on every row; row 0 holds it (an empty
      // weight never reaches the GEMM).
      p.w_scale = N > 0 ? rows.narrow(0, 0, 1).reshape({1}).contiguous() : at::ones({1}, rows.options());
      if (input_scale && input_scale->defined()) p.input_scale = input_scale->to(weight.device(), at::kFloat);
      return p;
    case QuantFormat::kFp8PerChannel:
      p.scaling = Fp8Scaling::kPerChannel;
      p.w_scale = rows.reshape({N}).contiguous();
      return p;
    case QuantFormat::kFp8Block: {
      p.scaling = Fp8Scaling::kBlock;
      const int64_t kb = (K + 127) / 128;
      TORCH_CHECK_VALUE(rows.size(1) == kb, "prepare_fp8: block scales have ", rows.size(1), " columns; K=", K,
                        " needs ", kb);
      if (N % 128 == 0 && N > 0) {
        const auto heads = rows.slice(0, 0, N, 128);  // [N/128, kb]: each 128-row group's first row
        if (at::equal(heads.repeat_interleave(128, 0), rows)) {
          p.w_scale = heads.contiguous();
          return p;
        }
      }
      TORCH_WARN_ONCE("tp: an fp8_block shard's rows do not start on a 128-row block (N=", N,
                      "); its CUDA path keeps the weight dequantized and runs a ", dtype, " GEMM");
      p.dequantized = (p.weight.to(at::kFloat) * rows.repeat_interleave(128, 1).narrow(1, 0, K)).to(dtype);
      return p;
    }
    default:
      TORCH_CHECK_VALUE(false, "prepare_fp8: ", to_string(format), " is not an FP8 format");
  }
}

at::Tensor apply(const Fp8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  if (p.dequantized.defined()) return tp::cuda::linear(x, p.dequantized.to(x.scalar_type()), bias);
  return fp8_linear(x, p.weight, p.w_scale, p.scaling, bias, p.input_scale);
}

Int8Prepared prepare_int8(bool w8a8, const at::Tensor& weight, const at::Tensor& weight_scale) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.scalar_type() == at::kChar, "prepare_int8: weight must be int8 ",
                    "[N, K]; got ", weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0);
  Int8Prepared p;
  p.w8a8 = w8a8;
  p.weight = weight.contiguous();
  const auto s = weight_scale.to(weight.device(), at::kFloat).contiguous();
  TORCH_CHECK_VALUE(s.numel() == N, "prepare_int8: weight_scale has ", s.numel(), " values; expected ", N);
  p.scale = w8a8 ? s.reshape({N}) : s.reshape({N, 1});
  return p;
}

at::Tensor apply(const Int8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  const int64_t K = p.weight.size(1);
  if (K == 0 || p.weight.size(0) == 0) {
    // A rank that owns no columns (or rows): the sum over nothing, plus the bias.
    return tp::cuda::linear(x, at::zeros(p.weight.sizes(), x.options()), bias);
  }
  if (p.w8a8) return int8_linear(x, p.weight, p.scale, bias);
  return weight_only_linear(x, p.weight, 8, p.scale, std::nullopt, K, bias);
}

Int4Prepared prepare_int4(const at::Tensor& codes, const at::Tensor& scale_kn, const at::Tensor& zero_kn,
                          int64_t group, const at::Device& device) {
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
