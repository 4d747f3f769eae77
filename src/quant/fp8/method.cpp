// The three FP8 E4M3 formats: quantize / dequantize (the reference semantics the
// tests are built on) and their QuantMethod.
//
//   format       stored (checkpoint)                                   activations
//   fp8_tensor   weight f8 [N,K], weight_scale f32 [], input_scale []  static: fp8(x / input_scale)
//   fp8_channel  weight f8 [N,K], weight_scale f32 [N,1]               dynamic per token: amax(row) / 448
//   fp8_block    weight f8 [N,K], weight_scale_inv [ceil(N/128),       dynamic 1x128 groups along K
//                ceil(K/128)] (DeepSeek-V3: w = w_f8 * scale_inv; compressed-tensors
//                names the same tensor weight_scale: QuantConfig::block_scale_name)
//
// Inside a layer, every format keeps its weight scales PER LOCAL ROW, in the kernel's
// layout, registered under the checkpoint's name:
//   fp8_tensor   weight_scale     [out_local, 1]
//   fp8_channel  weight_scale     [out_local, 1]            (the checkpoint's own shape)
//   fp8_block    weight_scale_inv [out_local, ceil(in_local / 128)]   (or weight_scale, as configured)
// plus fp8_tensor's input_scale []. Per-row scales make every concatenation exact: a
// fused QKV whose q, k, v tensors each have their own per-tensor scale, or a fused
// gate|up whose segments are not multiples of 128 (gate=1000: up's first row sits in
// the middle of a local 128-row block) - a local block grid could express neither.
// The cost is out_local * ceil(K/128) floats (~3% of the FP8 weight at K=4096).
//
// CPU kernels (all three formats): tp's own, in cpu_kernels.h (AVX2 / AVX-512 / scalar,
// chosen at run time): the E4M3 decode fused into the GEMV / GEMM, the weight read as
// one byte per element. The activations are quantized-dequantized by
// fp8_fake_quant_cpu, one C++ pass that is bit for bit the ATen functions below
// (which quantize_activation, the reference, uses), so the layer and the float64
// reference see identical activations. finalize() notes whether the weight holds NaN
// codes (the kernels then decode them exactly); a weight changed in place after
// finalize() (its version counter moved) takes the NaN-exact decode until the next
// finalize(). bf16 layers from kFp8AmxMinM rows, where AMX is usable and the weight has
// no NaN code, run on AMX bf16 tiles instead (fp8_linear_amx): the same quantized
// activations, as E4M3 values times their scales, exact products, float32 sums.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "cpu/amx.h"
#include "cpu/bf16_dot.h"
#include "quant/fp8/cpu_kernels.h"
#include "quant/fp8/fp8.h"
#include "quant/linear_2d.h"
#include "quant/random_weight.h"
#include "tp/loader/load_shard.h"

#if TP_WITH_CUDA
#include "quant/fp8/cuda.h"
#endif

namespace tp::detail {

namespace {

constexpr double kE4m3Max = 448.0;
constexpr int64_t kBlock = 128;
// quantize_weight has no activations to calibrate fp8_tensor's static input_scale
// on, so it stores the scale that maps |x| <= 16 onto the E4M3 range: wide enough for
// unit-variance test activations, while values down to ~6e-4 stay normal FP8
// numbers. Real checkpoints carry a calibrated input_scale; replace this one for
// real activations.
constexpr double kDefaultInputAmax = 16.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// amax -> scale; an all-zero group gets scale 1 so that it quantizes to zeros
// instead of 0/0.
at::Tensor scale_of(const at::Tensor& amax) { return at::where(amax > 0, amax / kE4m3Max, at::ones_like(amax)); }

// v / scale, saturated to the E4M3 range (the cast alone would give NaN past 448).
at::Tensor to_e4m3(const at::Tensor& v) { return v.clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn); }

// A [ceil(n/128), ceil(k/128)] block grid -> [n, k] (or [n, ceil(k/128)] with
// expand_cols=false): each block's value on every element it covers, the partial
// last blocks cut to size.
at::Tensor expand_block_rows(const at::Tensor& blocks, int64_t n) {
  return blocks.repeat_interleave(kBlock, 0).narrow(0, 0, n);
}
at::Tensor expand_blocks(const at::Tensor& blocks, int64_t n, int64_t k) {
  return expand_block_rows(blocks, n).repeat_interleave(kBlock, 1).narrow(1, 0, k);
}

// Quantize-dequantize of activations x [M, K] float32, as every kernel and the
// reference do it: one function, so both see the same bits.
at::Tensor fake_quant_static(const at::Tensor& x, const at::Tensor& input_scale) {
  return to_e4m3(x / input_scale).to(at::kFloat) * input_scale;
}
at::Tensor fake_quant_per_token(const at::Tensor& x) {
  const auto s = scale_of(x.abs().amax(-1, /*keepdim=*/true));  // [M, 1]
  return to_e4m3(x / s).to(at::kFloat) * s;
}
at::Tensor fake_quant_groups(const at::Tensor& x) {
  // 1x128 groups along K; a partial last group is padded with zeros, which change
  // no amax.
  const int64_t m = x.size(0), k = x.size(1), groups = ceil_div(k, kBlock);
  const at::Tensor padded = groups * kBlock == k ? x : at::constant_pad_nd(x, {0, groups * kBlock - k});
  const at::Tensor g = padded.reshape({m, groups, kBlock});
  const auto s = scale_of(g.abs().amax(-1, /*keepdim=*/true));  // [M, groups, 1]
  return (to_e4m3(g / s).to(at::kFloat) * s).reshape({m, groups * kBlock}).narrow(1, 0, k);
}

at::Tensor fake_quant_activation(QuantFormat format, const at::Tensor& x2d, const at::Tensor& input_scale) {
  switch (format) {
    case QuantFormat::kFp8PerTensor: return fake_quant_static(x2d, input_scale);
    case QuantFormat::kFp8PerChannel: return fake_quant_per_token(x2d);
    case QuantFormat::kFp8Block: return fake_quant_groups(x2d);
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "not an fp8 format: ", to_string(format));
  return x2d;
}

const at::Tensor& find(const QuantizedTensors& tensors, const char* suffix, const QuantConfig& config) {
  const auto it = tensors.find(suffix);
  TORCH_CHECK_VALUE(it != tensors.end() && it->second.defined(), to_string(config), ": no '", suffix,
                    "' tensor among the quantized tensors");
  return it->second;
}

// The name of the weight scale tensor of `config` in checkpoints and in the layer:
// fp8_block's is configurable (HF fine-grained FP8 "weight_scale_inv", compressed-tensors
// "weight_scale"; both multiply).
const char* scale_name(const QuantConfig& config) {
  return config.format == QuantFormat::kFp8Block ? to_string(config.block_scale_name) : "weight_scale";
}

void check_scale_dtype(const std::string& layer, const TensorSource& source, const QuantConfig& config) {
  TORCH_CHECK_VALUE(at::isFloatingType(source.dtype()) && !at::isFloat8Type(source.dtype()), layer, ": tensor '",
                    source.name(), "' has dtype ", source.dtype(), " but ", to_string(config),
                    " expects a floating-point scale (float32, or bfloat16/float16)");
}

// One FP8 method; the format decides the scale layout and the activation quantization.
class Fp8Method final : public QuantMethod {
 public:
  explicit Fp8Method(QuantConfig config) : config_(config) {}

  std::string name() const override { return to_string(config_); }
  int64_t tp_alignment(ShardMode mode) const override { return fp8_alignment(config_, mode); }
  bool allows_partial_block(ShardMode) const override { return block(); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    TORCH_CHECK_VALUE(options.device().is_cpu(), name(), ": this build runs FP8 layers on CPU only; got device ",
                      options.device());
    dtype_ = options.dtype().toScalarType();
    in_local_ = in_local;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device());
    weight_ = layer.register_parameter("weight", at::empty({out_local, in_local}, f32.dtype(at::kFloat8_e4m3fn)),
                                       /*requires_grad=*/false);
    scale_ = layer.register_parameter(scale_name(config_), at::empty({out_local, groups()}, f32),
                                      /*requires_grad=*/false);
    if (config_.format == QuantFormat::kFp8PerTensor)
      input_scale_ = layer.register_parameter("input_scale", at::empty({}, f32), /*requires_grad=*/false);
  }

  at::Tensor weight() const override { return weight_; }

  void reset_parameters(int64_t global_in_features) override {
    at::NoGradGuard no_grad;
    if (weight_.numel() == 0) {
      // No weight to draw, but a scale per row may remain (per channel at in_local 0).
      scale_.fill_(1.0);
      if (input_scale_.defined()) input_scale_.fill_(1.0);
      return finalize();
    }
    const int64_t n = weight_.size(0), k = weight_.size(1);
    if (config_.format == QuantFormat::kFp8PerTensor) {
      // One scale for the whole weight, so a chunk cannot choose its own: the draw's
      // bound is its amax (as quantize_fp8 would find it, to within the draw).
      const double bound = global_in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(global_in_features)) : 0.0;
      const at::Tensor s = scale_of(at::scalar_tensor(bound, at::kFloat));
      for_each_row_chunk(n, k, 1, [&](int64_t first, int64_t rows) {
        weight_.narrow(0, first, rows).copy_(to_e4m3(random_linear_weight(rows, k, global_in_features) / s));
      });
      scale_.fill_(s);
      input_scale_.fill_(kDefaultInputAmax / kE4m3Max);
      return finalize();
    }
    // Per channel / per 128 x 128 block: chunks of whole row blocks quantize alike.
    for_each_row_chunk(n, k, block() ? kBlock : 1, [&](int64_t first, int64_t rows) {
      const auto q = quantize_fp8(random_linear_weight(rows, k, global_in_features), config_);
      weight_.narrow(0, first, rows).copy_(q.at("weight"));
      set_rows(scale_, first, rows, q.at(scale_name(config_)), rows);
    });
    finalize();
  }

  void finalize() override {
    nan_codes_ = weight_.defined() && weight_.is_cpu() && weight_.numel() > 0 && fp8_has_nan_codes(weight_);
    seen_.store(pack_seen(version_of(weight_), nan_codes_));
#if TP_WITH_CUDA
    // On CUDA: the cuBLASLt FP8 path, with the scales in its layouts (quant/fp8/cuda.h).
    cuda_.reset();
    if (weight_.is_cuda()) {
      cuda_ =
          cuda::prepare_fp8(config_.format, weight_, scale_,
                            input_scale_.defined() ? std::optional<at::Tensor>(input_scale_) : std::nullopt, dtype_);
    }
#endif
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    const bool column = mode == ShardMode::kColumn;
    at::NoGradGuard no_grad;
    double input_scale = 0;
    for (const auto& part : parts) {
      // The checkpoint tensor's logical [N, K].
      const int64_t n = column ? part.logical_size : weight_.size(0);
      const int64_t k = column ? weight_.size(1) : part.logical_size;
      const auto& wsrc = checkpoint.get(part.prefix + ".weight", layer);
      TORCH_CHECK_VALUE(wsrc.dtype() == at::kFloat8_e4m3fn, layer, ": tensor '", wsrc.name(), "' has dtype ",
                        wsrc.dtype(), " but ", name(),
                        " expects float8_e4m3fn (make it with tp::quantize_weight or a matching exporter)");
      const auto wshape = wsrc.shape();
      TORCH_CHECK_VALUE(wshape.size() == 2 && (n < 0 || wshape[0] == n) && (k < 0 || wshape[1] == k), layer,
                        ": tensor '", wsrc.name(), "' has shape ", c10::IntArrayRef(wshape), "; expected [", n, ", ", k,
                        "] (weight is [out_features, in_features])");
      const int64_t n_all = wshape[0], k_all = wshape[1];
      const auto& ssrc = checkpoint.get(part.prefix + "." + scale_name(config_), layer);
      check_scale_dtype(layer, ssrc, config_);
      check_scale_shape(layer, ssrc, n_all, k_all);
      at::Tensor input;
      if (config_.format == QuantFormat::kFp8PerTensor) {
        const auto& isrc = checkpoint.get(part.prefix + ".input_scale", layer);
        check_scale_dtype(layer, isrc, config_);
        check_scale_shape(layer, isrc, n_all, k_all);
        LoadOptions flipped;
        flipped.flip_tp = true;  // input scales follow the input dimension (replicated when 0-d)
        input = load_shard(isrc, mode, part.range, flipped, layer).to(at::kFloat).reshape({});
        const double v = input.item<double>();
        TORCH_CHECK_VALUE(std::isfinite(v) && v > 0, layer, ": tensor '", isrc.name(), "' is ", v,
                          "; an input_scale must be finite and > 0");
        // One activation feeds every part of a fused layer, so it can be quantized
        // with one scale only: the largest, which saturates none of the parts' ranges
        // (vLLM does the same for fused per-tensor FP8).
        input_scale = std::max(input_scale, v);
      }
      if (part.range.size() == 0) continue;  // a rank past the tail owns nothing of this part

      LoadOptions options;
      options.logical_size = part.logical_size;
      // The codes straight from the file into their rows (load_shard_into).
      load_shard_into(wsrc, mode, part.range,
                      column ? weight_.narrow(0, part.local_offset, part.range.size()) : weight_, options, layer);

      if (block()) {
        options.scale_span = kBlock;  // one scale per 128 weight elements of the split dimension
      }
      const auto s = load_shard(ssrc, mode, part.range, options, layer).to(at::kFloat);
      check_finite(s, ssrc, layer);
      // Local rows of this part, and the first of them inside its scale block.
      const int64_t rows = column ? part.range.size() : weight_.size(0);
      const int64_t first = column ? part.range.begin : 0;
      const int64_t offset = column ? part.local_offset : 0;
      set_rows(scale_, offset, rows, s, rows, block() ? first % kBlock : 0);
    }
    if (input_scale_.defined()) input_scale_.fill_(input_scale);
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
#if TP_WITH_CUDA
    if (x.is_cuda() && cuda_) return cuda::apply(*cuda_, x, bias).to(dtype_);
#endif
    at::Tensor x2d = x.reshape({-1, in_local_});
    const auto xt = x2d.scalar_type();
    if (xt != at::kFloat && xt != at::kBFloat16 && xt != at::kHalf) x2d = x2d.to(at::kFloat);  // as the reference
    const float input_scale = input_scale_.defined() ? input_scale_.item<float>() : 1.0f;
    // NaN-exact decode where the weight has NaN codes (looked at again after an in-place
    // write, so a written layer takes the kernels a fresh one with its values takes).
    const bool nan_codes = weight_nan_codes();
    const int64_t group = block() ? kBlock : std::max<int64_t>(in_local_, 1);
    at::Tensor y = cpu_gemm(
        x2d.size(0), xt, x2d.device().is_cpu(), nan_codes, group,
        [&] { return fp8_quantize_codes_cpu(x2d, activation_kind(), input_scale); },
        [&] { return fp8_fake_quant_cpu(x2d, activation_kind(), input_scale); });
    // Bias in float32, so the output is rounded to the layer dtype once.
    if (bias) y.add_(bias->to(at::kFloat));
    auto shape = x.sizes().vec();
    shape.back() = weight_.size(0);
    return y.to(dtype_).reshape(shape);
  }

  // fp8_channel quantizes x per token first on the CPU, so a caller may hand the codes over.
  TokenQuant token_quant(const at::Tensor& x) const override {
    const auto xt = x.scalar_type();
    const bool widened = xt == at::kFloat || xt == at::kBFloat16 || xt == at::kHalf;
    return config_.format == QuantFormat::kFp8PerChannel && x.device().is_cpu() && weight_.is_cpu() && widened
               ? TokenQuant::kFp8E4m3
               : TokenQuant::kNone;
  }

  // apply()'s kernels, each fed the codes in its own form: the bf16 bit patterns and
  // transposed scales of fp8_quantize_codes_cpu, or the quantized-dequantized float32.
  at::Tensor apply_quantized(const at::Tensor& codes, const at::Tensor& scales,
                             const std::optional<at::Tensor>& bias) const override {
    TORCH_CHECK_VALUE(config_.format == QuantFormat::kFp8PerChannel && weight_.is_cpu(), name(),
                      ": pre-quantized activations are taken by fp8_channel on the CPU only");
    check_token_codes(codes, scales, at::kFloat8_e4m3fn, in_local_, name());
    const at::Tensor c2 = codes.reshape({-1, in_local_});
    const at::Tensor s2 = scales.reshape({-1, 1});
    const int64_t m = c2.size(0);
    const bool nan_codes = weight_nan_codes();
    const int64_t group = std::max<int64_t>(in_local_, 1);
    at::Tensor y;
    if (m == 0 || weight_.size(0) == 0 || in_local_ == 0) {
      y = at::zeros({m, weight_.size(0)}, codes.options().dtype(at::kFloat));
    } else {
      // q * scale in float32 is fake_quant_span's e4m3(x / scale) * scale, bit for bit.
      y = cpu_gemm(
          m, dtype_, /*x_on_cpu=*/true, nan_codes, group, [&] { return fp8_codes_from_e4m3(c2, s2); },
          [&] { return (c2.to(at::kFloat) * s2).contiguous(); });
    }
    if (bias) y.add_(bias->to(at::kFloat));
    auto shape = codes.sizes().vec();
    shape.back() = weight_.size(0);
    return y.to(dtype_).reshape(shape);
  }

  // The CPU GEMM of `m` rows of `xt` activations, [m, N] float32: bf16 layers on AMX or on
  // AVX-512 bf16 dot products take the activations' E4M3 codes (`codes()`:
  // fp8_quantize_codes_cpu's q and x_scale); the others their quantized-dequantized
  // float32 values (`dequantized()`). apply() and apply_quantized() choose here alike.
  template <class Codes, class Dequantized>
  at::Tensor cpu_gemm(int64_t m, at::ScalarType xt, bool x_on_cpu, bool nan_codes, int64_t group, const Codes& codes,
                      const Dequantized& dequantized) const {
    if (xt == at::kBFloat16 && m >= kFp8AmxMinM && !nan_codes && weight_.is_cpu() && cpu::amx_status().usable) {
      const auto [q, x_scale] = codes();
      return fp8_linear_amx(q, x_scale, weight_, scale_, group);
    }
    if (!nan_codes && weight_.is_cpu() && x_on_cpu && cpu::bf16_dot_applies(xt, m, cpu::isa())) {
      const auto [q, x_scale] = codes();
      return fp8_linear_bf16dot(q, x_scale, weight_, scale_, group);
    }
    return fp8_linear_cpu(dequantized(), weight_, scale_, group, nan_codes);
  }

  // The weight times its per-row scale (one per 128-column block of in_local for fp8_block).
  at::Tensor dequantized_weight() const override {
    const at::Tensor w = weight_.to(at::kFloat);
    const at::Tensor s = block() ? scale_.repeat_interleave(kBlock, 1).narrow(1, 0, in_local_) : scale_;
    return (w * s).to(dtype_);
  }

  at::ScalarType activation_dtype() const override { return dtype_; }
  at::Device weight_device() const override { return weight_.device(); }

 private:
  bool block() const { return config_.format == QuantFormat::kFp8Block; }
  Fp8Activation activation_kind() const {
    return config_.format == QuantFormat::kFp8PerTensor    ? Fp8Activation::kStatic
           : config_.format == QuantFormat::kFp8PerChannel ? Fp8Activation::kPerToken
                                                           : Fp8Activation::kGroup128;
  }
  // Whether the weight holds a NaN code now: finalize()'s answer while the weight's version
  // is the one it saw, else a new look (one pass over the codes per write), remembered with
  // that version. Two threads may both look after a write; they store the same answer.
  bool weight_nan_codes() const {
    const int64_t version = version_of(weight_);
    const int64_t seen = seen_.load();
    if (version >= 0 && seen >> 1 == version) return (seen & 1) != 0;
    if (version < 0) return nan_codes_;  // no version counter: trusted as finalized
    const bool nan = weight_.is_cpu() && weight_.numel() > 0 && fp8_has_nan_codes(weight_);
    seen_.store(pack_seen(version, nan));
    return nan;
  }
  static int64_t pack_seen(int64_t version, bool nan) { return version < 0 ? -1 : version * 2 + (nan ? 1 : 0); }
  // The tensor's version counter (bumped by every in-place write); -1 for tensors
  // that have none (made under InferenceMode), which are then trusted as finalized.
  static int64_t version_of(const at::Tensor& t) {
    return t.defined() && !t.is_inference() ? static_cast<int64_t>(t._version()) : -1;
  }
  // Scale columns per local row: one, or one per 128-column block of in_local.
  int64_t groups() const { return block() ? ceil_div(in_local_, kBlock) : 1; }

  // Writes `rows` local rows of the per-row scale starting at `offset` from a scale
  // tensor as stored: 0-d / [1] (per tensor), [rows, 1] (per channel), or block rows
  // [ceil((skip + rows) / 128), groups] whose first row block starts `skip` rows
  // before the first local row.
  void set_rows(at::Tensor& dst, int64_t offset, int64_t rows, const at::Tensor& src, int64_t n,
                int64_t skip = 0) const {
    auto out = dst.narrow(0, offset, rows);
    const at::Tensor s = src.to(at::kFloat);
    if (s.numel() == 1 && config_.format == QuantFormat::kFp8PerTensor) {
      out.fill_(s.reshape({}));
    } else if (block()) {
      out.copy_(expand_block_rows(s, skip + n).narrow(0, skip, rows));
    } else {
      out.copy_(s.reshape({rows, 1}));
    }
  }

  // The checkpoint shape of a scale of a [n, k] weight; wrong shapes name the tensor.
  void check_scale_shape(const std::string& layer, const TensorSource& source, int64_t n, int64_t k) const {
    const auto shape = source.shape();
    std::vector<int64_t> expected;
    bool ok = false;
    if (config_.format == QuantFormat::kFp8PerTensor) {
      ok = shape.empty() || shape == std::vector<int64_t>{1};
      expected = {};
    } else if (config_.format == QuantFormat::kFp8PerChannel) {
      expected = {n, 1};
      ok = shape == expected;
    } else {
      expected = {ceil_div(n, kBlock), ceil_div(k, kBlock)};
      ok = shape == expected;
    }
    TORCH_CHECK_VALUE(
        ok, layer, ": tensor '", source.name(), "' has shape ", c10::IntArrayRef(shape), "; ", name(), " expects ",
        c10::IntArrayRef(expected),
        config_.format == QuantFormat::kFp8PerTensor ? " (or [1]), one scale for the whole weight"
        : config_.format == QuantFormat::kFp8PerChannel
            ? " (one scale per output row of the [" + std::to_string(n) + ", " + std::to_string(k) + "] weight)"
            : " (one scale per 128x128 block of the [" + std::to_string(n) + ", " + std::to_string(k) + "] weight)");
  }

  QuantConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t in_local_ = 0;
  at::Tensor weight_;                      // [out_local, in_local] float8_e4m3fn, "weight"
  at::Tensor scale_;                       // [out_local, groups()] float32, "weight_scale" / "weight_scale_inv"
  at::Tensor input_scale_;                 // [] float32, "input_scale" (fp8_tensor only)
  bool nan_codes_ = false;                 // finalize(): the weight holds a NaN code (0x7f / 0xff)
  mutable std::atomic<int64_t> seen_{-1};  // weight_nan_codes(): version * 2 + NaN codes then
#if TP_WITH_CUDA
  std::optional<cuda::Fp8Prepared> cuda_;  // built by finalize() when the weight is on CUDA
#endif
};

void check_fp8(const QuantConfig& config) {
  const auto f = config.format;
  TORCH_INTERNAL_ASSERT(
      f == QuantFormat::kFp8PerTensor || f == QuantFormat::kFp8PerChannel || f == QuantFormat::kFp8Block,
      "not an fp8 format: ", to_string(config));
}

}  // namespace

int64_t fp8_alignment(const QuantConfig& config, ShardMode) {
  // Block scales cover 128 rows (column) and 128 columns (row); per-tensor and
  // per-channel scales are per row or replicated, so any boundary works.
  return config.format == QuantFormat::kFp8Block ? kBlock : 1;
}

std::shared_ptr<QuantMethod> make_fp8_method(const QuantConfig& config) {
  check_fp8(config);
  return std::make_shared<Fp8Method>(config);
}

QuantizedTensors quantize_fp8(const at::Tensor& weight, const QuantConfig& config) {
  check_fp8(config);
  const at::Tensor w = weight.to(at::kFloat);
  const int64_t n = w.size(0), k = w.size(1);
  switch (config.format) {
    case QuantFormat::kFp8PerTensor: {
      const auto s = scale_of(w.numel() ? w.abs().max() : at::zeros({}, at::kFloat));
      return {{"weight", to_e4m3(w / s)},
              {"weight_scale", s},
              {"input_scale", at::scalar_tensor(kDefaultInputAmax / kE4m3Max, at::kFloat)}};
    }
    case QuantFormat::kFp8PerChannel: {
      const auto s = scale_of(k ? w.abs().amax(1, /*keepdim=*/true) : at::zeros({n, 1}, at::kFloat));
      return {{"weight", to_e4m3(w / s)}, {"weight_scale", s}};
    }
    case QuantFormat::kFp8Block: {
      const int64_t nb = ceil_div(n, kBlock), kb = ceil_div(k, kBlock);
      // Zero padding to whole blocks changes no block's amax.
      const auto padded = at::constant_pad_nd(w, {0, kb * kBlock - k, 0, nb * kBlock - n});
      const auto amax = padded.abs().reshape({nb, kBlock, kb, kBlock}).amax(at::IntArrayRef{1, 3});
      const auto s = scale_of(amax);  // [nb, kb]
      return {{"weight", to_e4m3(w / expand_blocks(s, n, k))}, {scale_name(config), s}};
    }
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "not an fp8 format: ", to_string(config));
  return {};
}

at::Tensor dequantize_fp8(const QuantizedTensors& tensors, const QuantConfig& config) {
  check_fp8(config);
  const at::Tensor& w = find(tensors, "weight", config);
  TORCH_CHECK_VALUE(w.dim() == 2 && w.scalar_type() == at::kFloat8_e4m3fn, to_string(config),
                    ": 'weight' must be a float8_e4m3fn [out_features, in_features] tensor; got ", w.sizes(), " ",
                    w.scalar_type());
  const int64_t n = w.size(0), k = w.size(1);
  const at::Tensor s = find(tensors, scale_name(config), config).to(at::kFloat);
  switch (config.format) {
    case QuantFormat::kFp8PerTensor:
      TORCH_CHECK_VALUE(s.numel() == 1 && s.dim() <= 1, to_string(config), ": 'weight_scale' must be [] or [1]; got ",
                        s.sizes());
      return w.to(at::kFloat) * s.reshape({});
    case QuantFormat::kFp8PerChannel:
      TORCH_CHECK_VALUE(s.sizes() == at::IntArrayRef({n, 1}), to_string(config), ": 'weight_scale' must be [", n,
                        ", 1]; got ", s.sizes());
      return w.to(at::kFloat) * s;
    case QuantFormat::kFp8Block:
      TORCH_CHECK_VALUE(s.sizes() == at::IntArrayRef({ceil_div(n, kBlock), ceil_div(k, kBlock)}), to_string(config),
                        ": '", scale_name(config), "' must be [", ceil_div(n, kBlock), ", ", ceil_div(k, kBlock),
                        "]; got ", s.sizes());
      return w.to(at::kFloat) * expand_blocks(s, n, k);
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "not an fp8 format: ", to_string(config));
  return {};
}

at::Tensor quantize_activation_fp8(const at::Tensor& x, const QuantizedTensors& tensors, const QuantConfig& config) {
  check_fp8(config);
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1, to_string(config), ": expected an activation [..., in_features]");
  at::Tensor input_scale;
  if (config.format == QuantFormat::kFp8PerTensor) {
    input_scale = find(tensors, "input_scale", config).to(at::kFloat);
    TORCH_CHECK_VALUE(input_scale.numel() == 1, to_string(config), ": 'input_scale' must be [] or [1]; got ",
                      input_scale.sizes());
    input_scale = input_scale.reshape({});
  }
  const int64_t k = x.size(-1);
  const at::Tensor x2d = x.reshape({-1, k}).to(at::kFloat).contiguous();
  return fake_quant_activation(config.format, x2d, input_scale).reshape(x.sizes());
}

}  // namespace tp::detail
