#pragma once
// all_reduce's front end: resolves the strategy and wire precision of a call, validates,
// counts, and hands the tensor to the algorithm (front_end.cpp).

#include <ATen/core/Tensor.h>

#include "comm/call_check.h"
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

/// A strategy that cannot run here (a forced shared-memory strategy across hosts, for
/// a device tensor or an unsupported dtype; NCCL without an NCCL group) is an error.
/// Every rank sees the same tensor and settings, so all throw alike and none waits.
void check_possible(const CommunicatorState& s, AllReduceStrategy taken, const at::Tensor& t, const char* op);

/// Counts the call in all_reduce_counts (and the wire in its counts); with
/// TP_COMM_DEBUG=1, one line on stderr naming the strategy taken and why.
void count_call(const CommunicatorState& s, const at::Tensor& t, AllReduceStrategy requested, AllReduceStrategy taken,
                WirePrecision wire, const char* op);

/// The communicator's shared-memory workspace, created on first use (a collective:
/// every rank gets here at the same call, as the strategy is agreed).
ShmAllReduce& shm_workspace(const CommunicatorState& s);

/// Validates, resolves and counts the strategy, then reduces `t` in place. `verify`:
/// exchange an all_reduce fingerprint first (the caller has not checked agreement).
void all_reduce_impl(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy requested, WirePrecision wire,
                     const char* op, bool verify);

/// Reduces `t` in place with `taken` (resolved and checked): the algorithms' dispatch.
/// `shm_fingerprint`: a shared-memory strategy compares it in its data step (null: no
/// check there).
void run_all_reduce(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy taken, bool bf16, const char* op,
                    const Fingerprint* shm_fingerprint);

}  // namespace tp::detail
