// INT4 weight-only, group-wise: kInt4Gptq, kInt4Awq and kInt4PackQuantized (the
// packings are described in quant/int4/packing.h). One method: the packings differ in
// what is registered and loaded, and all unpack to the same codes / scales / zero
// points (Int4Unpacked), from which finalize() builds the kernels' layouts.
//
// TP alignment: COLUMN splits N, which GPTQ's qzeros, AWQ's qweight/qzeros and
// pack-quantized's weight_zero_point pack eight to an int32, so every boundary is a
// multiple of 8 - except for symmetric pack-quantized, which packs only along K
// (alignment 1). ROW splits K, which the scale groups cover g at a time (and the
// K-packed qweight / weight_packed eight at a time; g is a multiple of 8), so every
// boundary is a multiple of g.
//
// CPU kernel: tp's own (quant/int4/cpu_kernels.h). finalize() unpacks the checkpoint
// to codes q [N, K], scales and zero points, and repacks them once into the kernels'
// panel layout (independent of the activation dtype and of the ISA, which is chosen
// per call: scalar, AVX2 or AVX-512 by cpu::isa()). float32, bfloat16 and float16
// layers run it: x is converted to float32 exactly, every product q * x is exact and
// only the float32 accumulation rounds (no rounding of x to bfloat16), and the output
// is rounded once to the layer's dtype. Float64 layers and other devices take a
// dequantize-and-matmul reference with the weight dequantized once in finalize().
// Whatever finalize() derives is made again on the next call once the registered
// tensors were written in place (cpu/tensor_stamp.h).

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "common/shape_str.h"
#include "cpu/kernel_cache.h"
#include "cpu/panel_gemm.h"  // kPanelWidth: the rows of one kernel panel
#include "quant/int4/cpu_kernels.h"
#include "quant/int4/int4.h"
#include "quant/int4/packing.h"
#include "quant/linear_2d.h"
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

// Which checkpoint packing a format reads.
enum class Packing { kGptq, kAwq, kPackQuantized };

Packing packing_of(QuantFormat format) {
  switch (format) {
    case QuantFormat::kInt4Gptq: return Packing::kGptq;
    case QuantFormat::kInt4Awq: return Packing::kAwq;
    case QuantFormat::kInt4PackQuantized: return Packing::kPackQuantized;
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "not an int4 format: ", to_string(format));
  return Packing::kGptq;
}

bool is_float_scale(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

bool cpu_kernel_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

class Int4Method final : public QuantMethod {
 public:
  explicit Int4Method(const QuantConfig& config)
      : config_(config),
        g_(config.group_size),
        packing_(packing_of(config.format)),
        awq_(packing_ == Packing::kAwq),
        pack_(packing_ == Packing::kPackQuantized) {
    check_group(config);
  }

  std::string name() const override { return to_string(config_); }

  int64_t tp_alignment(ShardMode mode) const override { return int4_alignment(config_, mode); }

  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override {
    TORCH_CHECK_VALUE(in_local % g_ == 0, name(), ": the layer's in_features per rank (", in_local,
                      ") is not a multiple of the group size ", g_, "; pad in_features to a multiple of ", g_);
    TORCH_CHECK_VALUE(out_local % 8 == 0 || !packs_n(), name(), ": the layer's out_features per rank (", out_local,
                      ") is not a multiple of 8 (eight 4-bit values share one int32); pad out_features to ",
                      round_up(out_local, 8));
    n_ = out_local;
    k_ = in_local;
    dtype_ = c10::typeMetaToScalarType(options.dtype());
    const auto i32 = options.dtype(at::kInt);
    if (pack_) {
      // compressed-tensors' names and [N, K] orientation. The scale is kept in float32,
      // which holds the checkpoint's bfloat16 / float16 / float32 scale exactly.
      qweight_ = layer.register_parameter("weight_packed", at::empty({n_, k_ / 8}, i32), false);
      scales_ = layer.register_parameter("weight_scale", at::empty({n_, k_ / g_}, options.dtype(at::kFloat)), false);
      if (!config_.symmetric)
        qzeros_ = layer.register_parameter("weight_zero_point", at::empty({n_ / 8, k_ / g_}, i32), false);
      return;
    }
    // Registered as the checkpoint names them, so parameters() and state_dict() show the format.
    qweight_ = layer.register_parameter(
        "qweight", at::empty(awq_ ? std::vector<int64_t>{k_, n_ / 8} : std::vector<int64_t>{k_ / 8, n_}, i32), false);
    qzeros_ = layer.register_parameter("qzeros", at::empty({k_ / g_, n_ / 8}, i32), false);
    scales_ = layer.register_parameter("scales", at::empty({k_ / g_, n_}, options.dtype(at::kHalf)), false);
  }

  at::Tensor weight() const override { return qweight_; }

  void reset_parameters(int64_t global_in_features) override {
    if (n_ == 0 || k_ == 0) return;
    at::NoGradGuard no_grad;
    // Eight rows at a time at least: the zero points (and AWQ's qweight) pack N.
    for_each_row_chunk(n_, k_, 8, [&](int64_t first, int64_t rows) {
      const auto w = random_linear_weight(rows, k_, global_in_features);
      if (pack_) {
        const auto q = quantize_int4_pack_quantized(w, config_);
        rows_of(qweight_, false, first, rows).copy_(q.at("weight_packed"));
        rows_of(scales_, false, first, rows).copy_(q.at("weight_scale"));
        if (qzeros_.defined()) rows_of(qzeros_, true, first, rows).copy_(q.at("weight_zero_point"));
      } else {
        const auto q = quantize_int4(w, config_);
        rows_of(qweight_, awq_, first, rows).copy_(q.at("qweight"));
        rows_of(qzeros_, true, first, rows).copy_(q.at("qzeros"));
        rows_of(scales_, false, first, rows).copy_(q.at("scales"));
      }
    });
    finalize();
  }

  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override {
    if (pack_) return load_pack_quantized(checkpoint, parts, mode, layer);
    const bool column = mode == ShardMode::kColumn;
    // The checkpoint is [K, N]-oriented: COLUMN (split N) splits its dim 1 and ROW
    // (split K) its dim 0, which is load_shard's flip_tp. The local tensors have the
    // same orientation, so a part lands at `dst_dim` = the split dim.
    const int64_t dst_dim = column ? 1 : 0;
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      // Every rank checks every tensor's metadata, its own shard empty or not, so a
      // bad checkpoint fails on all ranks alike (issue 14, failure 3).
      const bool empty = part.range.size() == 0;
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
        if (empty) return;
        options.flip_tp = true;
        load_part(source, mode, part, options, dst, dst_dim, /*scale=*/!integer, layer);
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
    kernels_.rebuild(stamp(), [&] { return make_kernel(); });
  }

  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override {
    check_stored();
    const auto kernel = current_kernel();
#if TP_WITH_CUDA
    if (x.is_cuda() && kernel->cuda) return cuda::apply(*kernel->cuda, x, bias);
#endif
    return linear_2d(x, n_, k_, bias, [&](const at::Tensor& x2) {
      if (kernel->cpu.codes.defined() && x.device().is_cpu() && cpu_kernel_dtype(x.scalar_type()))
        return int4_cpu_linear(x2, kernel->cpu);
      const auto w = kernel->dequantized.defined() ? kernel->dequantized : dequantize_unpacked(unpack(), g_);
      return at::matmul(x2, w.to(x.device(), x.scalar_type()).t());
    });
  }

  at::Tensor dequantized_weight() const override {
    check_stored();
    if (n_ == 0 || k_ == 0) return at::zeros({n_, k_}, at::TensorOptions().dtype(dtype_).device(qweight_.device()));
    const auto kernel = current_kernel();
    if (kernel->dequantized.defined()) return kernel->dequantized;
    return dequantize_unpacked(unpack(), g_).to(qweight_.device(), dtype_);
  }

  at::ScalarType activation_dtype() const override {
    check_stored();
    return dtype_;
  }

  at::Device weight_device() const override { return qweight_.device(); }

 private:
  // Whether the checkpoint packs N eight to a word (then N-shards are multiples of 8).
  bool packs_n() const { return !pack_ || !config_.symmetric; }

  // The part of a registered tensor that holds weight rows [first, first + rows): along
  // the dim that holds N (dim 0 in pack-quantized, 1 in GPTQ / AWQ), N itself or, where
  // `packed_n`, N / 8 (rows then a multiple of 8). The stored names: qweight packs N in
  // AWQ only; the zero points always do; the scales never.
  at::Tensor rows_of(const at::Tensor& t, bool packed_n, int64_t first, int64_t rows) const {
    const int64_t per = packed_n ? 8 : 1;
    return t.narrow(pack_ ? 0 : 1, first / per, rows / per);
  }

  // What the kernels need, derived from the registered tensors: the CPU panels, or the
  // CUDA layout, or the dequantized weight where neither applies.
  struct Kernel {
    Int4CpuWeight cpu;       // the CPU kernels' panels (quant/int4/cpu_kernels.h)
    at::Tensor dequantized;  // [N, K] in dtype_, when the CPU kernels do not apply
#if TP_WITH_CUDA
    std::optional<cuda::Int4Prepared> cuda;  // when qweight is on CUDA
#endif
  };

  cpu::TensorStamp stamp() const { return cpu::TensorStamp::of({qweight_, qzeros_, scales_}); }

  std::shared_ptr<const Kernel> make_kernel() const {
    auto kernel = std::make_shared<Kernel>();
    if (n_ == 0 || k_ == 0) return kernel;
#if TP_WITH_CUDA
    if (qweight_.is_cuda()) {
      // The CUDA kernels' layout (quant/int4/cuda.h): GEMV for decode, dequantize + cuBLASLt above.
      const auto u = unpack();
      kernel->cuda = cuda::prepare_int4(u.codes, u.scale, u.zero, g_, qweight_.device());
      return kernel;
    }
#endif
    // A range of rows at a time: the unpacked codes are int32 [N, K], 8x the stored
    // weight, and the dequantized float32 weight as large again.
    if (qweight_.device().is_cpu() && cpu_kernel_dtype(dtype_)) {
      std::vector<Int4CpuWeight> parts;
      for_each_row_chunk(n_, k_, cpu::kPanelWidth, [&](int64_t first, int64_t rows) {
        const auto u = unpack(first, rows);
        parts.push_back(int4_cpu_pack(u.codes, u.scale, u.zero, g_));
      });
      kernel->cpu = int4_cpu_concat(std::move(parts));
    } else {
      kernel->dequantized = at::empty({n_, k_}, at::TensorOptions().dtype(dtype_).device(qweight_.device()));
      for_each_row_chunk(n_, k_, cpu::kPanelWidth, [&](int64_t first, int64_t rows) {
        kernel->dequantized.narrow(0, first, rows).copy_(dequantize_unpacked(unpack(first, rows), g_));
      });
    }
    return kernel;
  }

  // The kernel side for the tensors as they are now (cpu/kernel_cache.h).
  std::shared_ptr<const Kernel> current_kernel() const {
    return kernels_.get(stamp(), [&] { return make_kernel(); });
  }

  Int4Unpacked unpack() const { return unpack(0, n_); }

  // The weight rows [first, first + rows) unpacked, from the stored tensors' slices.
  Int4Unpacked unpack(int64_t first, int64_t rows) const {
    const auto slice = [&](const at::Tensor& t, bool packed_n) -> at::Tensor {
      if (!t.defined()) return t;
      return rows == n_ ? t.cpu() : rows_of(t, packed_n, first, rows).cpu().contiguous();
    };
    const auto qw = slice(qweight_, awq_), qz = slice(qzeros_, true), sc = slice(scales_, false);
    switch (packing_) {
      case Packing::kAwq: return unpack_awq(qw, qz, sc);
      case Packing::kPackQuantized: return unpack_pack_quantized(qw, qz, sc);
      case Packing::kGptq: break;
    }
    return unpack_gptq(qw, qz, sc, config_.gptq_format);
  }

  // compressed-tensors pack-quantized: every tensor [N, K]-oriented (no flip_tp).
  // COLUMN splits dim 0 (N; weight_zero_point packs it eight to a word), ROW dim 1
  // (K; weight_packed packs it eight to a word, weight_scale / weight_zero_point hold
  // one column per group). Every rank checks every tensor's metadata, including ranks
  // whose part is empty, so a bad checkpoint fails on all ranks alike.
  void load_pack_quantized(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
                           const std::string& layer) {
    const bool column = mode == ShardMode::kColumn;
    const int64_t dim = column ? 0 : 1;
    at::NoGradGuard no_grad;
    for (const auto& part : parts) {
      TORCH_INTERNAL_ASSERT(part.logical_size >= 0, layer, ": WeightPart '", part.prefix, "' has no logical_size");
      const int64_t n = column ? part.logical_size : n_;  // the checkpoint tensor's N and K
      const int64_t k = column ? k_ : part.logical_size;
      const std::string weight = "[" + std::to_string(n) + ", " + std::to_string(k) + "]";
      TORCH_CHECK_VALUE(k % g_ == 0 && (n % 8 == 0 || config_.symmetric), layer, ": '", part.prefix, "' is a ", weight,
                        " weight; ", name(), " needs in_features a multiple of ", g_,
                        config_.symmetric ? "" : " and out_features a multiple of 8 (the zero points pack N)");
      const auto check = [&](const TensorSource& source, bool integer, const std::vector<int64_t>& expected,
                             const char* layout) {
        const auto dtype = source.dtype();
        if (integer) {
          TORCH_CHECK_TYPE(dtype == at::kInt, layer, ": tensor '", source.name(), "' has dtype ", dtype, "; ", name(),
                           " stores it as int32 (eight 4-bit values per element)");
        } else {
          TORCH_CHECK_TYPE(is_float_scale(dtype), layer, ": tensor '", source.name(), "' has dtype ", dtype, "; ",
                           name(), " expects a bfloat16, float16 or float32 scale");
        }
        TORCH_CHECK_VALUE(source.shape() == expected, layer, ": tensor '", source.name(), "' has shape ",
                          shape_str(source.shape()), "; expected ", shape_str(expected), " (", layout, ") for a ",
                          weight, " (out_features, in_features) weight in ", name());
      };
      const auto& packed = checkpoint.get(part.prefix + ".weight_packed", layer);
      check(packed, true, {n, k / 8}, "[N, K/8], packed along K");
      const auto& scale = checkpoint.get(part.prefix + ".weight_scale", layer);
      check(scale, false, {n, k / g_}, "[N, K/g]");
      const std::string zp_name = part.prefix + ".weight_zero_point";
      const TensorSource* zero_point = nullptr;
      if (config_.symmetric) {
        TORCH_CHECK_VALUE(!checkpoint.contains(zp_name), layer, ": the checkpoint has '", zp_name,
                          "', but the layer is ", name(),
                          ", which has no zero points; build it with ':asym' (the checkpoint's "
                          "quantization_config says symmetric: false)");
      } else {
        zero_point = &checkpoint.get(zp_name, layer);
        check(*zero_point, true, {n / 8, k / g_}, "[N/8, K/g], packed along N");
      }
      const auto& shape = checkpoint.get(part.prefix + ".weight_shape", layer);
      TORCH_CHECK_VALUE(
          shape.shape() == std::vector<int64_t>{2} && (shape.dtype() == at::kLong || shape.dtype() == at::kInt), layer,
          ": tensor '", shape.name(), "' has shape ", shape_str(shape.shape()), " and dtype ", shape.dtype(),
          "; expected an int64 [2] holding [out_features, in_features]");
      const auto nk = shape.read_all().to(at::kLong);
      TORCH_CHECK_VALUE(nk[0].item<int64_t>() == n && nk[1].item<int64_t>() == k, layer, ": tensor '", shape.name(),
                        "' says the weight is [", nk[0].item<int64_t>(), ", ", nk[1].item<int64_t>(),
                        "]; the layer expects ", weight);
      if (part.range.size() == 0) continue;  // nothing of this part on this rank

      LoadOptions packed_k, per_group, packed_n_per_group;
      packed_k.elm_packing = column ? 1 : 8;   // K packed eight to a word: only ROW splits it
      per_group.scale_span = column ? 1 : g_;  // one column of scales per group of K
      packed_n_per_group.elm_packing = column ? 8 : 1;
      packed_n_per_group.scale_span = column ? 1 : g_;
      load_part(packed, mode, part, packed_k, qweight_, dim, /*scale=*/false, layer);
      load_part(scale, mode, part, per_group, scales_, dim, /*scale=*/true, layer);
      if (zero_point) load_part(*zero_point, mode, part, packed_n_per_group, qzeros_, dim, /*scale=*/false, layer);
    }
  }

  // Reads this rank's slice of `part` from `source` into its place in `dst` (along
  // `dim`, where `options` packs or spans `div` elements of the split dim per stored
  // element); a scale's values must be finite.
  void load_part(const TensorSource& source, ShardMode mode, const WeightPart& part, const LoadOptions& options,
                 const at::Tensor& dst, int64_t dim, bool scale, const std::string& layer) const {
    const int64_t div = options.scale_span * options.elm_packing;
    TORCH_INTERNAL_ASSERT(part.local_offset % div == 0 && part.range.size() % div == 0, layer, ": part '", part.prefix,
                          "' at ", part.local_offset, " is not aligned to ", div);
    auto slot = dst.narrow(dim, part.local_offset / div, part.range.size() / div);
    if (!scale) {
      // Packed codes and zero points: straight from the file into their slot (load_shard_into).
      load_shard_into(source, mode, part.range, slot, options, layer);
      return;
    }
    const auto shard = load_shard(source, mode, part.range, options, layer);
    TORCH_INTERNAL_ASSERT(shard.sizes() == slot.sizes(), layer, ": tensor '", source.name(), "' shard ", shard.sizes(),
                          " does not fit its local slot ", slot.sizes());
    check_finite(shard, source, layer);
    slot.copy_(shard);
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
    TORCH_CHECK_TYPE(qweight_.scalar_type() == at::kInt && (!qzeros_.defined() || qzeros_.scalar_type() == at::kInt),
                     name(), ": the packed weight / zero points are ", qweight_.scalar_type(), " / ",
                     qzeros_.defined() ? c10::toString(qzeros_.scalar_type()) : "absent",
                     ", not int32: Module::to(dtype) converts integer parameters too. Build the layer with "
                     "Options.dtype(...) and load the checkpoint instead of converting the layer");
  }

  QuantConfig config_;
  int64_t g_;
  Packing packing_;
  bool awq_;                           // packing_ == kAwq
  bool pack_;                          // packing_ == kPackQuantized
  at::ScalarType dtype_ = at::kFloat;  // the layer's activation and output dtype
  int64_t n_ = 0, k_ = 0;              // the local weight [N, K] = [out_local, in_local]
  // Registered on the layer, as stored in the checkpoint (shapes in quant/int4/packing.h):
  // GPTQ / AWQ "qweight", "qzeros", "scales"; pack-quantized "weight_packed",
  // "weight_zero_point" (asymmetric only; else undefined), "weight_scale" (float32).
  at::Tensor qweight_, qzeros_, scales_;
  // Kernel side: built by finalize(), rebuilt by current_kernel() when stale.
  cpu::KernelCache<Kernel> kernels_;
};

}  // namespace

// COLUMN: N is packed eight to an int32 (qzeros, AWQ's qweight, pack-quantized's
// weight_zero_point), except in symmetric pack-quantized, which packs K only; ROW: K in
// whole groups.
int64_t int4_alignment(const QuantConfig& config, ShardMode mode) {
  if (mode == ShardMode::kRow) return config.group_size;
  return config.format == QuantFormat::kInt4PackQuantized && config.symmetric ? 1 : 8;
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
  const bool v2 = config.gptq_format == GptqFormat::kV2;
  TORCH_INTERNAL_ASSERT(awq || config.format == QuantFormat::kInt4Gptq, "not a GPTQ / AWQ format: ", to_string(config));
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
    zero = at::round(-wg.amin(-1).clamp_max(0) / scale).clamp(awq || v2 ? 0 : 1, 15);
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
    out["qzeros"] = pack_int4(v2 ? zero_gn : zero_gn - 1, 1);  // v1 stores zero - 1
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
  TORCH_INTERNAL_ASSERT(awq || config.format == QuantFormat::kInt4Gptq, "not a GPTQ / AWQ format: ", to_string(config));
  const auto u = awq ? unpack_awq(get("qweight"), get("qzeros"), get("scales"))
                     : unpack_gptq(get("qweight"), get("qzeros"), get("scales"), config.gptq_format);
  const int64_t k = u.codes.size(1), groups = u.scale.size(0);
  TORCH_CHECK_VALUE(groups * config.group_size == k, "dequantize_weight(", to_string(config), "): 'scales' has ",
                    groups, " groups for in_features=", k, ", which is a group size of ", k / groups, ", not ",
                    config.group_size);
  return dequantize_unpacked(u, config.group_size);
}

}  // namespace tp::detail
