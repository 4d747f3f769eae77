// Loading a model without drawing it first (issue 46), at TP 1-4 (ranks as threads):
// - from_pretrained builds every layer with init_weights(false) and its parameters are
//   exactly the checkpoint's: every tensor whole (gather_weights), the padded vocabulary
//   rows zeros, each replica of a replicated KV head the checkpoint's rows;
// - LoadSession::expect_filled names a parameter that no load wrote, on every rank;
// - the default (init_weights(true)) draws the distributions it always did;
// - a config.json whose sizes are not its tensors' is refused on every rank before a
//   weight is allocated: within a bounded time and peak memory.
// The folders are written here from a randomly drawn tp::CausalLM (no Python needed).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/loading/load_session.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/models/causal_lm.h"
#include "tp/quant/quantize.h"

using namespace tp;
using Catch::Contains;

namespace {

// A small Llama: 6 query heads over 1 KV head (replicated at every TP > 1), an odd
// vocabulary (padded rows at pad_vocab_to_multiple_of 8), an untied head.
std::string llama_config(const std::string& replace = "") {
  std::map<std::string, std::string> fields = {
      {"model_type", "\"llama\""},    {"hidden_size", "96"},        {"intermediate_size", "80"},
      {"num_hidden_layers", "2"},     {"num_attention_heads", "6"}, {"num_key_value_heads", "1"},
      {"vocab_size", "1001"},         {"rms_norm_eps", "1e-05"},    {"max_position_embeddings", "128"},
      {"hidden_act", "\"silu\""},     {"rope_theta", "10000.0"},    {"tie_word_embeddings", "false"},
      {"torch_dtype", "\"float32\""}, {"attention_bias", "false"}};
  // `replace`: "key=value;key=value".
  size_t at = 0;
  while (at < replace.size()) {
    const size_t end = replace.find(';', at) == std::string::npos ? replace.size() : replace.find(';', at);
    const std::string item = replace.substr(at, end - at);
    const size_t eq = item.find('=');
    fields[item.substr(0, eq)] = item.substr(eq + 1);
    at = end + 1;
  }
  std::string out = "{";
  for (const auto& [k, v] : fields) out += (out.size() > 1 ? ", \"" : "\"") + k + "\": " + v;
  return out + "}";
}

std::string temp_folder(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/tp-loading-test-" + name;
  REQUIRE(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()) == 0);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

// A folder holding `config_json` and the tensors of a CausalLM drawn from it (seed 46).
std::map<std::string, at::Tensor> write_folder(const std::string& dir, const std::string& config_json) {
  at::manual_seed(46);
  CausalLM model(ModelConfig::from_json(config_json, dir + "/config.json"), CausalLMOptions().dtype(at::kFloat));
  const auto tensors = model->gather_weights();
  save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_text(dir + "/config.json", config_json);
  return tensors;
}

// The same for a config with a quantization_config: the model drawn unquantized, and each
// linear layer its format covers stored as that format's tensors (tp::quantize_weight).
std::map<std::string, at::Tensor> write_quantized_folder(const std::string& dir, const std::string& config_json) {
  at::manual_seed(46);
  const ModelConfig config = ModelConfig::from_json(config_json, dir + "/config.json");
  ModelConfig plain = config;
  plain.quantization = {};
  CausalLM model(plain, CausalLMOptions().dtype(at::kFloat));
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, tensor] : model->gather_weights()) {
    const std::string suffix = ".weight";
    const std::string module = name.substr(0, name.size() - suffix.size());
    const bool linear = name.rfind("model.layers.", 0) == 0 && tensor.dim() == 2 &&
                        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const QuantConfig quant = linear ? config.quant_config(module) : QuantConfig{};
    if (quant.format == QuantFormat::kNone) {
      tensors[name] = tensor;
      continue;
    }
    for (const auto& [stored, value] : quantize_weight(tensor, quant)) tensors[module + "." + stored] = value;
  }
  save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_text(dir + "/config.json", config_json);
  return tensors;
}

// Each rank's error from CausalLMImpl::from_pretrained(dir) at `world` (empty: it loaded).
std::vector<std::string> from_pretrained_errors(const std::string& dir, int64_t world) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        try {
          CausalLMImpl::from_pretrained(dir, {}, comm);
        } catch (const c10::Error& e) {
          errors[static_cast<size_t>(comm.rank())] = e.what_without_backtrace();
        }
      },
      test::test_comm_options());
  return errors;
}

// This process's peak resident memory (VmHWM), reset to the current RSS by writing 5 to
// /proc/self/clear_refs (Linux >= 4.0); -1 where that cannot be done.
int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

}  // namespace

TEST_CASE("from_pretrained fills every parameter with exactly the checkpoint's values at TP 1-4", "[models][loading]") {
  const std::string dir = temp_folder("exact");
  const auto want = write_folder(dir, llama_config());
  for (int64_t world = 1; world <= 4; ++world) {
    struct Seen {
      std::string error;
      std::map<std::string, at::Tensor> gathered;
      bool padding_zero = false, kv_rows_equal = false, init_off = false;
    };
    std::vector<Seen> seen(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          auto& out = seen[comm.rank()];
          try {
            const auto model = CausalLMImpl::from_pretrained(dir, CausalLMOptions().pad_vocab_to_multiple_of(8), comm);
            out.init_off = !model->options.init_weights();
            out.gathered = model->gather_weights();
            // The padded rows of both vocabulary tables: zeros, not whatever the allocator gave.
            bool zero = true;
            for (const auto& [w, local, real] :
                 {std::tuple{model->embed_tokens->weight, model->embed_tokens->local_range(),
                             model->embed_tokens->vocab_range()},
                  std::tuple{model->lm_head->weight, model->lm_head->local_range(), model->lm_head->vocab_range()}}) {
              const int64_t pad = local.size() - real.size();
              if (pad > 0) zero = zero && w.narrow(0, real.size(), pad).eq(0).all().item<bool>();
            }
            out.padding_zero = zero;
            // Every replica of the KV head holds the checkpoint's k and v rows.
            bool kv = true;
            for (int64_t i = 0; i < 2; ++i) {
              const auto& qkv = model->layers[i]->qkv;
              const auto& plan = qkv->head_plan();
              const int64_t d = plan.head_dim, q = plan.q_heads.size() * d, k = plan.kv_heads.size() * d;
              const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
              kv = kv && at::equal(qkv->weight.narrow(0, q, k),
                                   want.at(p + "k_proj.weight").narrow(0, plan.kv_heads.begin * d, k));
              kv = kv && at::equal(qkv->weight.narrow(0, q + k, k),
                                   want.at(p + "v_proj.weight").narrow(0, plan.kv_heads.begin * d, k));
            }
            out.kv_rows_equal = kv;
          } catch (const c10::Error& e) {
            out.error = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("TP " << world << " rank " << r << ": " << seen[r].error);
      REQUIRE(seen[r].error.empty());
      CHECK(seen[r].init_off);
      CHECK(seen[r].padding_zero);
      CHECK(seen[r].kv_rows_equal);
      REQUIRE(seen[r].gathered.size() == want.size());
      for (const auto& [name, tensor] : want) {
        INFO(name);
        REQUIRE(seen[r].gathered.count(name) == 1);
        CHECK(at::equal(seen[r].gathered.at(name), tensor));
      }
    }
  }
}

TEST_CASE("LoadSession::expect_filled names every parameter no load wrote, on every rank, at TP 1-4",
          "[models][loading][errors]") {
  const std::string dir = temp_folder("unfilled");
  write_folder(dir, llama_config());
  const Checkpoint checkpoint = open_checkpoint(dir);
  const auto config = ModelConfig::from_pretrained(dir);
  for (int64_t world = 1; world <= 4; ++world) {
    std::vector<std::string> errors(world), unfilled(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          try {
            CausalLM model(config, CausalLMOptions().init_weights(false), comm);
            LoadSession session(checkpoint, comm, LoadSessionOptions().allow_unread({"model.norm.weight"}));
            session.expect_filled(*model);
            // Everything but the final norm: its weight stays as the allocator left it.
            model->embed_tokens->load_weights(session.checkpoint(), "model.embed_tokens");
            for (auto& layer : model->layers) layer->load_weights(session.checkpoint());
            model->lm_head->load_weights(session.checkpoint(), "lm_head");
            const auto left = session.unfilled();
            for (const auto& name : left) unfilled[comm.rank()] += name + " ";
            session.finish();
          } catch (const c10::Error& e) {
            errors[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("TP " << world << " rank " << r << ": " << errors[r]);
      CHECK(unfilled[r] == "norm.weight ");
      CHECK_THAT(errors[r], Contains("'norm.weight'") && Contains("filled by no load") && Contains("init_weights"));
    }
  }
  // Loaded whole: nothing to report.
  CausalLM model(config, CausalLMOptions().init_weights(false));
  LoadSession session(checkpoint);
  session.expect_filled(*model);
  model->load_weights(session.checkpoint());
  CHECK(session.unfilled().empty());
  CHECK_NOTHROW(session.finish());
}

TEST_CASE("A module's own parameter that no load writes is named by expect_filled", "[models][loading][errors]") {
  struct Block : torch::nn::Module {
    Block() {
      fc = register_module("fc", ColumnParallelLinear(ColumnParallelLinearOptions(16, 8).init_weights(false)));
      scale = register_parameter("scale", at::empty({8}));
    }
    ColumnParallelLinear fc{nullptr};
    at::Tensor scale;
  };
  Block block;
  Checkpoint checkpoint;
  checkpoint.add("fc.weight", at::randn({8, 16}));
  checkpoint.add("fc.bias", at::randn({8}));
  LoadSession session(checkpoint);
  session.expect_filled(block);
  block.fc->load_weights(session.checkpoint(), "fc");
  CHECK(session.unfilled() == std::vector<std::string>{"scale"});
  CHECK_THROWS_WITH(session.finish(), Contains("1 of the module's 3 parameters and buffers were filled by no load: "
                                               "'scale'"));
  {
    at::NoGradGuard no_grad;
    block.scale.fill_(1.0);
  }
  CHECK(session.unfilled().empty());
  CHECK_NOTHROW(session.finish());
}

TEST_CASE("init_weights(true), the default, draws the distributions it always did", "[models][loading]") {
  at::manual_seed(7);
  const int64_t in = 1024, out = 2048;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  // Each statistic within 5 standard errors of its distribution's value: the sample mean's
  // is sigma / sqrt(n); the sample std's sigma * sqrt(0.2 / n) for a uniform draw (its
  // kurtosis 1.8) and sigma / sqrt(2 n) for a normal one.
  auto uniform_ok = [&](const at::Tensor& t, double b) {
    const auto d = t.to(at::kDouble);
    const double n = static_cast<double>(d.numel()), sigma = b / std::sqrt(3.0);
    INFO("n " << n << " min " << d.min().item<double>() << " max " << d.max().item<double>() << " mean "
              << d.mean().item<double>() << " std " << d.std().item<double>() << " bound " << b);
    CHECK(d.min().item<double>() >= -b);
    CHECK(d.max().item<double>() <= b);
    CHECK(d.min().item<double>() < -0.99 * b);  // the whole range is drawn
    CHECK(d.max().item<double>() > 0.99 * b);
    CHECK(std::abs(d.mean().item<double>()) < 5 * sigma / std::sqrt(n));
    CHECK(std::abs(d.std().item<double>() - sigma) < 5 * sigma * std::sqrt(0.2 / n));
  };
  auto normal_ok = [&](const at::Tensor& t, double sigma) {
    const auto d = t.to(at::kDouble);
    const double n = static_cast<double>(d.numel());
    INFO("n " << n << " mean " << d.mean().item<double>() << " std " << d.std().item<double>() << " sigma " << sigma);
    CHECK(std::abs(d.mean().item<double>()) < 5 * sigma / std::sqrt(n));
    CHECK(std::abs(d.std().item<double>() - sigma) < 5 * sigma / std::sqrt(2 * n));
  };
  ColumnParallelLinear column(ColumnParallelLinearOptions(in, out));
  uniform_ok(column->weight, bound);
  uniform_ok(column->bias, bound);
  RowParallelLinear row(RowParallelLinearOptions(in, out));
  uniform_ok(row->weight, bound);
  VocabParallelEmbedding embedding(VocabParallelEmbeddingOptions(4001, 256).pad_to_multiple_of(8));
  normal_ok(embedding->weight.narrow(0, 0, 4001), 1.0);
  CHECK(embedding->weight.narrow(0, 4001, 7).eq(0).all().item<bool>());
  ParallelLMHead head(ParallelLMHeadOptions(256, 4001));
  normal_ok(head->weight, 1.0 / 16.0);
  Norm norm(NormOptions(64));
  CHECK(norm->weight.eq(1).all().item<bool>());
  MoEParallelMLP moe(MoEParallelMLPOptions(256, 64, 64, 2));
  uniform_ok(moe->router_weight, 1.0 / 16.0);
  // The same seed draws the same weights as before the option existed: reset_parameters()
  // is what construction runs.
  at::manual_seed(11);
  ColumnParallelLinear again(ColumnParallelLinearOptions(in, out));
  at::manual_seed(11);
  ColumnParallelLinear skipped(ColumnParallelLinearOptions(in, out).init_weights(false));
  skipped->reset_parameters();
  CHECK(at::equal(again->weight, skipped->weight));
  CHECK(at::equal(again->bias, skipped->bias));
}

TEST_CASE("A config.json whose sizes are not its tensors' is refused before allocation, on every rank, at TP 1-4",
          "[models][loading][errors]") {
  const std::string dir = temp_folder("sizes");
  write_folder(dir, llama_config());
  struct Case {
    std::string replace, expect;
  };
  const std::vector<Case> cases = {
      {"vocab_size=4194304", "vocab_size = 4194304"},
      {"hidden_size=1099511627776;num_attention_heads=4;num_key_value_heads=1", "hidden_size = 1099511627776"},
      {"intermediate_size=8000000", "intermediate_size = 8000000"},
      {"num_hidden_layers=5", "num_hidden_layers = 5 but the checkpoint holds 2 layers"},
      {"num_hidden_layers=1", "the checkpoint holds 2 layers"},
      {"num_attention_heads=12;head_dim=16", "num_attention_heads * head_dim = 192"},
      {"num_key_value_heads=3", "num_key_value_heads * head_dim"},
  };
  for (const auto& c : cases) {
    write_text(dir + "/config.json", llama_config(c.replace));
    for (int64_t world = 1; world <= 4; ++world) {
      const bool peak_known = reset_peak_rss();
      const int64_t rss_before = status_kib("VmRSS");
      const auto start = std::chrono::steady_clock::now();
      const std::vector<std::string> errors = from_pretrained_errors(dir, world);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int64_t grew_kib = status_kib("VmHWM") - rss_before;
      INFO(c.replace << " at TP " << world << ": " << seconds << " s, peak RSS grew " << grew_kib << " KiB");
      // Reading headers: well under a second (the vocabulary case took 39 s and GBs when
      // the model was drawn first); the peak grows by the threads' stacks and buffers, not
      // by a model.
      CHECK(seconds < 5.0);
      if (peak_known) CHECK(grew_kib < 64 * 1024);
      for (int64_t r = 0; r < world; ++r) {
        INFO("rank " << r << ": " << errors[r]);
        CHECK_THAT(errors[r], Contains(c.expect) && Contains("does not describe the checkpoint's tensors") &&
                                  Contains("before allocating anything"));
      }
    }
  }
}

TEST_CASE("A mixture of experts whose num_experts is not its checkpoint's is refused before allocation",
          "[models][loading][errors]") {
  const std::string dir = temp_folder("experts");
  const std::string base = "model_type=\"mixtral\";num_local_experts=4;num_experts_per_tok=2;vocab_size=128";
  write_folder(dir, llama_config(base));
  for (const auto& [experts, expect] : std::vector<std::pair<std::string, std::string>>{
           {"8", "are not num_experts = 8"}, {"3", "are not num_experts = 3"}}) {
    write_text(dir + "/config.json", llama_config(base + ";num_local_experts=" + experts));
    for (int64_t world = 1; world <= 4; world += 3) {
      const std::vector<std::string> errors = from_pretrained_errors(dir, world);
      for (int64_t r = 0; r < world; ++r) {
        INFO(experts << " experts at TP " << world << " rank " << r << ": " << errors[r]);
        CHECK_THAT(errors[r], Contains(expect) && Contains("before allocating anything"));
      }
    }
  }
}

TEST_CASE(
    "A quantized checkpoint's sizes are checked against config.json before allocation, through its format's "
    "stored tensors",
    "[models][loading][errors]") {
  // compressed-tensors' INT8 weight-only (int8 codes [out, in], a scale per channel) and
  // W4A16 packed INT4 (eight codes to an int32 along in, a scale per 32 inputs): the linear
  // layers' tensors are codes, not [out, in] floats, and are checked through the format's axes;
  // and DeepSeek's FP8 blocks, whose scales the layer holds in another shape than the file's
  // (a folder that must still load). TP 1 and 2: 128-row blocks leave this small model no
  // split at 3.
  const auto quantized = [](const std::string& weights, const std::string& format) {
    return "quantization_config={\"quant_method\": \"compressed-tensors\", \"format\": \"" + format +
           "\", \"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": {\"targets\": "
           "[\"Linear\"], \"weights\": " +
           weights + ", \"format\": \"" + format + "\"}}, \"ignore\": [\"lm_head\"]}";
  };
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"int8 weight-only",
       quantized(R"({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel"})", "int-quantized")},
      {"fp8_block (DeepSeek's [128, 128] blocks; the scale is held per row, not as stored)",
       "quantization_config={\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\", "
       "\"weight_block_size\": [128, 128]};hidden_size=256;num_attention_heads=2;head_dim=128;intermediate_size=256"},
      {"int4 pack-quantized",
       quantized(R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32})",
                 "pack-quantized") +
           ";intermediate_size=128"},
  };
  const std::string dir = temp_folder("quantized-sizes");
  for (const auto& [name, quant] : formats) {
    const auto tensors = write_quantized_folder(dir, llama_config(quant));
    REQUIRE(tensors.count("model.layers.0.mlp.down_proj.weight_scale") +  // stored as the format's tensors
                tensors.count("model.layers.0.mlp.down_proj.weight_scale_inv") ==
            1);
    for (const auto& [replace, expect] : std::vector<std::pair<std::string, std::string>>{
             {"intermediate_size=8000000", "intermediate_size = 8000000"},
             {"intermediate_size=96", "intermediate_size = 96"},
             {"num_attention_heads=12;head_dim=16", "num_attention_heads * head_dim = 192"}}) {
      write_text(dir + "/config.json", llama_config(quant + ";" + replace));
      for (int64_t world = 1; world <= 2; ++world) {
        const bool peak_known = reset_peak_rss();
        const int64_t rss_before = status_kib("VmRSS");
        const std::vector<std::string> errors = from_pretrained_errors(dir, world);
        const int64_t grew_kib = status_kib("VmHWM") - rss_before;
        INFO(name << ", " << replace << " at TP " << world << ": peak RSS grew " << grew_kib << " KiB");
        if (peak_known) CHECK(grew_kib < 64 * 1024);
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r << ": " << errors[r]);
          CHECK_THAT(errors[r], Contains(expect) && Contains("before allocating anything"));
        }
      }
    }
    // The folder as written loads (the check refuses no valid quantized checkpoint).
    write_text(dir + "/config.json", llama_config(quant));
    for (int64_t world = 1; world <= 2; ++world) {
      const std::vector<std::string> errors = from_pretrained_errors(dir, world);
      for (int64_t r = 0; r < world; ++r) {
        INFO(name << " as written at TP " << world << ", rank " << r << ": " << errors[r]);
        CHECK(errors[r].empty());
      }
    }
  }
}
