#pragma once
// QuantMethod: everything format-specific about one linear layer's weights.
//
// Layers never branch on the format: they ask the method for its TP alignment (which
// feeds the shard policy), let it register the weight tensors with local shapes, load
// them through load_shard, repack them, and run the GEMM.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "tp/loader/checkpoint.h"
#include "tp/quant/quant_config.h"
#include "tp/shard/shard_mode.h"

namespace torch::nn {
class Module;
}

namespace tp {

/// A per-token activation quantization a caller can do before a layer's GEMM (the fused
/// boundary's quant_out, tp/comm/all_reduce_fusion.h) and hand it the result instead of
/// the activations: codes [..., K] and one float32 scale per token, x ~= codes * scale,
/// scale = amax / qmax (1 for a row of zeros).
///   kNone      none the caller can do: the layer takes x itself
///   kFp8E4m3   float8_e4m3fn codes, qmax 448 (fp8_channel's activations)
///   kInt8      int8 codes, round half to even, clamped to +-127 (int8_w8a8's)
enum class TokenQuant { kNone, kFp8E4m3, kInt8 };

class QuantMethod {
 public:
  virtual ~QuantMethod() = default;
  /// The format's name, for pretty_print and errors ("none", "fp8_block", ...).
  virtual std::string name() const = 0;
  /// Whether weight() is a plain parameter in the layer's dtype that training updates
  /// (the unquantized format): gather_weights reads it, and a checkpoint's quantized
  /// tensors would be misread by it. Quantized formats store frozen codes: false.
  virtual bool trainable() const { return false; }
  /// Every shard boundary of the split dimension must be a multiple of this many
  /// elements (a quant block, a packed element); 1 when anything goes.
  virtual int64_t tp_alignment(ShardMode mode) const = 0;
  /// Whether the split dimension may end inside a partial last block (a weight of
  /// 1000 rows in 128-row scale blocks): then the shard policy counts the partial
  /// block as a unit, owned whole by one rank (SplitPolicy::partial_tail). False
  /// for formats whose last block must be whole (packed elements).
  virtual bool allows_partial_block(ShardMode) const { return false; }
  /// Registers the weight tensors on `layer` with local shapes for a logical weight of
  /// [out_local, in_local]. `options` carries the layer's dtype (the activation and
  /// output dtype) and device; quantized tensors are registered as parameters that do
  /// not require grad, so they appear in parameters() and state_dict().
  virtual void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                              const at::TensorOptions& options) = 0;
  /// The main stored tensor as registered ("weight", or "qweight" for INT4); layers
  /// expose it as their `weight` member.
  virtual at::Tensor weight() const = 0;
  /// Fills the weights with a fresh random initialisation (as torch::nn::Linear does,
  /// with the GLOBAL fan-in so every TP size draws from the same distribution).
  virtual void reset_parameters(int64_t global_in_features) = 0;
  /// Reads this rank's slices of every part from `checkpoint` into the weights.
  /// `layer` names the caller in errors. Contract (loading is strict and collective,
  /// docs/DESIGN.md): every rank checks every part's tensors whole (presence, dtype,
  /// shape, scale shapes, packing), also a part whose range is empty on this rank, so a
  /// bad checkpoint fails on all ranks alike; values read (scales) are checked on the
  /// slice read. Read every tensor through `checkpoint.get` (it records what the
  /// layer consumed: a tensor under the part's prefix that no get() returned is an
  /// error after the load), and only the tensors the format defines.
  virtual void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
                    const std::string& layer) = 0;
  /// Repacks loaded weights for the kernel (no-op when the stored layout is the kernel's).
  virtual void finalize() {}
  /// y = x W^T (+ bias). x: [..., in_local]; bias: [out_local] or none; y: [..., out_local].
  virtual at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const = 0;
  /// The weight apply() computes with, as a plain tensor: [out_local, in_local] in the
  /// activation dtype, on the weights' device (the format's dequantize_weight of this
  /// rank's stored tensors). The layers' backward takes the input gradient through it,
  /// grad_x = grad_y W, so frozen quantized weights still pass gradients on (adapter
  /// and frozen-base training); for formats that also quantize activations that is the
  /// straight-through rule (docs/DESIGN.md, Training). For kNone it is the trainable
  /// parameter itself. Computed on each call (no cached full-precision copy).
  virtual at::Tensor dequantized_weight() const {
    TORCH_CHECK_NOT_IMPLEMENTED(false, name(),
                                ": this format has no dequantized weight, so its layers give no "
                                "input gradient");
  }
  /// The per-token quantization apply() gives an input like `x` (its dtype, device and
  /// shape) first, when apply_quantized() can take it done already; kNone otherwise.
  virtual TokenQuant token_quant(const at::Tensor& x) const { return TokenQuant::kNone; }
  /// apply() of the activations whose token_quant() quantization is `codes` [..., in_local]
  /// and `scales` [..., 1] float32: bit for bit what apply() gives those activations (it
  /// would quantize them to the same codes and scales). The output is in
  /// activation_dtype(). Refused by name for a format whose token_quant() is kNone.
  virtual at::Tensor apply_quantized(const at::Tensor& codes, const at::Tensor& scales,
                                     const std::optional<at::Tensor>& bias) const {
    TORCH_CHECK_VALUE(false, name(), ": this format takes no pre-quantized activations (token_quant is none)");
  }
  /// The dtype activations must have.
  virtual at::ScalarType activation_dtype() const = 0;
  /// Where the weights live; inputs must be there too.
  virtual at::Device weight_device() const = 0;
};

/// The method for `config`; a format this build cannot run is an error naming it.
std::shared_ptr<QuantMethod> make_quant_method(const QuantConfig& config);

/// make_quant_method(config)->tp_alignment(mode), read from the format table without
/// building a method (a model combining two layers' alignments before it builds them).
int64_t tp_alignment(const QuantConfig& config, ShardMode mode);

/// Whether every tensor `config`'s format stores is [out_features, ...], one row per
/// output feature (the unquantized weight and bias, per-channel scales; not per-tensor
/// scales, scale blocks or the INT4 packings): a stack of such tensors over experts
/// ([experts, out_features, ...], a fused MoE layout) splits into experts' rows.
bool splits_by_rows(const QuantConfig& config);

}  // namespace tp
