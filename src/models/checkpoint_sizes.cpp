// ModelConfig::check_sizes: config.json's sizes held against the checkpoint's tensor
// headers before a weight is allocated (CausalLM::from_pretrained).

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tp/loader/checkpoint.h"
#include "tp/models/model_config.h"
#include "tp/quant/stored_tensors.h"

namespace tp {

namespace {

// A float tensor: one whose shape is the layer's [out, in] (quantized codes are packed).
bool plain(const TensorSource& source) {
  const auto t = source.dtype();
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

class SizeCheck {
 public:
  SizeCheck(const ModelConfig& config, const Checkpoint& checkpoint) : c_(config), checkpoint_(checkpoint) {}

  // `name`'s shape, where the tensor is stored unquantized, must be `want`; each entry of
  // `fields` names the config field (or product) that gives that dimension.
  void shape(const std::string& name, const std::vector<int64_t>& want, const std::vector<std::string>& fields) {
    if (!checkpoint_.contains(name)) return;
    const auto& source = checkpoint_.get(name);
    if (!plain(source)) return;
    const auto got = source.shape();
    if (got == want) return;
    std::ostringstream msg;
    msg << "'" << name << "' is " << c10::IntArrayRef(got) << " where config.json gives [";
    for (size_t d = 0; d < want.size(); ++d) msg << (d ? ", " : "") << fields[d] << " = " << want[d];
    msg << "]";
    problems_.push_back(msg.str());
  }
  void problem(const std::string& text) { problems_.push_back(text); }

  // A linear layer's weight under `prefix`, the layer being [out, in] (fields: the config
  // fields that give each): the plain weight, or the codes its quantization format stores
  // (the format's first tensor: codes or packed words, read as the checkpoint has them),
  // along the dimensions that carry the output and the input features (tp::stored_tensors:
  // one index covers `per_index` features; a partial last index rounds up). The scales are
  // not held to the axes: those describe the layer's parameters, and some formats hold a
  // scale in another shape than the checkpoint's (FP8 blocks' per row, per tensor's per row).
  void linear(const std::string& prefix, int64_t out, int64_t in, const std::vector<std::string>& fields) {
    const QuantConfig quant = c_.quant_config(prefix);
    if (quant.format == QuantFormat::kNone) return shape(prefix + ".weight", {out, in}, fields);
    const StoredTensor codes = stored_tensors(quant).front();
    const std::string name = prefix + "." + codes.name;
    if (!checkpoint_.contains(name)) return;
    const auto got = checkpoint_.get(name).shape();
    features(name, got, codes.out_dim, codes.out_per_index, out, fields[0]);
    features(name, got, codes.in_dim, codes.in_per_index, in, fields[1]);
  }

  // Dimension `dim` of `name` (shape `got`) holds `count` features, `per_index` to an index.
  void features(const std::string& name, const std::vector<int64_t>& got, int64_t dim, int64_t per_index, int64_t count,
                const std::string& field) {
    if (dim < 0 || dim >= static_cast<int64_t>(got.size()) || per_index <= 0) return;
    const int64_t have = got[static_cast<size_t>(dim)];
    if (have == (count + per_index - 1) / per_index) return;
    std::ostringstream msg;
    msg << "'" << name << "' is " << c10::IntArrayRef(got) << ": its dimension " << dim << " holds " << have
        << (per_index > 1 ? " x " + std::to_string(per_index) : std::string()) << " features where config.json gives "
        << field << " = " << count;
    problems_.push_back(msg.str());
  }

  void report() const {
    if (problems_.empty()) return;
    std::ostringstream msg;
    msg << "ModelConfig: " << c_.source << " does not describe the checkpoint's tensors (checked against their "
        << "headers, before allocating anything): ";
    for (size_t i = 0; i < problems_.size(); ++i) msg << (i ? "; " : "") << problems_[i];
    msg << ". Use the config.json that was saved with these tensors";
    TORCH_CHECK_VALUE(false, msg.str());
  }

 private:
  const ModelConfig& c_;
  const Checkpoint& checkpoint_;
  std::vector<std::string> problems_;
};

// The layer indices under "<layers>.": one past the highest (0: none).
int64_t layers_held(const Checkpoint& checkpoint, const std::string& layers) {
  const std::string prefix = layers + ".";
  int64_t count = 0;
  for (const auto& name : checkpoint.names_with_prefix(prefix)) {
    const size_t dot = name.find('.', prefix.size());
    const std::string index = name.substr(prefix.size(), dot - prefix.size());
    if (index.empty() || index.size() > 18 || !std::all_of(index.begin(), index.end(), ::isdigit)) continue;
    count = std::max<int64_t>(count, std::stoll(index) + 1);
  }
  return count;
}

}  // namespace

void ModelConfig::check_sizes(const Checkpoint& checkpoint, int64_t num_layers) const {
  SizeCheck check(*this, checkpoint);
  const auto& n = names;
  const int64_t h = hidden_size;
  check.shape(n.embed + ".weight", {vocab_size, h}, {"vocab_size", "hidden_size"});
  if (!tie_word_embeddings) check.shape(n.lm_head + ".weight", {vocab_size, h}, {"vocab_size", "hidden_size"});
  check.shape(n.final_norm + ".weight", {h}, {"hidden_size"});

  const int64_t held = layers_held(checkpoint, n.layers);
  const int64_t stored = num_hidden_layers + extra_layers;
  const int64_t used = num_layers > 0 ? std::min(num_layers, num_hidden_layers) : num_hidden_layers;
  if (held < used) {
    check.problem("num_hidden_layers = " + std::to_string(num_hidden_layers) + " but the checkpoint holds " +
                  std::to_string(held) + " layers ('" + n.layers + ".0' to '" + n.layers + "." +
                  std::to_string(held - 1) + "')");
  } else if (held > stored) {
    check.problem("the checkpoint holds " + std::to_string(held) + " layers ('" + n.layers + ".0' to '" + n.layers +
                  "." + std::to_string(held - 1) + "') but num_hidden_layers = " + std::to_string(num_hidden_layers) +
                  (extra_layers ? " (+ " + std::to_string(extra_layers) + " extra)" : std::string()));
  }
  const std::vector<std::string> hidden_in{"hidden_size"};
  for (int64_t i = 0; i < std::min(used, held); ++i) {
    const std::string p = layer_prefix(i);
    check.shape(p + "." + n.input_norm + ".weight", {h}, hidden_in);
    check.shape(p + "." + n.post_attention_norm + ".weight", {h}, hidden_in);
    const std::string attention = p + "." + n.attention;
    const std::string q = "num_attention_heads * head_dim", kv = "num_key_value_heads * head_dim";
    check.linear(attention + "." + n.o_proj, h, q_size(), {"hidden_size", q});
    if (n.qkv.layout() == QKVLayout::kSeparate) {
      check.linear(attention + "." + n.qkv.q_name(), q_size(), h, {q, "hidden_size"});
      check.linear(attention + "." + n.qkv.k_name(), kv_size(), h, {kv, "hidden_size"});
      check.linear(attention + "." + n.qkv.v_name(), kv_size(), h, {kv, "hidden_size"});
    } else {
      check.linear(attention + "." + n.qkv.fused_name(), q_size() + 2 * kv_size(), h,
                   {"(num_attention_heads + 2 * num_key_value_heads) * head_dim", "hidden_size"});
    }
    if (!is_moe(i)) {
      check.linear(p + "." + n.mlp + "." + n.down_proj, h, intermediate_size, {"hidden_size", "intermediate_size"});
      continue;
    }
    const std::string block = p + "." + n.moe;
    const auto& layout = n.moe_layout;
    const int64_t e = moe.num_experts;
    check.shape(block + "." + layout.router_name() + ".weight", {e, h}, {"num_experts", "hidden_size"});
    if (layout.experts() == ExpertLayout::kPerExpert) {
      const std::string experts = block + ".experts.";
      const bool last = !checkpoint.names_with_prefix(experts + std::to_string(e - 1) + ".").empty();
      const bool beyond = !checkpoint.names_with_prefix(experts + std::to_string(e) + ".").empty();
      if (!last || beyond) {
        check.problem("the experts of '" + block + "' are not num_experts = " + std::to_string(e) + " ('" + experts +
                      std::to_string(last ? e : e - 1) + ".*' " + (last ? "exists" : "does not exist") + ")");
      }
      check.linear(experts + "0." + layout.down_name(), h, moe.intermediate_size,
                   {"hidden_size", "the experts' intermediate size"});
    } else if (checkpoint.contains(block + ".experts." + layout.down_name())) {
      const auto& down = checkpoint.get(block + ".experts." + layout.down_name());
      const auto shape = down.shape();
      if (shape.empty() || shape[0] != e) {
        check.problem("'" + down.name() + "' is " + c10::str(c10::IntArrayRef(shape)) +
                      " where config.json gives num_experts = " + std::to_string(e) + " experts");
      }
    }
  }
  check.report();
}

}  // namespace tp
