#include "tp/shard/vocab.h"

#include <algorithm>
#include <string>

#include "tp/shard/split.h"

namespace tp {

Range VocabPartition::real(int64_t rank) const {
  const Range& r = range(rank);
  return {std::min(r.begin, vocab_size), std::min(r.end, vocab_size)};
}

int64_t VocabPartition::owner(int64_t id) const {
  // Padding rows belong to a rank but are no token.
  for (int64_t r = 0; id >= 0 && id < vocab_size && r < world_size(); ++r) {
    if (id >= ranges[r].begin && id < ranges[r].end) return r;
  }
  throw ShardError("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                   ")");
}

VocabPartition partition_vocab(int64_t vocab_size, int64_t world, int64_t pad_to_multiple_of,
                               const std::vector<double>& weights) {
  if (vocab_size <= 0) throw ShardError("vocab_size must be positive; got " + std::to_string(vocab_size));
  if (world <= 0) throw ShardError("world_size must be positive; got " + std::to_string(world));
  if (pad_to_multiple_of <= 0)
    throw ShardError("pad_to_multiple_of must be positive (1: no padding); got " + std::to_string(pad_to_multiple_of));
  VocabPartition p;
  p.vocab_size = vocab_size;
  p.pad_to_multiple_of = pad_to_multiple_of;
  p.padded_size = round_up(vocab_size, pad_to_multiple_of);
  p.ranges =
      split(p.padded_size, world, SplitPolicy{}.with_granularity(pad_to_multiple_of).with_weights(weights), "vocab");
  return p;
}

}  // namespace tp
