#pragma once
// Losses and decoding on vocabulary-parallel logits, without gathering them.
//
// `local_logits` is [..., partition.range(rank).size()]: this rank's columns of the
// padded vocabulary (ParallelLMHead's output); its padding columns are ignored whatever
// they hold. Every rank passes the same `target` and gets the same result.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/layers/numerics/numerics.h"
#include "tp/shard/vocab.h"

namespace tp {

/// Megatron's vocab-parallel cross entropy: -log softmax(logits)[target] per row, with
/// the row max (all-gathered) and the sum of exponentials and the target logit
/// (all-reduced) as the only communication (a few floats per row, never the logits).
/// target: int64 [...] in [0, vocab_size), or `ignore_index` (loss 0, no gradient).
/// Returns [...] in float32 (float64 for float64 logits), the same on every rank. The
/// backward needs no communication: the gradient of the local logits is
/// (softmax - one_hot(target)) * grad, zero on padding columns.
/// Under invariant numerics (float32 / bfloat16 logits) the sum of exponentials is the
/// canonical sum over the vocabulary (tp/layers/numerics/numerics.h), so the loss has TP 1's bits.
/// Example: auto loss = tp::vocab_parallel_cross_entropy(head->forward(h), labels, head->partition(), comm).mean();
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                        const VocabPartition& partition, const Communicator& comm,
                                        int64_t ignore_index = -100, Numerics numerics = Numerics::kDefault);

/// The index of the largest logit of each row, over the whole vocabulary (padding
/// excluded): each rank's (max, index) are all-gathered and the largest wins; ties go to
/// the lowest token id, as at::argmax on the gathered logits would. Returns int64 [...],
/// the same on every rank. Not differentiable.
at::Tensor vocab_parallel_argmax(const at::Tensor& local_logits, const VocabPartition& partition,
                                 const Communicator& comm);

}  // namespace tp
