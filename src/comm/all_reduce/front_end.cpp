// all_reduce's front end: which strategy and wire precision a call takes, whether it
// can run here, the bookkeeping that makes the choice observable, and the dispatch to
// the algorithms (process_group.cpp, recursive_doubling.cpp, shared_memory.cpp).

#include <iostream>
#include <sstream>

#include <ATen/ATen.h>

#include "comm/all_reduce/front_end.h"
#include "comm/all_reduce/process_group.h"
#include "comm/all_reduce/recursive_doubling.h"
#include "comm/all_reduce/select.h"
#include "comm/call_check.h"
#include "comm/collectives.h"
#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "comm/run_collective.h"

namespace tp {
namespace detail {
namespace {

bool applies_bf16_wire(AllReduceStrategy s) {
  return s == AllReduceStrategy::kSharedMemoryOneShot || s == AllReduceStrategy::kSharedMemoryTwoShot ||
         s == AllReduceStrategy::kRecursiveDoubling;
}

std::string host_list(const CommunicatorState& s) {
  std::ostringstream out;
  for (size_t r = 0; r < s.host_ids.size(); ++r)
    out << (r ? ", " : "") << "rank " << r << " on '" << s.host_ids[r] << "'";
  return out.str();
}

void log_choice(const CommunicatorState& s, const at::Tensor& t, AllReduceStrategy requested, AllReduceStrategy taken,
                WirePrecision wire, const char* op) {
  std::ostringstream line;
  const char* why = requested != AllReduceStrategy::kAuto              ? "requested by the call"
                    : s.env_all_reduce                                 ? "forced by TP_ALLREDUCE"
                    : s.options.all_reduce != AllReduceStrategy::kAuto ? "forced by CommunicatorOptions::all_reduce"
                                                                       : nullptr;
  line << "[tp comm] rank " << s.rank << "/" << s.world << " " << op << " " << t.scalar_type() << t.sizes() << " "
       << t.numel() * static_cast<int64_t>(t.element_size()) << " bytes -> " << taken << " (";
  if (why != nullptr) {
    line << why;
  } else {
    line << "auto: table " << s.table->source << ", ranks_on_one_host=" << (s.ranks_on_one_host ? 1 : 0);
  }
  line << "), wire " << wire << "\n";
  std::cerr << line.str() << std::flush;  // one write per line: ranks as threads do not interleave
}

}  // namespace

void check_possible(const CommunicatorState& s, AllReduceStrategy taken, const at::Tensor& t, const char* op) {
  if (taken == AllReduceStrategy::kNccl || taken == AllReduceStrategy::kNcclBf16Wire) {
    check_nccl_strategy(s.group.get(), taken, t, op_name(op));
    return;
  }
  if (!is_shared_memory(taken)) return;
  TORCH_CHECK_VALUE(t.is_cpu(), op_name(op), ": strategy ", taken, " reduces CPU tensors only; got a tensor on ",
                    t.device(),
                    ". Use auto, process_group or recursive_doubling for device tensors (check "
                    "TP_ALLREDUCE and CommunicatorOptions::all_reduce)");
  TORCH_CHECK_VALUE(shm_supports_dtype(t.scalar_type()), op_name(op), ": strategy ", taken,
                    " supports float32, float64, bfloat16 and float16; got ", t.scalar_type(),
                    ". Use auto, process_group or recursive_doubling for this tensor");
  TORCH_CHECK_VALUE(s.ranks_on_one_host, op_name(op), ": strategy ", taken,
                    " needs every rank on this host, "
                    "but rank ",
                    s.rank, " of world_size ", s.world, " found the ranks on different hosts (", host_list(s),
                    "). Use auto, process_group or recursive_doubling (check TP_ALLREDUCE, "
                    "CommunicatorOptions::all_reduce and the layers' Options)");
}

ShmAllReduce& shm_workspace(const CommunicatorState& s) {
  if (!s.shm) {
    s.shm = std::make_unique<ShmAllReduce>(
        s.rank, s.world, s.options.timeout, [&](at::Tensor& t) { broadcast_impl(s, t, 0); }, [&] { barrier_impl(s); });
  }
  return *s.shm;
}

void count_call(const CommunicatorState& s, const at::Tensor& t, AllReduceStrategy requested, AllReduceStrategy taken,
                WirePrecision wire, const char* op) {
  {
    std::lock_guard<std::mutex> lock(s.counts_mutex);
    ++s.counts[taken];
    ++s.wire_counts[wire];
  }
  if (s.debug) log_choice(s, t, requested, taken, wire, op);
}

AllReduceStrategy resolve_strategy(const CommunicatorState& s, AllReduceStrategy requested, const at::Tensor& t) {
  if (requested != AllReduceStrategy::kAuto) return requested;
  if (s.env_all_reduce) return *s.env_all_reduce;
  if (s.options.all_reduce != AllReduceStrategy::kAuto) return s.options.all_reduce;
  const AllReduceStrategy chosen =
      select_all_reduce(t.is_cuda(), s.world, static_cast<int64_t>(t.numel() * t.element_size()), t.scalar_type(),
                        s.ranks_on_one_host, *s.table);
  TORCH_INTERNAL_ASSERT(chosen != AllReduceStrategy::kAuto, "select_all_reduce returned kAuto");
  return chosen;
}

WirePrecision resolve_wire(const CommunicatorState& s, WirePrecision requested, AllReduceStrategy taken,
                           const at::Tensor& t) {
  WirePrecision w = requested;
  if (w == WirePrecision::kDefault) w = s.env_wire.value_or(s.options.wire);
  if (w == WirePrecision::kBFloat16 && (t.scalar_type() != at::kFloat || !applies_bf16_wire(taken))) {
    return WirePrecision::kNative;
  }
  return w;
}

void all_reduce_impl(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy requested, WirePrecision wire_req,
                     const char* op, bool verify) {
  TORCH_CHECK_VALUE(t.defined(), op_name(op), ": the tensor is undefined");
  const auto dtype = t.scalar_type();
  TORCH_CHECK_TYPE(dtype != at::kBool && !at::isComplexType(dtype), op_name(op), ": dtype ", dtype,
                   " cannot be summed; expected a floating-point or integer tensor");
  ensure_host_ids(s, op);
  const AllReduceStrategy taken = resolve_strategy(s, requested, t);
  check_possible(s, taken, t, op);
  const WirePrecision wire = resolve_wire(s, wire_req, taken, t);
  count_call(s, t, requested, taken, wire, op);
  // Shapes agree across ranks, so every rank skips an empty tensor alike.
  if (s.world == 1 || t.numel() == 0) return;
  // A shared-memory all_reduce compares the fingerprints in the same step as its data
  // (see verify_call): the process group's allgather would cost several times the
  // reduction it guards. The first one (which creates the workspace) still verifies
  // over the process group, so a peer in another collective gets the mismatch message.
  const bool shm_step = is_shared_memory(taken) && s.shm != nullptr;
  const Fingerprint mine = fingerprint(CallKind::kAllReduce, &t, -1, -1, taken, nullptr, wire);
  if (verify && !shm_step) verify_call(s, op, mine, t.device());
  run_all_reduce(s, t, taken, wire == WirePrecision::kBFloat16, op,
                 verify && shm_step && s.options.verify_calls ? &mine : nullptr);
}

void run_all_reduce(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy taken, bool bf16, const char* op,
                    const Fingerprint* shm_fingerprint) {
  switch (taken) {
    case AllReduceStrategy::kProcessGroup: all_reduce_process_group(s, t, op); return;
    case AllReduceStrategy::kRecursiveDoubling: all_reduce_recursive_doubling(s, t, bf16, op); return;
    case AllReduceStrategy::kSharedMemoryOneShot:
    case AllReduceStrategy::kSharedMemoryTwoShot:
      shm_workspace(s).run(
          t, taken == AllReduceStrategy::kSharedMemoryTwoShot, bf16, op, shm_fingerprint,
          [&](int64_t rank, const Fingerprint& theirs) { calls_disagree(s, op, *shm_fingerprint, rank, theirs); });
      return;
    case AllReduceStrategy::kNccl:
      // The group's allreduce, which check_possible has established is NCCL's.
      all_reduce_process_group(s, t, op);
      return;
    case AllReduceStrategy::kNcclBf16Wire: all_reduce_bf16_wire(s, t, op); return;
    case AllReduceStrategy::kAuto: break;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled all-reduce strategy ", to_string(taken));
}

}  // namespace detail

at::Tensor& Communicator::all_reduce(at::Tensor& t, AllReduceStrategy strategy, WirePrecision wire) const {
  detail::all_reduce_impl(*state_, t, strategy, wire, "all_reduce", /*verify=*/true);
  return t;
}

AllReduceStrategy Communicator::resolve_all_reduce(const at::Tensor& t, AllReduceStrategy strategy) const {
  TORCH_CHECK_VALUE(t.defined(), "tp::Communicator::resolve_all_reduce: the tensor is undefined");
  detail::ensure_host_ids(*state_, "resolve_all_reduce");
  return detail::resolve_strategy(*state_, strategy, t);
}

}  // namespace tp
