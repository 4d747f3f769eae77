#include "tp/comm/communicator.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/communicator_access.h"
#include "comm/env.h"
#include "comm/nccl.h"
#include "comm/select.h"
#include "comm/shm_all_reduce.h"

namespace tp {

namespace detail {

/// What a Communicator handle shares with its copies.
struct CommunicatorState {
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // null for the default world-1 communicator
  int64_t rank = 0;
  int64_t world = 1;
  CommunicatorOptions options;
  /// TP_ALLREDUCE, parsed once at construction; nullopt when unset or "auto".
  std::optional<AllReduceStrategy> env_all_reduce;
  /// Every rank runs on this host (see Communicator::ranks_on_one_host).
  bool ranks_on_one_host = true;
  /// The shared-memory workspace, created by the first shared-memory all_reduce.
  mutable std::unique_ptr<ShmAllReduce> shm;

  mutable std::mutex counts_mutex;
  mutable std::map<AllReduceStrategy, int64_t> counts;  // guarded by counts_mutex
};

}  // namespace detail

namespace {

using detail::CommunicatorState;

constexpr std::chrono::milliseconds kDefaultTimeout{300000};

std::optional<AllReduceStrategy> all_reduce_from_env() {
  const auto v = detail::env_value("TP_ALLREDUCE");
  if (!v) return std::nullopt;
  AllReduceStrategy s = AllReduceStrategy::kAuto;
  try {
    s = parse_all_reduce_strategy(*v);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "TP_ALLREDUCE='", *v, "' is not a valid all-reduce strategy: ",
                      e.what_without_backtrace(), ". Unset TP_ALLREDUCE to let tp choose.");
  }
  if (s == AllReduceStrategy::kAuto) return std::nullopt;
  return s;
}

void check_timeout(const CommunicatorOptions& options) {
  TORCH_CHECK_VALUE(options.timeout.count() > 0, "tp::Communicator: options.timeout=",
                    options.timeout.count(), " ms; expected a positive number of milliseconds");
}

std::string op_name(const char* op) { return std::string("tp::Communicator::") + op; }

void check_defined(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), op_name(op), ": the tensor is undefined");
}

/// `dim` wrapped into [0, ndim).
int64_t wrap_dim(const at::Tensor& t, int64_t dim, const char* op) {
  const int64_t n = t.dim();
  TORCH_CHECK_INDEX(n > 0, op_name(op), ": dim=", dim, " is invalid for a 0-dimensional tensor; ",
                    "expected a tensor with at least one dimension");
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op_name(op), ": dim=", dim, " is out of range for a ", n,
                    "-D tensor of shape ", t.sizes(), " (dim should be in the ", -n, "..", n - 1,
                    " range)");
  return dim < 0 ? dim + n : dim;
}

/// One extent per rank, none negative.
void check_sizes(const CommunicatorState& s, const std::vector<int64_t>& sizes, const char* op) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(sizes.size()) == s.world, op_name(op), ": sizes has ",
                    sizes.size(), " entries but world_size is ", s.world,
                    "; pass one extent per rank");
  for (size_t r = 0; r < sizes.size(); ++r) {
    TORCH_CHECK_VALUE(sizes[r] >= 0, op_name(op), ": sizes[", r, "]=", sizes[r],
                      " is negative; expected extents >= 0 (sizes=", c10::IntArrayRef(sizes), ")");
  }
}

/// Rethrows whatever a collective threw (or its timeout) as a c10::Error that says
/// which collective, where, and what usually causes it.
[[noreturn]] void collective_failed(const CommunicatorState& s, const char* op,
                                    const std::string& original) {
  TORCH_CHECK(false, op_name(op), " failed on rank ", s.rank, " of world_size ", s.world,
              " (timeout ", s.options.timeout.count(),
              " ms). Likely causes: a peer rank died or stopped calling collectives, or the ranks "
              "passed different shapes or dtypes to the same collective. The timeout is "
              "CommunicatorOptions::timeout (default from TP_COMM_TIMEOUT_MS). Do not use this "
              "communicator's group again: its connections are in an unknown state. Original "
              "error: ",
              original);
}

/// Held while a CPU collective is being started (not while it runs). torch 2.11's
/// ProcessGroupGloo::enqueue records every op in the process-wide FlightRecorder, whose
/// recordWithResetEnabled reads and inserts into a std::map (all_pg_status_) before
/// taking its own lock: several groups of one process (run_ranks_in_threads) starting
/// collectives at once corrupt it (seen as a segfault in _Rb_tree_insert_and_rebalance).
/// Starting a Gloo op never waits for peers, so holding this cannot deadlock. Not
/// taken for device collectives: NCCL's first op initialises its communicator and
/// blocks until every rank arrives.
std::mutex& cpu_start_mutex() {
  static std::mutex m;
  return m;
}

/// Starts a collective with `start()` and waits for it, at most the configured timeout.
/// `cpu`: the op runs on a CPU backend (see cpu_start_mutex).
template <typename Start>
void run_collective(const CommunicatorState& s, const char* op, bool cpu, Start&& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work;
    if (cpu) {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      work = start();
    } else {
      work = start();
    }
    if (!cpu && detail::current_stream_capturing()) {
      // Inside CUDA-graph capture the op exists only in the graph: no host wait (it
      // would query an event that is never recorded); the stream orders it.
      work->wait();
    } else {
      TORCH_CHECK(work->wait(s.options.timeout), "the collective did not complete within ",
                  s.options.timeout.count(), " ms");
    }
  } catch (const c10::Error& e) {
    collective_failed(s, op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    collective_failed(s, op, e.what());
  }
}

AllReduceStrategy resolve(const CommunicatorState& s, AllReduceStrategy requested,
                          const at::Tensor& t) {
  if (requested != AllReduceStrategy::kAuto) return requested;
  if (s.env_all_reduce) return *s.env_all_reduce;
  if (s.options.all_reduce != AllReduceStrategy::kAuto) return s.options.all_reduce;
  const AllReduceStrategy chosen = detail::select_all_reduce(
      t.is_cuda(), s.world, static_cast<int64_t>(t.numel() * t.element_size()), t.scalar_type(),
      s.ranks_on_one_host);
  TORCH_INTERNAL_ASSERT(chosen != AllReduceStrategy::kAuto, "select_all_reduce returned kAuto");
  return chosen;
}

/// Which collective a fingerprint describes.
enum class CallKind : int64_t {
  kAllReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kBroadcast = 4,
  kBarrier = 5,
};

const char* call_name(int64_t kind) {
  switch (static_cast<CallKind>(kind)) {
    case CallKind::kAllReduce:
      return "all_reduce";
    case CallKind::kAllGather:
      return "all_gather";
    case CallKind::kReduceScatter:
      return "reduce_scatter";
    case CallKind::kBroadcast:
      return "broadcast";
    case CallKind::kBarrier:
      return "barrier";
  }
  return "an unknown collective";
}

/// One rank's view of a collective call, in a fixed-size record so that exchanging
/// it can never itself disagree in size. Layout (int64):
///   [0] kind  [1] dtype (-1: none)  [2] ndim (-1: none)  [3..11) dims, -1 for the
///   dimension whose extent may differ (all_gather), or, past kMaxDims, [3] a hash
///   [11] dim or root (-1: none)  [12] strategy (-1: none)  [13] number of sizes
///   [14] hash of sizes  [15] unused
using Fingerprint = std::array<int64_t, 16>;
constexpr int64_t kMaxDims = 8;

int64_t hash_values(c10::IntArrayRef values) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (int64_t v : values) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

Fingerprint fingerprint(CallKind kind, const at::Tensor* t, int64_t free_dim, int64_t dim_or_root,
                        std::optional<AllReduceStrategy> strategy,
                        const std::vector<int64_t>* sizes) {
  Fingerprint f;
  f.fill(-1);
  f[0] = static_cast<int64_t>(kind);
  if (t != nullptr) {
    f[1] = static_cast<int64_t>(t->scalar_type());
    f[2] = t->dim();
    std::vector<int64_t> shape = t->sizes().vec();
    if (free_dim >= 0) shape[free_dim] = -1;
    if (t->dim() <= kMaxDims) {
      std::copy(shape.begin(), shape.end(), f.begin() + 3);
    } else {
      f[3] = hash_values(shape);
    }
  }
  f[11] = dim_or_root;
  if (strategy) f[12] = static_cast<int64_t>(*strategy);
  if (sizes != nullptr) {
    f[13] = static_cast<int64_t>(sizes->size());
    f[14] = hash_values(*sizes);
  }
  return f;
}

std::string describe(const Fingerprint& f) {
  std::ostringstream out;
  out << call_name(f[0]) << "(";
  if (f[1] >= 0) {
    out << "dtype=" << static_cast<at::ScalarType>(f[1]) << ", shape=[";
    if (f[2] > kMaxDims) {
      out << f[2] << " dims, hash " << std::hex << f[3] << std::dec;
    } else {
      for (int64_t i = 0; i < f[2]; ++i) {
        out << (i ? ", " : "");
        if (f[3 + i] < 0) {
          out << "*";
        } else {
          out << f[3 + i];
        }
      }
    }
    out << "]";
  }
  const auto kind = static_cast<CallKind>(f[0]);
  if (kind == CallKind::kBroadcast) out << ", root=" << f[11];
  if (kind == CallKind::kAllGather || kind == CallKind::kReduceScatter) {
    out << ", dim=" << f[11] << ", sizes: " << f[13] << " entries, hash " << std::hex << f[14]
        << std::dec;
  }
  if (f[12] >= 0) {
    out << ", strategy=";
    if (f[12] <= static_cast<int64_t>(AllReduceStrategy::kSharedMemoryTwoShot)) {
      out << static_cast<AllReduceStrategy>(f[12]);
    } else {
      out << "#" << f[12];  // a strategy this build does not know
    }
  }
  out << ")";
  return out.str();
}

[[noreturn]] void calls_disagree(const CommunicatorState& s, const char* op, const Fingerprint& mine,
                                 int64_t rank, const Fingerprint& theirs) {
  TORCH_CHECK_VALUE(false, op_name(op), ": the ranks disagree on this collective: rank ", s.rank,
                    " called ", describe(mine), " while rank ", rank, " called ", describe(theirs),
                    ". Every rank must make the same collective calls in the same order, with "
                    "the same dtype and shape (only all_gather's extents along dim may differ).");
}

/// Exchanges `mine` with every rank; every rank throws if any two disagree (each
/// differs from at least one other, so none is left waiting).
void verify_call(const CommunicatorState& s, const char* op, const Fingerprint& mine,
                 at::Device device) {
  if (!s.options.verify_calls) return;
  // Once the ranks share a shared-memory workspace, every collective's fingerprint goes
  // through it (one flag round trip instead of a process-group allgather). All
  // collectives use the one sequence there, so a rank in all_reduce and a peer in,
  // say, barrier still meet at the same step and both see the mismatch.
  if (s.shm) {
    s.shm->exchange(mine, op, [&](int64_t rank, const Fingerprint& theirs) {
      calls_disagree(s, op, mine, rank, theirs);
    });
    return;
  }
  at::Tensor local = at::tensor(c10::IntArrayRef(mine.data(), mine.size()), at::kLong).to(device);
  std::vector<at::Tensor> inputs{local};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(local));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, device.is_cpu(),
                 [&] { return s.group->allgather(outputs, inputs, opts); });
  for (int64_t r = 0; r < s.world; ++r) {
    const at::Tensor theirs_t = outputs[0][r].cpu();
    Fingerprint theirs;
    std::copy(theirs_t.data_ptr<int64_t>(), theirs_t.data_ptr<int64_t>() + theirs.size(),
              theirs.begin());
    if (theirs != mine) calls_disagree(s, op, mine, r, theirs);
  }
}

/// The process group's own allreduce (Gloo: ring reduce-scatter + allgather). Each
/// element's final value is computed once, by the rank owning its ring segment, and
/// then copied to the others, so every rank ends with the same bits; the
/// "bitwise identical across ranks" tests check it at world 2, 3 and 4.
void all_reduce_process_group(const CommunicatorState& s, at::Tensor& t, const char* op) {
  // half / bfloat16 are summed in fp32: rounding after every hop of the ring would
  // lose bits at each rank boundary.
  const bool widen = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  at::Tensor buf = widen ? t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true,
                                at::MemoryFormat::Contiguous)
                         : t.contiguous();
  std::vector<at::Tensor> bufs{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = s.options.timeout;
  run_collective(s, op, buf.is_cpu(), [&] { return s.group->allreduce(bufs, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

/// float32 sent as bf16: every rank's message gathered, then summed in fp32 in rank
/// order (comm/nccl.h), so the ranks agree bitwise and the sum keeps fp32 precision;
/// only each rank's contribution is rounded to bf16.
void all_reduce_bf16_wire(const CommunicatorState& s, at::Tensor& t, const char* op) {
  // As bytes, so any backend moves it (not every one has a bf16 allgather).
  std::vector<at::Tensor> inputs{detail::bf16_wire_message(t).view(at::kByte)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, t.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });
  for (auto& piece : outputs[0]) piece = piece.view(at::kBFloat16);
  detail::sum_bf16_wire(outputs[0], t);
}

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root);
void barrier_impl(const CommunicatorState& s);

bool is_shared_memory(AllReduceStrategy strategy) {
  return strategy == AllReduceStrategy::kSharedMemoryOneShot ||
         strategy == AllReduceStrategy::kSharedMemoryTwoShot;
}

/// A forced strategy that cannot run here is an error (every rank sees the same
/// tensor and settings, so all ranks throw alike and none is left waiting).
void check_possible(const CommunicatorState& s, AllReduceStrategy taken, const at::Tensor& t,
                    const char* op) {
  if (taken == AllReduceStrategy::kNccl || taken == AllReduceStrategy::kNcclBf16Wire) {
    detail::check_nccl_strategy(s.group.get(), taken, t, op_name(op));
    return;
  }
  if (!is_shared_memory(taken)) return;
  TORCH_CHECK_VALUE(t.is_cpu(), op_name(op), ": strategy ", taken,
                    " reduces CPU tensors only; got a tensor on ", t.device(),
                    ". Use auto or process_group for device tensors (check TP_ALLREDUCE and "
                    "CommunicatorOptions::all_reduce)");
  TORCH_CHECK_VALUE(detail::shm_supports_dtype(t.scalar_type()), op_name(op), ": strategy ", taken,
                    " supports float32, float64, bfloat16 and float16; got ", t.scalar_type(),
                    ". Use auto or process_group for this tensor");
  TORCH_CHECK_VALUE(s.ranks_on_one_host, op_name(op), ": strategy ", taken, " needs every rank on "
                    "this host, which is not known for this communicator (rank ", s.rank,
                    " of world_size ", s.world, "): only run_ranks_in_threads, "
                    "make_gloo_communicator and connect_tcp/communicator_from_env over a loopback "
                    "MASTER_ADDR establish it. Use auto or process_group");
}

/// The communicator's shared-memory workspace, created on first use (a collective:
/// every rank gets here at the same call, as the strategy is agreed).
detail::ShmAllReduce& shm_workspace(const CommunicatorState& s) {
  if (!s.shm) {
    s.shm = std::make_unique<detail::ShmAllReduce>(
        s.rank, s.world, s.options.timeout, [&](at::Tensor& t) { broadcast_impl(s, t, 0); },
        [&] { barrier_impl(s); });
  }
  return *s.shm;
}

/// Validates, resolves and counts the strategy, then reduces `t` in place. `verify`:
/// exchange an all_reduce fingerprint first (the caller has not checked agreement).
void all_reduce_impl(const CommunicatorState& s, at::Tensor& t, AllReduceStrategy requested,
                     const char* op, bool verify) {
  check_defined(t, op);
  const auto dtype = t.scalar_type();
  TORCH_CHECK_TYPE(dtype != at::kBool && !at::isComplexType(dtype), op_name(op), ": dtype ",
                   dtype, " cannot be summed; expected a floating-point or integer tensor");
  const AllReduceStrategy taken = resolve(s, requested, t);
  check_possible(s, taken, t, op);
  {
    std::lock_guard<std::mutex> lock(s.counts_mutex);
    ++s.counts[taken];
  }
  // Shapes agree across ranks, so every rank skips an empty tensor alike.
  if (s.world == 1 || t.numel() == 0) return;
  // A shared-memory all_reduce compares the fingerprints in the same step as its data
  // (see verify_call): the process group's allgather would cost several times the
  // reduction it guards. The first one (which creates the workspace) still verifies
  // over the process group, so a peer in another collective gets the mismatch message.
  const bool shm_step = is_shared_memory(taken) && s.shm != nullptr;
  const Fingerprint mine = fingerprint(CallKind::kAllReduce, &t, -1, -1, taken, nullptr);
  if (verify && !shm_step) verify_call(s, op, mine, t.device());
  switch (taken) {
    case AllReduceStrategy::kProcessGroup:
      all_reduce_process_group(s, t, op);
      return;
    case AllReduceStrategy::kSharedMemoryOneShot:
    case AllReduceStrategy::kSharedMemoryTwoShot:
      shm_workspace(s).run(t, taken == AllReduceStrategy::kSharedMemoryTwoShot, op,
                           verify && shm_step && s.options.verify_calls ? &mine : nullptr,
                           [&](int64_t rank, const Fingerprint& theirs) {
                             calls_disagree(s, op, mine, rank, theirs);
                           });
      return;
    case AllReduceStrategy::kNccl:
      // The group's allreduce, which check_possible has established is NCCL's.
      all_reduce_process_group(s, t, op);
      return;
    case AllReduceStrategy::kNcclBf16Wire:
      all_reduce_bf16_wire(s, t, op);
      return;
    case AllReduceStrategy::kAuto:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled all-reduce strategy ", to_string(taken));
}

/// A contiguous tensor's bytes as a 1-D uint8 view (so byte-moving collectives work
/// for every dtype, bool and complex included).
at::Tensor as_bytes(const at::Tensor& contiguous) {
  return contiguous.view({-1}).view(at::kByte);
}

void broadcast_impl(const CommunicatorState& s, at::Tensor& t, int64_t root) {
  const char* op = "broadcast";
  check_defined(t, op);
  TORCH_CHECK_VALUE(root >= 0 && root < s.world, op_name(op), ": invalid root ", root,
                    " (root should be in the 0..", s.world - 1, " range)");
  if (s.world == 1 || t.numel() == 0) return;
  verify_call(s, op, fingerprint(CallKind::kBroadcast, &t, -1, root, std::nullopt, nullptr),
              t.device());
  at::Tensor buf = t.contiguous();
  std::vector<at::Tensor> bufs{as_bytes(buf)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  opts.timeout = s.options.timeout;
  run_collective(s, op, buf.is_cpu(), [&] { return s.group->broadcast(bufs, opts); });
  if (!buf.is_same(t)) t.copy_(buf);
}

void barrier_impl(const CommunicatorState& s) {
  if (s.world == 1) return;
  // The fingerprint travels on CPU when the group has a CPU backend (Gloo), else on
  // the group's device (an NCCL-only group handed in from Python).
  const auto devices = s.group->getDeviceTypes();
  const bool has_cpu = devices.empty() || std::any_of(devices.begin(), devices.end(),
                                                      [](const c10::Device& d) { return d.is_cpu(); });
  verify_call(s, "barrier", fingerprint(CallKind::kBarrier, nullptr, -1, -1, std::nullopt, nullptr),
              has_cpu ? at::Device(at::kCPU) : devices.front());
  c10d::BarrierOptions opts;
  opts.timeout = s.options.timeout;
  // Straight to the backend: ProcessGroup::barrier assigns a function-static tensor,
  // a data race when several ranks of one process (run_ranks_in_threads) call it at
  // once. Its CPU kernel ends in the same backend call.
  const bool gloo = s.group->getBackendType() == c10d::ProcessGroup::BackendType::GLOO;
  run_collective(s, "barrier", gloo, [&] { return s.group->getDefaultBackend()->barrier(opts); });
}

}  // namespace

void detail::CommunicatorAccess::set_ranks_on_one_host(Communicator& comm, bool on_one_host) {
  comm.state_->ranks_on_one_host = on_one_host || comm.state_->world == 1;
}

std::chrono::milliseconds CommunicatorOptions::default_timeout() {
  const auto v = detail::env_value("TP_COMM_TIMEOUT_MS");
  if (!v) return kDefaultTimeout;
  const auto ms = detail::parse_int64(*v);
  TORCH_CHECK_VALUE(ms && *ms > 0, "TP_COMM_TIMEOUT_MS='", *v,
                    "' is not a valid timeout: expected a positive integer number of milliseconds "
                    "(e.g. 60000); unset it for the default of ",
                    kDefaultTimeout.count(), " ms");
  return std::chrono::milliseconds(*ms);
}

bool CommunicatorOptions::default_verify_calls() {
  const auto v = detail::env_value("TP_COMM_VERIFY");
  if (!v) return true;
  TORCH_CHECK_VALUE(*v == "0" || *v == "1", "TP_COMM_VERIFY='", *v,
                    "' is not valid: expected 1 (verify every collective's shapes across ranks, the default) "
                    "or 0 (skip the check: one small allgather less per collective)");
  return *v == "1";
}

Communicator::Communicator() : state_(std::make_shared<detail::CommunicatorState>()) {
  state_->env_all_reduce = all_reduce_from_env();
}

Communicator::Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                           CommunicatorOptions options)
    : state_(std::make_shared<detail::CommunicatorState>()) {
  TORCH_CHECK_VALUE(group, "tp::Communicator: the process group is null; use tp::Communicator() ",
                    "for world size 1");
  check_timeout(options);
  state_->group = group;
  state_->rank = group->getRank();
  state_->world = group->getSize();
  TORCH_CHECK_VALUE(state_->world >= 1 && state_->rank >= 0 && state_->rank < state_->world,
                    "tp::Communicator: the process group reports rank ", state_->rank,
                    " of world_size ", state_->world, "; expected 0 <= rank < world_size");
  state_->options = options;
  state_->env_all_reduce = all_reduce_from_env();
  // A group handed in from outside may span hosts; launchers that know better say so
  // through CommunicatorAccess.
  state_->ranks_on_one_host = state_->world == 1;
}

int64_t Communicator::rank() const { return state_->rank; }

int64_t Communicator::world_size() const { return state_->world; }

const CommunicatorOptions& Communicator::options() const { return state_->options; }

c10::intrusive_ptr<c10d::ProcessGroup> Communicator::process_group() const {
  return state_->group;
}

bool Communicator::ranks_on_one_host() const { return state_->ranks_on_one_host; }

at::Tensor& Communicator::all_reduce(at::Tensor& t, AllReduceStrategy strategy) const {
  all_reduce_impl(*state_, t, strategy, "all_reduce", /*verify=*/true);
  return t;
}

at::Tensor Communicator::all_gather(const at::Tensor& t, int64_t dim,
                                    const std::vector<int64_t>& sizes) const {
  const CommunicatorState& s = *state_;
  const char* op = "all_gather";
  check_defined(t, op);
  const int64_t d = wrap_dim(t, dim, op);
  check_sizes(s, sizes, op);
  TORCH_CHECK_VALUE(sizes[s.rank] == t.size(d), op_name(op), ": sizes[", s.rank, "]=",
                    sizes[s.rank], " but this rank's tensor has extent ", t.size(d), " along dim ",
                    d, " (shape ", t.sizes(), "); sizes[r] must be rank r's extent");
  if (s.world == 1) return t;
  verify_call(s, op, fingerprint(CallKind::kAllGather, &t, d, d, std::nullopt, &sizes), t.device());

  // Every rank pads its piece to the largest extent so the group's allgather sees
  // equal sizes; each piece is cut back to its own extent afterwards.
  const int64_t max_extent = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> padded_shape = t.sizes().vec();  // t's shape with dim d = max_extent
  padded_shape[d] = max_extent;
  std::vector<int64_t> out_shape = t.sizes().vec();  // t's shape with dim d = sum(sizes)
  out_shape[d] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t padded_numel = c10::multiply_integers(padded_shape);
  // Every rank computes the same padded_numel (other dims agree), so all skip alike.
  if (padded_numel == 0) return at::empty(out_shape, t.options());

  at::Tensor padded;
  if (t.size(d) == max_extent) {
    padded = t.contiguous();
  } else {
    padded = at::zeros(padded_shape, t.options());
    padded.narrow(d, 0, t.size(d)).copy_(t);
  }
  std::vector<at::Tensor> inputs{as_bytes(padded)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, t.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });

  std::vector<at::Tensor> pieces;
  pieces.reserve(s.world);
  for (int64_t r = 0; r < s.world; ++r) {
    pieces.push_back(
        outputs[0][r].view(t.scalar_type()).view(padded_shape).narrow(d, 0, sizes[r]));
  }
  return at::cat(pieces, d);
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& t, int64_t dim,
                                        const std::vector<int64_t>& sizes) const {
  const CommunicatorState& s = *state_;
  const char* op = "reduce_scatter";
  check_defined(t, op);
  const int64_t d = wrap_dim(t, dim, op);
  check_sizes(s, sizes, op);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  TORCH_CHECK_VALUE(total == t.size(d), op_name(op), ": sizes ", c10::IntArrayRef(sizes),
                    " add up to ", total, " but the tensor has extent ", t.size(d), " along dim ",
                    d, " (shape ", t.sizes(), "); the slices must cover it exactly");
  if (s.world == 1) {
    at::Tensor alias = t;  // counted and validated like world > 1; the reduction is a no-op
    all_reduce_impl(s, alias, AllReduceStrategy::kAuto, op, /*verify=*/false);
    return t;
  }
  verify_call(s, op,
              fingerprint(CallKind::kReduceScatter, &t, -1, d,
                          resolve(s, AllReduceStrategy::kAuto, t), &sizes),
              t.device());
  // A full all-reduce, then this rank's slice: simple and correct, and every rank's
  // slice is bitwise what the others computed for it. A bandwidth-optimal version
  // (the group's reduce_scatter on padded slices, 1/world of the traffic) is future
  // work. The all-reduce is counted in all_reduce_counts like any other.
  at::Tensor sum = t.clone(at::MemoryFormat::Contiguous);
  all_reduce_impl(s, sum, AllReduceStrategy::kAuto, op, /*verify=*/false);
  const int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + s.rank, int64_t{0});
  // clone: do not keep the whole reduced tensor alive behind a narrow view.
  return sum.narrow(d, offset, sizes[s.rank]).clone(at::MemoryFormat::Contiguous);
}

void Communicator::broadcast(at::Tensor& t, int64_t root) const { broadcast_impl(*state_, t, root); }

void Communicator::barrier() const { barrier_impl(*state_); }

std::map<AllReduceStrategy, int64_t> Communicator::all_reduce_counts() const {
  std::lock_guard<std::mutex> lock(state_->counts_mutex);
  return state_->counts;
}

}  // namespace tp
