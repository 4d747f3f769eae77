#include "tp/models/decoder_layer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <cmath>
#include <limits>

#include "models/invariant_activation.h"
#include "models/model_common.h"
#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/differentiable.h"
#include "tp/comm/reduction.h"
#include "tp/layers/numerics/heads.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/layers/sequence_parallel.h"
#include "tp/models/layer_options.h"
#include "tp/models/rotary_embedding.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/split.h"

namespace tp {

DecoderLayerImpl::DecoderLayerImpl(ModelConfig config_, int64_t index_, at::ScalarType dtype_, at::Device device_,
                                   Communicator comm_, bool init_weights_)
    : config(std::move(config_)),
      index(index_),
      dtype(dtype_),
      device(device_),
      comm(std::move(comm_)),
      dp(AttentionDataParallel::none(comm)),
      init_weights(init_weights_) {
  reset();
}

DecoderLayerImpl::DecoderLayerImpl(ModelConfig config_, int64_t index_, at::ScalarType dtype_, at::Device device_,
                                   AttentionDataParallel dp_, bool init_weights_)
    : config(std::move(config_)),
      index(index_),
      dtype(dtype_),
      device(device_),
      comm(dp_.world),
      dp(std::move(dp_)),
      init_weights(init_weights_) {
  reset();
}

std::string DecoderLayerImpl::prefix() const { return config.layer_prefix(index); }

namespace {}  // namespace

void DecoderLayerImpl::reset() {
  const auto& c = config;
  const std::string p = prefix();
  auto norm = [&](int64_t size) {
    return Norm(NormOptions(size).kind(c.norm).eps(c.norm_eps).dtype(dtype).device(device).init_weights(init_weights));
  };
  input_layernorm = register_module("input_layernorm", norm(c.hidden_size));
  post_attention_layernorm = register_module("post_attention_layernorm", norm(c.hidden_size));
  if (c.sandwich_norms) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", norm(c.hidden_size));
    post_feedforward_layernorm = register_module("post_feedforward_layernorm", norm(c.hidden_size));
  }
  if (qk_norm()) {
    q_norm = register_module("q_norm", norm(c.head_dim));
    k_norm = register_module("k_norm", norm(c.head_dim));
  }
  auto opts = decoder_layer_options(c, index, dtype, device);
  opts.qkv.init_weights(init_weights);
  opts.o.init_weights(init_weights);
  opts.gate_up.init_weights(init_weights);
  opts.up.init_weights(init_weights);
  opts.down.init_weights(init_weights);
  qkv = register_module("qkv", QKVParallelLinear(opts.qkv, dp.attention));
  if (c.attention_sinks) {
    // One logit per query head, for this rank's heads (zeros until loaded).
    const auto sink_options = at::TensorOptions(dtype).device(device);
    const int64_t heads = qkv->head_plan().q_heads.size();
    sinks =
        register_parameter("sinks", init_weights ? at::zeros({heads}, sink_options) : at::empty({heads}, sink_options));
  }
  if (c.numerics == Numerics::kInvariant) use_invariant_heads();
  // O owns exactly this rank's query heads, even when heads split unevenly.
  if (dp.enabled()) {
    // The attention's output reduced within its group; the MLP's partial sums
    // reduce-scattered over every rank by mlp_over_groups.
    TORCH_CHECK_VALUE(c.numerics != Numerics::kInvariant && c.split_weights.empty(), p,
                      ": attention data parallelism covers the default numerics and even splits");
    opts.o.reduce_output(true);
    opts.down.reduce_output(false);
  }
  o_proj = register_module("o_proj", RowParallelLinear(opts.o_proj(*qkv), dp.attention));
  if (c.is_moe(index)) {
    TORCH_CHECK_VALUE(!c.parallel_residual, p, ": a mixture of experts under the parallel residual is not supported");
    moe = register_module(
        "moe",
        MoEParallelMLP(
            moe_layer_options(c, index, dtype, device).init_weights(init_weights).reduce_output(!dp.enabled()), comm));
    return;
  }
  Range column_range;
  if (c.gated_mlp) {
    gate_up = register_module("gate_up", GateUpParallelLinear(opts.gate_up, comm));
    column_range = gate_up->local_range();
  } else {
    up_proj = register_module("up_proj", ColumnParallelLinear(opts.up, comm));
    column_range = up_proj->local_range();
  }
  down_proj = register_module("down_proj", RowParallelLinear(opts.down, comm));
  TORCH_CHECK_VALUE(column_range == down_proj->local_range(), p, ": the MLP's intermediate slice ", column_range,
                    " differs from down_proj's ", down_proj->local_range());
}

void DecoderLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::DecoderLayer(index=" << index << ", " << to_string(config.model_type);
  if (config.is_sliding(index)) stream << ", sliding_window=" << config.sliding_window;
  if (config.parallel_residual) stream << ", parallel_residual";
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

namespace {

// Which keys each new query sees: key j (of `total`, the cache's then the new ones) for
// the query at position past + i when j <= past + i and, with a window, past + i - j < window.
// Undefined when every key is visible (one token, no window cut), or, with `implicit_causal`,
// when plain causal attention does it (SDPA's is_causal).
at::Tensor attention_mask(int64_t s, int64_t total, int64_t window, const at::Device& device, bool implicit_causal) {
  const int64_t past = total - s;
  const bool windowed = window > 0 && total > window;
  if (!windowed && (s == 1 || (implicit_causal && past == 0))) return {};
  const auto opts = at::TensorOptions(at::kLong).device(device);
  const at::Tensor key = at::arange(total, opts).unsqueeze(0), query = (at::arange(s, opts) + past).unsqueeze(1);
  at::Tensor mask = key <= query;
  if (windowed) mask = mask.logical_and(query - key < window);
  return mask;
}

// Causal GQA attention of this rank's query heads. q: [b, hq, s, d]; k, v: [b, hkv, L, d]
// with L = past + s (the cache's positions, then the new ones).
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const HeadPlan& plan,
                             int64_t group, const ModelConfig& config, int64_t window, const at::Tensor& sinks,
                             const std::function<at::Tensor(const at::Tensor&)>& expand) {
  const int64_t b = q.size(0), nq = q.size(1), s = q.size(2), d = q.size(3), total = k.size(2);
  if (nq == 0) return at::empty({b, 0, s, d}, q.options());
  // Local query head h reads local KV head (q_begin + h) / group - kv_begin.
  std::vector<int64_t> kv_of_q;
  bool identity = nq == k.size(1);
  for (int64_t h = 0; h < nq; ++h) {
    kv_of_q.push_back((plan.q_heads.begin + h) / group - plan.kv_heads.begin);
    identity = identity && kv_of_q.back() == h;
  }
  at::Tensor kh = k, vh = v;
  // Invariant numerics expands on every rank, even where its own mapping is the identity
  // (a rank with one query head of a replicated KV head): the expansion's backward is a
  // collective (every replica gets the KV head's whole gradient), so a rank that skipped it
  // would leave the others waiting (5 heads and one KV head at TP 3: 2, 2, 1).
  if (expand) {
    kh = expand(k);
    vh = expand(v);
  } else if (!identity) {
    const auto index = at::tensor(kv_of_q, at::TensorOptions(at::kLong).device(q.device()));
    kh = k.index_select(1, index);
    vh = v.index_select(1, index);
  }
  const double scale = config.attention_scale;
  if (sinks.defined()) {
    // GPT-OSS's eager attention, operation for operation: each head's sink logit joins its
    // row of scores, the softmax runs over both (in the scores' dtype, after subtracting
    // the row's max), and the sink's share is dropped.
    at::Tensor scores = at::matmul(q, kh.transpose(2, 3)) * scale;
    const at::Tensor visible = attention_mask(s, total, window, q.device(), /*implicit_causal=*/false);
    if (visible.defined()) scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
    const at::Tensor sink = sinks.to(scores.scalar_type()).view({1, nq, 1, 1}).expand({b, nq, s, 1});
    at::Tensor combined = at::cat({scores, sink}, -1);
    combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
    const at::Tensor probs = at::softmax(combined, -1, combined.scalar_type());
    return at::matmul(probs.narrow(-1, 0, total).to(vh.scalar_type()), vh);
  }
  if (config.attn_logit_softcapping > 0) {
    // Soft-capped scores, as transformers' eager attention (the one implementation that
    // applies the cap) computes them: cap * tanh(q.k * scale / cap), masked, softmax in float32.
    const double cap = config.attn_logit_softcapping;
    at::Tensor scores = at::matmul(q, kh.transpose(2, 3)) * scale;
    scores = at::tanh(scores / cap) * cap;
    const at::Tensor visible = attention_mask(s, total, window, q.device(), /*implicit_causal=*/false);
    if (visible.defined()) scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
    const at::Tensor weights = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    return at::matmul(weights, vh);
  }
  const at::Tensor mask = attention_mask(s, total, window, q.device(), /*implicit_causal=*/true);
  if (!mask.defined())  // one new token sees everything; a fresh sequence is plainly causal
    return at::scaled_dot_product_attention(q, kh, vh, {}, 0.0, /*is_causal=*/s > 1, scale);
  return at::scaled_dot_product_attention(q, kh, vh, mask, 0.0, false, scale);
}

}  // namespace

void DecoderLayerImpl::use_invariant_heads() {
  TORCH_CHECK_VALUE(config.norm == NormKind::kRMS && !config.sandwich_norms && !config.attention_sinks &&
                        config.attn_logit_softcapping <= 0,
                    prefix(),
                    ": invariant numerics covers RMSNorm decoders without attention sinks or soft caps "
                    "(Llama, Qwen2, Qwen3, Mistral); use numerics=default for ",
                    config.source);
  const HeadsByRank hidden{comm, {Range{0, 1}}, 1};
  const auto scale_hidden = [hidden](const at::Tensor& w, const at::Tensor& x) {
    return scale_by_weight_invariant(w, x, hidden);
  };
  input_layernorm->scale = scale_hidden;
  post_attention_layernorm->scale = scale_hidden;
  const HeadsByRank q_heads{comm, qkv->q_head_ranges(), config.num_attention_heads};
  // Every rank takes part in the KV expansion's backward (a collective); a rank without
  // query heads has no attention to run it from.
  for (size_t r = 0; r < q_heads.ranges.size(); ++r) {
    TORCH_CHECK_VALUE(q_heads.ranges[r].size() > 0, prefix(),
                      ": invariant numerics needs query heads on every rank, but rank ", r, " of ",
                      q_heads.ranges.size(), " holds none of the ", config.num_attention_heads,
                      " (num_key_value_heads=", config.num_key_value_heads,
                      "); use a TP size of at most num_attention_heads, or numerics=default");
  }
  const HeadsByRank kv_heads{comm, qkv->kv_head_ranges(), config.num_key_value_heads};
  if (qk_norm()) {
    q_norm->scale = [q_heads](const at::Tensor& w, const at::Tensor& x) {
      return scale_by_weight_invariant(w, x, q_heads);
    };
    k_norm->scale = [kv_heads](const at::Tensor& w, const at::Tensor& x) {
      return scale_by_weight_invariant(w, x, kv_heads);
    };
  }
  const int64_t group = config.num_attention_heads / config.num_key_value_heads;
  expand_kv = [q_heads, kv_heads, group](const at::Tensor& kv) {
    return expand_kv_invariant(kv, q_heads, kv_heads, group);
  };
}

std::string DecoderLayerImpl::moe_prefix() const { return prefix() + "." + config.names.moe; }

MoECheckpointLayout DecoderLayerImpl::moe_layout() const { return config.names.moe_layout; }

at::Tensor DecoderLayerImpl::mlp(const at::Tensor& x) {
  if (dp.enabled()) return mlp_over_groups(x);
  if (!moe.is_empty()) return moe->forward(x);
  // The column layers route their mirrored input through copy_to_parallel themselves.
  // Invariant numerics: an activation whose bits do not depend on where the rank's slice
  // of the intermediate dimension ends (models/invariant_activation.h).
  const auto act = [&](const at::Tensor& h) {
    return config.numerics == Numerics::kInvariant ? detail::invariant_activation(config.hidden_act, h)
                                                   : detail::activation(config.hidden_act, h);
  };
  if (!config.gated_mlp) return down_proj->forward(act(up_proj->forward(x)));
  auto [gate, up] = gate_up->split(gate_up->forward(x));
  return down_proj->forward(act(gate) * up);
}

at::Tensor DecoderLayerImpl::mlp_partial(const at::Tensor& x) {
  if (!moe.is_empty()) return moe->forward_partial(x);
  if (!config.gated_mlp) return down_proj->forward_partial(detail::activation(config.hidden_act, up_proj->forward(x)));
  auto [gate, up] = gate_up->split(gate_up->forward(x));
  return down_proj->forward_partial(detail::activation(config.hidden_act, gate) * up);
}

at::Tensor DecoderLayerImpl::mlp_bias() const { return moe.is_empty() ? down_proj->bias : at::Tensor(); }

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     KVCache* cache) {
  return forward(LayerStream(x), NextNorm{}, cos, sin, cache).hidden;
}

at::Tensor DecoderLayerImpl::mlp_over_groups(const at::Tensor& x) {
  // This rank's piece of its group's tokens; every group's pieces gathered over the world
  // (their counts exchanged: groups hold different batches); the MLP's partial sums
  // reduce-scattered back to the pieces; the group's pieces gathered again. Each step's
  // backward is the matching collective (tp/comm/differentiable.h).
  const at::Tensor tokens = x.reshape({-1, x.size(-1)});
  const auto group_sizes = sequence_sizes(tokens.size(0), dp.attention.world_size());
  const at::Tensor piece = scatter_to_parallel(tokens, dp.attention, 0, group_sizes);
  const auto world_sizes = exchange_sizes(piece, comm, 0);
  const at::Tensor all = gather_from_parallel(piece, comm, 0, world_sizes);
  at::Tensor mine = reduce_scatter_to_sequence_parallel(mlp_partial(all), comm, 0, world_sizes);
  // down's bias on every rank's piece: its gradient, each piece's, summed over the world.
  if (const at::Tensor bias = mlp_bias(); bias.defined()) mine = mine + copy_to_parallel(bias, comm);
  return gather_from_parallel(mine, dp.attention, 0, group_sizes).reshape(x.sizes());
}

at::Tensor DecoderLayerImpl::forward_unfused(const at::Tensor& x, const at::Tensor& a) {
  at::Tensor attn = o_proj->forward(a);
  if (config.parallel_residual && dp.enabled()) {
    // O reduced within the group; the MLP over every rank, reduced by mlp().
    return x + attn + mlp(post_attention_layernorm->forward(x));
  }
  if (config.parallel_residual) {
    // O and down hand on partial sums (their output reductions are none): one all-reduce
    // serves both (each row layer adds its bias on one rank only, so each is counted once).
    return x + Reduction::all_reduce(comm).apply(attn + mlp(post_attention_layernorm->forward(x)));
  }
  if (config.sandwich_norms) {
    const at::Tensor h = x + post_attention_layernorm->forward(attn);
    return h + post_feedforward_layernorm->forward(mlp(pre_feedforward_layernorm->forward(h)));
  }
  const at::Tensor h = x + attn;
  return h + mlp(post_attention_layernorm->forward(h));
}

at::Tensor DecoderLayerImpl::attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                       const at::Tensor& cos, const at::Tensor& sin, KVCache* cache) {
  const int64_t b = q_in.size(0), s = q_in.size(1), d = config.head_dim;
  const auto& plan = qkv->head_plan();
  // The head counts spelled out: a group of attention data parallelism may have no tokens.
  at::Tensor q = q_in.reshape({b, s, q_in.size(-1) / d, d});
  at::Tensor k = k_in.reshape({b, s, k_in.size(-1) / d, d});
  at::Tensor v = v_in.reshape({b, s, v_in.size(-1) / d, d});
  if (qk_norm()) {
    // Each rank applies the shared per-head weight to its own heads: the weight's
    // gradient is the sum of every rank's part.
    // Invariant numerics: the weights' gradient is made whole by their canonical scale
    // (use_invariant_heads), not by copy_to_parallel's all-reduce.
    const bool invariant = config.numerics == Numerics::kInvariant;
    const at::Tensor qw = invariant ? q_norm->weight : copy_to_parallel(q_norm->weight, dp.attention);
    const at::Tensor kw = invariant ? k_norm->weight : copy_to_parallel(k_norm->weight, dp.attention);
    q = q_norm->forward(q.contiguous(), qw);
    k = k_norm->forward(k.contiguous(), kw);
  }
  q = apply_rotary(q.transpose(1, 2), cos, sin);
  k = apply_rotary(k.transpose(1, 2), cos, sin);
  v = v.transpose(1, 2);
  if (cache) std::tie(k, v) = cache->append(index, k, v);
  const int64_t group = config.num_attention_heads / config.num_key_value_heads;
  const int64_t window = config.is_sliding(index) ? config.sliding_window : 0;
  // Each rank's heads see their own sinks; the shared sink tensor's gradient is theirs alone.
  const at::Tensor a = grouped_attention(q, k, v, plan, group, config, window, sinks, expand_kv);
  return a.transpose(1, 2).reshape({b, s, a.size(1) * a.size(3)});
}

namespace {

// The norms of a layer under their checkpoint names, in registration order.
std::vector<std::pair<std::string, Norm>> named_norms(const DecoderLayerImpl& l) {
  const auto& n = l.config.names;
  const std::string p = l.prefix() + ".", attn = p + n.attention + ".";
  std::vector<std::pair<std::string, Norm>> out{{p + n.input_norm, l.input_layernorm},
                                                {p + n.post_attention_norm, l.post_attention_layernorm}};
  if (l.config.sandwich_norms) {
    out.emplace_back(p + n.pre_feedforward_norm, l.pre_feedforward_layernorm);
    out.emplace_back(p + n.post_feedforward_norm, l.post_feedforward_layernorm);
  }
  if (l.qk_norm()) {
    out.emplace_back(attn + "q_norm", l.q_norm);
    out.emplace_back(attn + "k_norm", l.k_norm);
  }
  return out;
}

}  // namespace

void DecoderLayerImpl::load_weights(const Checkpoint& checkpoint) {
  for (auto& [name, norm] : named_norms(*this)) {
    detail::load_mirrored(checkpoint, name + ".weight", norm->weight);
    if (norm->bias.defined()) detail::load_mirrored(checkpoint, name + ".bias", norm->bias);
  }
  const auto opts = decoder_layer_options(config, index, dtype, device);
  qkv->load_weights(checkpoint, opts.qkv_prefix, config.names.qkv);
  o_proj->load_weights(checkpoint, opts.o_prefix);
  if (sinks.defined()) {
    // This rank's query heads' sinks, of [num_attention_heads].
    const std::string name = prefix() + "." + config.names.attention + ".sinks";
    const auto& source = checkpoint.get(name, "DecoderLayer");
    TORCH_CHECK_VALUE(source.shape() == std::vector<int64_t>{config.num_attention_heads}, "tensor '", name,
                      "' has shape ", c10::IntArrayRef(source.shape()), "; expected [", config.num_attention_heads,
                      "] (one sink logit per query head)");
    TORCH_CHECK_TYPE(at::isFloatingType(source.dtype()) && !at::isFloat8Type(source.dtype()), "tensor '", name,
                     "' has dtype ", source.dtype(), "; attention sinks are stored in a floating dtype");
    at::NoGradGuard no_grad;
    sinks.copy_(source.read(0, qkv->head_plan().q_heads));
  }
  if (!moe.is_empty()) {
    moe->load_weights(checkpoint, moe_prefix(), moe_layout());
    return;
  }
  if (config.gated_mlp)
    gate_up->load_weights(checkpoint, opts.gate_up_prefix, config.names.gate_up);
  else
    up_proj->load_weights(checkpoint, opts.up_prefix);
  down_proj->load_weights(checkpoint, opts.down_prefix);
}

std::map<std::string, at::Tensor> DecoderLayerImpl::gather_weights() const {
  const auto opts = decoder_layer_options(config, index, dtype, device);
  std::map<std::string, at::Tensor> out;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, norm] : named_norms(*this)) {
      out[name + ".weight"] = norm->weight.clone();
      if (norm->bias.defined()) out[name + ".bias"] = norm->bias.clone();
    }
  }
  const auto add = [&](std::map<std::string, at::Tensor> part) { out.insert(part.begin(), part.end()); };
  add(qkv->gather_weights(opts.qkv_prefix, config.names.qkv));
  add(o_proj->gather_weights(opts.o_prefix));
  if (sinks.defined()) {
    // Every rank's heads' sinks, in head order (ranks own consecutive query heads).
    at::NoGradGuard no_grad;
    const at::Tensor count = at::full({1}, sinks.size(0), at::kLong);
    std::vector<int64_t> sizes;
    if (comm.world_size() > 1) {
      const at::Tensor counts = comm.all_gather(count, 0, std::vector<int64_t>(comm.world_size(), 1)).cpu();
      for (int64_t r = 0; r < comm.world_size(); ++r) sizes.push_back(counts[r].item<int64_t>());
    }
    out[prefix() + "." + config.names.attention + ".sinks"] =
        comm.world_size() == 1 ? sinks.clone() : comm.all_gather(sinks.contiguous(), 0, sizes);
  }
  if (!moe.is_empty()) {
    add(moe->gather_weights(moe_prefix(), moe_layout()));
    return out;
  }
  add(config.gated_mlp ? gate_up->gather_weights(opts.gate_up_prefix, config.names.gate_up)
                       : up_proj->gather_weights(opts.up_prefix));
  add(down_proj->gather_weights(opts.down_prefix));
  return out;
}

}  // namespace tp
