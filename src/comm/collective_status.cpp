#include "tp/comm/collective_status.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>
#include <vector>

namespace tp {

namespace {

// One rank's status as exchanged: [0] the outcome, [1, 4) zero, [4, 8) the message
// length (little-endian), [8, kRecordBytes) the message. Fixed-size, so that the
// exchange itself cannot disagree in size between ranks.
constexpr int64_t kRecordBytes = 4096;
constexpr size_t kMaxMessage = kRecordBytes - 8;

enum class Outcome : uint8_t {
  kOk = 0,
  kError = 1,
  kValueError = 2,
  kTypeError = 3,
  kIndexError = 4,
  kNotImplemented = 5
};

struct Status {
  Outcome outcome = Outcome::kOk;
  std::string message;
};

at::Tensor encode(const Status& s) {
  at::Tensor out = at::zeros({kRecordBytes}, at::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  std::string msg = s.message;
  if (msg.size() > kMaxMessage) {
    const std::string cut = " ... (message cut to fit the status exchange)";
    msg = msg.substr(0, kMaxMessage - cut.size()) + cut;
  }
  p[0] = static_cast<uint8_t>(s.outcome);
  const auto n = static_cast<uint32_t>(msg.size());
  for (int i = 0; i < 4; ++i) p[4 + i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(p + 8, msg.data(), msg.size());
  return out;
}

Status decode(const uint8_t* p) {
  Status s;
  s.outcome = p[0] <= static_cast<uint8_t>(Outcome::kNotImplemented) ? static_cast<Outcome>(p[0]) : Outcome::kError;
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | p[4 + i];
  s.message.assign(reinterpret_cast<const char*>(p + 8), std::min<size_t>(n, kMaxMessage));
  return s;
}

// What `fn` did on this rank. The most specific c10 type first: they derive from c10::Error.
Status run_local(const std::function<void()>& fn) {
  try {
    fn();
    return {};
  } catch (const c10::ValueError& e) {
    return {Outcome::kValueError, e.what_without_backtrace()};
  } catch (const c10::TypeError& e) {
    return {Outcome::kTypeError, e.what_without_backtrace()};
  } catch (const c10::IndexError& e) {
    return {Outcome::kIndexError, e.what_without_backtrace()};
  } catch (const c10::NotImplementedError& e) {
    return {Outcome::kNotImplemented, e.what_without_backtrace()};
  } catch (const c10::Error& e) {
    return {Outcome::kError, e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {Outcome::kError, e.what()};
  } catch (...) {
    return {Outcome::kError, "an exception that is not a std::exception"};
  }
}

// Where the group exchanges small host data: its CPU backend (Gloo) if it has one,
// else its device (an NCCL-only group handed in from Python).
at::Device exchange_device(const Communicator& comm) {
  const auto group = comm.process_group();
  const auto devices = group->getDeviceTypes();
  const bool has_cpu =
      devices.empty() || std::any_of(devices.begin(), devices.end(), [](const c10::Device& d) { return d.is_cpu(); });
  return has_cpu ? at::Device(at::kCPU) : devices.front();
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// "<what> failed on rank 2 of 4: <msg>", or on several ranks, grouped by message.
std::string compose(const std::string& what, const std::vector<Status>& all) {
  const int64_t world = static_cast<int64_t>(all.size());
  std::vector<std::pair<std::string, std::vector<int64_t>>> groups;  // message -> ranks, by first rank
  int64_t failed = 0;
  for (int64_t r = 0; r < world; ++r) {
    if (all[r].outcome == Outcome::kOk) continue;
    ++failed;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[r].message; });
    if (it == groups.end()) {
      groups.push_back({all[r].message, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::ostringstream out;
  out << what << " failed on ";
  if (groups.size() == 1) {
    const auto& ranks = groups.front().second;
    if (failed == world && world > 1) {
      out << "every rank (" << world << " of " << world << ")";
    } else {
      out << (ranks.size() == 1 ? "rank " : "ranks ") << rank_list(ranks) << " of " << world;
    }
    out << ": " << groups.front().first;
    return out.str();
  }
  out << failed << " of " << world << " ranks:";
  for (const auto& [message, ranks] : groups)
    out << "\n  " << (ranks.size() == 1 ? "rank " : "ranks ") << rank_list(ranks) << ": " << message;
  return out.str();
}

// Throws `message` as the error type `outcome` names.
void raise(Outcome outcome, const std::string& message) {
  if (outcome == Outcome::kValueError) TORCH_CHECK_VALUE(false, message);
  if (outcome == Outcome::kTypeError) TORCH_CHECK_TYPE(false, message);
  if (outcome == Outcome::kIndexError) TORCH_CHECK_INDEX(false, message);
  if (outcome == Outcome::kNotImplemented) TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  TORCH_CHECK(false, message);
}

}  // namespace

void run_collectively(const Communicator& comm, const std::string& what, const std::function<void()>& fn) {
  if (comm.world_size() == 1) {
    fn();
    return;
  }
  const Status mine = run_local(fn);
  const int64_t world = comm.world_size();
  const at::Tensor local = encode(mine).to(exchange_device(comm));
  const at::Tensor gathered = comm.all_gather(local, 0, std::vector<int64_t>(world, kRecordBytes)).cpu();
  const uint8_t* p = gathered.data_ptr<uint8_t>();
  std::vector<Status> all;
  all.reserve(world);
  for (int64_t r = 0; r < world; ++r) all.push_back(decode(p + r * kRecordBytes));
  const auto first = std::find_if(all.begin(), all.end(), [](const Status& s) { return s.outcome != Outcome::kOk; });
  if (first == all.end()) return;
  raise(first->outcome, compose(what, all));
}

}  // namespace tp
