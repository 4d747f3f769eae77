#include "tp/layers/loading/load_session.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "tp/comm/collective_status.h"

namespace tp {

std::vector<std::string> LoadSessionOptions::default_allow_unread() { return {"*rotary_emb.inv_freq"}; }

LoadSession::LoadSession(const Checkpoint& checkpoint, Communicator comm, LoadSessionOptions options)
    : log_(std::make_shared<ReadLog>(options.allow_unread())),
      view_(checkpoint.recording(log_)),
      comm_(std::move(comm)) {}

std::vector<std::string> LoadSession::read() const { return log_->read(); }

std::vector<std::string> LoadSession::unread() const {
  std::vector<std::string> out;
  for (const auto& name : view_.names()) {
    if (!log_->was_read(name) && !log_->allows_unread(name)) out.push_back(name);
  }
  return out;
}

void LoadSession::expect_filled(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) tensors.emplace_back(b.key(), b.value());
  expect_filled(tensors);
}

void LoadSession::expect_filled(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    TORCH_CHECK_VALUE(!t.is_inference(), "LoadSession::expect_filled: '", name,
                      "' is an inference tensor (built under c10::InferenceMode / torch.inference_mode), whose "
                      "writes cannot be observed; build the module outside inference mode and load it there");
    watched_.push_back({name, t, static_cast<int64_t>(t._version()), t.storage().data()});
  }
}

std::vector<std::string> LoadSession::unfilled() const {
  std::vector<std::string> out;
  for (const auto& w : watched_) {
    const bool written = static_cast<int64_t>(w.tensor._version()) != w.version || w.tensor.storage().data() != w.data;
    if (!written) out.push_back(w.name);
  }
  return out;
}

namespace {

void append_names(std::ostringstream& msg, const std::vector<std::string>& names) {
  constexpr size_t kShown = 20;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) msg << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() > kShown) msg << ", ... (" << names.size() - kShown << " more)";
}

}  // namespace

void LoadSession::finish() const {
  run_collectively(comm_, "LoadSession::finish", [&] {
    const auto left = unread();
    const auto empty = unfilled();
    if (left.empty() && empty.empty()) return;
    std::ostringstream msg;
    msg << "LoadSession: ";
    if (!empty.empty()) {
      msg << empty.size() << " of the module's " << watched_.size()
          << " parameters and buffers were filled by no load: ";
      append_names(msg, empty);
      msg << ". Built uninitialized (init_weights(false)), they would be read as whatever memory they were given: "
             "load them from the checkpoint (it has no tensor for them: is it the model's?), or build the module "
             "with init_weights(true)";
      if (left.empty()) TORCH_CHECK_VALUE(false, msg.str());
      msg << ". And ";
    }
    msg << left.size() << " of the checkpoint's " << view_.size() << " tensors were read by no layer: ";
    append_names(msg, left);
    msg << ". Load them (a layer's load_weights, or session.checkpoint().get(name) for tensors outside the TP "
           "layers), or allow them to stay unread with LoadSessionOptions::allow_unread (glob patterns; now: ";
    const auto& allow = log_->allow_unread();
    if (allow.empty()) msg << "none";
    for (size_t i = 0; i < allow.size(); ++i) msg << (i ? ", " : "") << "'" << allow[i] << "'";
    msg << ")";
    TORCH_CHECK_VALUE(false, msg.str());
  });
}

}  // namespace tp
