// NVFP4 (kNvfp4): E2M1 codes, an E4M3 scale per 16 elements and an F32 global scale per
// checkpoint tensor (quant/nvfp4/nvfp4.h), in compressed-tensors' or ModelOpt's dialect.
// Weight-only: activations stay in the layer's dtype.
//
// TP alignment: COLUMN 1 (rows are independent, each with its global scale); ROW 16 (a
// slice of K holds whole groups: the codes are read with elm_packing 2, the scales with
// scale_span 16, the global scale whole).
//
// Fused layers: each part's global scale fills that part's rows, so q, k and v (gate and
// up) keep the scales their producer gave them; nothing is taken as the max, asserted
// equal or requantized.
//
// CPU kernel: the shared panel GEMM over weights decoded as the producers do
// (cpu_kernels.cpp) for float32, bfloat16 and float16 layers; float64 layers and other
// devices: the dequantized weight and at::matmul.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>

#include "common/shape_str.h"
#include "quant/linear_2d.h"
#include "quant/mxfp4/e2m1.h"
#include "quant/nvfp4/nvfp4.h"
#include "quant/random_weight.h"
#include "tp/loader/load_shard.h"

namespace tp::detail {

namespace {

constexpr double kE4m3Max = 448.0, kE2m1Max = 6.0;

bool divides(const QuantConfig& config) { return config.nvfp4_dialect == Nvfp4Dialect::kCompressedTensors; }

// codes u8 [N, K/2], scales e4m3 [N, K/16], global f32 [N, 1] -> float32 [N, K].
at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& global, bool divide) {
  const at::Tensor values = e2m1_table().index({e2m1_unpack(codes)});
  const at::Tensor s = scales.to(at::kFloat), g = global.to(at::kFloat).reshape({-1, 1});
  const at::Tensor group_scale = divide ? s / g : s * g;  // float32, as the producers compute it
  return values * group_scale.repeat_interleave(kNvfp4Group, 1);
}

// The checkpoint tensors of w [N, K] quantized against the global amax `amax` (> 0): the
// producers' rule, a global scale ([1]) mapping amax to E4M3's max times E2M1's, group
// scales amax_group / 6 in those units rounded to E4M3, codes the nearest E2M1 values.
QuantizedTensors quantize(const at::Tensor& weight, double amax, const QuantConfig& config) {
  const int64_t n = weight.size(0), groups = weight.size(1) / kNvfp4Group;
  const at::Tensor w = weight.to(at::kFloat);
  const float gs = static_cast<float>(kE4m3Max * kE2m1Max / amax);  // compressed-tensors' weight_global_scale
  const float global = divides(config) ? gs : static_cast<float>(amax / (kE4m3Max * kE2m1Max));
  const at::Tensor group_amax = w.reshape({n, groups, kNvfp4Group}).abs().amax(-1);
  const at::Tensor scales = (group_amax / kE2m1Max * gs).clamp(0, kE4m3Max).to(at::kFloat8_e4m3fn);
  const at::Tensor globals = at::full({1}, global, at::kFloat);
  const at::Tensor s = scales.to(at::kFloat);
  const at::Tensor group_scale = divides(config) ? s / globals : s * globals;
  // A group of zeros (scale 0) codes zeros.
  const at::Tensor v =
      at::where(group_scale.unsqueeze(-1) > 0, w.reshape({n, groups, kNvfp4Group}) / group_scale.unsqueeze(-1),
                at::zeros({}, at::kFloat));
  return {{nvfp4_codes_name(config), e2m1_pack(e2m1_round(v).reshape({n, groups * kNvfp4Group}))},
          {"weight_scale", scales.contiguous()},
          {nvfp4_global_name(config), globals}};
}

class Nvfp4Method final : public QuantMethod {
 public:
  explicit Nvfp4Method(const QuantConfig& config) : config_(config) {}

  std::string name() const override { return to_string(config_); }
  int64_t tp_alignment(ShardMode mode) const override { return nvfp4_alignment(config_, mode); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    TORCH_CHECK_VALUE(in_local % kNvfp4Group == 0, name(), ": in_features per rank = ", in_local,
                      " is not a multiple of NVFP4's scale group of ", kNvfp4Group,
                      " (every rank's slice of K holds whole groups)");
    n_ = out_local;
    k_ = in_local;
    dtype_ = c10::typeMetaToScalarType(options.dtype());
    codes_ =
        layer.register_parameter(nvfp4_codes_name(config_), at::empty({n_, k_ / 2}, options.dtype(at::kByte)), false);
    scales_ = layer.register_parameter("weight_scale",
                                       at::empty({n_, k_ / kNvfp4Group}, options.dtype(at::kFloat8_e4m3fn)), false);
    global_ = layer.register_parameter(nvfp4_global_name(config_), at::ones({n_, 1}, options.dtype(at::kFloat)), false);
  }

  at::Tensor weight() const override { return codes_; }

  void reset_parameters(int64_t global_in_features) override {
    if (n_ == 0 || k_ == 0) return;
    at::NoGradGuard no_grad;
    // One global scale for every chunk: the draw's bound (as a producer would find the
    // amax, to within the draw), so the chunks quantize alike.
    const double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(global_in_features, 1)));
    for_each_row_chunk(n_, k_, 1, [&](int64_t first, int64_t rows) {
      const auto q = quantize(random_linear_weight(rows, k_, global_in_features), bound, config_);
      codes_.narrow(0, first, rows).copy_(q.at(nvfp4_codes_name(config_)));
      scales_.narrow(0, first, rows).copy_(q.at("weight_scale"));
      global_.narrow(0, first, rows).fill_(q.at(nvfp4_global_name(config_)).item<float>());
    });
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    const bool column = mode == ShardMode::kColumn;
    const int64_t split = column ? 0 : 1;
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      TORCH_INTERNAL_ASSERT(part.logical_size >= 0, layer, ": WeightPart '", part.prefix, "' has no logical_size");
      const int64_t n = column ? part.logical_size : n_;
      const int64_t k = column ? k_ : part.logical_size;
      TORCH_CHECK_VALUE(k % kNvfp4Group == 0, layer, ": '", part.prefix, "' has in_features ", k,
                        "; NVFP4 stores K in whole groups of ", kNvfp4Group);
      // Every rank checks every tensor's metadata, its own slice empty or not.
      const auto& c = checkpoint.get(part.prefix + "." + nvfp4_codes_name(config_), layer);
      const auto& s = checkpoint.get(part.prefix + ".weight_scale", layer);
      const auto& g = checkpoint.get(part.prefix + "." + nvfp4_global_name(config_), layer);
      TORCH_CHECK_TYPE(c.dtype() == at::kByte, layer, ": tensor '", c.name(), "' has dtype ", c.dtype(), "; ", name(),
                       " stores two E2M1 codes a byte as uint8");
      TORCH_CHECK_TYPE(s.dtype() == at::kFloat8_e4m3fn, layer, ": tensor '", s.name(), "' has dtype ", s.dtype(), "; ",
                       name(), " stores its group scales as float8_e4m3fn");
      TORCH_CHECK_TYPE(g.dtype() == at::kFloat, layer, ": tensor '", g.name(), "' has dtype ", g.dtype(), "; ", name(),
                       " stores its global scale as float32");
      TORCH_CHECK_VALUE(c.shape() == std::vector<int64_t>({n, k / 2}), layer, ": tensor '", c.name(), "' has shape ",
                        shape_str(c.shape()), "; expected [", n, ", ", k / 2, "] (two E2M1 codes a byte)");
      TORCH_CHECK_VALUE(s.shape() == std::vector<int64_t>({n, k / kNvfp4Group}), layer, ": tensor '", s.name(),
                        "' has shape ", shape_str(s.shape()), "; expected [", n, ", ", k / kNvfp4Group,
                        "] (one E4M3 scale per ", kNvfp4Group, " elements)");
      TORCH_CHECK_VALUE(g.shape().empty() || g.shape() == std::vector<int64_t>({1}), layer, ": tensor '", g.name(),
                        "' has shape ", shape_str(g.shape()), "; expected [] or [1] (one global scale for the tensor)");
      // The global scale: read whole by every rank (every rank's rows use it), checked.
      const double global = load_shard(g, mode, part.range, {}, layer).to(at::kDouble).reshape({}).item<double>();
      TORCH_CHECK_VALUE(std::isfinite(global) && global > 0, layer, ": tensor '", g.name(), "' is ", global,
                        "; a global scale must be finite and > 0");
      if (part.range.size() == 0) continue;
      LoadOptions packed, grouped;
      packed.elm_packing = column ? 1 : 2;            // K packed two a byte: only ROW splits it
      grouped.scale_span = column ? 1 : kNvfp4Group;  // ROW: K counted in groups
      const int64_t offset = part.local_offset, size = part.range.size();
      const at::Tensor scales = load_shard(s, mode, part.range, grouped, layer);
      TORCH_CHECK_VALUE(!scales.to(at::kFloat).isnan().any().item<bool>(), layer, ": tensor '", s.name(),
                        "' holds an E4M3 NaN (0x7f / 0xff): the scales are corrupt");
      scales_.narrow(split, offset / grouped.scale_span, size / grouped.scale_span).copy_(scales);
      load_shard_into(c, mode, part.range, codes_.narrow(split, offset / packed.elm_packing, size / packed.elm_packing),
                      packed, layer);
      // Column: this part's rows; row: the one part covers every row.
      (column ? global_.narrow(0, offset, size) : global_).fill_(global);
    }
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
    check_stored();
    return linear_2d(x, n_, k_, bias, [&](const at::Tensor& x2) {
      const auto t = x.scalar_type();
      if (x.device().is_cpu() && codes_.is_cpu() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf)) {
        const auto c = codes_.contiguous(), s = scales_.contiguous(), g = global_.contiguous();
        const Nvfp4CpuWeight w{c.const_data_ptr<uint8_t>(),
                               reinterpret_cast<const uint8_t*>(s.const_data_ptr()),
                               g.const_data_ptr<float>(),
                               n_,
                               k_,
                               divides(config_)};
        return nvfp4_cpu_linear(x2, w);
      }
      return at::matmul(x2, dequantized_weight().to(x2.device()).t());
    });
  }

  at::Tensor dequantized_weight() const override {
    check_stored();
    return dequantize(codes_.cpu(), scales_.cpu(), global_.cpu(), divides(config_)).to(codes_.device(), dtype_);
  }

  at::ScalarType activation_dtype() const override { return dtype_; }
  at::Device weight_device() const override { return codes_.device(); }

 private:
  // Module::to(dtype) converts every parameter, the codes and scales too: refuse rather
  // than compute with them.
  void check_stored() const {
    TORCH_CHECK_TYPE(codes_.scalar_type() == at::kByte && scales_.scalar_type() == at::kFloat8_e4m3fn &&
                         global_.scalar_type() == at::kFloat,
                     name(), ": the codes / scales / global scale are ", codes_.scalar_type(), " / ",
                     scales_.scalar_type(), " / ", global_.scalar_type(),
                     ", not uint8 / float8_e4m3fn / float32: Module::to(dtype) converts them too. Build the layer "
                     "with Options.dtype(...) and load the checkpoint instead of converting the layer");
  }

  QuantConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t n_ = 0, k_ = 0;
  at::Tensor codes_;   // u8 [N, K / 2], "weight_packed" / "weight"
  at::Tensor scales_;  // e4m3 [N, K / 16], "weight_scale"
  at::Tensor global_;  // f32 [N, 1], "weight_global_scale" / "weight_scale_2"
};

}  // namespace

const char* nvfp4_codes_name(const QuantConfig& config) { return divides(config) ? "weight_packed" : "weight"; }
const char* nvfp4_global_name(const QuantConfig& config) {
  return divides(config) ? "weight_global_scale" : "weight_scale_2";
}

int64_t nvfp4_alignment(const QuantConfig&, ShardMode mode) { return mode == ShardMode::kRow ? kNvfp4Group : 1; }

std::shared_ptr<QuantMethod> make_nvfp4_method(const QuantConfig& config) {
  return std::make_shared<Nvfp4Method>(config);
}

QuantizedTensors quantize_nvfp4(const at::Tensor& weight, const QuantConfig& config) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) % kNvfp4Group == 0, "quantize_weight(", to_string(config),
                    "): the weight [N, K] needs K a multiple of ", kNvfp4Group, "; got ", weight.sizes());
  const double amax = weight.numel() ? weight.abs().max().item<double>() : 0.0;
  return quantize(weight, amax > 0 ? amax : 1.0, config);
}

at::Tensor dequantize_nvfp4(const QuantizedTensors& tensors, const QuantConfig& config) {
  const auto get = [&](const char* suffix) {
    const auto it = tensors.find(suffix);
    TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(", to_string(config), "): no '", suffix, "' tensor");
    return it->second.cpu();
  };
  const auto c = get(nvfp4_codes_name(config)), s = get("weight_scale"), g = get(nvfp4_global_name(config));
  TORCH_CHECK_VALUE(c.dim() == 2 && s.dim() == 2 && c.size(0) == s.size(0) &&
                        c.size(1) * 2 == s.size(1) * kNvfp4Group && c.scalar_type() == at::kByte &&
                        s.scalar_type() == at::kFloat8_e4m3fn && g.scalar_type() == at::kFloat &&
                        (g.numel() == 1 || g.numel() == c.size(0)),
                    "dequantize_weight(", to_string(config),
                    "): expected uint8 codes [N, K/2], float8_e4m3fn scales [N, K/16] and a float32 global scale "
                    "([], [1] or [N, 1]); got ",
                    c.sizes(), ", ", s.sizes(), " and ", g.sizes());
  const at::Tensor rows = g.numel() == 1 ? g.reshape({1, 1}).expand({c.size(0), 1}) : g.reshape({-1, 1});
  return dequantize(c, s, rows, divides(config));
}

at::Tensor quantize_activation_nvfp4(const at::Tensor& x, const QuantizedTensors&, const QuantConfig&) {
  return x.to(at::kFloat);  // weight-only
}

}  // namespace tp::detail
