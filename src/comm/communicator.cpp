// Communicator: construction (settings from options and the environment, the tuning
// table, the host-id exchange) and the accessors. The collectives live in
// all_reduce/front_end.cpp (with one file per algorithm beside it) and collectives.cpp.

#include "tp/comm/communicator.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "common/env.h"

namespace tp {
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
    TORCH_CHECK_VALUE(false, "TP_ALLREDUCE='", *v, "' is not a valid all-reduce strategy: ", e.what_without_backtrace(),
                      ". Unset TP_ALLREDUCE to let tp choose.");
  }
  if (s == AllReduceStrategy::kAuto) return std::nullopt;
  return s;
}

std::optional<WirePrecision> wire_from_env() {
  const auto v = detail::env_value("TP_ALLREDUCE_WIRE");
  if (!v) return std::nullopt;
  WirePrecision w = WirePrecision::kDefault;
  try {
    w = parse_wire_precision(*v);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "TP_ALLREDUCE_WIRE='", *v, "' is not a valid wire precision: ", e.what_without_backtrace(),
                      ". Unset TP_ALLREDUCE_WIRE for native precision.");
  }
  if (w == WirePrecision::kDefault) return std::nullopt;
  return w;
}

bool debug_from_env() {
  const auto v = detail::env_value("TP_COMM_DEBUG");
  if (!v) return false;
  TORCH_CHECK_VALUE(*v == "0" || *v == "1", "TP_COMM_DEBUG='", *v,
                    "' is not valid: expected 1 (log every all_reduce's strategy on stderr) or 0 (quiet, the default)");
  return *v == "1";
}

/// The settings every communicator reads the same way, world 1 included.
void init_settings(CommunicatorState& s) {
  s.env_all_reduce = all_reduce_from_env();
  s.env_wire = wire_from_env();
  s.debug = debug_from_env();
  TORCH_CHECK_VALUE(s.options.wire != WirePrecision::kDefault,
                    "tp::Communicator: options.wire=default; expected "
                    "native or bf16 (kDefault is for a call: 'use the communicator's setting')");
  if (s.options.all_reduce_table.empty()) {
    s.table = std::shared_ptr<const AllReduceTable>(&AllReduceTable::builtin(), [](const AllReduceTable*) {});
  } else {
    s.table = std::make_shared<const AllReduceTable>(AllReduceTable::load(s.options.all_reduce_table));
  }
}

}  // namespace

void detail::check_settings(const CommunicatorOptions& options) {
  CommunicatorState s;
  s.options = options;
  init_settings(s);
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

std::string CommunicatorOptions::default_all_reduce_table() {
  return detail::env_value("TP_ALLREDUCE_TABLE").value_or("");
}

std::string CommunicatorOptions::default_host_id() { return detail::env_value("TP_COMM_HOST_ID").value_or(""); }

Communicator::Communicator() : state_(std::make_shared<CommunicatorState>()) {
  init_settings(*state_);
  state_->hosts_known = true;  // world 1: trivially on one host
}

Communicator::Communicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group, CommunicatorOptions options)
    : state_(std::make_shared<CommunicatorState>()) {
  TORCH_CHECK_VALUE(group, "tp::Communicator: the process group is null; use tp::Communicator() ", "for world size 1");
  TORCH_CHECK_VALUE(options.timeout.count() > 0, "tp::Communicator: options.timeout=", options.timeout.count(),
                    " ms; expected a positive number of milliseconds");
  CommunicatorState& s = *state_;
  s.group = group;
  s.rank = group->getRank();
  s.world = group->getSize();
  TORCH_CHECK_VALUE(s.world >= 1 && s.rank >= 0 && s.rank < s.world,
                    "tp::Communicator: the process group reports rank ", s.rank, " of world_size ", s.world,
                    "; expected 0 <= rank < world_size");
  s.options = std::move(options);
  init_settings(s);
}

namespace {

// The parent's Gloo backend for CPU tensors, or null.
c10d::ProcessGroupGloo* gloo_backend(c10d::ProcessGroup& group) {
  try {
    return dynamic_cast<c10d::ProcessGroupGloo*>(group.getBackend(c10::DeviceType::CPU).get());
  } catch (const c10::Error&) {  // no backend for CPU tensors (an NCCL-only group)
    return nullptr;
  }
}

// The group of `ranks` (this rank the `mine`-th) inside `parent`. Over Gloo a new Gloo
// backend on the parent's store under a prefix of its own and the parent's devices (Gloo's
// own split needs the global ranks a group made by hand does not record); over another
// backend (NCCL), the backend's split.
c10::intrusive_ptr<c10d::ProcessGroup> split_group(c10d::ProcessGroup& parent, const std::vector<int64_t>& ranks,
                                                   int64_t mine, const std::string& name,
                                                   const CommunicatorOptions& options) {
  auto* gloo = gloo_backend(parent);
  if (gloo == nullptr) {
    return parent.splitGroup(std::vector<int>(ranks.begin(), ranks.end()), options.timeout, std::nullopt, name, name);
  }
  const auto store = c10::make_intrusive<c10d::PrefixStore>(name, parent.getStore());
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices = gloo->getOptions()->devices;
  const int rank = static_cast<int>(mine), size = static_cast<int>(ranks.size());
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    group->setBackend(device, c10d::ProcessGroup::BackendType::GLOO, c10::intrusive_ptr<c10d::Backend>(backend));
  }
  return group;
}

}  // namespace

Communicator Communicator::split(const std::vector<int64_t>& ranks) const {
  const auto& s = *state_;
  const int64_t mine = std::find(ranks.begin(), ranks.end(), s.rank) - ranks.begin();
  std::vector<int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  TORCH_CHECK_VALUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() && !sorted.empty() &&
                        sorted.front() >= 0 && sorted.back() < s.world && mine < static_cast<int64_t>(ranks.size()),
                    "tp::Communicator::split: rank ", s.rank, " of world_size ", s.world, " asked for the group ",
                    c10::IntArrayRef(ranks), "; expected distinct ranks in 0..", s.world - 1, " including ", s.rank);
  // splitGroup numbers the new group's ranks in increasing order.
  TORCH_CHECK_VALUE(std::is_sorted(ranks.begin(), ranks.end()), "tp::Communicator::split: the group ",
                    c10::IntArrayRef(ranks), " must list its ranks in increasing order");
  // A number for the new groups that no earlier split over this store used (a communicator
  // made again over the same process group starts its own count at 0): the store's counter,
  // read by rank 0 and broadcast. Over a backend without a store of ours (NCCL) the count.
  int64_t n = s.splits.fetch_add(1);
  if (gloo_backend(*s.group) != nullptr && s.group->getStore()) {
    at::Tensor seq = at::zeros({1}, at::kLong);
    if (s.rank == 0) seq.fill_(s.group->getStore()->add("tp_split_seq", 1));
    broadcast(seq, 0);
    n = seq.item<int64_t>();
  }
  if (ranks.size() == 1) return Communicator();
  // Each group named by the call's number and its ranks, so no two groups share keys in
  // the parent's store.
  std::string name = "tp_split_" + std::to_string(n);
  for (int64_t r : ranks) name += "_" + std::to_string(r);
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = split_group(*s.group, ranks, mine, name, s.options);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tp::Communicator::split: rank ", s.rank, " could not form the group ", c10::IntArrayRef(ranks),
                ": ", e.what_without_backtrace());
  }
  TORCH_CHECK(group, "tp::Communicator::split: the process group's backend cannot split (group ",
              c10::IntArrayRef(ranks), ")");
  TORCH_INTERNAL_ASSERT(group->getSize() == static_cast<int>(ranks.size()) && group->getRank() == mine);
  // As make_gloo: every rank of the new group is connected when this returns.
  Communicator out(group, s.options);
  out.barrier();
  return out;
}

int64_t Communicator::rank() const { return state_->rank; }

int64_t Communicator::world_size() const { return state_->world; }

const CommunicatorOptions& Communicator::options() const { return state_->options; }

c10::intrusive_ptr<c10d::ProcessGroup> Communicator::process_group() const { return state_->group; }

bool Communicator::ranks_on_one_host() const {
  detail::ensure_host_ids(*state_, "ranks_on_one_host");
  return state_->ranks_on_one_host;
}

const AllReduceTable& Communicator::all_reduce_table() const { return *state_->table; }

std::map<AllReduceStrategy, int64_t> Communicator::all_reduce_counts() const {
  std::lock_guard<std::mutex> lock(state_->counts_mutex);
  return state_->counts;
}

std::map<WirePrecision, int64_t> Communicator::all_reduce_wire_counts() const {
  std::lock_guard<std::mutex> lock(state_->counts_mutex);
  return state_->wire_counts;
}

}  // namespace tp
