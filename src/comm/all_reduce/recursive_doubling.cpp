// The recursive_doubling strategy: a butterfly over the process group's
// point-to-point send/recv. With p the largest power of two <= world and
// rem = world - p, the first 2*rem ranks pair up (2i, 2i+1): the even one hands its
// input to the odd one and waits; the p remaining ranks exchange whole partial sums
// with partner rank ^ 2^k for k = 0..log2(p)-1; then every odd rank of the first
// 2*rem hands the result back to its even partner. ceil(log2 world) rounds of
// latency instead of the ring's 2 (world - 1), at the cost of sending the whole
// message each round: the algorithm for small messages across hosts.
//
// Bitwise identical on every rank: each butterfly round adds exactly the two values
// both partners hold (their own and the partner's, both as sent on the wire), lower
// rank's first, so after round k the 2^k ranks of a block hold the same bits; the
// folded-out ranks receive those bits unrounded. Sums accumulate in fp32 (fp64 for
// float64, the integer type for integers).
//
// Its element-wise work runs serially on the calling thread (see point_to_point.h:
// parallel ATen ops here made it 40-120 ms per call from 256 KiB).

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/all_reduce/recursive_doubling.h"
#include "comm/communicator_state.h"
#include "comm/point_to_point.h"
#include "comm/run_collective.h"

namespace tp::detail {
namespace {

// Tags keep the phases apart (Gloo matches a send to a recv by peer and tag).
constexpr int kFoldInTag = 1;
constexpr int kFirstRoundTag = 2;  // round k uses kFirstRoundTag + k
constexpr int kFoldOutTag = 64;

}  // namespace

void all_reduce_recursive_doubling(const CommunicatorState& s, at::Tensor& t, bool bf16_wire, const char* op) {
  const int64_t world = s.world;
  const int64_t rank = s.rank;
  const at::ScalarType acc = accumulate_type(t.scalar_type());
  const bool lossy = bf16_wire && t.scalar_type() == at::kFloat;
  const at::ScalarType wire_type = lossy ? at::kBFloat16 : acc;
  // buf: this rank's running sum, [numel], CPU (send/recv move host memory). A
  // non-contiguous or device input is first copied as it is (a plain copy).
  const at::Tensor input = t.to(at::kCPU).contiguous().view({-1});
  at::Tensor buf = converted(input, acc);

  int64_t p = 1;
  int rounds = 0;
  while (p * 2 <= world) {
    p *= 2;
    ++rounds;
  }
  const int64_t rem = world - p;
  const bool folded = rank < 2 * rem;  // one of a pair that folds into a single butterfly rank
  const bool sits_out = folded && rank % 2 == 0;
  const int64_t vrank = sits_out ? -1 : folded ? rank / 2 : rank - rem;  // rank in the butterfly
  auto real_rank = [&](int64_t v) { return v < rem ? v * 2 + 1 : v + rem; };

  // Every receive is posted up front, into its own buffer: a peer's send then finds
  // its receive already waiting (Gloo's rendezvous costs no extra round trip), and no
  // round waits on anything but its data. Sends are waited for only at the end.
  std::vector<Transfer> recvs;  // in the order they are consumed
  std::vector<Transfer> sends;
  {
    std::lock_guard<std::mutex> lock(cpu_start_mutex());
    if (folded && !sits_out) {
      recvs.push_back(post(s, op, "recursive_doubling", false, at::empty(buf.sizes(), buf.options().dtype(wire_type)),
                           rank - 1, kFoldInTag, "folding in"));
    }
    if (!sits_out) {
      for (int r = 0; r < rounds; ++r) {
        recvs.push_back(post(s, op, "recursive_doubling", false, at::empty(buf.sizes(), buf.options().dtype(wire_type)),
                             real_rank(vrank ^ (int64_t{1} << r)), kFirstRoundTag + r, "round " + std::to_string(r)));
      }
    }
    if (sits_out) {
      // Receives the result straight into buf, unrounded, after handing in its input.
      const at::Tensor wire = converted(buf, wire_type);
      sends.push_back(post(s, op, "recursive_doubling", true, wire, rank + 1, kFoldInTag, "folding in"));
      recvs.push_back(post(s, op, "recursive_doubling", false, buf, rank + 1, kFoldOutTag, "folding out"));
    }
  }
  size_t next = 0;
  if (folded && !sits_out) {
    wait(s, op, recvs[next]);
    buf = added(recvs[next++].tensors[0], buf, acc);  // the lower rank's data first
  }
  if (!sits_out) {
    for (int r = 0; r < rounds; ++r) {
      const int64_t peer = real_rank(vrank ^ (int64_t{1} << r));
      at::Tensor wire = buf;
      if (lossy) {
        // Both partners add the values as they travel: this rank's own rounded too.
        wire = converted(buf, at::kBFloat16);
        buf = converted(wire, at::kFloat);
      }
      {
        std::lock_guard<std::mutex> lock(cpu_start_mutex());
        sends.push_back(
            post(s, op, "recursive_doubling", true, wire, peer, kFirstRoundTag + r, "round " + std::to_string(r)));
      }
      wait(s, op, recvs[next]);
      const at::Tensor& theirs = recvs[next++].tensors[0];
      buf = peer < rank ? added(theirs, buf, acc) : added(buf, theirs, acc);
    }
    if (folded) {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      sends.push_back(post(s, op, "recursive_doubling", true, buf, rank - 1, kFoldOutTag, "folding out"));
    }
  } else {
    wait(s, op, recvs[next++]);  // the result, into buf
  }
  for (Transfer& x : sends) wait(s, op, x);
  if (t.is_cpu() && t.is_contiguous()) {
    at::Tensor flat = t.view({-1});
    copy_serially(flat, buf);
  } else {
    t.copy_(buf.view(t.sizes()));
  }
}

}  // namespace tp::detail
