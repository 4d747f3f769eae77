#pragma once
// LoadSession: loading a whole module tree from one checkpoint, strictly. Every
// tensor the layers (and the caller's own code) read through session.checkpoint() is
// recorded; finish() then reports the checkpoint tensors nothing read, on every rank,
// and (expect_filled) the module's parameters and buffers no load wrote: a module built
// with init_weights(false) holds uninitialized memory until its load fills it.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "tp/comm/communicator.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/read_log.h"

namespace tp {

/// Options of a LoadSession.
struct LoadSessionOptions {
  /// {"*rotary_emb.inv_freq"}: the RoPE frequency buffers older transformers versions
  /// saved; they are a function of config.json's RoPE parameters, recomputed by whoever
  /// applies RoPE. Nothing else is skipped by default.
  static std::vector<std::string> default_allow_unread();

  /// Tensors that may stay unread: globs over whole names ('*' any run of characters,
  /// dots included; '?' one character). Default: default_allow_unread().
  /// Example: LoadSessionOptions().allow_unread({"*rotary_emb.inv_freq", "lm_head.weight"})
  TORCH_ARG(std::vector<std::string>, allow_unread) = default_allow_unread();
};

/// One rank's load of a module tree. Per rank and per session, so ranks that run as
/// threads can share one Checkpoint: each session records into its own log.
/// Example:
///   tp::LoadSession session(ckpt, comm);
///   qkv->load_weights(session.checkpoint(), "model.layers.0.self_attn");
///   o->load_weights(session.checkpoint(), "model.layers.0.self_attn.o_proj");
///   auto norm = session.checkpoint().get("model.norm.weight").read_all();
///   session.finish();   // every rank: error listing 'model.embed_tokens.weight', ... if unread
class LoadSession {
 public:
  /// `comm` makes finish() collective (world 1: local).
  explicit LoadSession(const Checkpoint& checkpoint, Communicator comm = Communicator(),
                       LoadSessionOptions options = {});

  /// The checkpoint to load from: the same tensors (shared, not copied), every get()
  /// recorded in this session.
  const Checkpoint& checkpoint() const { return view_; }
  /// Names read so far, sorted.
  std::vector<std::string> read() const;
  /// Names no one has read and no allow_unread pattern matches, sorted.
  std::vector<std::string> unread() const;
  /// Watches every parameter and buffer of `module` (named as module.named_parameters()
  /// and named_buffers() name them): finish() then fails naming each one that no load has
  /// written since this call (its version counter unchanged and its storage the same), so
  /// a tensor built uninitialized (init_weights(false)) is never read unfilled. Tensors
  /// with no elements (a rank's empty shard) need no filling. Call it after building the
  /// module and before loading it.
  /// Example: session.expect_filled(*model); model->load_weights(session.checkpoint()); session.finish();
  void expect_filled(const torch::nn::Module& module);
  /// The same for named tensors (Python's LoadSession.expect_filled passes a module's
  /// named_parameters() and named_buffers()).
  void expect_filled(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  /// Names of the watched tensors that no load has written yet, in the module's order.
  std::vector<std::string> unfilled() const;
  /// Throws (c10::ValueError) on every rank if unread() or unfilled() is not empty on
  /// any rank, listing the unread checkpoint tensors and how to allow them, and the
  /// unfilled module tensors; returns otherwise. A collective over the session's
  /// communicator: every rank must call it.
  void finish() const;

 private:
  struct Watched {
    std::string name;
    at::Tensor tensor;
    int64_t version;
    const void* data;
  };
  std::shared_ptr<ReadLog> log_;
  std::vector<Watched> watched_;
  Checkpoint view_;
  Communicator comm_;
};

}  // namespace tp
