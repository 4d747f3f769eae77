// MXFP4 (kMxfp4): OCP Microscaling FP4 weights, E2M1 codes in blocks of 32 along K that
// share a power-of-two E8M0 scale (quant/mxfp4/mxfp4.h), as GPT-OSS stores its experts.
// Weight-only: activations stay in the layer's dtype.
//
// TP alignment: COLUMN 1 (rows are independent); ROW 32 (a slice of K holds whole blocks,
// each with its scale: blocks and scales are read with scale_span 32 along K).
//
// CPU kernel: the shared panel GEMM over weights decoded exactly to float32
// (cpu_kernels.cpp) for float32, bfloat16 and float16 layers; float64 layers and other
// devices: the dequantized weight and at::matmul.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>

#include "common/shape_str.h"
#include "quant/linear_2d.h"
#include "quant/mxfp4/e2m1.h"
#include "quant/mxfp4/mxfp4.h"
#include "quant/random_weight.h"
#include "tp/loader/load_shard.h"

namespace tp::detail {

namespace {

// blocks [N, K / 32, 16] and scales [N, K / 32] -> float32 [N, K].
at::Tensor dequantize(const at::Tensor& blocks, const at::Tensor& scales) {
  const int64_t n = blocks.size(0), groups = blocks.size(1);
  const at::Tensor codes = e2m1_unpack(blocks).reshape({n, groups, 32});
  const at::Tensor values = e2m1_table().index({codes});
  return at::ldexp(values, (scales.to(at::kInt) - 127).unsqueeze(-1).to(at::kFloat)).reshape({n, groups * 32});
}

class Mxfp4Method final : public QuantMethod {
 public:
  explicit Mxfp4Method(const QuantConfig& config) : config_(config) {}

  std::string name() const override { return to_string(config_); }
  int64_t tp_alignment(ShardMode mode) const override { return mxfp4_alignment(config_, mode); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    TORCH_CHECK_VALUE(in_local % kMxfp4Block == 0, name(), ": in_features per rank = ", in_local,
                      " is not a multiple of the MXFP4 block of ", kMxfp4Block,
                      " (every rank's slice of K holds whole blocks)");
    n_ = out_local;
    k_ = in_local;
    dtype_ = c10::typeMetaToScalarType(options.dtype());
    const auto u8 = options.dtype(at::kByte);
    blocks_ = layer.register_parameter("blocks", at::empty({n_, k_ / kMxfp4Block, 16}, u8), false);
    scales_ = layer.register_parameter("scales", at::empty({n_, k_ / kMxfp4Block}, u8), false);
  }

  at::Tensor weight() const override { return blocks_; }

  void reset_parameters(int64_t global_in_features) override {
    if (n_ == 0 || k_ == 0) return;
    at::NoGradGuard no_grad;
    for_each_row_chunk(n_, k_, 1, [&](int64_t first, int64_t rows) {
      const auto q = quantize_mxfp4(random_linear_weight(rows, k_, global_in_features), config_);
      blocks_.narrow(0, first, rows).copy_(q.at("blocks"));
      scales_.narrow(0, first, rows).copy_(q.at("scales"));
    });
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    const bool column = mode == ShardMode::kColumn;
    const int64_t split = column ? 0 : 1;  // the weight's; blocks and scales split the same dims
    LoadOptions options;
    options.scale_span = column ? 1 : kMxfp4Block;  // ROW: K is the split dim, counted in blocks
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      TORCH_INTERNAL_ASSERT(part.logical_size >= 0, layer, ": WeightPart '", part.prefix, "' has no logical_size");
      const int64_t n = column ? part.logical_size : n_;
      const int64_t k = column ? k_ : part.logical_size;
      TORCH_CHECK_VALUE(k % kMxfp4Block == 0, layer, ": '", part.prefix, "' has in_features ", k,
                        "; MXFP4 stores K in whole blocks of ", kMxfp4Block);
      // Every rank checks every tensor's metadata, its own slice empty or not.
      const auto& b = checkpoint.get(part.prefix + ".blocks", layer);
      const auto& s = checkpoint.get(part.prefix + ".scales", layer);
      for (const auto* src : {&b, &s}) {
        TORCH_CHECK_TYPE(src->dtype() == at::kByte, layer, ": tensor '", src->name(), "' has dtype ", src->dtype(),
                         "; mxfp4 stores its blocks and scales as uint8");
      }
      TORCH_CHECK_VALUE(b.shape() == std::vector<int64_t>({n, k / kMxfp4Block, 16}), layer, ": tensor '", b.name(),
                        "' has shape ", shape_str(b.shape()), "; expected [", n, ", ", k / kMxfp4Block,
                        ", 16] (two E2M1 codes per byte, 32 per block)");
      TORCH_CHECK_VALUE(s.shape() == std::vector<int64_t>({n, k / kMxfp4Block}), layer, ": tensor '", s.name(),
                        "' has shape ", shape_str(s.shape()), "; expected [", n, ", ", k / kMxfp4Block,
                        "] (one E8M0 scale per block of 32)");
      if (part.range.size() == 0) continue;
      const int64_t offset = part.local_offset / options.scale_span, size = part.range.size() / options.scale_span;
      const at::Tensor scales = load_shard(s, mode, part.range, options, layer);
      TORCH_CHECK_VALUE(!scales.eq(255).any().item<bool>(), layer, ": tensor '", s.name(),
                        "' holds the E8M0 code 255, which is NaN: the scales are corrupt");
      scales_.narrow(split, offset, size).copy_(scales);
      load_shard_into(b, mode, part.range, blocks_.narrow(split, offset, size), options, layer);  // codes in place
    }
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
    check_stored();
    return linear_2d(x, n_, k_, bias, [&](const at::Tensor& x2) {
      const auto t = x.scalar_type();
      if (x.device().is_cpu() && blocks_.is_cpu() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf)) {
        const auto b = blocks_.contiguous(), s = scales_.contiguous();
        return mxfp4_cpu_linear(x2, Mxfp4CpuWeight{b.const_data_ptr<uint8_t>(), s.const_data_ptr<uint8_t>(), n_, k_});
      }
      return at::matmul(x2, dequantized_weight().to(x2.device()).t());
    });
  }

  at::Tensor dequantized_weight() const override {
    check_stored();
    return dequantize(blocks_.cpu(), scales_.cpu()).to(blocks_.device(), dtype_);
  }

  at::ScalarType activation_dtype() const override { return dtype_; }
  at::Device weight_device() const override { return blocks_.device(); }

 private:
  // Module::to(dtype) converts every parameter, the uint8 codes too: refuse rather than
  // compute with them.
  void check_stored() const {
    TORCH_CHECK_TYPE(blocks_.scalar_type() == at::kByte && scales_.scalar_type() == at::kByte, name(),
                     ": 'blocks' / 'scales' are ", blocks_.scalar_type(), " / ", scales_.scalar_type(),
                     ", not uint8: Module::to(dtype) converts integer parameters too. Build the layer with "
                     "Options.dtype(...) and load the checkpoint instead of converting the layer");
  }

  QuantConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t n_ = 0, k_ = 0;
  at::Tensor blocks_;  // u8 [N, K / 32, 16], registered as "blocks"
  at::Tensor scales_;  // u8 [N, K / 32], registered as "scales"
};

}  // namespace

at::Tensor e2m1_table() { return at::tensor(c10::ArrayRef<float>(kE2m1Values, 16), at::kFloat); }

at::Tensor e2m1_round(const at::Tensor& v) {
  // The E2M1 magnitude nearest |v|, ties to the even code.
  const at::Tensor m = v.abs();
  at::Tensor code = at::full(m.sizes(), 7, m.options().dtype(at::kInt));
  const std::pair<double, int> ties_down[] = {{5.0, 6}, {2.5, 4}, {1.25, 2}, {0.25, 0}};  // m <= edge: even code
  const std::pair<double, int> below[] = {{3.5, 5}, {1.75, 3}, {0.75, 1}};                // m < edge: odd code
  // Applied from the top edge down so each lower edge overwrites the codes under it.
  const std::pair<double, int> steps[] = {ties_down[0], below[0], ties_down[1], below[1],
                                          ties_down[2], below[2], ties_down[3]};
  for (const auto& [edge, c] : steps) {
    const bool tie_down = c % 2 == 0;
    code = at::where(tie_down ? m.le(edge) : m.lt(edge), at::full_like(code, c), code);
  }
  return at::where(v.lt(0), code.bitwise_or(8), code);
}

at::Tensor e2m1_pack(const at::Tensor& codes) {
  auto sizes = codes.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  const at::Tensor pairs = codes.reshape(sizes);
  return pairs.select(-1, 0).bitwise_or(pairs.select(-1, 1).bitwise_left_shift(4)).to(at::kByte).contiguous();
}

at::Tensor e2m1_unpack(const at::Tensor& bytes) {
  const at::Tensor b = bytes.to(at::kLong);
  auto sizes = bytes.sizes().vec();
  sizes.back() *= 2;
  // Element 2i of a byte's pair in the low nibble, 2i + 1 in the high one.
  return at::stack({b.bitwise_and(0x0F), b.bitwise_right_shift(4)}, -1).reshape(sizes);
}

int64_t mxfp4_alignment(const QuantConfig&, ShardMode mode) { return mode == ShardMode::kRow ? kMxfp4Block : 1; }

std::shared_ptr<QuantMethod> make_mxfp4_method(const QuantConfig& config) {
  return std::make_shared<Mxfp4Method>(config);
}

QuantizedTensors quantize_mxfp4(const at::Tensor& weight, const QuantConfig& config) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) % kMxfp4Block == 0, "quantize_weight(", to_string(config),
                    "): the weight [N, K] needs K a multiple of ", kMxfp4Block, "; got ", weight.sizes());
  const int64_t n = weight.size(0), groups = weight.size(1) / kMxfp4Block;
  const at::Tensor w = weight.to(at::kFloat).reshape({n, groups, kMxfp4Block});
  // The OCP MX rule: the block's scale is 2^(floor(log2(amax)) - 2), 2 being E2M1's
  // largest exponent, so the largest element lands in [4, 8) and saturates at 6.
  const at::Tensor amax = w.abs().amax(-1);
  const at::Tensor e = at::where(amax > 0, at::floor(at::log2(amax)) - 2, at::full_like(amax, -127)).clamp(-127, 127);
  const at::Tensor v = w / at::ldexp(at::ones_like(amax), e).unsqueeze(-1);
  const at::Tensor blocks = e2m1_pack(e2m1_round(v).reshape({n, groups, 32}));
  return {{"blocks", blocks.contiguous()}, {"scales", (e + 127).to(at::kByte).contiguous()}};
}

at::Tensor dequantize_mxfp4(const QuantizedTensors& tensors, const QuantConfig& config) {
  const auto get = [&](const char* suffix) {
    const auto it = tensors.find(suffix);
    TORCH_CHECK_VALUE(it != tensors.end(), "dequantize_weight(", to_string(config), "): no '", suffix, "' tensor");
    return it->second.cpu();
  };
  const auto b = get("blocks"), s = get("scales");
  TORCH_CHECK_VALUE(b.dim() == 3 && b.size(2) == 16 && s.dim() == 2 && b.size(0) == s.size(0) &&
                        b.size(1) == s.size(1) && b.scalar_type() == at::kByte && s.scalar_type() == at::kByte,
                    "dequantize_weight(", to_string(config),
                    "): expected uint8 blocks [N, K/32, 16] and scales "
                    "[N, K/32]; got ",
                    b.sizes(), " and ", s.sizes());
  return dequantize(b, s);
}

at::Tensor quantize_activation_mxfp4(const at::Tensor& x, const QuantizedTensors&, const QuantConfig&) {
  return x.to(at::kFloat);  // weight-only
}

}  // namespace tp::detail
