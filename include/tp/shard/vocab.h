#pragma once
// How a vocabulary (the rows of an embedding table, the columns of the logits) is split
// over ranks, with optional padding so every rank's rows are a multiple of a chosen size.

#include <cstdint>
#include <vector>

#include "tp/shard/range.h"

namespace tp {

/// The vocabulary's split. Token ids are global: rank r owns rows `ranges[r]` of the
/// padded table, of which `real(r)` are tokens; the rest (at the end of the last ranks'
/// slices) are padding rows, zero in the weight, never a token, never a logit that
/// counts.
/// Example: partition_vocab(500, 3, 64): padded 512 = 8 units of 64 -> [0,192) [192,384)
/// [384,512); rank 2's real tokens are [384,500), its rows 116..127 are padding.
struct VocabPartition {
  int64_t vocab_size = 0;   ///< real tokens
  int64_t padded_size = 0;  ///< vocab_size rounded up to pad_to_multiple_of
  int64_t pad_to_multiple_of = 1;
  std::vector<Range> ranges;  ///< per rank, in padded rows; they tile [0, padded_size)

  int64_t world_size() const { return static_cast<int64_t>(ranges.size()); }
  /// Rank r's rows of the padded table.
  const Range& range(int64_t rank) const { return ranges.at(rank); }
  /// Rank r's real tokens, [begin, min(end, vocab_size)) (possibly empty).
  Range real(int64_t rank) const;
  /// The rank that owns token `id` (0 <= id < vocab_size).
  int64_t owner(int64_t id) const;
};

/// Splits `vocab_size` tokens over `world` ranks: the vocabulary is padded to a multiple
/// of `pad_to_multiple_of` (1: no padding) and split in whole units of that size, the
/// remainder units one each to the first ranks (tp::split's even policy), so slices may
/// differ by one unit and a rank may own none. With `weights` (one per rank), each rank's
/// units are within one of units * w[r] / sum(w) (tp::split's weighted policy).
/// ShardError for non-positive arguments or weights tp::split refuses.
VocabPartition partition_vocab(int64_t vocab_size, int64_t world, int64_t pad_to_multiple_of = 1,
                               const std::vector<double>& weights = {});

}  // namespace tp
