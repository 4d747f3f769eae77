#include "quant/fp8/cuda.h"

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
    default: TORCH_CHECK_VALUE(false, "prepare_fp8: ", to_string(format), " is not an FP8 format");
  }
}

at::Tensor apply(const Fp8Prepared& p, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  if (p.dequantized.defined()) return tp::cuda::linear(x, p.dequantized.to(x.scalar_type()), bias);
  return fp8_linear(x, p.weight, p.w_scale, p.scaling, bias, p.input_scale);
}

}  // namespace tp::cuda
