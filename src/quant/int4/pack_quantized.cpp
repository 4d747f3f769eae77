// compressed-tensors pack-quantized (kInt4PackQuantized): the format's reference
// quantize / dequantize (its row of the format table). The layer's loading and
// kernels are the INT4 method's (method.cpp); the layout is in quant/int4/packing.h.
//
// Quantization follows compressed-tensors' calculate_qparams and _quantize for
// 4-bit integer groups (the W4A16 / W4A16_ASYM presets), with the min / max over
// each group of g along K (llm-compressor's default min-max observer):
//   the range [lo, hi] = [min(w, 0), max(w, 0)];
//   symmetric:  scale = max(-lo, hi) / 7.5, zp = 0;
//   asymmetric: scale = (hi - lo) / 15, zp = clamp(round(-8 - lo / scale), -8, 7);
//   a zero scale becomes float32's epsilon;
//   q = clamp(round(w / scale + zp), -8, 7), stored offset binary (u = q + 8, uz = zp + 8).
// Dequantization is (q - zp) * scale in float32 (compressed-tensors computes in the
// scale's dtype), i.e. (u - uz) * scale.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>

#include "quant/int4/int4.h"
#include "quant/int4/packing.h"
#include "tp/shard/split.h"

namespace tp::detail {

namespace {

void check_pack_quantized(const QuantConfig& config) {
  TORCH_INTERNAL_ASSERT(config.format == QuantFormat::kInt4PackQuantized,
                        "not int4_pack_quantized: ", to_string(config));
  const int64_t g = config.group_size;
  TORCH_CHECK_VALUE(g == 32 || g == 64 || g == 128, to_string(config.format), ": group_size ", g,
                    " is not supported; use 32, 64 or 128");
}

}  // namespace

QuantizedTensors quantize_int4_pack_quantized(const at::Tensor& weight, const QuantConfig& config) {
  check_pack_quantized(config);
  const int64_t n = weight.size(0), k = weight.size(1), g = config.group_size;
  TORCH_CHECK_VALUE(k % g == 0 && (config.symmetric || n % 8 == 0), "quantize_weight(", to_string(config), "): a [", n,
                    ", ", k, "] weight needs in_features a multiple of the group size ", g,
                    config.symmetric ? "" : " and out_features a multiple of 8 (the zero points pack N)", "; pad to [",
                    config.symmetric ? n : round_up(n, 8), ", ", round_up(k, g), "]");
  const auto wg = weight.to(at::kFloat).reshape({n, k / g, g});
  const auto lo = wg.amin(-1).clamp_max(0), hi = wg.amax(-1).clamp_min(0);  // [N, K/g]
  at::Tensor scale, zp;
  if (config.symmetric) {
    scale = at::maximum(-lo, hi) / 7.5;
    zp = at::zeros_like(scale);
  } else {
    scale = (hi - lo) / 15;
  }
  scale = at::where(scale == 0, at::full_like(scale, std::numeric_limits<float>::epsilon()), scale);
  if (!config.symmetric) zp = at::round((-8 - lo / scale).clamp(-8, 7));
  const auto q = at::round(wg / scale.unsqueeze(-1) + zp.unsqueeze(-1)).clamp(-8, 7).reshape({n, k});
  QuantizedTensors out;
  out["weight_packed"] = pack_int4(q + 8, 1);  // [N, K/8]
  out["weight_scale"] = scale.contiguous();    // [N, K/g] float32
  out["weight_shape"] = at::tensor(std::vector<int64_t>{n, k}, at::kLong);
  if (!config.symmetric) out["weight_zero_point"] = pack_int4(zp + 8, 0);  // [N/8, K/g]
  return out;
}

at::Tensor dequantize_int4_pack_quantized(const QuantizedTensors& tensors, const QuantConfig& config) {
  check_pack_quantized(config);
  const auto get = [&](const char* suffix) {
    const auto it = tensors.find(suffix);
    TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(", to_string(config), "): no '", suffix, "' tensor");
    return it->second.cpu();
  };
  const bool has_zp = tensors.count("weight_zero_point") > 0;
  TORCH_CHECK_VALUE(has_zp != config.symmetric, "dequantize_weight(", to_string(config), "): ",
                    config.symmetric ? "a symmetric format has no 'weight_zero_point'"
                                     : "an asymmetric format needs a 'weight_zero_point'");
  const auto u = unpack_pack_quantized(get("weight_packed"), has_zp ? get("weight_zero_point") : at::Tensor(),
                                       get("weight_scale"));
  const int64_t n = u.codes.size(0), k = u.codes.size(1), groups = u.scale.size(0);
  TORCH_CHECK_VALUE(groups * config.group_size == k, "dequantize_weight(", to_string(config), "): 'weight_scale' has ",
                    groups, " groups for in_features=", k, ", which is a group size of ", k / groups, ", not ",
                    config.group_size);
  if (tensors.count("weight_shape")) {
    const auto shape = get("weight_shape").to(at::kLong);
    TORCH_CHECK_VALUE(shape.numel() == 2 && shape[0].item<int64_t>() == n && shape[1].item<int64_t>() == k,
                      "dequantize_weight(", to_string(config), "): 'weight_shape' is ", shape, ", not [", n, ", ", k,
                      "]");
  }
  return dequantize_unpacked(u, config.group_size);
}

}  // namespace tp::detail
