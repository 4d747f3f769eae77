#pragma once
// all_reduce's front end: resolves the strategy and wire precision of a call, validates,
// counts, and hands the tensor to the algorithm (front_end.cpp).

#include <ATen/core/Tensor.h>

#include "comm/communicator_state.h"
#include "tp/comm/all_reduce_strategy.h"

namespace tp::detail {

/// The strategy a call takes: `requested` unless kAuto, else TP_ALLREDUCE, else
/// CommunicatorOptions::all_reduce, else the selector over the table. Never kAuto.
AllReduceStrategy resolve_strategy(const CommunicatorState& s, AllReduceStrategy requested, const at::Tensor& t);

/// The wire precision a call uses once `taken` is known: kNative or kBFloat16 (the
/// latter only for float32 tensors and the strategies that apply it).
WirePrecision resolve_wire(const CommunicatorState& s, WirePrecision requested, AllReduceStrategy taken,
                           const at::Tensor& t);

/// Validates, resolves and counts the strategy, then reduces `t` in place. `verify`:
/// exchange an all_reduce fingerprint first (the caller has not checked agreement).
void all_reduce_impl(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy requested, WirePrecision wire,
                     const char* op, bool verify);

}  // namespace tp::detail
