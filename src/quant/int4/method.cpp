// INT4 weight-only, group-wise: kInt4Gptq and kInt4Awq (the packings are described in
// quant/int4/packing.h).
//
// TP alignment: COLUMN splits N, which GPTQ's qzeros and AWQ's qweight/qzeros pack
// eight to an int32, so every boundary is a multiple of 8. ROW splits K, which the
// scale groups cover g at a time (and GPTQ's qweight packs eight at a time; g is a
// multiple of 8), so every boundary is a multiple of g.
//
// CPU kernel: at::_weight_int4pack_mm_for_cpu. finalize() unpacks the checkpoint to
// codes q [N, K] and converts them once with at::_convert_weight_to_int4pack_for_cpu
// (u8 [N, K/2], independent of the activation dtype), plus scales_and_zeros
// [K/g, N, 2] in the kernel's dtype. That kernel computes w = (q - 8) * scale + zero_f,
// so the checkpoint's integer zero point becomes zero_f = (8 - zero) * scale
// (tested against dequantize_weight). The op needs N % 16 == 0. In torch 2.11 on the
// CPU only its bfloat16 path is vectorized (AVX512-BF16); float32 and float16 are
// scalar loops, 5-15x slower than at::linear in float32. So a float32 layer runs the
// bfloat16 kernel (x rounded to bfloat16, the output converted back): ~2^-9 relative
// error, far below the weights' own 4-bit rounding. A float16 layer runs the exact
// (slow) float16 path. Anything else (N of 8 mod 16, a float64 layer, another
// device) takes a dequantize-and-matmul reference with the weight dequantized once in
// finalize().

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>

#include "quant/int4/int4.h"
#include "quant/int4/packing.h"
#include "quant/random_weight.h"
#include "tp/loader/load_shard.h"

#if TP_WITH_CUDA
#include "quant/int4/cuda.h"
#endif
#include "tp/shard/split.h"

namespace tp::detail {

namespace {

void check_group(const QuantConfig& config) {
  const int64_t g = config.group_size;
  TORCH_CHECK_VALUE(g == 32 || g == 64 || g == 128, to_string(config.format), ": group_size ", g,
                    " is not supported; use 32, 64 or 128");
}

bool aten_kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

class Int4Method final : public QuantMethod {
 public:
  explicit Int4Method(const QuantConfig& config)
      : config_(config), g_(config.group_size), awq_(config.format == QuantFormat::kInt4Awq) {
    check_group(config);
  }

  std::string name() const override { return to_string(config_); }

  int64_t tp_alignment(ShardMode mode) const override { return int4_alignment(config_, mode); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    TORCH_CHECK_VALUE(in_local % g_ == 0, name(), ": the layer's in_features per rank (", in_local,
                      ") is not a multiple of the group size ", g_, "; pad in_features to a multiple of ", g_);
    TORCH_CHECK_VALUE(out_local % 8 == 0, name(), ": the layer's out_features per rank (", out_local,
                      ") is not a multiple of 8 (eight 4-bit values share one int32); pad out_features to ",
                      round_up(out_local, 8));
    n_ = out_local;
    k_ = in_local;
    dtype_ = c10::typeMetaToScalarType(options.dtype());
    const auto i32 = options.dtype(at::kInt);
    // Registered as the checkpoint names them, so parameters() and state_dict() show the format.
    qweight_ = layer.register_parameter(
        "qweight", at::zeros(awq_ ? std::vector<int64_t>{k_, n_ / 8} : std::vector<int64_t>{k_ / 8, n_}, i32), false);
    qzeros_ = layer.register_parameter("qzeros", at::zeros({k_ / g_, n_ / 8}, i32), false);
    scales_ = layer.register_parameter("scales", at::ones({k_ / g_, n_}, options.dtype(at::kHalf)), false);
  }

  at::Tensor weight() const override { return qweight_; }

  void reset_parameters(int64_t global_in_features) override {
    if (n_ == 0 || k_ == 0) return;
    const auto q = quantize_int4(random_linear_weight(n_, k_, global_in_features), config_);
    at::NoGradGuard no_grad;
    qweight_.copy_(q.at("qweight"));
    qzeros_.copy_(q.at("qzeros"));
    scales_.copy_(q.at("scales"));
    finalize();
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    const bool column = mode == ShardMode::kColumn;
    // The checkpoint is [K, N]-oriented: COLUMN (split N) splits its dim 1 and ROW
    // (split K) its dim 0, which is load_shard's flip_tp. The local tensors have the
    // same orientation, so a part lands at `dst_dim` = the split dim.
    const int64_t dst_dim = column ? 1 : 0;
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      if (part.range.size() == 0) continue;
      const int64_t logical = part.logical_size;
      TORCH_INTERNAL_ASSERT(logical >= 0, layer, ": WeightPart '", part.prefix, "' has no logical_size");
      const int64_t n = column ? logical : n_;  // the checkpoint tensor's N and K
      const int64_t k = column ? k_ : logical;
      TORCH_CHECK_VALUE(n % 8 == 0 && k % g_ == 0, layer, ": '", part.prefix, "' is a [", n, ", ", k, "] weight; ",
                        name(), " needs out_features a multiple of 8 and in_features a multiple of ", g_);
      const auto load_one = [&](const char* suffix, const std::vector<int64_t>& expected, bool integer,
                                LoadOptions options, const at::Tensor& dst) {
        const auto& source = checkpoint.get(part.prefix + "." + suffix, layer);
        const auto dtype = source.dtype();
        if (integer) {
          TORCH_CHECK_TYPE(dtype == at::kInt, layer, ": tensor '", source.name(), "' has dtype ", dtype, "; ", name(),
                           " stores '", suffix, "' as int32 (eight 4-bit values per element)");
        } else {
          TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat, layer, ": tensor '",
                           source.name(), "' has dtype ", dtype, "; ", name(),
                           " expects float16 scales (bfloat16 and float32 are converted to float16)");
        }
        TORCH_CHECK_VALUE(source.shape() == expected, layer, ": tensor '", source.name(), "' has shape ",
                          shape_str(source.shape()), "; expected ", shape_str(expected), " for a [", n, ", ", k,
                          "] (out_features, in_features) weight in ", name(), " (",
                          awq_ ? "qweight [K, N/8]" : "qweight [K/8, N]", ", qzeros [K/g, N/8], scales [K/g, N])");
        options.flip_tp = true;
        const int64_t div = options.scale_span * options.elm_packing;
        TORCH_INTERNAL_ASSERT(part.local_offset % div == 0 && part.range.size() % div == 0, layer, ": part '",
                              part.prefix, "' at ", part.local_offset, " is not aligned to ", div);
        const auto shard = load_shard(source, mode, part.range, options, layer);
        auto slot = dst.narrow(dst_dim, part.local_offset / div, part.range.size() / div);
        TORCH_INTERNAL_ASSERT(shard.sizes() == slot.sizes(), layer, ": tensor '", source.name(), "' shard ",
                              shard.sizes(), " does not fit its local slot ", slot.sizes());
        slot.copy_(shard);
      };
      LoadOptions packed_n, packed_k, per_group;
      packed_n.elm_packing = column ? 8 : 1;   // N packed eight to a word: only COLUMN splits it
      packed_k.elm_packing = column ? 1 : 8;   // K packed eight to a word: only ROW splits it
      per_group.scale_span = column ? 1 : g_;  // one row of scales/qzeros per group of K
      if (awq_) {
        load_one("qweight", {k, n / 8}, true, packed_n, qweight_);
      } else {
        load_one("qweight", {k / 8, n}, true, packed_k, qweight_);
        check_g_idx(checkpoint, part.prefix + ".g_idx", k, layer);
      }
      LoadOptions zeros = per_group;
      zeros.elm_packing = packed_n.elm_packing;
      load_one("qzeros", {k / g_, n / 8}, true, zeros, qzeros_);
      load_one("scales", {k / g_, n}, false, per_group, scales_);
    }
  }

  void finalize() override {
    packed_ = scales_and_zeros_ = dequantized_ = at::Tensor();
#if TP_WITH_CUDA
    cuda_.reset();
#endif
    if (n_ == 0 || k_ == 0) return;
    const auto u = unpack();
#if TP_WITH_CUDA
    if (qweight_.is_cuda()) {
      // The CUDA kernels' layout (quant/int4/cuda.h): GEMV for decode, dequantize + cuBLASLt above.
      cuda_ = cuda::prepare_int4(u.codes, u.scale, u.zero, g_, qweight_.device());
      return;
    }
#endif
    if (qweight_.device().is_cpu() && aten_kernel_dtype(dtype_) && n_ % 16 == 0) {
      // innerKTiles is ignored by the CPU conversion; the layout does not depend on the activation dtype.
      packed_ = at::_convert_weight_to_int4pack_for_cpu(u.codes, /*innerKTiles=*/1);
      const auto kernel_dtype = dtype_ == at::kHalf ? at::kHalf : at::kBFloat16;
      scales_and_zeros_ = at::stack({u.scale, (8 - u.zero) * u.scale}, -1).to(kernel_dtype).contiguous();
    } else {
      dequantized_ = dequantize_unpacked(u, g_).to(qweight_.device(), dtype_);
    }
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
    check_stored();
#if TP_WITH_CUDA
    if (x.is_cuda() && cuda_) return cuda::apply(*cuda_, x, bias);
#endif
    auto out_shape = x.sizes().vec();
    out_shape.back() = n_;
    const auto x2 = x.reshape({-1, k_}).contiguous();
    at::Tensor y;
    if (x2.size(0) == 0 || n_ == 0) {
      y = at::zeros({x2.size(0), n_}, x.options());
    } else if (packed_.defined() && x.device().is_cpu() && aten_kernel_dtype(x.scalar_type())) {
      // float32 and bfloat16 run the vectorized bfloat16 kernel, float16 its own.
      const auto kernel_dtype = x.scalar_type() == at::kHalf ? at::kHalf : at::kBFloat16;
      const auto sz =
          scales_and_zeros_.scalar_type() == kernel_dtype ? scales_and_zeros_ : scales_and_zeros_.to(kernel_dtype);
      y = at::_weight_int4pack_mm_for_cpu(x2.to(kernel_dtype), packed_, g_, sz).to(x.scalar_type());
    } else {
      const auto w = dequantized_.defined() ? dequantized_ : dequantize_unpacked(unpack(), g_);
      y = at::matmul(x2, w.to(x.device(), x.scalar_type()).t());
    }
    if (bias) y = y + *bias;
    return y.view(out_shape);
  }

  at::Tensor dequantized_weight() const override {
    check_stored();
    if (n_ == 0 || k_ == 0) return at::zeros({n_, k_}, at::TensorOptions().dtype(dtype_).device(qweight_.device()));
    if (dequantized_.defined()) return dequantized_;
    return dequantize_unpacked(unpack(), g_).to(qweight_.device(), dtype_);
  }

  at::ScalarType activation_dtype() const override {
    check_stored();
    return dtype_;
  }

  at::Device weight_device() const override { return qweight_.device(); }

 private:
  Int4Unpacked unpack() const {
    const auto qw = qweight_.cpu(), qz = qzeros_.cpu(), sc = scales_.cpu();
    return awq_ ? unpack_awq(qw, qz, sc) : unpack_gptq(qw, qz, sc);
  }

  // Act-order checkpoints permute K through g_idx; only the trivial g_idx[k] = k / g is accepted.
  void check_g_idx(const Checkpoint& checkpoint, const std::string& tensor, int64_t k, const std::string& layer) const {
    if (!checkpoint.contains(tensor)) return;
    const auto& source = checkpoint.get(tensor, layer);
    TORCH_CHECK_VALUE(source.shape() == std::vector<int64_t>{k} && !at::isFloatingType(source.dtype()), layer,
                      ": tensor '", source.name(), "' has shape ", shape_str(source.shape()), " and dtype ",
                      source.dtype(), "; expected an integer [", k, "] g_idx");
    const auto g_idx = source.read_all().to(at::kLong);
    const auto trivial = at::div(at::arange(k, at::kLong), g_, "floor");
    TORCH_CHECK_VALUE(at::equal(g_idx, trivial), layer, ": tensor '", source.name(), "' is not the trivial k / ", g_,
                      ": act-order (desc_act) GPTQ checkpoints are not supported; quantize without act-order");
  }

  // Module::to(dtype) converts every parameter, the integer ones too, which would
  // turn the codes into garbage: refuse to run on them rather than compute nonsense.
  void check_stored() const {
    TORCH_CHECK_TYPE(qweight_.scalar_type() == at::kInt && qzeros_.scalar_type() == at::kInt, name(),
                     ": 'qweight' / 'qzeros' are ", qweight_.scalar_type(), " / ", qzeros_.scalar_type(),
                     ", not int32: Module::to(dtype) converts integer parameters too. Build the layer with "
                     "Options.dtype(...) and load the checkpoint instead of converting the layer");
  }

  QuantConfig config_;
  int64_t g_;
  bool awq_;
  at::ScalarType dtype_ = at::kFloat;  // the layer's activation and output dtype
  int64_t n_ = 0, k_ = 0;              // the local weight [N, K] = [out_local, in_local]
  // Registered on the layer, as stored in the checkpoint (shapes in quant/int4/packing.h).
  at::Tensor qweight_, qzeros_, scales_;
  // Kernel side, built by finalize().
  at::Tensor packed_;            // u8 [N, K/2]: _convert_weight_to_int4pack_for_cpu(q [N, K])
  at::Tensor scales_and_zeros_;  // [K/g, N, 2] bf16 (f16 for float16 layers): scale, (8 - zero) * scale
  at::Tensor dequantized_;       // [N, K] in dtype_, when the ATen kernel does not apply
#if TP_WITH_CUDA
  std::optional<cuda::Int4Prepared> cuda_;  // built by finalize() when qweight is on CUDA
#endif
};

}  // namespace

// COLUMN: N is packed eight to an int32 (qzeros, AWQ's qweight); ROW: K in whole groups.
int64_t int4_alignment(const QuantConfig& config, ShardMode mode) {
  return mode == ShardMode::kColumn ? 8 : config.group_size;
}

// Weight-only: activations stay as they are.
at::Tensor quantize_activation_int4(const at::Tensor& x, const QuantizedTensors&, const QuantConfig&) {
  return x.to(at::kFloat);
}

std::shared_ptr<QuantMethod> make_int4_method(const QuantConfig& config) {
  return std::make_shared<Int4Method>(config);
}

QuantizedTensors quantize_int4(const at::Tensor& weight, const QuantConfig& config) {
  check_group(config);
  const int64_t n = weight.size(0), k = weight.size(1), g = config.group_size;
  const bool awq = config.format == QuantFormat::kInt4Awq;
  TORCH_CHECK_VALUE(k % g == 0 && n % 8 == 0, "quantize_weight(", to_string(config), "): a [", n, ", ", k,
                    "] weight needs in_features a multiple of the group size ", g,
                    " and out_features a multiple of 8; pad to [", round_up(n, 8), ", ", round_up(k, g), "]");
  // Round to nearest per group of g along K. Symmetric: scale = amax / 7, zero 8, so
  // codes 1..15 and no clipping. Asymmetric: the range [min(w, 0), max(w, 0)] over
  // 15 steps, zero = round(-min / scale) (GPTQ v1 cannot store a zero of 0: 1..15).
  const auto wg = weight.to(at::kFloat).reshape({n, k / g, g});
  at::Tensor scale, zero;
  if (config.symmetric) {
    scale = wg.abs().amax(-1) / 7;
  } else {
    scale = (wg.amax(-1).clamp_min(0) - wg.amin(-1).clamp_max(0)) / 15;
  }
  // Quantize with the float16 scale the checkpoint stores, so the codes match it.
  scale = scale.to(at::kHalf).to(at::kFloat);
  scale = at::where(scale > 0, scale, at::ones_like(scale));  // an all-zero group
  if (config.symmetric) {
    zero = at::full_like(scale, 8);
  } else {
    zero = at::round(-wg.amin(-1).clamp_max(0) / scale).clamp(awq ? 0 : 1, 15);
  }
  const auto codes = (at::round(wg / scale.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, 15).reshape({n, k});
  const auto codes_kn = codes.t().to(at::kInt);  // [K, N]
  const auto zero_gn = zero.t().to(at::kInt);    // [K/g, N]
  QuantizedTensors out;
  out["scales"] = scale.t().to(at::kHalf).contiguous();
  if (awq) {
    out["qweight"] = pack_int4(codes_kn, 1, /*awq_order=*/true);
    out["qzeros"] = pack_int4(zero_gn, 1, /*awq_order=*/true);
  } else {
    out["qweight"] = pack_int4(codes_kn, 0);
    out["qzeros"] = pack_int4(zero_gn - 1, 1);  // v1 stores zero - 1
  }
  return out;
}

at::Tensor dequantize_int4(const QuantizedTensors& tensors, const QuantConfig& config) {
  check_group(config);
  const char* format = to_string(config.format);
  const auto get = [&](const char* suffix) {
    const auto it = tensors.find(suffix);
    TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(", format, "): no '", suffix, "' tensor");
    return it->second.cpu();
  };
  const bool awq = config.format == QuantFormat::kInt4Awq;
  const auto u = awq ? unpack_awq(get("qweight"), get("qzeros"), get("scales"))
                     : unpack_gptq(get("qweight"), get("qzeros"), get("scales"));
  const int64_t k = u.codes.size(1), groups = u.scale.size(0);
  TORCH_CHECK_VALUE(groups * config.group_size == k, "dequantize_weight(", to_string(config), "): 'scales' has ",
                    groups, " groups for in_features=", k, ", which is a group size of ", k / groups, ", not ",
                    config.group_size);
  return dequantize_unpacked(u, config.group_size);
}

}  // namespace tp::detail
