// DecoderLayer's boundaries: each row layer's partial sum ends in one fused collective
// (Communicator::all_reduce_fusion) that adds its bias once, the residual, the next norm
// and, where the GEMM after that norm quantizes its input per token, that quantization;
// and the block's forward on a LayerStream, which carries the norm (and its codes) that
// the last boundary computed for the next block. docs/DESIGN.md, "The boundary between
// layers".

#include "tp/models/decoder_layer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "models/model_common.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/quant/quant_method.h"

namespace tp {

namespace {

// A norm the fused collective computes as tp::Norm does: its kinds in float32, no
// canonical scale (invariant numerics keeps its own path).
bool fusable(const Norm& n) { return n && !n->scale && n->options.compute_dtype() == at::kFloat; }

// The norm half of a fused boundary's parameters: `n`'s, none for a null or unfusable
// norm (the consumer then normalizes the residual itself), with `quant` only beside a norm.
AllReduceFusionParams with_norm(const Norm& n, TokenQuant quant = TokenQuant::kNone) {
  AllReduceFusionParams p;
  if (!fusable(n)) return p;
  switch (n->options.kind()) {
    case NormKind::kRMS: p.norm = AllReduceFusionNorm::kRMS; break;
    case NormKind::kRMSUnitOffset: p.norm = AllReduceFusionNorm::kRMSUnitOffset; break;
    case NormKind::kRMSScaleFirst: p.norm = AllReduceFusionNorm::kRMSScaleFirst; break;
    case NormKind::kLayerNorm: p.norm = AllReduceFusionNorm::kLayerNorm; break;
  }
  p.norm_weight = n->weight;
  p.norm_bias = n->bias;
  p.eps = n->options.eps();
  switch (quant) {
    case TokenQuant::kNone: break;
    case TokenQuant::kFp8E4m3: p.quant_out = AllReduceFusionQuant::kFp8PerToken; break;
    case TokenQuant::kInt8: p.quant_out = AllReduceFusionQuant::kInt8PerToken; break;
  }
  return p;
}

// The sum of two row layers' biases (either may be undefined), added once by one reduction.
at::Tensor bias_sum(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return a + b;
}

// A fused boundary's result as the stream the next block reads.
LayerStream stream_of(AllReduceFusionResult r) {
  return LayerStream(std::move(r.residual_out), std::move(r.norm_out), std::move(r.quant_out), std::move(r.scale_out));
}

}  // namespace

bool DecoderLayerImpl::fuses(const at::Tensor& x) const {
  const auto t = x.scalar_type();
  // Invariant numerics keeps its own path (its sums are canonical, taken whole), as the
  // row layers resolve it.
  // Attention data parallelism reduces the MLP by a reduce-scatter, not an all-reduce to fuse.
  if (!fuse_boundary || at::GradMode::is_enabled() || resolve_numerics(config.numerics) == Numerics::kInvariant ||
      dp.enabled())
    return false;
  if (!(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) || !(x.is_cpu() || x.is_cuda())) return false;
  bool ok = fusable(post_attention_layernorm);
  if (config.sandwich_norms) ok = ok && fusable(post_feedforward_layernorm);
  return ok;
}

TokenQuant DecoderLayerImpl::input_quant(const at::Tensor& x) const { return qkv->input_quant(x); }

TokenQuant DecoderLayerImpl::mlp_input_quant(const at::Tensor& x) const {
  if (!moe.is_empty()) return TokenQuant::kNone;
  return config.gated_mlp ? gate_up->input_quant(x) : up_proj->input_quant(x);
}

at::Tensor DecoderLayerImpl::mlp_partial_from(const LayerStream& in) {
  if (!in.codes.defined()) return mlp_partial(in.normed);
  if (!config.gated_mlp)
    return down_proj->forward_partial(
        detail::activation(config.hidden_act, up_proj->forward_quantized(in.codes, in.scales)));
  auto [gate, up] = gate_up->split(gate_up->forward_quantized(in.codes, in.scales));
  return down_proj->forward_partial(detail::activation(config.hidden_act, gate) * up);
}

LayerStream DecoderLayerImpl::forward(const LayerStream& in, const NextNorm& next, const at::Tensor& cos,
                                      const at::Tensor& sin, KVCache* cache) {
  const at::Tensor& x = in.hidden;
  // The previous block's last boundary may have normalized (and quantized) x already.
  const at::Tensor y = in.codes.defined()    ? qkv->forward_quantized(in.codes, in.scales)
                       : in.normed.defined() ? qkv->forward(in.normed)
                                             : qkv->forward(input_layernorm->forward(x));
  auto [q, k, v] = qkv->split(y);
  const at::Tensor a = attention(q, k, v, cos, sin, cache);
  if (!fuses(x)) return LayerStream(forward_unfused(x, a));
  return forward_fused(x, a, next);
}

LayerStream DecoderLayerImpl::forward_fused(const at::Tensor& x, const at::Tensor& a, const NextNorm& next) {
  // The row layers hand on their partial sums without their biases; each boundary's one
  // collective adds the bias once, then the residual, then the next norm, with the
  // strategy and wire the row layer's own reduction would take.
  const auto by = [](const RowParallelLinear& row, AllReduceFusionParams p) {
    p.strategy = row->options.all_reduce();
    p.wire = row->options.wire();
    return p;
  };
  const auto mlp_params = [&](AllReduceFusionParams p) { return moe.is_empty() ? by(down_proj, std::move(p)) : p; };
  const at::Tensor attn = o_proj->forward_partial(a);
  if (config.parallel_residual) {
    // One reduction of both partial sums; the next block's input norm fused into it.
    AllReduceFusionParams p = by(o_proj, with_norm(next.norm, next.quant));
    p.bias = bias_sum(o_proj->bias, mlp_bias());
    p.residual_in = x;
    return stream_of(comm.all_reduce_fusion(attn + mlp_partial(post_attention_layernorm->forward(x)), p));
  }
  if (config.sandwich_norms) {
    // Gemma: the norm of the reduced output, then the residual add (the next block's
    // input norm would be a second norm in one pass: it normalizes the stream itself).
    AllReduceFusionParams p = by(o_proj, with_norm(post_attention_layernorm));
    p.bias = o_proj->bias;
    const at::Tensor h = x + comm.all_reduce_fusion(attn, p).norm_out;
    AllReduceFusionParams q = mlp_params(with_norm(post_feedforward_layernorm));
    q.bias = mlp_bias();
    return LayerStream(h + comm.all_reduce_fusion(mlp_partial(pre_feedforward_layernorm->forward(h)), q).norm_out);
  }
  // Sequential: o_proj's boundary normalizes for the MLP (quantized when its GEMM takes
  // codes), down_proj's for the next block (or the model's final norm).
  AllReduceFusionParams p = by(o_proj, with_norm(post_attention_layernorm, mlp_input_quant(x)));
  p.bias = o_proj->bias;
  p.residual_in = x;
  const LayerStream h = stream_of(comm.all_reduce_fusion(attn, p));
  AllReduceFusionParams q = mlp_params(with_norm(next.norm, next.quant));
  q.bias = mlp_bias();
  q.residual_in = h.hidden;
  return stream_of(comm.all_reduce_fusion(mlp_partial_from(h), q));
}

}  // namespace tp
