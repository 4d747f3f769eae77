#include "model_bench.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "bench_checkpoint.h"
#include "tp/comm/launch.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/models/causal_lm.h"

namespace tp::bench {
namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A folder of the preset's family and shape: config.json and one model.safetensors of
// random float32 weights (linear N(0, 1/K), embeddings N(0, 1), norms 1 + N(0, 0.01); Gemma's
// norm offsets N(0, 0.01)), stored as the family stores them (Phi-3's fused qkv_proj and
// gate_up_proj, Gemma's four norms per layer and tied embeddings).
std::string write_folder(const ModelBenchConfig& c) {
  std::string dir = c.ckpt_dir;
  if (dir.empty()) {
    const char* home = std::getenv("HOME");
    dir = std::string(home && *home ? home : "/tmp") + "/.cache/tp/bench";
  }
  const auto& s = c.shape;
  const std::string& family = s.family;
  TORCH_CHECK_VALUE(family == "llama" || family == "mistral" || family == "phi3" || family == "gemma2",
                    "tp-bench --rows model: no folder writer for family ", family);
  TORCH_CHECK_VALUE(family != "phi3" || s.heads * s.head_dim == s.hidden,
                    "tp-bench --rows model: Phi-3 has head_dim = hidden / heads; got ", s.head_dim);
  std::ostringstream name;
  name << dir << "/model-" << s.name << "-" << family << "-h" << s.hidden << "-i" << s.intermediate << "-q" << s.heads
       << "-kv" << s.kv_heads << "-d" << s.head_dim << "-L" << c.layers << "-V" << c.vocab << "-s" << c.seed;
  const std::string folder = name.str();
  if (exists(folder + "/config.json") && exists(folder + "/model.safetensors")) return folder;
  TORCH_CHECK(std::system(("mkdir -p '" + folder + "'").c_str()) == 0, "tp-bench: cannot create ", folder);
  std::cerr << "  writing the model folder " << folder << "\n" << std::flush;
  auto gen = at::detail::createCPUGenerator(c.seed);
  auto randn = [&](std::vector<int64_t> shape) { return at::randn(shape, gen, at::kFloat); };
  const bool gemma = family == "gemma2", fused = family == "phi3";
  auto norm = [&] { return (gemma ? 0 : 1) + 0.1 * randn({s.hidden}); };
  std::map<std::string, at::Tensor> t;
  t["model.embed_tokens.weight"] = randn({c.vocab, s.hidden});
  if (!gemma) t["lm_head.weight"] = randn({c.vocab, s.hidden}) / std::sqrt(double(s.hidden));
  t["model.norm.weight"] = norm();
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    auto linear = [&](int64_t out, int64_t in) { return randn({out, in}) / std::sqrt(double(in)); };
    const auto q = linear(s.heads * s.head_dim, s.hidden), k = linear(s.kv_heads * s.head_dim, s.hidden),
               v = linear(s.kv_heads * s.head_dim, s.hidden);
    const auto gate = linear(s.intermediate, s.hidden), up = linear(s.intermediate, s.hidden);
    if (fused) {
      t[p + ".self_attn.qkv_proj.weight"] = at::cat({q, k, v}, 0);
      t[p + ".mlp.gate_up_proj.weight"] = at::cat({gate, up}, 0);
    } else {
      t[p + ".self_attn.q_proj.weight"] = q;
      t[p + ".self_attn.k_proj.weight"] = k;
      t[p + ".self_attn.v_proj.weight"] = v;
      t[p + ".mlp.gate_proj.weight"] = gate;
      t[p + ".mlp.up_proj.weight"] = up;
    }
    t[p + ".self_attn.o_proj.weight"] = linear(s.hidden, s.heads * s.head_dim);
    t[p + ".mlp.down_proj.weight"] = linear(s.hidden, s.intermediate);
    t[p + ".input_layernorm.weight"] = norm();
    t[p + ".post_attention_layernorm.weight"] = norm();
    if (gemma) {
      t[p + ".pre_feedforward_layernorm.weight"] = norm();
      t[p + ".post_feedforward_layernorm.weight"] = norm();
    }
  }
  save_safetensors(folder + "/model.safetensors", t, {{"format", "pt"}});
  std::ofstream config(folder + "/config.json");
  config << "{\"model_type\": \"" << family << "\", \"hidden_size\": " << s.hidden
         << ", \"intermediate_size\": " << s.intermediate << ", \"num_hidden_layers\": " << c.layers
         << ", \"num_attention_heads\": " << s.heads << ", \"num_key_value_heads\": " << s.kv_heads
         << (fused ? "" : ", \"head_dim\": " + std::to_string(s.head_dim)) << ", \"vocab_size\": " << c.vocab
         << ", \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-05, \"torch_dtype\": \"float32\"";
  if (family == "llama")
    config << ", \"rope_theta\": 500000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false";
  if (family == "mistral")  // Mistral-7B-v0.1's window
    config << ", \"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"sliding_window\": 4096";
  if (family == "phi3")  // Phi-3-mini-4k
    config << ", \"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"sliding_window\": 2047";
  if (family == "gemma2") {  // Gemma-2-9B
    config << ", \"rope_theta\": 10000.0, \"hidden_activation\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": "
           << s.head_dim
           << ", \"attn_logit_softcapping\": 50.0, \"final_logit_softcapping\": 30.0, \"sliding_window\": 4096, "
              "\"tie_word_embeddings\": true";
  }
  config << "}\n";
  return folder;
}

struct Row {
  std::string dtype;
  int64_t tp = 1;
  double prefill_s = 0, decode_s = 0, rel_err = 0;
  double decode_unfused_s = 0;  // the same decode steps with DecoderLayer::fuse_boundary off
  double decode_saved_s = 0;    // median over steps of (unfused - fused), slowest rank
  bool tokens_equal = true, unfused_equal = true;
  at::Tensor logits, tokens;  // rank 0's (TP=1: the reference)
};

Row run_one(const std::string& folder, const ModelBenchConfig& c, c10::ScalarType dtype, int64_t world) {
  Row row;
  row.tp = world;
  std::mutex mutex;
  std::vector<double> prefill(world), decode(world), unfused(world), saved(world);
  std::vector<char> unfused_equal(world, 1);
  const int total_threads = at::get_num_threads();
  const int per_rank = std::max<int>(1, total_threads / static_cast<int>(world));
  const auto prompt = at::randint(0, c.vocab, {1, c.prefill}, at::detail::createCPUGenerator(c.seed + 1), at::kLong);
  run_ranks_in_threads(world, [&](Communicator& comm) {
    at::set_num_threads(per_rank);
    const auto model = CausalLMImpl::from_pretrained(folder, CausalLMOptions().dtype(dtype), comm);
    at::NoGradGuard no_grad;
    std::vector<double> p_times, d_times, u_times, s_times;
    at::Tensor logits, tokens;
    bool same_tokens = true;
    const auto fuse = [&](bool on) {
      for (auto& layer : model->layers) layer->fuse_boundary = on;
    };
    const int rounds = std::max(1, c.timing.rounds);
    for (int round = -std::max(0, c.timing.warmup); round < rounds; ++round) {
      auto cache = model->make_cache(1, c.prefill + c.decode_steps);
      auto t0 = std::chrono::steady_clock::now();
      auto local = model->forward(prompt, &cache, /*logits_to_keep=*/1);
      const double p = seconds_since(t0);
      std::vector<at::Tensor> out{model->lm_head->argmax(local)};
      if (round >= 0) p_times.push_back(p);
      if (round == rounds - 1) logits = model->gather_logits(local).to(at::kDouble);
      // A second cache, prefilled with the boundary unfused (untimed): each decode step then
      // runs fused and unfused side by side on the same token, so both see the same machine.
      fuse(false);
      auto cache_u = model->make_cache(1, c.prefill + c.decode_steps);
      (void)model->forward(prompt, &cache_u, 1);
      for (int64_t step = 0; step + 1 < c.decode_steps; ++step) {
        fuse(true);
        comm.barrier();
        t0 = std::chrono::steady_clock::now();
        local = model->forward(out.back(), &cache, 1);
        const double fused_s = seconds_since(t0);
        const at::Tensor next = model->lm_head->argmax(local);
        fuse(false);
        comm.barrier();
        t0 = std::chrono::steady_clock::now();
        const at::Tensor local_u = model->forward(out.back(), &cache_u, 1);
        const double unfused_s = seconds_since(t0);
        same_tokens = same_tokens && at::equal(model->lm_head->argmax(local_u), next);
        out.push_back(next);
        if (round >= 0) {
          d_times.push_back(fused_s);
          u_times.push_back(unfused_s);
          s_times.push_back(unfused_s - fused_s);
        }
      }
      fuse(true);
      if (round == rounds - 1) tokens = at::cat(out, 1);
    }
    std::lock_guard<std::mutex> lock(mutex);
    prefill[comm.rank()] = median(p_times);
    decode[comm.rank()] = median(d_times);
    unfused[comm.rank()] = median(u_times);
    saved[comm.rank()] = median(s_times);
    unfused_equal[comm.rank()] = same_tokens;
    if (comm.rank() == 0) row.logits = logits, row.tokens = tokens;
  });
  at::set_num_threads(total_threads);
  row.prefill_s = *std::max_element(prefill.begin(), prefill.end());
  row.decode_s = *std::max_element(decode.begin(), decode.end());
  row.decode_unfused_s = *std::max_element(unfused.begin(), unfused.end());
  row.decode_saved_s = *std::min_element(saved.begin(), saved.end());
  row.unfused_equal = std::all_of(unfused_equal.begin(), unfused_equal.end(), [](char e) { return e != 0; });
  return row;
}

double bound(c10::ScalarType dtype) {
  if (dtype == c10::kDouble) return 1e-12;
  if (dtype == c10::kFloat) return 1e-4;
  return 5e-2;  // bfloat16 / float16
}

}  // namespace

int run_model_rows(const ModelBenchConfig& c) {
  const auto& s = c.shape;
  std::cout << "tp-bench --rows model: a tp::CausalLM (" << s.family << ") of shape '" << s.name << "' with "
            << c.layers << " decoder layers and vocab " << c.vocab << ", from a Hugging Face folder of random weights\n"
            << "  machine: " << machine_description() << "; " << at::get_num_threads()
            << " intra-op threads (each of N ranks gets 1/N of them); ranks are threads of this process\n"
            << "  load average (1, 5, 15 min) at the start: " << load_average() << "\n"
            << "  prefill: one forward of " << c.prefill << " tokens into a fresh KV cache (logits of the last only);"
            << " decode: one token (M = 1) after them with the cache\n"
            << "  times: medians over " << c.timing.rounds << " rounds after " << c.timing.warmup
            << " warm-ups (decode: " << c.decode_steps - 1 << " greedy steps per round), slowest rank; tok/s ="
            << " tokens / time; x TP1 = tok/s over TP=1's\n"
            << "  rel_err = max |logits - TP=1 logits| / max |TP=1 logits| of the prefill's last position; tokens ="
            << " the greedy tokens equal TP=1's; '!' marks an error above the dtype's bound\n"
            << "  unfused ms = the same decode steps with each layer's boundary unfused (DecoderLayer::fuse_boundary"
            << " off: all-reduce, then bias, residual and norm as tensor operations), step by step beside the fused"
            << " one on its own cache; saved us = median over steps of (unfused - fused), the rank that saved least;"
            << " same = the unfused steps chose the fused steps' tokens\n"
            << std::flush;
  const std::string folder = write_folder(c);
  bool suspicious = false;
  std::ostringstream table;
  table << "\nrow    dtype     TP  prefill ms  prefill tok/s  x TP1  decode ms  decode tok/s  x TP1  rel_err    tokens"
           "  unfused ms  saved us  same\n";
  for (const auto dtype : c.dtypes) {
    std::vector<Row> rows;
    for (const auto tp : c.tp_sizes) {
      std::cerr << "  " << dtype_name(dtype) << " TP=" << tp << "\n" << std::flush;
      rows.push_back(run_one(folder, c, dtype, tp));
    }
    const auto ref = std::find_if(rows.begin(), rows.end(), [](const Row& r) { return r.tp == 1; });
    for (auto& r : rows) {
      if (ref != rows.end()) {
        r.rel_err = ((r.logits - ref->logits).abs().max() / ref->logits.abs().max()).item<double>();
        r.tokens_equal = at::equal(r.tokens, ref->tokens);
      }
      const bool bad = !(r.rel_err <= bound(dtype));
      suspicious = suspicious || bad;
      const double p_tps = c.prefill / r.prefill_s, d_tps = 1.0 / r.decode_s;
      const double p_x = ref != rows.end() ? ref->prefill_s / r.prefill_s : NAN;
      const double d_x = ref != rows.end() ? ref->decode_s / r.decode_s : NAN;
      suspicious = suspicious || !r.unfused_equal;
      table << format(
          "model  %-8s  %2lld  %10.2f  %13.1f  %5.2f  %9.3f  %12.1f  %5.2f  %.2e%s  %-6s  %10.3f  %8.1f  %s\n",
          dtype_name(dtype).c_str(), static_cast<long long>(r.tp), r.prefill_s * 1e3, p_tps, p_x, r.decode_s * 1e3,
          d_tps, d_x, r.rel_err, bad ? "!" : " ", ref == rows.end() ? "-" : (r.tokens_equal ? "equal" : "differ"),
          r.decode_unfused_s * 1e3, r.decode_saved_s * 1e6, r.unfused_equal ? "yes" : "no!");
    }
  }
  std::cout << table.str() << "load average (1, 5, 15 min) at the end: " << load_average() << "\n";
  if (suspicious) std::cerr << "tp-bench --rows model: a logit error is above its dtype's bound\n";
  return suspicious ? 1 : 0;
}

}  // namespace tp::bench
