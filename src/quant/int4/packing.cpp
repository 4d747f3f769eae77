#include "quant/int4/packing.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tp::detail {

namespace {

// Column j of an AWQ group of eight sits in nibble kAwqInverse[j] (the inverse of kAwqOrder).
constexpr int64_t kAwqInverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};

at::Tensor index_tensor(const int64_t (&values)[8]) { return at::tensor(at::ArrayRef<int64_t>(values, 8), at::kLong); }

void check_2d_int32(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined() && t.dim() == 2 && t.scalar_type() == at::kInt, "int4: '", name,
                    "' must be a 2-D int32 tensor; got ", t.defined() ? t.sizes() : at::IntArrayRef{}, " ",
                    t.defined() ? c10::toString(t.scalar_type()) : "undefined");
}

}  // namespace

at::Tensor pack_int4(const at::Tensor& codes, int64_t dim, bool awq_order) {
  at::Tensor c = codes.to(at::kLong).movedim(dim, -1);
  const int64_t size = c.size(-1);
  TORCH_CHECK_VALUE(size % 8 == 0, "pack_int4: dim ", dim, " has ", size, " elements, not a multiple of 8");
  auto shape = c.sizes().vec();
  shape.back() = size / 8;
  shape.push_back(8);
  c = c.reshape(shape);
  if (awq_order) c = c.index_select(-1, index_tensor(kAwqOrder));
  const auto shifts = at::arange(0, 32, 4, at::kLong);
  at::Tensor words = at::bitwise_left_shift(at::bitwise_and(c, 15), shifts).sum(-1);
  // Words with nibble 7 >= 8 have bit 31 set: wrap them to the negative int32 they are.
  words = at::where(words >= (int64_t{1} << 31), words - (int64_t{1} << 32), words).to(at::kInt);
  return words.movedim(-1, dim).contiguous();
}

at::Tensor unpack_int4(const at::Tensor& words, int64_t dim, bool awq_order) {
  const at::Tensor w = words.to(at::kInt).movedim(dim, -1).unsqueeze(-1);
  const auto shifts = at::arange(0, 32, 4, at::kInt);
  at::Tensor c = at::bitwise_and(at::bitwise_right_shift(w, shifts), 15);  // [..., D/8, 8]
  if (awq_order) c = c.index_select(-1, index_tensor(kAwqInverse));
  return c.flatten(-2).movedim(-1, dim).contiguous();
}

Int4Unpacked unpack_gptq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                         GptqFormat format) {
  check_2d_int32(qweight, "qweight");
  check_2d_int32(qzeros, "qzeros");
  const int64_t k = qweight.size(0) * 8, n = qweight.size(1);
  TORCH_CHECK_VALUE(scales.dim() == 2 && scales.size(1) == n && scales.size(0) >= 1 && k % scales.size(0) == 0,
                    "int4_gptq: 'scales' has shape ", scales.sizes(), "; expected [K/g, N] with K=", k, ", N=", n,
                    " (qweight is [K/8, N] = ", qweight.sizes(), ")");
  TORCH_CHECK_VALUE(qzeros.size(0) == scales.size(0) && qzeros.size(1) * 8 == n, "int4_gptq: 'qzeros' has shape ",
                    qzeros.sizes(), "; expected [K/g, N/8] = [", scales.size(0), ", ", n / 8, "]");
  Int4Unpacked u;
  u.codes = unpack_int4(qweight, 0).t().contiguous();
  u.zero = unpack_int4(qzeros, 1).to(at::kFloat);
  if (format == GptqFormat::kV1) u.zero += 1;  // v1 stores zero - 1
  u.scale = scales.to(at::kFloat);
  return u;
}

Int4Unpacked unpack_awq(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales) {
  check_2d_int32(qweight, "qweight");
  check_2d_int32(qzeros, "qzeros");
  const int64_t k = qweight.size(0), n = qweight.size(1) * 8;
  TORCH_CHECK_VALUE(scales.dim() == 2 && scales.size(1) == n && scales.size(0) >= 1 && k % scales.size(0) == 0,
                    "int4_awq: 'scales' has shape ", scales.sizes(), "; expected [K/g, N] with K=", k, ", N=", n,
                    " (qweight is [K, N/8] = ", qweight.sizes(), ")");
  TORCH_CHECK_VALUE(qzeros.size(0) == scales.size(0) && qzeros.size(1) * 8 == n, "int4_awq: 'qzeros' has shape ",
                    qzeros.sizes(), "; expected [K/g, N/8] = [", scales.size(0), ", ", n / 8, "]");
  Int4Unpacked u;
  u.codes = unpack_int4(qweight, 1, /*awq_order=*/true).t().contiguous();
  u.zero = unpack_int4(qzeros, 1, /*awq_order=*/true).to(at::kFloat);
  u.scale = scales.to(at::kFloat);
  return u;
}

Int4Unpacked unpack_pack_quantized(const at::Tensor& weight_packed, const at::Tensor& weight_zero_point,
                                   const at::Tensor& weight_scale) {
  check_2d_int32(weight_packed, "weight_packed");
  const int64_t n = weight_packed.size(0), k = weight_packed.size(1) * 8;
  TORCH_CHECK_VALUE(weight_scale.dim() == 2 && weight_scale.size(0) == n && weight_scale.size(1) >= 1 &&
                        k % weight_scale.size(1) == 0,
                    "int4_pack_quantized: 'weight_scale' has shape ", weight_scale.sizes(),
                    "; expected [N, K/g] with N=", n, ", K=", k,
                    " (weight_packed is [N, K/8] = ", weight_packed.sizes(), ")");
  const int64_t groups = weight_scale.size(1);
  Int4Unpacked u;
  u.codes = unpack_int4(weight_packed, 1);  // [N, K], 0..15 = signed code + 8
  u.scale = weight_scale.to(at::kFloat).t().contiguous();
  if (weight_zero_point.defined()) {
    check_2d_int32(weight_zero_point, "weight_zero_point");
    TORCH_CHECK_VALUE(weight_zero_point.size(0) * 8 == n && weight_zero_point.size(1) == groups,
                      "int4_pack_quantized: 'weight_zero_point' has shape ", weight_zero_point.sizes(),
                      "; expected [N/8, K/g] = [", n / 8, ", ", groups, "]");
    u.zero = unpack_int4(weight_zero_point, 0).to(at::kFloat).t().contiguous();  // [K/g, N], 0..15
  } else {
    u.zero = at::full({groups, n}, 8.0f, at::kFloat);
  }
  return u;
}

at::Tensor dequantize_unpacked(const Int4Unpacked& u, int64_t group_size) {
  // scale, zero: [K/g, N] -> [N, K], one value repeated over each group of g.
  const auto scale = u.scale.repeat_interleave(group_size, 0).t();
  const auto zero = u.zero.repeat_interleave(group_size, 0).t();
  return (u.codes.to(at::kFloat) - zero) * scale;
}

}  // namespace tp::detail
