// Which host each rank runs on, so that shared memory is used only when every rank
// can map the same segment. Agreed by all ranks: each publishes its host id through
// the process group's allgather at its first collective and all compare the same list.

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/communicator_state.h"
#include "comm/host_identity.h"
#include "comm/run_collective.h"

namespace tp::detail {
namespace {

// Fixed-size records: the exchange itself can never disagree in size. A longer id is
// cut, with an FNV-1a hash of the whole id in the last 16 characters.
constexpr int64_t kIdBytes = 128;

std::string fit(const std::string& id) {
  if (static_cast<int64_t>(id.size()) < kIdBytes) return id;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return id.substr(0, kIdBytes - 17) + hex;
}

}  // namespace

std::string local_host_id(const CommunicatorOptions& options) {
  if (!options.host_id.empty()) return options.host_id;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "unknown-host");
  std::string id(name);
  // Two machines (or VMs) can share a hostname; they do not share a boot id.
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) id += "/" + boot_id;
  return id;
}

void ensure_host_ids(const CommunicatorState& s, const char* op) {
  std::lock_guard<std::mutex> lock(s.hosts_mutex);
  if (s.hosts_known) return;
  s.host_ids.clear();
  if (s.world == 1) {
    s.ranks_on_one_host = true;
    s.hosts_known = true;
    return;
  }
  const std::string mine = fit(local_host_id(s.options));
  // On CPU when the group has a CPU backend (Gloo), else on its device (an NCCL-only
  // group handed in from Python).
  const auto devices = s.group->getDeviceTypes();
  const bool has_cpu =
      devices.empty() || std::any_of(devices.begin(), devices.end(), [](const c10::Device& d) { return d.is_cpu(); });
  const at::Device device = has_cpu ? at::Device(at::kCPU) : devices.front();
  at::Tensor local = at::zeros({kIdBytes}, at::kByte);
  std::memcpy(local.data_ptr<uint8_t>(), mine.data(), mine.size());
  local = local.to(device);
  std::vector<at::Tensor> inputs{local};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(local));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, device.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });
  for (int64_t r = 0; r < s.world; ++r) {
    const at::Tensor theirs = outputs[0][r].cpu();
    const char* p = reinterpret_cast<const char*>(theirs.data_ptr<uint8_t>());
    s.host_ids.emplace_back(p, strnlen(p, kIdBytes));
  }
  s.ranks_on_one_host = std::all_of(s.host_ids.begin(), s.host_ids.end(),
                                    [&](const std::string& id) { return id == s.host_ids.front(); });
  s.hosts_known = true;
}

}  // namespace tp::detail
