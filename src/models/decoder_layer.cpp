#include "tp/models/decoder_layer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>

#include "models/model_common.h"
#include "tp/comm/differentiable.h"
#include "tp/models/layer_options.h"
#include "tp/models/rotary_embedding.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/split.h"

namespace tp {

DecoderLayerImpl::DecoderLayerImpl(ModelConfig config_, int64_t index_, at::ScalarType dtype_, at::Device device_,
                                   Communicator comm_)
    : config(std::move(config_)), index(index_), dtype(dtype_), device(device_), comm(std::move(comm_)) {
  reset();
}

std::string DecoderLayerImpl::prefix() const { return "model.layers." + std::to_string(index); }

void DecoderLayerImpl::reset() {
  const auto& c = config;
  const std::string p = prefix();
  auto norm = [&](int64_t size) {
    return RMSNorm(RMSNormOptions(size).eps(c.rms_norm_eps).dtype(dtype).device(device));
  };
  input_layernorm = register_module("input_layernorm", norm(c.hidden_size));
  post_attention_layernorm = register_module("post_attention_layernorm", norm(c.hidden_size));
  if (qk_norm()) {
    q_norm = register_module("q_norm", norm(c.head_dim));
    k_norm = register_module("k_norm", norm(c.head_dim));
  }
  auto opts = decoder_layer_options(c, index, dtype, device);
  qkv = register_module("qkv", QKVParallelLinear(opts.qkv, comm));
  // O owns exactly this rank's query heads, even when heads split unevenly.
  o_proj = register_module("o_proj", RowParallelLinear(opts.o_proj(*qkv), comm));
  // gate_up (column) and down (row) must cut the intermediate dimension alike: one
  // granularity that satisfies both formats' alignments.
  const auto split = SplitPolicy{}.with_granularity(combine_granularity(
      tp_alignment(opts.gate_up.quant(), ShardMode::kColumn), tp_alignment(opts.down.quant(), ShardMode::kRow)));
  gate_up = register_module("gate_up", GateUpParallelLinear(opts.gate_up.split(split), comm));
  down_proj = register_module("down_proj", RowParallelLinear(opts.down.split(split), comm));
  TORCH_CHECK_VALUE(gate_up->local_range() == down_proj->local_range(), p, ": gate_up's intermediate slice ",
                    gate_up->local_range(), " differs from down_proj's ", down_proj->local_range());
}

void DecoderLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::DecoderLayer(index=" << index << ", " << to_string(config.model_type) << ", rank=" << comm.rank()
         << "/" << comm.world_size() << ")";
}

namespace {

// Causal GQA attention of this rank's query heads. q: [b, hq, s, d]; k, v: [b, hkv, L, d]
// with L = past + s (the cache's positions, then the new ones).
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const HeadPlan& plan,
                             int64_t group, double scale) {
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
  if (!identity) {
    const auto index = at::tensor(kv_of_q, at::TensorOptions(at::kLong).device(q.device()));
    kh = k.index_select(1, index);
    vh = v.index_select(1, index);
  }
  const int64_t past = total - s;
  if (s == 1 || past == 0)  // one new token sees everything; a fresh sequence is plainly causal
    return at::scaled_dot_product_attention(q, kh, vh, {}, 0.0, /*is_causal=*/s > 1, scale);
  // New tokens after cached ones: token i (position past + i) sees keys 0 .. past + i.
  const auto opts = at::TensorOptions(at::kLong).device(q.device());
  const at::Tensor mask = at::arange(total, opts).unsqueeze(0) <= (at::arange(s, opts) + past).unsqueeze(1);
  return at::scaled_dot_product_attention(q, kh, vh, mask, 0.0, false, scale);
}

}  // namespace

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     KVCache* cache) {
  // The column layers route their mirrored input through copy_to_parallel themselves.
  auto [q, k, v] = qkv->split(qkv->forward(input_layernorm->forward(x)));
  const at::Tensor h = x + o_proj->forward(attention(q, k, v, cos, sin, cache));
  auto [gate, up] = gate_up->split(gate_up->forward(post_attention_layernorm->forward(h)));
  return h + down_proj->forward(at::silu(gate) * up);
}

at::Tensor DecoderLayerImpl::attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                       const at::Tensor& cos, const at::Tensor& sin, KVCache* cache) {
  const int64_t b = q_in.size(0), s = q_in.size(1), d = config.head_dim;
  const auto& plan = qkv->head_plan();
  at::Tensor q = q_in.reshape({b, s, -1, d});
  at::Tensor k = k_in.reshape({b, s, -1, d});
  at::Tensor v = v_in.reshape({b, s, -1, d});
  if (qk_norm()) {
    // Each rank applies the shared per-head weight to its own heads: the weight's
    // gradient is the sum of every rank's part.
    q = q_norm->forward(q.contiguous(), copy_to_parallel(q_norm->weight, comm));
    k = k_norm->forward(k.contiguous(), copy_to_parallel(k_norm->weight, comm));
  }
  q = apply_rotary(q.transpose(1, 2), cos, sin);
  k = apply_rotary(k.transpose(1, 2), cos, sin);
  v = v.transpose(1, 2);
  if (cache) std::tie(k, v) = cache->append(index, k, v);
  const int64_t group = config.num_attention_heads / config.num_key_value_heads;
  const at::Tensor a = grouped_attention(q, k, v, plan, group, std::pow(static_cast<double>(d), -0.5));
  return a.transpose(1, 2).reshape({b, s, -1});
}

void DecoderLayerImpl::load_weights(const Checkpoint& checkpoint) {
  const std::string p = prefix();
  detail::load_mirrored(checkpoint, p + ".input_layernorm.weight", input_layernorm->weight);
  detail::load_mirrored(checkpoint, p + ".post_attention_layernorm.weight", post_attention_layernorm->weight);
  if (qk_norm()) {
    detail::load_mirrored(checkpoint, p + ".self_attn.q_norm.weight", q_norm->weight);
    detail::load_mirrored(checkpoint, p + ".self_attn.k_norm.weight", k_norm->weight);
  }
  qkv->load_weights(checkpoint, p + ".self_attn");
  o_proj->load_weights(checkpoint, p + ".self_attn.o_proj");
  gate_up->load_weights(checkpoint, p + ".mlp");
  down_proj->load_weights(checkpoint, p + ".mlp.down_proj");
}

std::map<std::string, at::Tensor> DecoderLayerImpl::gather_weights() const {
  const std::string p = prefix();
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> out{
      {p + ".input_layernorm.weight", input_layernorm->weight.clone()},
      {p + ".post_attention_layernorm.weight", post_attention_layernorm->weight.clone()}};
  if (qk_norm()) {
    out[p + ".self_attn.q_norm.weight"] = q_norm->weight.clone();
    out[p + ".self_attn.k_norm.weight"] = k_norm->weight.clone();
  }
  for (auto&& part : {qkv->gather_weights(p + ".self_attn"), o_proj->gather_weights(p + ".self_attn.o_proj"),
                      gate_up->gather_weights(p + ".mlp"), down_proj->gather_weights(p + ".mlp.down_proj")})
    out.insert(part.begin(), part.end());
  return out;
}

}  // namespace tp
