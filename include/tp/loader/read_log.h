#pragma once
// ReadLog: which tensors of a checkpoint a load consumed, so that the rest can be
// reported (loading is strict: a tensor nothing reads is an error unless allowed).
//
// A Checkpoint view made with Checkpoint::recording(log) records in `log` the name of
// every tensor its get() hands out. A log belongs to one load (one rank's LoadSession,
// one layer's load_weights): ranks that run as threads and share one Checkpoint each
// record into their own log, so no state is shared between ranks. A log is still
// thread-safe, for a rank that loads with several threads.

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace tp {

/// Names read through the views that record here, and the patterns of names that may
/// stay unread. Patterns are globs over whole names: '*' matches any run of characters
/// (dots included), '?' one character; anything else matches itself.
/// Example: auto log = std::make_shared<tp::ReadLog>(std::vector<std::string>{"*rotary_emb.inv_freq"});
///          layer->load_weights(ckpt.recording(log), "model.layers.0.mlp.down_proj");
class ReadLog {
 public:
  explicit ReadLog(std::vector<std::string> allow_unread = {});
  ReadLog(const ReadLog&) = delete;
  ReadLog& operator=(const ReadLog&) = delete;

  void record(const std::string& name);
  bool was_read(const std::string& name) const;
  /// The names recorded so far, sorted.
  std::vector<std::string> read() const;
  /// Whether `name` matches one of the allow_unread patterns.
  bool allows_unread(const std::string& name) const;
  const std::vector<std::string>& allow_unread() const { return allow_unread_; }

 private:
  const std::vector<std::string> allow_unread_;
  mutable std::mutex mutex_;
  std::set<std::string> read_;
};

/// Whether `name` matches the glob `pattern` ('*' any run, '?' one character).
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace tp
