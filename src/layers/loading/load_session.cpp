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

void LoadSession::finish() const {
  run_collectively(comm_, "LoadSession::finish", [&] {
    const auto left = unread();
    if (left.empty()) return;
    constexpr size_t kShown = 20;
    std::ostringstream msg;
    msg << "LoadSession: " << left.size() << " of the checkpoint's " << view_.size()
        << " tensors were read by no layer: ";
    for (size_t i = 0; i < left.size() && i < kShown; ++i) msg << (i ? ", " : "") << "'" << left[i] << "'";
    if (left.size() > kShown) msg << ", ... (" << left.size() - kShown << " more)";
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
