// config.json's quantization_config -> CheckpointQuantization: which format each
// linear layer is stored in (docs/checkpoint_formats.md §3-7). Every value tp cannot
// read is an error naming the field and the value: a checkpoint read with the wrong
// format computes wrong numbers, so nothing here guesses.

#include <c10/util/Exception.h>

#include <cctype>
#include <regex>
#include <sstream>

#include "models/config_fields.h"
#include "tp/models/model_config.h"

namespace tp {

namespace {

using detail::ConfigFields;
using Match = CheckpointQuantization::Match;
using Pattern = CheckpointQuantization::Pattern;
using Rule = CheckpointQuantization::Rule;

std::regex compile(const std::string& pattern) { return std::regex(pattern, std::regex::ECMAScript); }

// A pattern as written in the config; regexes are compiled once here so a bad one is
// an error at parse time.
Pattern make_pattern(const ConfigFields& f, const std::string& key, Match match, const std::string& text) {
  if (match == Match::kRegex || match == Match::kTransformers) {
    try {
      compile(text);
    } catch (const std::regex_error& e) {
      f.fail(key, "holds \"" + text + "\", which is not a regular expression tp can read (" + e.what() + ")");
    }
  }
  return Pattern{match, text};
}

// compressed-tensors targets / ignore entries: "Linear", "re:<regex>", or a module name.
std::vector<Pattern> ct_patterns(const ConfigFields& f, const std::string& key) {
  std::vector<Pattern> out;
  for (const auto& t : f.strings(key)) {
    if (t.rfind("re:", 0) == 0) {
      out.push_back(make_pattern(f, key, Match::kRegex, t.substr(3)));
    } else if (t == "Linear") {
      out.push_back(Pattern{Match::kLinear, t});
    } else if (!t.empty() && t.find('.') == std::string::npos && t[0] >= 'A' && t[0] <= 'Z') {
      // A class name other than Linear (compressed-tensors matches classes too): tp sees
      // only module names, so it cannot tell which modules that class covers.
      f.fail(key, "holds the class name \"" + t + "\"; tp matches \"Linear\", module names and \"re:\" patterns only");
    } else {
      out.push_back(Pattern{Match::kExact, t});
    }
  }
  return out;
}

void check_group_size(const ConfigFields& f, const std::string& key, int64_t g) {
  if (g == -1 || g == 0)
    f.fail(key,
           "(one group per output column, as wide as in_features) is not supported; tp's INT4 kernels take "
           "groups of 32, 64 or 128 in_features");
  if (g != 32 && g != 64 && g != 128) f.fail(key, "is not supported; tp's INT4 kernels take groups of 32, 64 or 128");
}

// ---- compressed-tensors --------------------------------------------------------------

// One config group's weights / input_activations -> the format (docs §3.2's table).
QuantConfig ct_scheme(const ConfigFields& group, const std::string& format_key, const std::string& format) {
  const auto w = group.object("weights");
  const std::string type = w.required_string("type");
  const int64_t bits = w.required_int("num_bits");
  const std::string strategy = w.required_string("strategy");
  const bool sym = w.boolean("symmetric", true);
  if (w.boolean("dynamic", false)) w.fail("dynamic", "is not supported: weights are quantized once, when stored");
  const std::string actorder = w.string("actorder", "");
  if (actorder == "group" || actorder == "dynamic")
    w.fail("actorder",
           "(activation order with a stored weight_g_idx permuting in_features) is not supported; "
           "quantize with actorder \"weight\" or none");
  else if (!actorder.empty() && actorder != "weight" && actorder != "static")
    w.fail("actorder", "is not an activation ordering tp knows (weight, static, group, dynamic)");
  const bool has_input = group.has("input_activations");
  if (group.has("output_activations"))
    group.fail("output_activations", "is not supported (tp's layers output the activation dtype)");

  // The input activations a format quantizes: their type, strategy and dynamism.
  const auto check_input = [&](const char* want_type, const char* want_strategy, bool want_dynamic, int64_t want_group,
                               const char* what) {
    if (!has_input) group.fail("input_activations", std::string("is null; ") + what);
    const auto a = group.object("input_activations");
    const auto bad = [&](const std::string& key, const std::string& expected) {
      a.fail(key, "is not supported with these weights; " + std::string(what) + " (expected " + key + " = " + expected +
                      ")");
    };
    if (a.required_string("type") != want_type) bad("type", want_type);
    if (a.required_int("num_bits") != 8) bad("num_bits", "8");
    if (!a.boolean("symmetric", true)) bad("symmetric", "true");
    if (a.boolean("dynamic", false) != want_dynamic) bad("dynamic", want_dynamic ? "true" : "false");
    if (a.required_string("strategy") != want_strategy) bad("strategy", want_strategy);
    if (want_group > 0 && a.integer("group_size", 0) != want_group) bad("group_size", std::to_string(want_group));
  };
  const auto check_format = [&](const char* want) {
    if (format != want)
      group.fail(format_key, "is \"" + format + "\", but these weights (" + type + " " + std::to_string(bits) +
                                 "-bit, strategy " + strategy + ") are stored as \"" + want +
                                 "\" by compressed-tensors");
  };

  QuantConfig config;
  if (type == "float" && bits == 4) {
    // NVFP4 (the NVFP4A16 preset): E2M1 in groups of 16 with E4M3 scales and a global scale.
    if (!sym) w.fail("symmetric", "false is not supported for FP4 weights");
    if (strategy != "tensor_group" || w.integer("group_size", 0) != 16)
      w.fail("strategy", "\"" + strategy + "\" with group_size " + std::to_string(w.integer("group_size", 0)) +
                             " is not supported for FP4 weights; tp reads NVFP4 (tensor_group, group_size 16)");
    if (has_input)
      group.fail("input_activations",
                 "is not supported with NVFP4 weights: tp reads NVFP4A16 (weight-only), and reading a W4A4 "
                 "checkpoint without quantizing its activations would compute other numbers than it specifies");
    check_format("nvfp4-pack-quantized");
    config.format = QuantFormat::kNvfp4;
    config.nvfp4_dialect = Nvfp4Dialect::kCompressedTensors;
  } else if (type == "float") {
    if (bits != 8) w.fail("num_bits", "is not supported for float weights; tp reads FP8 (num_bits 8, E4M3) and NVFP4");
    if (!sym) w.fail("symmetric", "false is not supported for FP8 weights");
    check_format("float-quantized");
    if (strategy == "tensor") {
      check_input("float", "tensor", false, 0,
                  "tp's fp8_tensor quantizes activations with a static per-tensor "
                  "input_scale (the FP8 preset)");
      config.format = QuantFormat::kFp8PerTensor;
    } else if (strategy == "channel") {
      check_input("float", "token", true, 0,
                  "tp's fp8_channel quantizes activations per token at run time "
                  "(the FP8_DYNAMIC preset)");
      config.format = QuantFormat::kFp8PerChannel;
    } else if (strategy == "block") {
      const auto& block = w.array("block_structure");
      if (block.size() != 2 || block[0].as_int(w.path("block_structure")) != 128 ||
          block[1].as_int(w.path("block_structure")) != 128)
        w.fail("block_structure", "is not supported; tp's fp8_block takes 128x128 blocks");
      check_input("float", "group", true, 128,
                  "tp's fp8_block quantizes activations in dynamic groups of 128 "
                  "(the FP8_BLOCK preset)");
      config.format = QuantFormat::kFp8Block;
      config.block_scale_name = BlockScaleName::kWeightScale;
    } else {
      w.fail("strategy", "is not supported for FP8 weights; tp reads tensor, channel and block");
    }
  } else if (type == "int") {
    if (bits == 8) {
      if (!sym) w.fail("symmetric", "false is not supported for INT8 weights");
      if (strategy != "channel") w.fail("strategy", "is not supported for INT8 weights; tp reads channel");
      check_format("int-quantized");
      if (has_input) {
        check_input("int", "token", true, 0,
                    "tp's int8_w8a8 quantizes activations per token at run time "
                    "(the W8A8 preset)");
        config.format = QuantFormat::kInt8W8A8;
      } else {
        config.format = QuantFormat::kInt8WeightOnly;
      }
    } else if (bits == 4) {
      if (strategy != "group")
        w.fail("strategy", "is not supported for INT4 weights; tp reads group (W4A16 / W4A16_ASYM)");
      const int64_t g = w.required_int("group_size");
      check_group_size(w, "group_size", g);
      if (has_input) group.fail("input_activations", "is not supported with INT4 weights (tp reads W4A16)");
      check_format("pack-quantized");
      config.format = QuantFormat::kInt4PackQuantized;
      config.group_size = g;
      config.symmetric = sym;
    } else {
      w.fail("num_bits", "is not supported for int weights; tp reads 8 (W8A8, W8A16) and 4 (W4A16)");
    }
  } else {
    w.fail("type", "is not supported; tp reads int and float");
  }
  return config;
}

void parse_compressed_tensors(const ConfigFields& q, std::vector<Rule>& rules, std::vector<Pattern>& ignore) {
  const std::string status = q.string("quantization_status", "compressed");
  if (status != "compressed")
    q.fail("quantization_status", "is not supported; tp reads compressed checkpoints (\"" + status +
                                      "\" stores weights that are not in their compressed form)");
  for (const char* key : {"sparsity_config", "transform_config"}) {
    if (q.has(key) && !q.object(key).keys().empty())
      q.fail(key, "is not supported (tp reads dense, untransformed weights)");
  }
  if (q.has("kv_cache_scheme")) q.fail("kv_cache_scheme", "is not supported (tp's layers are the linear layers)");
  const std::string top_format = q.string("format", "");
  const auto groups = q.object("config_groups");
  if (groups.keys().empty()) q.fail("config_groups", "is empty");
  for (const auto& name : groups.keys()) {
    const auto group = groups.object(name);
    const bool own = group.has("format");
    const std::string format = own ? group.required_string("format") : top_format;
    if (format.empty()) group.fail("format", "is absent, and so is quantization_config.format");
    Rule rule;
    rule.name = name;
    rule.targets = ct_patterns(group, "targets");
    if (rule.targets.empty()) group.fail("targets", "is empty");
    rule.config = ct_scheme(group, own ? "format" : "(quantization_config.format)", format);
    rules.push_back(std::move(rule));
  }
  ignore = ct_patterns(q, "ignore");
}

// ---- GPTQ ------------------------------------------------------------------------------

void parse_gptq(const ConfigFields& q, std::vector<Rule>& rules, std::vector<Pattern>& ignore) {
  if (q.required_int("bits") != 4) q.fail("bits", "is not supported; tp reads 4-bit GPTQ");
  QuantConfig config;
  config.format = QuantFormat::kInt4Gptq;
  config.group_size = q.required_int("group_size");
  check_group_size(q, "group_size", config.group_size);
  config.symmetric = q.boolean("sym", true);
  if (q.boolean("desc_act", false))
    q.fail("desc_act",
           "(act-order: g_idx permutes in_features) is not supported; use a checkpoint quantized "
           "without desc_act (or with static_groups)");
  // checkpoint_format decides v1 / v2; GPTQModel also writes it as "format", and
  // AutoGPTQ writes neither (v1). Two that disagree are refused.
  std::string fmt = q.string("checkpoint_format", "");
  const std::string alt = q.string("format", "");
  if (fmt.empty()) fmt = alt.empty() ? "gptq" : alt;
  if (!alt.empty() && alt != fmt)
    q.fail("format", "disagrees with checkpoint_format = \"" + fmt + "\"; one of them is wrong");
  const std::string fmt_key =
      q.has("checkpoint_format") ? "checkpoint_format" : (alt.empty() ? "checkpoint_format" : "format");
  if (fmt == "gptq") {
    config.gptq_format = GptqFormat::kV1;
  } else if (fmt == "gptq_v2") {
    config.gptq_format = GptqFormat::kV2;
  } else {
    q.fail(fmt_key, "(\"" + fmt +
                        "\") is not supported; tp reads \"gptq\" (v1: zero points stored minus 1) and "
                        "\"gptq_v2\" (v2)");
  }
  if (q.string("pack_dtype", "int32") != "int32")
    q.fail("pack_dtype", "is not supported; tp reads GPTQ words of int32");
  if (q.has("dynamic")) q.fail("dynamic", "(per-module overrides) is not supported");
  if (q.boolean("is_marlin_format", false)) q.fail("is_marlin_format", "(the Marlin layout) is not supported");
  if (q.has("modules_in_block_to_quantize"))
    q.fail("modules_in_block_to_quantize",
           "is not supported (tp reads checkpoints that quantize every decoder linear)");
  rules.push_back(Rule{"gptq", {Pattern{Match::kLinear, "Linear"}}, config});
  if (!q.boolean("lm_head", false)) ignore.push_back(Pattern{Match::kLmHead, "lm_head"});
}

// ---- AWQ -------------------------------------------------------------------------------

void parse_awq(const ConfigFields& q, std::vector<Rule>& rules, std::vector<Pattern>& ignore) {
  // transformers' AwqConfig.to_dict also writes "sym", which means nothing for AWQ:
  // zero_point says whether there are zero points.
  if (q.required_int(q.has("bits") ? "bits" : "w_bit") != 4) q.fail("bits", "is not supported; tp reads 4-bit AWQ");
  const std::string gkey = q.has("group_size") ? "group_size" : "q_group_size";
  QuantConfig config;
  config.format = QuantFormat::kInt4Awq;
  config.group_size = q.required_int(gkey);
  check_group_size(q, gkey, config.group_size);
  const std::string vkey = q.has("version") ? "version" : "format";
  std::string version = q.string(vkey, "gemm");
  for (auto& ch : version) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (version != "gemm")
    q.fail(vkey,
           "is not supported; tp reads AutoAWQ's GEMM layout (\"gemm\"); gemv, gemv_fast, marlin, exllama "
           "and ipex pack differently");
  if (!q.boolean("zero_point", true))
    q.fail("zero_point", "false is not supported: AutoAWQ's GEMM layout always stores zero points");
  config.symmetric = false;
  rules.push_back(Rule{"awq", {Pattern{Match::kLinear, "Linear"}}, config});
  ignore.push_back(Pattern{Match::kLmHead, "lm_head"});  // AWQ never quantizes lm_head
  for (const auto& m : q.strings("modules_to_not_convert")) ignore.push_back(Pattern{Match::kSubstring, m});
}

// ---- HF fine-grained FP8 ---------------------------------------------------------------

void parse_fp8(const ConfigFields& q, std::vector<Rule>& rules, std::vector<Pattern>& ignore) {
  if (q.string("activation_scheme", "dynamic") != "dynamic")
    q.fail("activation_scheme", "is not supported; tp's fp8_block quantizes activations dynamically");
  if (!q.has("weight_block_size"))
    q.fail("weight_block_size", "is absent: per-tensor HF FP8 is not supported; tp reads 128x128 blocks");
  const auto& block = q.array("weight_block_size");
  if (block.size() != 2 || block[0].as_int(q.path("weight_block_size")) != 128 ||
      block[1].as_int(q.path("weight_block_size")) != 128)
    q.fail("weight_block_size", "is not supported; tp's fp8_block takes [128, 128]");
  if (q.string("fmt", "e4m3") != "e4m3") q.fail("fmt", "is not supported; tp reads float8 E4M3 weights");
  if (q.string("scale_fmt", "float") != "float")
    q.fail("scale_fmt", "is not supported; tp reads float32 weight_scale_inv (not power-of-two ue8m0 scales)");
  if (q.has("modules_to_convert"))
    q.fail("modules_to_convert", "is not supported (tp reads checkpoints that quantize every decoder linear)");
  QuantConfig config;
  config.format = QuantFormat::kFp8Block;
  config.block_scale_name = BlockScaleName::kWeightScaleInv;
  rules.push_back(Rule{"fp8", {Pattern{Match::kLinear, "Linear"}}, config});
  ignore.push_back(Pattern{Match::kLmHead, "lm_head"});
  for (const auto& m : q.strings("modules_to_not_convert"))
    ignore.push_back(make_pattern(q, "modules_to_not_convert", Match::kTransformers, m));
}

// ---- MXFP4 (transformers' Mxfp4Config: GPT-OSS) ------------------------------------------

void parse_mxfp4(const ConfigFields& q, std::vector<Rule>& rules, std::vector<Pattern>& ignore) {
  // transformers' Mxfp4HfQuantizer stores the experts of a mixture of experts (GPT-OSS's
  // "...mlp.experts": gate_up_proj_blocks / _scales, down_proj_blocks / _scales) in MXFP4
  // and nothing else; "dequantize" only tells transformers to widen them when it loads.
  QuantConfig config;
  config.format = QuantFormat::kMxfp4;
  rules.push_back(Rule{"mxfp4", {Pattern{Match::kRegex, R"(.*\.experts$)"}}, config});
  for (const auto& m : q.strings("modules_to_not_convert"))
    ignore.push_back(make_pattern(q, "modules_to_not_convert", Match::kTransformers, m));
}

std::string describe_pattern(const Pattern& p) {
  switch (p.match) {
    case Match::kRegex: return "re:" + p.text;
    case Match::kSubstring: return "*" + p.text + "*";
    default: return p.text;
  }
}

}  // namespace

bool CheckpointQuantization::Pattern::matches(const std::string& module) const {
  switch (match) {
    case Match::kExact: return module == text;
    case Match::kLinear: return true;
    case Match::kLmHead: return module == "lm_head";
    case Match::kSubstring: return module.find(text) != std::string::npos;
    case Match::kRegex: {
      // Python's re.match: anchored at the start, not at the end.
      std::smatch m;
      return std::regex_search(module, m, compile(text), std::regex_constants::match_continuous);
    }
    case Match::kTransformers: {
      // transformers' should_convert_module: the pattern matches from the start up to a
      // module boundary (the character before or after the match is a '.', or the end),
      // or it is a suffix of the name.
      if (module.size() >= text.size() && module.compare(module.size() - text.size(), text.size(), text) == 0)
        return true;
      const auto re = compile(text);
      for (size_t i = 0; i <= module.size(); ++i) {
        const bool boundary = i == module.size() || module[i] == '.' || (i > 0 && module[i - 1] == '.');
        if (boundary && std::regex_match(module.begin(), module.begin() + static_cast<std::ptrdiff_t>(i), re))
          return true;
      }
      return false;
    }
  }
  return false;
}

QuantConfig CheckpointQuantization::for_module(const std::string& module) const {
  for (const auto& p : ignore_) {
    if (p.matches(module)) return QuantConfig{};
  }
  const Rule* found = nullptr;
  for (const auto& rule : rules_) {
    bool hit = false;
    for (const auto& t : rule.targets) hit = hit || t.matches(module);
    if (!hit) continue;
    TORCH_CHECK_VALUE(found == nullptr || found->config == rule.config, "ModelConfig: ", method_, " config groups '",
                      found ? found->name : "", "' (", found ? to_string(found->config) : "", ") and '", rule.name,
                      "' (", to_string(rule.config), ") both target '", module, "'");
    found = &rule;
  }
  return found ? found->config : QuantConfig{};
}

std::string CheckpointQuantization::describe() const {
  if (rules_.empty()) return "unquantized";
  std::ostringstream out;
  out << method_ << ":";
  for (const auto& rule : rules_) {
    out << " " << rule.name << " = " << to_string(rule.config) << " for";
    for (const auto& t : rule.targets) out << " " << describe_pattern(t);
    out << ";";
  }
  out << " unquantized:";
  if (ignore_.empty()) out << " (none)";
  for (const auto& p : ignore_) out << " " << describe_pattern(p);
  return out.str();
}

namespace detail {

CheckpointQuantization QuantizationParser::parse(const ConfigFields& q) {
  CheckpointQuantization out;
  out.method_ = q.required_string("quant_method");
  if (out.method_ == "compressed-tensors") {
    parse_compressed_tensors(q, out.rules_, out.ignore_);
  } else if (out.method_ == "gptq") {
    parse_gptq(q, out.rules_, out.ignore_);
  } else if (out.method_ == "awq") {
    parse_awq(q, out.rules_, out.ignore_);
  } else if (out.method_ == "fp8") {
    parse_fp8(q, out.rules_, out.ignore_);
  } else if (out.method_ == "mxfp4") {
    parse_mxfp4(q, out.rules_, out.ignore_);
  } else {
    q.fail("quant_method", "is not supported; tp reads compressed-tensors, gptq, awq, fp8 and mxfp4");
  }
  return out;
}

}  // namespace detail

}  // namespace tp
