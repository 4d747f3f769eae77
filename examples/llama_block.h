#pragma once
// A Llama-style decoder block composed from the tp layers, shared by the examples
// llama_block.cpp (float weights) and quant_block.cpp (FP8 and INT4 weights):
//
//   h   = x + O(attention(RoPE(Q), RoPE(K), V))      Q, K, V = QKV(RMSNorm(x))
//   out = h + down(SiLU(gate) * up)                  gate, up = gate_up(RMSNorm(h))
//
// Split states: x and h are mirrored on every rank; Q/K/V and gate/up are split by
// heads / intermediate columns; O and down produce partial sums, reduced over ranks.

#include <ATen/ATen.h>
#include <tp/tp.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace example {

struct Config {
  int64_t hidden = 256, heads = 8, kv_heads = 4, head_dim = 32, intermediate = 768;
  int64_t batch = 2, seq = 7;
  double eps = 1e-6, theta = 10000.0;
};

inline const std::string kPrefix = "model.layers.0.";

/// The projections' Hugging Face names (without ".weight").
inline std::vector<std::string> projections() {
  return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
}

/// The global float weights under Llama's Hugging Face names: [out, in] projections
/// and the two RMSNorm weights.
inline std::map<std::string, at::Tensor> make_weights(const Config& c, uint64_t seed = 7) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto w = [&](int64_t out, int64_t in) { return at::randn({out, in}, gen) / std::sqrt(static_cast<double>(in)); };
  const int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  return {
      {kPrefix + "input_layernorm.weight", 1 + 0.1 * at::randn({c.hidden}, gen)},
      {kPrefix + "self_attn.q_proj.weight", w(q, c.hidden)},
      {kPrefix + "self_attn.k_proj.weight", w(kv, c.hidden)},
      {kPrefix + "self_attn.v_proj.weight", w(kv, c.hidden)},
      {kPrefix + "self_attn.o_proj.weight", w(c.hidden, q)},
      {kPrefix + "post_attention_layernorm.weight", 1 + 0.1 * at::randn({c.hidden}, gen)},
      {kPrefix + "mlp.gate_proj.weight", w(c.intermediate, c.hidden)},
      {kPrefix + "mlp.up_proj.weight", w(c.intermediate, c.hidden)},
      {kPrefix + "mlp.down_proj.weight", w(c.hidden, c.intermediate)},
  };
}

inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

/// Rotary embedding (the rotate-half form) on [batch, heads, seq, head_dim].
inline at::Tensor rope(const at::Tensor& x, double theta) {
  const int64_t seq = x.size(-2), dim = x.size(-1);
  const auto opts = at::TensorOptions(x.scalar_type());
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, opts) / dim);
  const auto angles = at::outer(at::arange(seq, opts), inv_freq);
  const auto both = at::cat({angles, angles}, -1);
  const auto x1 = x.narrow(-1, 0, dim / 2), x2 = x.narrow(-1, dim / 2, dim / 2);
  return x * both.cos() + at::cat({-x2, x1}, -1) * both.sin();
}

/// Causal GQA attention (at::scaled_dot_product_attention) for query heads
/// [q_begin, q_begin + nq) reading KV heads from kv_begin (query head h reads KV head
/// h / group). q: [b, s, nq*d]; k, v: [b, s, nkv*d] -> [b, s, nq*d].
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Config& c,
                            int64_t q_begin, int64_t kv_begin) {
  const int64_t b = q.size(0), s = q.size(1), d = c.head_dim, nq = q.size(-1) / d, group = c.heads / c.kv_heads;
  if (nq == 0) return at::empty({b, s, 0}, q.options());
  auto heads = [&](const at::Tensor& t) { return t.reshape({b, s, -1, d}).transpose(1, 2); };  // [b, H, s, d]
  std::vector<int64_t> kv_of_q;
  for (int64_t h = q_begin; h < q_begin + nq; ++h) kv_of_q.push_back(h / group - kv_begin);
  const auto index = at::tensor(kv_of_q, at::kLong);
  const auto qh = rope(heads(q), c.theta);
  const auto kh = rope(heads(k), c.theta).index_select(1, index), vh = heads(v).index_select(1, index);
  const auto out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true);
  return out.transpose(1, 2).reshape({b, s, nq * d});
}

/// The block on one rank. Sizes are global; each layer holds this rank's shard, in
/// the weight format `quant`.
struct DecoderBlock {
  Config c;
  tp::QKVParallelLinear qkv{nullptr};
  tp::RowParallelLinear o_proj{nullptr};
  tp::GateUpParallelLinear gate_up{nullptr};
  tp::RowParallelLinear down_proj{nullptr};
  at::Tensor input_norm, post_attention_norm;  // [hidden], whole on every rank

  DecoderBlock(const Config& config, const tp::Communicator& comm, const tp::QuantConfig& quant = {}) : c(config) {
    qkv = tp::QKVParallelLinear(tp::QKVParallelLinearOptions(c.hidden, c.head_dim, c.heads, c.kv_heads).quant(quant),
                                comm);
    // O owns exactly this rank's query heads, even when heads split unevenly.
    o_proj = tp::RowParallelLinear(tp::RowParallelLinearOptions(c.heads * c.head_dim, c.hidden)
                                       .bias(false)
                                       .quant(quant)
                                       .split(qkv->attention_output_split()),
                                   comm);
    // gate_up (column) and down (row) must cut the intermediate dim alike; one
    // granularity for both keeps that true whatever alignment the format needs.
    const auto split = tp::SplitPolicy{}.with_granularity(128);
    gate_up = tp::GateUpParallelLinear(
        tp::GateUpParallelLinearOptions(c.hidden, c.intermediate).quant(quant).split(split), comm);
    down_proj = tp::RowParallelLinear(
        tp::RowParallelLinearOptions(c.intermediate, c.hidden).bias(false).quant(quant).split(split), comm);
  }

  void load(const tp::Checkpoint& ckpt) {
    qkv->load_weights(ckpt, kPrefix + "self_attn");  // q_proj, k_proj, v_proj: this rank's heads
    o_proj->load_weights(ckpt, kPrefix + "self_attn.o_proj");
    gate_up->load_weights(ckpt, kPrefix + "mlp");  // gate_proj, up_proj: this rank's rows
    down_proj->load_weights(ckpt, kPrefix + "mlp.down_proj");
    input_norm = ckpt.get(kPrefix + "input_layernorm.weight").read_all();
    post_attention_norm = ckpt.get(kPrefix + "post_attention_layernorm.weight").read_all();
  }

  /// x: [batch, seq, hidden], the same on every rank -> the same output on every rank.
  at::Tensor forward(const at::Tensor& x) {
    auto [q, k, v] = qkv->split(qkv->forward(rms_norm(x, input_norm, c.eps)));
    const auto& plan = qkv->head_plan();
    const auto h = x + o_proj->forward(attention(q, k, v, c, plan.q_heads.begin, plan.kv_heads.begin));
    auto [gate, up] = gate_up->split(gate_up->forward(rms_norm(h, post_attention_norm, c.eps)));
    return h + down_proj->forward(at::silu(gate) * up);
  }
};

/// The same block on one device, with `linear(x, name)` computing projection `name`
/// ("self_attn.q_proj", ...) on the full weights, and norm weights `norms`.
inline at::Tensor reference_block(const Config& c, const at::Tensor& x,
                                  const std::function<at::Tensor(const at::Tensor&, const std::string&)>& linear,
                                  const at::Tensor& input_norm, const at::Tensor& post_attention_norm) {
  const auto n1 = rms_norm(x, input_norm, c.eps);
  const auto a = attention(linear(n1, "self_attn.q_proj"), linear(n1, "self_attn.k_proj"),
                           linear(n1, "self_attn.v_proj"), c, 0, 0);
  const auto h = x + linear(a, "self_attn.o_proj");
  const auto n2 = rms_norm(h, post_attention_norm, c.eps);
  return h + linear(at::silu(linear(n2, "mlp.gate_proj")) * linear(n2, "mlp.up_proj"), "mlp.down_proj");
}

/// Runs `rank(comm)` at TP = world: on this thread with a no-op communicator for 1
/// (the same layers), else as `world` threads.
inline void run_tp(int64_t world, const std::function<void(tp::Communicator&)>& rank) {
  if (world == 1) {
    tp::Communicator single;
    rank(single);
  } else {
    tp::run_ranks_in_threads(world, rank);
  }
}

/// The folder an example writes its checkpoint to: `--dir DIR`, else $TMPDIR or /tmp.
inline std::string checkpoint_dir_from_args(int argc, char** argv, const char* program) {
  std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TORCH_CHECK_VALUE(flag == "--dir" && i + 1 < argc, "usage: ", program, " [--dir DIR]; got '", flag, "'");
    dir = argv[++i];
  }
  return dir;
}

}  // namespace example
