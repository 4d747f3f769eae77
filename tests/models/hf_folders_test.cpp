// Hugging Face folders written by other people's code (tests/python/hf_fixtures.py:
// transformers' save_pretrained, compressed-tensors' own quantization API, GPTQ / AWQ
// packers written from the published definitions), read by ModelConfig, and every
// projection of every layer built from decoder_layer_options and loaded from the
// folder at TP 1-4 (ranks as threads), against:
// - float folders (float64): transformers' own modules' outputs, within 1e-12;
// - quantized folders: x @ W^T + b with W as the producer dequantizes it, the layers
//   in float64. Per format, elementwise |y - y_ref| <= bound, with A = |x| @ |W|^T:
//     INT4 (pack-quantized, GPTQ v1 / v2, AWQ): 1e-12 max(1, |y_ref|max), the
//       float64 layers dequantize to the producer's very float32 weights;
//     FP8 (per channel, 128x128 block; dynamic activations): 2^-4 A (E4M3's half
//       step, relative) + 2^-15 amax(x row) rowsum|W| (its subnormals) + (K + 2) 2^-23 A
//       (float32 GEMM) + 2^-22 |b|;
//     INT8 W8A8 (dynamic per-token activations): amax(x row) / 254 rowsum|W| (half a
//       step of amax / 127) + 2^-21 (A + that) + 2^-22 |b|.
//   Row-parallel layers quantize their local slice of x, whose amax is <= the row's,
//   so the same bounds hold.
// A projection the heads cannot split at a world size (Qwen3's 2 KV heads over 3
// ranks) must fail with a clear error, and only those may.
//
// The folders come from the CTest fixture "models: Hugging Face folders", which runs
// tests/python/hf_fixtures.py into TP_HF_FIXTURE_DIR (tests/CMakeLists.txt).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "common/json_value.h"
#include "support/hf_fixtures.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/layer_options.h"
#include "tp/models/model_config.h"

using namespace tp;
using tp::detail::JsonValue;
using tp::test::fixture_dir;

namespace {

const JsonValue& manifest() {
  static const JsonValue m = [] {
    const std::string path = fixture_dir() + "/manifest.json";
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("no " + path +
                               ": run `ctest -R hf_fixtures` (the fixture) or `.venv/bin/python "
                               "tests/python/hf_fixtures.py " +
                               fixture_dir() + "` first");
    std::stringstream text;
    text << in.rdbuf();
    return JsonValue::parse(text.str(), path.c_str());
  }();
  return m;
}

std::vector<std::string> fixture_names() { return manifest().keys("manifest"); }

const JsonValue& entry(const std::string& name) { return *manifest().find(name); }

std::string format_of(const std::string& name) { return entry(name).find("format")->as_string("format"); }

enum class Bound { kExact, kFp8, kInt8 };

Bound bound_kind(const std::string& format) {
  if (format == "ct_fp8_channel" || format == "ct_fp8_block" || format == "hf_fp8") return Bound::kFp8;
  if (format == "ct_w8a8") return Bound::kInt8;
  return Bound::kExact;
}

// The reference tensors of one fixture (hf_fixtures.py's NAME.reference.safetensors).
class Reference {
 public:
  explicit Reference(const std::string& name)
      : ckpt_(open_checkpoint(fixture_dir() + "/" + name + ".reference.safetensors")), format_(format_of(name)) {}
  at::Tensor get(const std::string& key) const { return ckpt_.get(key).read_all(); }
  bool has(const std::string& key) const { return ckpt_.contains(key); }
  // The input each projection reads: q/k/v/gate/up the hidden state, o the attention
  // output, down the MLP activation.
  static std::string input_of(const std::string& module) {
    if (module.size() > 6 && module.compare(module.size() - 6, 6, "o_proj") == 0) return "x.attn";
    if (module.size() > 9 && module.compare(module.size() - 9, 9, "down_proj") == 0) return "x.inter";
    return "x.hidden";
  }
  // y_ref [T, N] and the elementwise bound [T, N] of one module.
  std::pair<at::Tensor, at::Tensor> expected(const std::string& module) const {
    const auto x = get(input_of(module));
    const auto w = get("w." + module);
    const auto b = has("b." + module) ? get("b." + module) : at::zeros({w.size(0)}, at::kDouble);
    at::Tensor y = has("y." + module) ? get("y." + module) : at::matmul(x, w.t()) + b;
    const double k = static_cast<double>(w.size(1));
    const auto a = at::matmul(x.abs(), w.abs().t());
    const auto amax = x.abs().amax(1, true);          // [T, 1]
    const auto rowsum = w.abs().sum(1).unsqueeze(0);  // [1, N]
    at::Tensor bound;
    switch (bound_kind(format_)) {
      case Bound::kExact: bound = at::full_like(y, 1e-12 * std::max(1.0, y.abs().max().item<double>())); break;
      case Bound::kFp8:
        bound = std::ldexp(1.0, -4) * a + std::ldexp(1.0, -15) * amax * rowsum + (k + 2) * std::ldexp(1.0, -23) * a +
                std::ldexp(1.0, -22) * b.abs().unsqueeze(0);
        break;
      case Bound::kInt8: {
        const auto act = amax / 254 * rowsum;
        bound = act + std::ldexp(1.0, -21) * (a + act) + std::ldexp(1.0, -22) * b.abs().unsqueeze(0);
        break;
      }
    }
    return {y, bound};
  }

 private:
  Checkpoint ckpt_;
  std::string format_;
};

// What one rank saw for one projection: its worst error relative to the bound (<= 1
// passes), the worst absolute error, or the construction / load error.
struct Outcome {
  bool ran = false;
  double ratio = 0, abs_err = 0;
  std::string error;
};

void record(Outcome& o, const at::Tensor& got, const at::Tensor& ref, const at::Tensor& bound) {
  if (got.sizes() != ref.sizes()) {
    o.error = "shape " + c10::str(got.sizes()) + " != reference " + c10::str(ref.sizes());
    return;
  }
  const auto err = (got.to(at::kDouble) - ref).abs();
  o.ran = true;
  o.abs_err = std::max(o.abs_err, err.numel() ? err.max().item<double>() : 0.0);
  o.ratio = std::max(o.ratio, err.numel() ? (err / bound).max().item<double>() : 0.0);
}

// Whether the heads cannot split `projection` of fixture `name` at `world`.
bool infeasible(const std::string& name, const std::string& projection, int64_t world) {
  const auto& e = entry(name);
  const bool attention = projection == "qkv" || projection == "o";
  const int64_t kv = e.find("config")->find("num_key_value_heads")->as_int("kv");
  return attention && world > kv && world % kv != 0;  // Qwen3's 2 KV heads over 3 ranks
}

using Outcomes = std::map<std::string, Outcome>;  // "<layer>.<projection>" -> outcome

// Every projection of every layer of fixture `name` on this rank.
Outcomes run_rank(const std::string& name, Communicator& comm) {
  const std::string folder = fixture_dir() + "/" + name;
  const auto config = ModelConfig::from_pretrained(folder);
  const auto ckpt = open_checkpoint(folder);
  const Reference ref(name);
  const auto x_hidden = ref.get("x.hidden"), x_attn = ref.get("x.attn"), x_inter = ref.get("x.inter");
  Outcomes out;
  const auto attempt = [&](const std::string& key, const std::function<void(Outcome&)>& fn) {
    Outcome& o = out[key];
    try {
      fn(o);
    } catch (const c10::Error& e) {
      o.ran = false;
      o.error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      o.ran = false;
      o.error = e.what();
    }
  };
  const int64_t d = config.head_dim;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const auto opts = decoder_layer_options(config, layer, at::kDouble);
    const std::string p = opts.qkv_prefix, l = std::to_string(layer) + ".";
    std::optional<QKVParallelLinear> qkv;
    attempt(l + "qkv", [&](Outcome& o) {
      qkv.emplace(opts.qkv, comm);
      (*qkv)->load_weights(ckpt, opts.qkv_prefix);
      const auto [q, k, v] = (*qkv)->split((*qkv)->forward(x_hidden));
      const auto& plan = (*qkv)->head_plan();
      const auto check = [&](const at::Tensor& got, const std::string& module, Range heads) {
        auto [y, bound] = ref.expected(p + "." + module);
        record(o, got, y.narrow(1, heads.begin * d, heads.size() * d),
               bound.narrow(1, heads.begin * d, heads.size() * d));
      };
      check(q, "q_proj", plan.q_heads);
      check(k, "k_proj", plan.kv_heads);
      check(v, "v_proj", plan.kv_heads);
    });
    attempt(l + "o", [&](Outcome& o) {
      TORCH_CHECK(qkv.has_value() && out[l + "qkv"].ran,
                  "o_proj needs the QKV layer, which failed: ", out[l + "qkv"].error);
      RowParallelLinear proj(opts.o_proj(**qkv), comm);
      proj->load_weights(ckpt, opts.o_prefix);
      const auto r = proj->local_range();
      const auto [y, bound] = ref.expected(opts.o_prefix);
      record(o, proj->forward(x_attn.narrow(1, r.begin, r.size())), y, bound);
    });
    attempt(l + "gate_up", [&](Outcome& o) {
      GateUpParallelLinear proj(opts.gate_up, comm);
      proj->load_weights(ckpt, opts.gate_up_prefix);
      const auto [gate, up] = proj->split(proj->forward(x_hidden));
      const auto r = proj->local_range();
      for (const auto& [got, module] : {std::pair{gate, "gate_proj"}, std::pair{up, "up_proj"}}) {
        auto [y, bound] = ref.expected(opts.gate_up_prefix + "." + module);
        record(o, got, y.narrow(1, r.begin, r.size()), bound.narrow(1, r.begin, r.size()));
      }
    });
    attempt(l + "down", [&](Outcome& o) {
      RowParallelLinear proj(opts.down, comm);
      proj->load_weights(ckpt, opts.down_prefix);
      const auto r = proj->local_range();
      const auto [y, bound] = ref.expected(opts.down_prefix);
      record(o, proj->forward(x_inter.narrow(1, r.begin, r.size())), y, bound);
    });
  }
  return out;
}

}  // namespace

TEST_CASE("ModelConfig reads every folder transformers and the quantizers wrote", "[models][hf]") {
  for (const auto& name : fixture_names()) {
    INFO("fixture " << name);
    const auto& e = entry(name);
    const auto c = ModelConfig::from_pretrained(fixture_dir() + "/" + name);
    const auto& want = *e.find("config");
    const auto i = [&](const char* key) { return want.find(key)->as_int(key); };
    const auto f = [&](const char* key) { return want.find(key)->as_double(key); };
    const auto b = [&](const char* key) { return want.find(key)->as_bool(key); };
    CHECK(to_string(c.model_type) == want.find("model_type")->as_string(""));
    CHECK(c.hidden_size == i("hidden_size"));
    CHECK(c.intermediate_size == i("intermediate_size"));
    CHECK(c.num_hidden_layers == i("num_hidden_layers"));
    CHECK(c.num_attention_heads == i("num_attention_heads"));
    CHECK(c.num_key_value_heads == i("num_key_value_heads"));
    CHECK(c.head_dim == i("head_dim"));
    CHECK(c.vocab_size == i("vocab_size"));
    CHECK(c.qkv_bias == b("qkv_bias"));
    CHECK(c.o_bias == b("o_bias"));
    CHECK(c.mlp_bias == b("mlp_bias"));
    CHECK(c.tie_word_embeddings == b("tie_word_embeddings"));
    CHECK(c.norm_eps == f("rms_norm_eps"));
    CHECK(to_string(c.rope.type) == want.find("rope_type")->as_string(""));
    CHECK(c.rope.theta == f("rope_theta"));
    if (c.rope.type == RopeType::kLlama3) {
      CHECK(c.rope.factor == f("rope_factor"));
      CHECK(c.rope.low_freq_factor == f("rope_low_freq_factor"));
      CHECK(c.rope.high_freq_factor == f("rope_high_freq_factor"));
      CHECK(c.rope.original_max_position_embeddings == i("rope_original_max_position_embeddings"));
    }
    CHECK(std::string(c10::toString(c.dtype)) ==
          std::string(c10::toString(want.find("dtype")->as_string("") == "float64" ? at::kDouble : at::kFloat)));
    const auto& quant = *e.find("quant");
    const auto& modules = quant.keys("quant");
    for (size_t m = 0; m < modules.size(); ++m) {
      INFO("module " << modules[m]);
      CHECK(to_string(c.quant_config(modules[m])) == quant.values("quant")[m].as_string(""));
    }
  }
}

TEST_CASE("every projection of every Hugging Face folder loads and matches its producer at TP 1-4",
          "[models][hf][layers]") {
  std::ostringstream table;
  table << "\nfixture          TP  qkv        o          gate_up    down       (max |y - y_ref|; '-' cannot split)\n";
  for (const auto& name : fixture_names()) {
    for (int64_t world = 1; world <= 4; ++world) {
      std::vector<Outcomes> ranks(world);
      run_ranks_in_threads(
          world, [&](Communicator& comm) { ranks[comm.rank()] = run_rank(name, comm); }, test::test_comm_options());
      std::map<std::string, double> worst;
      for (int64_t r = 0; r < world; ++r) {
        for (const auto& [key, o] : ranks[r]) {
          const std::string projection = key.substr(key.find('.') + 1);
          INFO("fixture " << name << " (" << format_of(name) << ") TP " << world << " rank " << r << " layer "
                          << key.substr(0, key.find('.')) << " " << projection);
          if (infeasible(name, projection, world)) {
            INFO("expected a clear error: " << (o.ran ? "(it ran)" : o.error));
            CHECK_FALSE(o.ran);
            // Either the split's own message or, for O, that its QKV layer failed.
            CHECK((o.error.find("multiple of") != std::string::npos || o.error.find("KV heads") != std::string::npos ||
                   o.error.find("kv_heads") != std::string::npos ||
                   o.error.find("o_proj needs the QKV layer") != std::string::npos));
            worst.emplace(projection, -1.0);
            continue;
          }
          INFO("error: " << o.error);
          REQUIRE(o.ran);
          INFO("max |err| " << o.abs_err << ", max err/bound " << o.ratio);
          CHECK(o.ratio <= 1.0);
          worst[projection] = std::max(worst.count(projection) ? worst[projection] : 0.0, o.abs_err);
        }
      }
      table << std::left << std::setw(16) << name << " " << world << "   ";
      for (const char* projection : {"qkv", "o", "gate_up", "down"}) {
        std::ostringstream cell;
        if (worst[projection] < 0)
          cell << "-";
        else
          cell << std::setprecision(2) << std::scientific << worst[projection];
        table << std::setw(11) << cell.str();
      }
      table << "\n";
    }
  }
  std::cout << table.str();
}
