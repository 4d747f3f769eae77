#include "layers/loading/strict_load.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "tp/loader/read_log.h"
#include "tp/quant/stored_tensors.h"

namespace tp::detail {

namespace {

// Tensor names (after the layer's prefix) that only quantized formats store: what the
// format table declares (tp/quant/stored_tensors.h).
bool is_quant_tensor(const std::string& suffix) {
  const auto& names = quantized_tensor_names();
  return std::binary_search(names.begin(), names.end(), suffix);
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << "'" << names[i] << "'";
  return out.str();
}

// Why `name` (= prefix + "." + suffix) would be ignored, and what fixes it.
std::string reason(const LayerFacts& facts, const std::string& prefix, const std::string& suffix,
                   const std::vector<std::string>& read_here) {
  const std::string reads = read_here.empty() ? std::string("nothing under '") + prefix + "'" : quoted_list(read_here);
  if (suffix == "bias" && !facts.bias) {
    return "the layer was built with bias=false, so it reads no bias. Build it with bias=true (Qwen2's q/k/v "
           "projections have a bias; config.json's attention_bias / mlp_bias say which layers have one)";
  }
  if (is_quant_tensor(suffix) && facts.trainable) {
    return "it belongs to a quantized format, but the layer's quant format is " + facts.quant + ", which reads " +
           reads +
           " and would use quantized codes as weights. Build the layer with the format the checkpoint's "
           "config.json quantization_config names (quant=...)";
  }
  if (is_quant_tensor(suffix)) {
    return "the layer's quant format " + facts.quant + " reads " + reads +
           ", not this one: the checkpoint is in another format or variant. Build the layer with the format "
           "the checkpoint's config.json quantization_config names";
  }
  return "the layer (quant format " + facts.quant + ") reads " + reads +
         ". If it is meant to stay unread, allow it by name or pattern (LoadSessionOptions::allow_unread, "
         "Python: tp.LoadSession(..., allow_unread=[...]))";
}

}  // namespace

void load_strictly(const Checkpoint& checkpoint, const std::vector<std::string>& prefixes, const LayerFacts& facts,
                   const std::function<void(const Checkpoint&)>& load) {
  const auto log = std::make_shared<ReadLog>();
  load(checkpoint.recording(log));

  std::vector<std::string> seen, problems;
  for (const auto& prefix : prefixes) {
    if (std::find(seen.begin(), seen.end(), prefix) != seen.end()) continue;  // fused parts share one tensor
    seen.push_back(prefix);
    const auto under = checkpoint.names_with_prefix(prefix + ".");
    std::vector<std::string> read_here, unread;
    for (const auto& name : under) {
      if (log->was_read(name)) {
        read_here.push_back(name);
      } else if (!checkpoint.may_stay_unread(name)) {
        unread.push_back(name);
      }
    }
    for (const auto& name : unread) {
      problems.push_back("'" + name +
                         "' would be ignored: " + reason(facts, prefix, name.substr(prefix.size() + 1), read_here));
    }
  }
  if (problems.empty()) return;
  std::ostringstream msg;
  msg << facts.layer << ": ";
  if (problems.size() == 1) {
    msg << "checkpoint tensor " << problems.front();
  } else {
    msg << problems.size() << " checkpoint tensors would be ignored:";
    for (const auto& p : problems) msg << "\n  " << p;
  }
  TORCH_CHECK_VALUE(false, msg.str());
}

void check_bias(const std::string& layer, const TensorSource& source, int64_t n) {
  const auto t = source.dtype();
  TORCH_CHECK_TYPE(t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16, layer, ": tensor '",
                   source.name(), "' has dtype ", t,
                   "; a bias is stored as float64, float32, float16 or bfloat16 (quantized formats keep the bias "
                   "unquantized)");
  TORCH_CHECK_VALUE(source.shape() == std::vector<int64_t>{n}, layer, ": tensor '", source.name(), "' has shape ",
                    c10::IntArrayRef(source.shape()), "; expected [", n, "]");
}

}  // namespace tp::detail
