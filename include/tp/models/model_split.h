#pragma once
// How a whole model is cut over its ranks: the split policy of every layer under per-rank
// weights (CausalLMOptions::split_weights, for unequal devices, as llama.cpp's
// --tensor-split), and the plan that says what each rank holds.
//
// With weights w, each layer kind is cut on its own units (KV-head groups, or the query
// heads of a replicated KV head; the MLP's intermediate rows in whole quant groups; the
// experts over their groups and each expert's rows; the vocabulary's padded rows), every
// rank's share within one unit of units * w[r] / sum(w) (tp::split's largest remainder).
// The leftover units rotate: layer i's attention starts them at rank i, its MLP at rank
// i + 1, so no rank takes every extra head or row. Without weights every cut is the even
// one it always was (remainders from rank 0).

#include <cstdint>
#include <string>
#include <vector>

#include "tp/models/model_config.h"
#include "tp/shard/split.h"

namespace tp {

/// The parts of a decoder layer a weighted split cuts, each with its own rotation. (A
/// mixture's experts take the MLP's rotation, its shared expert the next: MoEParallelMLPOptions::
/// split_rotation; the vocabulary's leftover starts at rank 0.)
enum class SplitKind {
  kAttention,  ///< the KV-head groups (QKV; O follows its query heads)
  kMlp,        ///< the MLP's intermediate rows, or a mixture's experts and their rows
};

/// The policy `kind` of layer `layer` is cut with under config.split_weights: the
/// weights and the rotation above; granularity 1 (each layer adds its format's alignment).
/// Without weights: SplitPolicy{} (an even split).
SplitPolicy model_split_policy(const ModelConfig& config, int64_t layer, SplitKind kind);

/// What one rank holds of one decoder layer.
struct LayerShare {
  int64_t q_heads = 0, kv_heads = 0;
  /// The dense MLP's intermediate rows (0 in a mixture-of-experts layer).
  int64_t mlp_rows = 0;
  /// A mixture's experts on this rank, the rows of each, and the shared expert's rows.
  int64_t experts = 0, expert_rows = 0, shared_rows = 0;
};

/// Every rank's share of a model (CausalLM::split_plan; to_string prints it).
struct SplitPlan {
  std::string model;            ///< the config's source
  std::vector<double> weights;  ///< as given (empty: even)
  int64_t world = 1;
  std::vector<std::vector<LayerShare>> layers;  ///< [layer][rank]
  std::vector<int64_t> vocab_rows;              ///< per rank, padded rows
  /// Per rank: the bytes of the parameters and buffers the split cuts (projections,
  /// experts, embedding, LM head) and of those every rank holds whole (norms, routers).
  /// Filled by CausalLM::split_plan, which measures them; zero from plan_model_split.
  std::vector<int64_t> split_bytes, whole_bytes;

  /// A table: one row per layer and kind, one column per rank, then the vocabulary and
  /// the bytes with each rank's fraction beside its weight's.
  std::string to_string() const;
};

/// The plan of `config` (config.split_weights, the first `num_layers` layers, the
/// vocabulary padded to `pad_vocab_to_multiple_of`) over `world` ranks: every rank's units,
/// computed by the same calls the layers make. Throws c10::ValueError, on every rank alike,
/// when a weight cannot be honoured: a weight count other than `world`, a weight that is not
/// a finite positive number, a rank whose weight rounds to none of some layer's units where
/// the even split gives it some (the error names the layer, the units and the nearest
/// weights that work; a cut too coarse for every rank, one quant block of KV heads over two
/// ranks, leaves a rank idle at any weights, as it does evenly), or KV heads replicated over
/// groups of ranks whose weights differ (each group holds one KV head: the weights that work
/// are given).
SplitPlan plan_model_split(const ModelConfig& config, int64_t world, int64_t num_layers,
                           int64_t pad_vocab_to_multiple_of = 1);

}  // namespace tp
