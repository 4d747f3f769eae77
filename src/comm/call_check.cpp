#include "comm/call_check.h"
#include "comm/run_collective.h"

#include <algorithm>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace tp::detail {
namespace {

constexpr int64_t kMaxDims = 8;

int64_t hash_values(c10::IntArrayRef values) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (int64_t v : values) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

const char* call_name(int64_t kind) {
  switch (static_cast<CallKind>(kind)) {
    case CallKind::kAllReduce: return "all_reduce";
    case CallKind::kAllGather: return "all_gather";
    case CallKind::kReduceScatter: return "reduce_scatter";
    case CallKind::kBroadcast: return "broadcast";
    case CallKind::kBarrier: return "barrier";
    case CallKind::kAllReduceFusion: return "all_reduce_fusion";
  }
  return "an unknown collective";
}

}  // namespace

Fingerprint fingerprint(CallKind kind, const at::Tensor* t, int64_t free_dim, int64_t dim_or_root,
                        std::optional<AllReduceStrategy> strategy, const std::vector<int64_t>* sizes,
                        std::optional<WirePrecision> wire) {
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
  if (wire) f[15] = static_cast<int64_t>(*wire);
  return f;
}

std::string describe(const Fingerprint& f) {
  std::ostringstream out;
  out << call_name(f[0]) << "(";
  if (f[13] == kRefusedCall) return call_name(f[0]) + std::string("(refused its own arguments: see that rank's error)");
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
  if (kind == CallKind::kAllReduceFusion) {
    out << ", fusion=" << std::hex << f[11] << ", eps bits " << f[14] << std::dec;
  }
  if (kind == CallKind::kAllGather || kind == CallKind::kReduceScatter) {
    out << ", dim=" << f[11] << ", sizes: " << f[13] << " entries, hash " << std::hex << f[14] << std::dec;
  }
  if (f[12] >= 0) {
    out << ", strategy=";
    if (f[12] <= static_cast<int64_t>(AllReduceStrategy::kRecursiveDoubling)) {
      out << static_cast<AllReduceStrategy>(f[12]);
    } else {
      out << "#" << f[12];  // a strategy this build does not know
    }
  }
  if (f[15] >= 0) {
    out << ", wire=";
    if (f[15] <= static_cast<int64_t>(WirePrecision::kBFloat16)) {
      out << static_cast<WirePrecision>(f[15]);
    } else {
      out << "#" << f[15];
    }
  }
  out << ")";
  return out.str();
}

void calls_disagree(const CommunicatorState& s, const char* op, const Fingerprint& mine, int64_t rank,
                    const Fingerprint& theirs) {
  std::string hint;
  if (mine[0] == theirs[0] && (mine[12] != theirs[12] || mine[15] != theirs[15])) {
    hint =
        " The ranks chose different all-reduce strategies or wire precisions: check that TP_ALLREDUCE, "
        "TP_ALLREDUCE_WIRE, TP_ALLREDUCE_TABLE, CommunicatorOptions and the layers' Options are the "
        "same on every rank.";
  }
  TORCH_CHECK_VALUE(false, op_name(op), ": the ranks disagree on this collective: rank ", s.rank, " called ",
                    describe(mine), " while rank ", rank, " called ", describe(theirs),
                    ". Every rank must make the same collective calls in the same order, with "
                    "the same dtype and shape (only all_gather's extents along dim may differ).",
                    hint);
}

void verify_call(const CommunicatorState& s, const char* op, const Fingerprint& mine, at::Device device) {
  if (!s.options.verify_calls) return;
  // Once the ranks share a shared-memory workspace, every collective's fingerprint goes
  // through it (one flag round trip instead of a process-group allgather). All
  // collectives use the one sequence there, so a rank in all_reduce and a peer in,
  // say, barrier still meet at the same step and both see the mismatch.
  if (s.shm) {
    s.shm->exchange(mine, op,
                    [&](int64_t rank, const Fingerprint& theirs) { calls_disagree(s, op, mine, rank, theirs); });
    return;
  }
  at::Tensor local = at::tensor(c10::IntArrayRef(mine.data(), mine.size()), at::kLong).to(device);
  std::vector<at::Tensor> inputs{local};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < s.world; ++r) outputs[0].push_back(at::empty_like(local));
  c10d::AllgatherOptions opts;
  opts.timeout = s.options.timeout;
  run_collective(s, op, device.is_cpu(), [&] { return s.group->allgather(outputs, inputs, opts); });
  for (int64_t r = 0; r < s.world; ++r) {
    const at::Tensor theirs_t = outputs[0][r].cpu();
    Fingerprint theirs;
    std::copy(theirs_t.data_ptr<int64_t>(), theirs_t.data_ptr<int64_t>() + theirs.size(), theirs.begin());
    if (theirs != mine) calls_disagree(s, op, mine, r, theirs);
  }
}

}  // namespace tp::detail
