// A Llama-style decoder block in C++, composed from the tp layers:
//
//   h   = x + O(attention(RoPE(Q), RoPE(K), V))      Q, K, V = QKV(RMSNorm(x))
//   out = h + down(SiLU(gate) * up)                  gate, up = gate_up(RMSNorm(h))
//
// The weights are written once to a safetensors file under Hugging Face's names;
// every rank opens it (tp::open_checkpoint) and reads only its shard. The block
// runs at TP 1, 2, 3 and 4 (ranks as threads; 3 splits the KV heads unevenly) and
// is checked against the same block on one device, in float64, on the full weights.
// Built and run by the tests (ctest -R example).
//
//   llama_block_example [--dir DIR]       # where the checkpoint is written (default $TMPDIR or /tmp)

#include <ATen/ATen.h>
#include <tp/tp.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Config {
  int64_t hidden = 256, heads = 8, kv_heads = 4, head_dim = 32, intermediate = 688;
  int64_t batch = 2, seq = 7;
  double eps = 1e-6, theta = 10000.0;
};

const std::string kPrefix = "model.layers.0.";

// The global weights under Llama's Hugging Face names.
std::map<std::string, at::Tensor> make_weights(const Config& c) {
  auto gen = at::detail::createCPUGenerator(7);
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

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

// Rotary embedding (the rotate-half form) on [batch, heads, seq, head_dim].
at::Tensor rope(const at::Tensor& x, double theta) {
  const int64_t seq = x.size(-2), dim = x.size(-1);
  const auto opts = at::TensorOptions(x.scalar_type());
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, opts) / dim);
  const auto angles = at::outer(at::arange(seq, opts), inv_freq);
  const auto both = at::cat({angles, angles}, -1);
  const auto x1 = x.narrow(-1, 0, dim / 2), x2 = x.narrow(-1, dim / 2, dim / 2);
  return x * both.cos() + at::cat({-x2, x1}, -1) * both.sin();
}

// Causal GQA attention for query heads [q_begin, q_begin + nq) reading KV heads from
// kv_begin (query head h reads KV head h / group). q: [b, s, nq*d]; k, v: [b, s, nkv*d].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Config& c, int64_t q_begin,
                     int64_t kv_begin) {
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

// The block on one rank. Sizes are global; each layer holds this rank's shard.
struct DecoderBlock {
  Config c;
  tp::QKVParallelLinear qkv{nullptr};
  tp::RowParallelLinear o_proj{nullptr};
  tp::GateUpParallelLinear gate_up{nullptr};
  tp::RowParallelLinear down_proj{nullptr};
  at::Tensor input_norm, post_attention_norm;  // [hidden], whole on every rank

  DecoderBlock(const Config& config, const tp::Communicator& comm) : c(config) {
    qkv = tp::QKVParallelLinear(tp::QKVParallelLinearOptions(c.hidden, c.head_dim, c.heads, c.kv_heads), comm);
    // O owns exactly this rank's query heads, even when heads split unevenly.
    o_proj = tp::RowParallelLinear(
        tp::RowParallelLinearOptions(c.heads * c.head_dim, c.hidden).bias(false).split(qkv->attention_output_split()),
        comm);
    gate_up = tp::GateUpParallelLinear(tp::GateUpParallelLinearOptions(c.hidden, c.intermediate), comm);
    down_proj = tp::RowParallelLinear(tp::RowParallelLinearOptions(c.intermediate, c.hidden).bias(false), comm);
  }

  void load(const tp::Checkpoint& ckpt) {
    qkv->load_weights(ckpt, kPrefix + "self_attn");  // q_proj, k_proj, v_proj: this rank's heads
    o_proj->load_weights(ckpt, kPrefix + "self_attn.o_proj");
    gate_up->load_weights(ckpt, kPrefix + "mlp");  // gate_proj, up_proj: this rank's rows
    down_proj->load_weights(ckpt, kPrefix + "mlp.down_proj");
    input_norm = ckpt.get(kPrefix + "input_layernorm.weight").read_all();
    post_attention_norm = ckpt.get(kPrefix + "post_attention_layernorm.weight").read_all();
  }

  // x: [batch, seq, hidden], the same on every rank -> the same output on every rank.
  at::Tensor forward(const at::Tensor& x) {
    auto [q, k, v] = qkv->split(qkv->forward(rms_norm(x, input_norm, c.eps)));
    const auto& plan = qkv->head_plan();
    const auto h = x + o_proj->forward(attention(q, k, v, c, plan.q_heads.begin, plan.kv_heads.begin));
    auto [gate, up] = gate_up->split(gate_up->forward(rms_norm(h, post_attention_norm, c.eps)));
    return h + down_proj->forward(at::silu(gate) * up);
  }
};

// The same block on one device, in float64, on the full weights.
at::Tensor reference(const Config& c, const std::map<std::string, at::Tensor>& w64, const at::Tensor& x) {
  auto W = [&](const std::string& name) { return w64.at(kPrefix + name); };
  const auto n1 = rms_norm(x, W("input_layernorm.weight"), c.eps);
  const auto a = attention(at::linear(n1, W("self_attn.q_proj.weight")), at::linear(n1, W("self_attn.k_proj.weight")),
                           at::linear(n1, W("self_attn.v_proj.weight")), c, 0, 0);
  const auto h = x + at::linear(a, W("self_attn.o_proj.weight"));
  const auto n2 = rms_norm(h, W("post_attention_layernorm.weight"), c.eps);
  const auto mlp = at::silu(at::linear(n2, W("mlp.gate_proj.weight"))) * at::linear(n2, W("mlp.up_proj.weight"));
  return h + at::linear(mlp, W("mlp.down_proj.weight"));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      TORCH_CHECK_VALUE(flag == "--dir" && i + 1 < argc, "usage: llama_block_example [--dir DIR]; got '", flag, "'");
      dir = argv[++i];
    }
    const Config c;
    const auto weights = make_weights(c);
    const std::string path = dir + "/tp_llama_block_example_" + std::to_string(::getpid()) + ".safetensors";
    tp::save_safetensors(path, weights, {{"format", "pt"}});

    std::map<std::string, at::Tensor> w64;
    for (const auto& [name, t] : weights) w64[name] = t.to(at::kDouble);
    const auto x = at::randn({c.batch, c.seq, c.hidden}, at::detail::createCPUGenerator(8));
    const auto want = reference(c, w64, x.to(at::kDouble));

    bool ok = true;
    for (const int64_t world : {1, 2, 3, 4}) {
      std::mutex mutex;
      double worst = 0.0;
      auto rank = [&](tp::Communicator& comm) {
        const auto ckpt = tp::open_checkpoint(path);  // mapped; each rank reads only its slices
        DecoderBlock block(c, comm);
        block.load(ckpt);
        const auto y = block.forward(x);
        const double rel = ((y.to(at::kDouble) - want).norm() / want.norm()).item<double>();
        std::lock_guard<std::mutex> lock(mutex);
        worst = std::max(worst, rel);
        if (comm.rank() == 0 && world == 3) std::cout << *block.qkv << "\n" << *block.o_proj << "\n";
      };
      if (world == 1) {
        tp::Communicator single;  // TP = 1: the same layers, a no-op communicator
        rank(single);
      } else {
        tp::run_ranks_in_threads(world, rank);
      }
      const bool pass = worst < 1e-5;
      ok = ok && pass;
      std::cout << "TP=" << world << ": ||block - one device|| / ||one device|| = " << worst
                << (pass ? "  ok" : "  FAILED (bound 1e-5)") << "\n";
    }
    std::remove(path.c_str());
    return ok ? 0 : 1;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
