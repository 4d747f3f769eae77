// INT8 formats: kInt8W8A8 and kInt8WeightOnly.
//
// Stored (Hugging Face / compressed-tensors names): weight i8 [N, K] and
// weight_scale f32 [N, 1] (float16 / bfloat16 and a 1-D [N] are accepted),
// symmetric per output channel: W[n, k] = weight[n, k] * weight_scale[n].
//
// TP alignment: 1 in both modes. COLUMN slices weight and weight_scale along N; ROW
// slices weight along K and replicates weight_scale (its split dim has width 1).
//
// CPU kernels:
// - int8_weight_only (W8A16): tp's own kernels (quant/int8/weight_only_cpu_kernels.h),
//   which read the registered weight [N, K] in place (finalize() only converts the
//   scales) and choose the ISA per call (scalar, AVX2, AVX-512 by cpu::isa()). float32,
//   bfloat16 and float16 layers run them: x is converted to float32 exactly, every
//   product q * x is exact and only the float32 accumulation rounds (no rounding of x
//   to bfloat16), any K. Float64 layers and other devices take the reference:
//   dequantize to the activation dtype, then at::matmul.
// - int8_w8a8: x is quantized per token (scale = amax / 127, round half to even, clamp
//   to +-127: w8a8_quantize_per_token, bit for bit the ATen helper below that
//   quantize_activation uses), tp's own kernels compute the exact int32 products
//   (w8a8_kernels.h: AMX int8 tiles from M = 4 where usable, else AVX2 / AVX-VNNI /
//   AVX-512 (VNNI) / scalar, chosen at run time; all give the same bits),
//   then y = acc * x_scale[M, 1] * weight_scale[1, N] in float32, cast to x's dtype.
//   The VNNI kernels need sum_k weight[n, k], computed by finalize(); a weight or
//   scale written in place since has them, and the float scales, made again on the
//   next call (cpu/tensor_stamp.h). K past
//   kW8a8MaxK (int32 could overflow) takes at::_int_mm; off the CPU the products go
//   through a float32 matmul.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <utility>

#include "common/shape_str.h"
#include "cpu/kernel_cache.h"
#include "quant/int8/int8.h"
#include "quant/int8/w8a8_kernels.h"
#include "quant/int8/weight_only_cpu_kernels.h"
#include "quant/linear_2d.h"
#include "quant/random_weight.h"
#include "tp/loader/load_shard.h"

#if TP_WITH_CUDA
#include "quant/int8/cuda.h"
#endif

namespace tp::detail {

namespace {

bool is_w8a8(const QuantConfig& config) { return config.format == QuantFormat::kInt8W8A8; }

// Per-token symmetric INT8 of x [M, K] (float32): q = round(x / scale) in -127..127,
// scale [M, 1] = amax / 127 (1 for an all-zero row).
std::pair<at::Tensor, at::Tensor> quantize_per_token(const at::Tensor& x) {
  const auto amax = x.abs().amax(-1, /*keepdim=*/true);
  const auto scale = at::where(amax > 0, amax / 127, at::ones_like(amax));
  return {at::round(x / scale).clamp(-127, 127).to(at::kChar), scale};
}

class Int8Method final : public QuantMethod {
 public:
  explicit Int8Method(const QuantConfig& config) : config_(config), w8a8_(is_w8a8(config)) {}

  std::string name() const override { return to_string(config_); }
  int64_t tp_alignment(ShardMode mode) const override { return int8_alignment(config_, mode); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    n_ = out_local;
    k_ = in_local;
    dtype_ = c10::typeMetaToScalarType(options.dtype());
    weight_ = layer.register_parameter("weight", at::empty({n_, k_}, options.dtype(at::kChar)), false);
    weight_scale_ = layer.register_parameter("weight_scale", at::empty({n_, 1}, options.dtype(at::kFloat)), false);
  }

  at::Tensor weight() const override { return weight_; }

  void reset_parameters(int64_t global_in_features) override {
    if (n_ > 0 && k_ > 0) {
      at::NoGradGuard no_grad;
      for_each_row_chunk(n_, k_, 1, [&](int64_t first, int64_t rows) {
        const auto q = quantize_int8(random_linear_weight(rows, k_, global_in_features), config_);
        weight_.narrow(0, first, rows).copy_(q.at("weight"));
        weight_scale_.narrow(0, first, rows).copy_(q.at("weight_scale"));
      });
    } else {
      at::NoGradGuard no_grad;
      weight_scale_.fill_(1.0);  // no weight to draw; the rows' scales (k_ == 0) stay defined
    }
    finalize();
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    const bool column = mode == ShardMode::kColumn;
    const int64_t split = column ? 0 : 1;
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      // Every rank checks every tensor's metadata, its own shard empty or not, so a
      // bad checkpoint fails on all ranks alike (issue 14, failure 3).
      const bool empty = part.range.size() == 0;
      TORCH_INTERNAL_ASSERT(part.logical_size >= 0, layer, ": WeightPart '", part.prefix, "' has no logical_size");
      const int64_t n = column ? part.logical_size : n_;
      const int64_t k = column ? k_ : part.logical_size;

      const auto& w = checkpoint.get(part.prefix + ".weight", layer);
      TORCH_CHECK_TYPE(w.dtype() == at::kChar, layer, ": tensor '", w.name(), "' has dtype ", w.dtype(), "; ", name(),
                       " stores the weight as int8");
      TORCH_CHECK_VALUE(w.shape() == std::vector<int64_t>({n, k}), layer, ": tensor '", w.name(), "' has shape ",
                        shape_str(w.shape()), "; expected [", n, ", ", k, "] (weight is [out_features, in_features])");
      if (!empty)  // the codes straight from the file into their place
        load_shard_into(w, mode, part.range, weight_.narrow(split, part.local_offset, part.range.size()), {}, layer);

      const auto& s = checkpoint.get(part.prefix + ".weight_scale", layer);
      const auto sd = s.dtype();
      TORCH_CHECK_TYPE(sd == at::kFloat || sd == at::kHalf || sd == at::kBFloat16, layer, ": tensor '", s.name(),
                       "' has dtype ", sd, "; ", name(), " expects a float32 (or float16 / bfloat16) weight_scale");
      const auto shape = s.shape();
      TORCH_CHECK_VALUE(shape == std::vector<int64_t>({n, 1}) || shape == std::vector<int64_t>({n}), layer,
                        ": tensor '", s.name(), "' has shape ", shape_str(shape), "; expected [", n,
                        ", 1] (one scale per output channel)");
      if (empty) continue;
      // COLUMN slices the scales with the rows; ROW replicates them (split dim of width 1, or 1-D along dim 1).
      const auto scale = load_shard(s, mode, part.range, {}, layer).reshape({-1, 1});
      check_finite(scale, s, layer);
      weight_scale_.narrow(0, column ? part.local_offset : 0, column ? part.range.size() : n_).copy_(scale);
    }
  }

  void finalize() override {
    kernels_.rebuild(stamp(), [&] { return make_kernel(); });
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
    check_stored();
    const auto kernel = current_kernel();
#if TP_WITH_CUDA
    if (x.is_cuda() && kernel->cuda) return cuda::apply(*kernel->cuda, x, bias);
#endif
    return linear_2d(x, n_, k_, bias, [&](const at::Tensor& x2) {
      if (w8a8_ && x.device().is_cpu() && k_ <= kW8a8MaxK) {
        const auto xt = x2.scalar_type();
        const bool direct = xt == at::kFloat || xt == at::kBFloat16 || xt == at::kHalf;  // else widened as below
        const auto [q, x_scale] = w8a8_quantize_per_token(direct ? x2 : x2.to(at::kFloat));
        return w8a8_cpu_gemm(*kernel, q, x_scale).to(x.scalar_type());
      }
      if (w8a8_) {
        const auto [q, x_scale] = quantize_per_token(x2.to(at::kFloat));
        const auto acc = x.device().is_cpu() ? at::_int_mm(q, weight_.t()).to(at::kFloat)
                                             : at::matmul(q.to(at::kFloat), weight_.to(at::kFloat).t());
        return (acc * x_scale * kernel->row_scale).to(x.scalar_type());
      }
      if (x.device().is_cpu() && kernel->cpu_wo.codes.defined() &&
          (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf))
        return int8_wo_cpu_linear(x2, kernel->cpu_wo);
      const auto w = (weight_.to(at::kFloat) * weight_scale_.to(at::kFloat)).to(x.scalar_type());
      return at::matmul(x2, w.t());
    });
  }

  // W8A8 on the CPU quantizes x per token first (w8a8_quantize_per_token and
  // quantize_per_token give the same bits), so a caller may hand the codes over.
  TokenQuant token_quant(const at::Tensor& x) const override {
    const auto xt = x.scalar_type();
    const bool widened = xt == at::kFloat || xt == at::kBFloat16 || xt == at::kHalf;
    return w8a8_ && x.device().is_cpu() && weight_.is_cpu() && widened ? TokenQuant::kInt8 : TokenQuant::kNone;
  }

  at::Tensor apply_quantized(const at::Tensor& codes, const at::Tensor& scales,
                             const std::optional<at::Tensor>& bias) const override {
    check_stored();
    TORCH_CHECK_VALUE(w8a8_ && codes.device().is_cpu() && weight_.is_cpu(), name(),
                      ": pre-quantized activations are taken by int8_w8a8 on the CPU only");
    check_token_codes(codes, scales, at::kChar, k_, name());
    const auto kernel = current_kernel();
    auto shape = codes.sizes().vec();
    shape.back() = n_;
    const at::Tensor q = codes.reshape({-1, k_}).contiguous();
    const at::Tensor x_scale = scales.reshape({-1, 1}).contiguous();
    at::Tensor y;
    if (q.size(0) == 0 || n_ == 0) {
      y = at::zeros({q.size(0), n_}, q.options().dtype(dtype_));
    } else {
      y = w8a8_cpu_gemm(*kernel, q, x_scale).to(dtype_);
    }
    if (bias) y = y + *bias;
    return y.view(shape);
  }

  // weight * weight_scale per output channel (dequantize_int8), not the kernels' bfloat16 scales.
  at::Tensor dequantized_weight() const override {
    check_stored();
    return (weight_.to(at::kFloat) * weight_scale_.to(at::kFloat)).to(dtype_);
  }

  at::ScalarType activation_dtype() const override {
    check_stored();
    return dtype_;
  }
  at::Device weight_device() const override { return weight_.device(); }

 private:
  // What the kernels need beyond the registered tensors, derived from them.
  struct Kernel {
    at::Tensor row_scale;    // f32 [1, N], for the W8A8 epilogue
    at::Tensor row_sums;     // i32 [N], sum_k weight[n, k], for the VNNI W8A8 kernels
    Int8WoCpuWeight cpu_wo;  // weight-only CPU kernels: weight_ itself + f32 scales
#if TP_WITH_CUDA
    std::optional<cuda::Int8Prepared> cuda;  // when the weight is on CUDA
#endif
  };

  cpu::TensorStamp stamp() const { return cpu::TensorStamp::of({weight_, weight_scale_}); }

  // W8A8 on the CPU from per-token codes q [M, K] and scales [M, 1]: [M, N] float32 by tp's
  // kernels, or at::_int_mm past kW8a8MaxK (apply() and apply_quantized() both).
  at::Tensor w8a8_cpu_gemm(const Kernel& kernel, const at::Tensor& q, const at::Tensor& x_scale) const {
    if (k_ <= kW8a8MaxK) return w8a8_linear_cpu(q, x_scale, weight_, kernel.row_scale.reshape({-1}), kernel.row_sums);
    return at::_int_mm(q, weight_.t()).to(at::kFloat) * x_scale * kernel.row_scale;
  }

  std::shared_ptr<const Kernel> make_kernel() const {
    auto kernel = std::make_shared<Kernel>();
    kernel->row_scale = weight_scale_.reshape({1, -1}).to(at::kFloat).contiguous();
    const bool cpu_int8 = weight_.is_cpu() && weight_.scalar_type() == at::kChar;
    if (w8a8_ && cpu_int8) kernel->row_sums = w8a8_row_sums(weight_);
    // The weight-only CPU kernels read the registered weight itself (no copy).
    if (!w8a8_ && cpu_int8 && weight_.is_contiguous()) kernel->cpu_wo = int8_wo_cpu_pack(weight_, weight_scale_);
#if TP_WITH_CUDA
    // On CUDA: cuBLASLt IMMA (W8A8) or the weight-only GEMV (quant/int8/cuda.h).
    if (weight_.is_cuda() && weight_.scalar_type() == at::kChar)
      kernel->cuda = cuda::prepare_int8(w8a8_, weight_, weight_scale_);
#endif
    return kernel;
  }

  // The kernel side for the tensors as they are now (cpu/kernel_cache.h).
  std::shared_ptr<const Kernel> current_kernel() const {
    return kernels_.get(stamp(), [&] { return make_kernel(); });
  }

  // Module::to(dtype) converts every parameter, the int8 weight too: refuse rather
  // than compute with it.
  void check_stored() const {
    TORCH_CHECK_TYPE(weight_.scalar_type() == at::kChar, name(), ": 'weight' is ", weight_.scalar_type(),
                     ", not int8: Module::to(dtype) converts integer parameters too. Build the layer with "
                     "Options.dtype(...) and load the checkpoint instead of converting the layer");
  }

  QuantConfig config_;
  bool w8a8_;
  at::ScalarType dtype_ = at::kFloat;  // the layer's activation and output dtype
  int64_t n_ = 0, k_ = 0;              // the local weight [N, K] = [out_local, in_local]
  at::Tensor weight_;                  // i8 [N, K], registered as "weight"
  at::Tensor weight_scale_;            // f32 [N, 1], registered as "weight_scale"
  cpu::KernelCache<Kernel> kernels_;   // built by finalize(), rebuilt when stale
};

}  // namespace

// Per-channel scales are sliced with the rows (COLUMN) or replicated (ROW): any boundary works.
int64_t int8_alignment(const QuantConfig&, ShardMode) { return 1; }

std::shared_ptr<QuantMethod> make_int8_method(const QuantConfig& config) {
  return std::make_shared<Int8Method>(config);
}

QuantizedTensors quantize_int8(const at::Tensor& weight, const QuantConfig&) {
  // Symmetric per output channel: scale = amax / 127 (1 for an all-zero row).
  const auto w = weight.to(at::kFloat);
  const auto amax = w.abs().amax(1, /*keepdim=*/true);
  const auto scale = at::where(amax > 0, amax / 127, at::ones_like(amax));
  return {{"weight", at::round(w / scale).clamp(-127, 127).to(at::kChar)}, {"weight_scale", scale}};
}

at::Tensor dequantize_int8(const QuantizedTensors& tensors, const QuantConfig& config) {
  const auto get = [&](const char* suffix) {
    const auto it = tensors.find(suffix);
    TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(", to_string(config), "): no '", suffix, "' tensor");
    return it->second.cpu();
  };
  const auto w = get("weight"), s = get("weight_scale");
  TORCH_CHECK_VALUE(w.dim() == 2 && w.scalar_type() == at::kChar && s.numel() == w.size(0), "dequantize_weight(",
                    to_string(config), "): expected an int8 [N, K] weight and an [N, 1] weight_scale; got ", w.sizes(),
                    " ", w.scalar_type(), " and ", s.sizes());
  return w.to(at::kFloat) * s.to(at::kFloat).reshape({-1, 1});
}

at::Tensor quantize_activation_int8(const at::Tensor& x, const QuantizedTensors&, const QuantConfig& config) {
  const auto xf = x.to(at::kFloat);
  if (!is_w8a8(config) || xf.numel() == 0) return xf;
  const auto [q, scale] = quantize_per_token(xf.reshape({-1, xf.size(-1)}));
  return (q.to(at::kFloat) * scale).view(xf.sizes());
}

}  // namespace tp::detail
