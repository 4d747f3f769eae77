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

#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/communicator_state.h"

namespace tp::detail {
namespace {

// Tags keep the phases apart (Gloo matches a send to a recv by peer and tag).
constexpr int kFoldInTag = 1;
constexpr int kFirstRoundTag = 2;  // round k uses kFirstRoundTag + k
constexpr int kFoldOutTag = 64;

/// Sends `send` to `send_to` and/or receives into `recv` from `recv_from` (either may
/// be absent), both in flight together; waits at most the timeout for each.
void transfer(const CommunicatorState& s, const char* op, const at::Tensor* send, int64_t send_to,
              const at::Tensor* recv, int64_t recv_from, int tag, const char* phase) {
  std::string step;
  try {
    c10::intrusive_ptr<c10d::Work> sent, received;
    std::vector<at::Tensor> send_list, recv_list;
    {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      if (recv != nullptr) {
        recv_list.push_back(*recv);
        received = s.group->recv(recv_list, static_cast<int>(recv_from), tag);
      }
      if (send != nullptr) {
        send_list.push_back(*send);
        sent = s.group->send(send_list, static_cast<int>(send_to), tag);
      }
    }
    if (received) {
      step = "receiving from rank " + std::to_string(recv_from);
      TORCH_CHECK(received->wait(s.options.timeout), "did not complete within ", s.options.timeout.count(), " ms");
    }
    if (sent) {
      step = "sending to rank " + std::to_string(send_to);
      TORCH_CHECK(sent->wait(s.options.timeout), "did not complete within ", s.options.timeout.count(), " ms");
    }
  } catch (const c10::Error& e) {
    collective_failed(s, op, std::string("recursive_doubling, ") + phase + ", " + step + ": " +
                                 e.what_without_backtrace());
  } catch (const std::exception& e) {
    collective_failed(s, op, std::string("recursive_doubling, ") + phase + ", " + step + ": " + e.what());
  }
}

at::ScalarType accumulate_type(at::ScalarType dtype) {
  if (dtype == at::kDouble) return at::kDouble;
  if (at::isFloatingType(dtype)) return at::kFloat;  // float32, float16, bfloat16
  return dtype;                                      // integers sum exactly in their own type
}

}  // namespace

void all_reduce_recursive_doubling(const CommunicatorState& s, at::Tensor& t, bool bf16_wire, const char* op) {
  const int64_t world = s.world;
  const int64_t rank = s.rank;
  const at::ScalarType acc = accumulate_type(t.scalar_type());
  const bool lossy = bf16_wire && t.scalar_type() == at::kFloat;
  // buf: this rank's running sum, [numel], CPU (send/recv move host memory).
  at::Tensor buf = t.to(at::kCPU, acc, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous).view({-1});
  at::Tensor incoming = at::empty(buf.sizes(), buf.options().dtype(lossy ? at::kBFloat16 : acc));

  int64_t p = 1;
  while (p * 2 <= world) p *= 2;
  const int64_t rem = world - p;

  // Fold in: of each pair (2i, 2i+1) below 2*rem, the even rank sits out the butterfly.
  int64_t vrank = rank - rem;  // rank in the power-of-two butterfly; -1: folded out
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      const at::Tensor wire = lossy ? buf.to(at::kBFloat16) : buf;
      transfer(s, op, &wire, rank + 1, nullptr, -1, kFoldInTag, "folding in");
      vrank = -1;
    } else {
      transfer(s, op, nullptr, -1, &incoming, rank - 1, kFoldInTag, "folding in");
      buf = at::add(incoming.to(acc), buf);  // the lower rank's data first
      vrank = rank / 2;
    }
  }

  if (vrank >= 0) {
    int round = 0;
    for (int64_t mask = 1; mask < p; mask <<= 1, ++round) {
      const int64_t vpeer = vrank ^ mask;
      const int64_t peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
      at::Tensor wire = buf;
      if (lossy) {
        // Both partners add the values as they travel: this rank's own rounded too.
        wire = buf.to(at::kBFloat16);
        buf = wire.to(at::kFloat);
      }
      const std::string phase = "round " + std::to_string(round);
      transfer(s, op, &wire, peer, &incoming, peer, kFirstRoundTag + round, phase.c_str());
      const at::Tensor theirs = lossy ? incoming.to(at::kFloat) : incoming;
      buf = peer < rank ? at::add(theirs, buf) : at::add(buf, theirs);
    }
  }

  // Fold out: the odd rank of each pair hands the result back, unrounded.
  if (rank < 2 * rem) {
    if (rank % 2 == 1) {
      transfer(s, op, &buf, rank - 1, nullptr, -1, kFoldOutTag, "folding out");
    } else {
      transfer(s, op, nullptr, -1, &buf, rank + 1, kFoldOutTag, "folding out");
    }
  }
  t.copy_(buf.view(t.sizes()));
}

}  // namespace tp::detail
