#pragma once
// Sampling a token per row from vocabulary-parallel logits, without gathering them.
//
// The filters are transformers' sampling warpers, in their order: repetition penalty,
// temperature, top-k, top-p, min-p; then one draw from the softmax of what is left. The
// draw is the Gumbel-max trick with the randomness a pure function of (seed, step, row,
// global token id) (sampling_uniform): every token's noise is the same whichever rank
// holds it, so for the same logits the sampled token is the same at every TP size, and
// equal to a single-device sampler given the same draws. What travels, per row:
//   - the row's maximum (one value per rank);
//   - top-k: each rank's k best (value, id) pairs;
//   - top-p: the normalizer (one value per rank), then each rank's best candidates, 64 at
//     first, 8 times more each round until the nucleus is settled (a token's place in the
//     global order is known once it beats every rank's last candidate sent): one round for
//     a peaked distribution, several (and up to every token) for a nearly flat one;
//   - the winner: one (value, id) pair per rank.
// Never the logits. Every rank passes the same params, step and previous tokens, and gets
// the same tokens.
// One caveat to "the same at every TP size": top-p compares a token's cumulative probability
// with top_p through the normalizer, a float64 sum whose last bit depends on how the
// vocabulary is split; a cumulative probability within ~1e-15 of top_p can fall on either side.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/shard/vocab.h"

namespace tp {

/// What sampling does (transformers' GenerationConfig names and defaults).
struct SamplingParams {
  /// 0: greedy (the argmax, after the repetition penalty); else the logits are divided by it.
  double temperature = 1.0;
  /// Keep the top_k largest logits (ties at the k-th all kept); 0: off.
  int64_t top_k = 0;
  /// Keep the smallest set of most probable tokens whose probability reaches top_p; 1: off.
  double top_p = 1.0;
  /// Keep tokens whose probability is at least min_p times the largest; 0: off.
  double min_p = 0.0;
  /// transformers' (CTRL's): a token already in the row has its logit divided by it where
  /// positive, multiplied where negative; 1: off.
  double repetition_penalty = 1.0;
  /// The randomness: the same seed gives the same tokens.
  uint64_t seed = 0;

  /// c10::ValueError naming the field unless every field is in range.
  void validate() const;
};

/// The uniform draw in (0, 1) for (seed, step, row, token): splitmix64 over the four, its top
/// 53 bits, centred in their interval. The same on every rank, TP size and machine.
double sampling_uniform(uint64_t seed, int64_t step, int64_t row, int64_t token);

/// One token per row of `local_logits` ([rows, this rank's rows of the padded vocabulary],
/// any floating dtype; padding columns ignored), int64 [rows], the same on every rank.
/// `step` tells the draws of one call from another's (generate passes the position);
/// `previous`: int64 [rows, n] token ids already in each row (prompt and generated; may be
/// undefined), for the repetition penalty. `first_row`: the global index of row 0, whose
/// draws row r takes as row first_row + r (attention data parallelism: the rows of the groups
/// before this one, so a prompt draws the same in whichever group it runs). Not differentiable.
at::Tensor vocab_parallel_sample(const at::Tensor& local_logits, const VocabPartition& partition,
                                 const Communicator& comm, const SamplingParams& params, int64_t step,
                                 const at::Tensor& previous = at::Tensor(), int64_t first_row = 0);

}  // namespace tp
