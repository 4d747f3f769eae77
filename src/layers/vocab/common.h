#pragma once
// What the vocabulary layers and the functions on their logits share: checking token ids
// and local logits, loading a [vocab, hidden] table's rows, zeroing padding rows, stacking
// every rank's tensor.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/range.h"
#include "tp/shard/vocab.h"

namespace tp::detail {

/// ids: an int64 / int32 tensor on `device` with every element in [0, vocab_size);
/// otherwise an error naming `layer`, the first offending id and where it is. The ids
/// are mirrored, so every rank raises the same error without communicating.
void check_token_ids(const char* layer, const at::Tensor& ids, int64_t vocab_size, const at::Device& device);

/// `logits` is this rank's local logits of `partition` ([..., its rows of the padded
/// vocabulary], floating point) and the communicator matches the partition; otherwise an
/// error naming `op`, the rank and the shapes.
void check_local_logits(const char* op, const at::Tensor& logits, const VocabPartition& partition,
                        const Communicator& comm);

/// Every rank's `t` stacked along a new dim 0: [world, ...] (an all-gather; every rank calls it).
at::Tensor gather_stacked(const at::Tensor& t, const Communicator& comm);

/// Loads rows `real` of `name` ([vocab_size, hidden], a floating dtype other than FP8)
/// into `weight` ([rows.size(), hidden], rows of the padded table) and zeroes the
/// padding rows. Shape and dtype are checked; errors name the layer, the tensor and the
/// numbers.
void load_vocab_rows(const char* layer, const Checkpoint& checkpoint, const std::string& name, int64_t vocab_size,
                     int64_t hidden, Range rows, Range real, at::Tensor& weight);

/// Zeroes the rows of `weight` (local rows `rows` of the padded table) outside `real`.
void zero_padding_rows(at::Tensor& weight, Range rows, Range real);

/// The whole [vocab_size, hidden] table from every rank's rows (`partition`; an
/// all-gather: every rank calls it), padding rows left out, as load_vocab_rows reads it.
at::Tensor gather_vocab_rows(const at::Tensor& weight, const VocabPartition& partition, const Communicator& comm);

}  // namespace tp::detail
