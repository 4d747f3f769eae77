#pragma once
// Attention data parallelism (TensorRT-LLM's enable_attention_dp; SGLang's DP attention):
// a world of W ranks as D groups of T = W / D consecutive ranks. Each group runs its own
// requests: its attention (heads split over its T ranks, or whole when T = 1: no KV head
// replicated), its KV cache, its embedding and LM head (the vocabulary split over its T
// ranks), on its own batch (any prompt count, zero included, and length). The MLP, or a
// mixture's experts, runs over all W ranks on every group's tokens: each rank hands on its
// piece of its group's tokens (tp::sequence_ranges over the group), the pieces are
// all-gathered over the world, the MLP's partial sums reduce-scattered back to the pieces,
// and each group all-gathers its pieces again:
//
//   group g:  x_g --attention (T ranks)--> h_g --norm--> piece of h_g ──┐
//                                                                    all-gather (W ranks)
//   every rank:                      MLP over W ranks on every group's tokens (partial sums)
//                                                                    reduce-scatter (W ranks)
//   group g:  h_g + mlp_g  <--all-gather (T ranks)-- this rank's piece ─┘
//
// The parameters outside the MLP are replicated over the D groups (one copy per group, cut
// over its T ranks): in training their gradients are summed over the groups
// (CausalLM::reduce_data_parallel_grads), as data parallelism does.

#include <cstdint>

#include "tp/comm/communicator.h"

namespace tp {

/// One rank's place in an attention-data-parallel world, and the communicators it needs.
struct AttentionDataParallel {
  /// D: the number of groups (1: plain tensor parallelism, every rank one group).
  int64_t size = 1;
  /// This rank's group (rank / T).
  int64_t group = 0;
  /// Every rank: the MLP's and the experts' collectives.
  Communicator world;
  /// This rank's group of T ranks: the attention's, the embedding's and the LM head's.
  Communicator attention;
  /// The D ranks holding the same attention shard, one in each group: their replicated
  /// parameters' gradients are summed over it.
  Communicator replicas;

  bool enabled() const { return size > 1; }

  /// Plain tensor parallelism over `world`: every communicator is `world` itself (local).
  static AttentionDataParallel none(const Communicator& world);
  /// `size` groups over `world` (its world size a multiple of `size`; errors name both).
  /// Collective: every rank calls it, in the same order as its other collectives (it
  /// forms the groups' communicators).
  static AttentionDataParallel make(const Communicator& world, int64_t size);
};

}  // namespace tp
