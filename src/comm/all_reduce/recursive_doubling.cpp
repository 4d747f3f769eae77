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
// Its element-wise work (widening, adding, rounding to the wire) runs on the calling
// thread only, in pieces below ATen's grain size. A parallel ATen op leaves its
// OpenMP workers spinning for a while after it returns (libgomp's wait policy), and
// with as many busy threads as cores they keep Gloo's transport thread, which moves
// the data, off the CPU: measured with 2 processes on 2 cores, 4-12 ms per call at
// 4-64 KiB and 40-120 ms from 256 KiB (the first size above the grain size, 32768
// elements), against Gloo's 0.3-0.8 ms; with OMP_WAIT_POLICY=passive the cliff
// went away, which is what located it.

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/all_reduce/recursive_doubling.h"
#include "comm/communicator_state.h"
#include "comm/run_collective.h"

namespace tp::detail {
namespace {

// Tags keep the phases apart (Gloo matches a send to a recv by peer and tag).
constexpr int kFoldInTag = 1;
constexpr int kFirstRoundTag = 2;  // round k uses kFirstRoundTag + k
constexpr int kFoldOutTag = 64;

/// One posted send or receive, kept until it is waited for.
struct Transfer {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // the group's API takes a list; keeps the buffer alive
  int64_t peer = -1;
  std::string what;  // "receiving from rank 1 (round 0)", for errors
};

[[noreturn]] void transfer_failed(const CommunicatorState& s, const char* op, const std::string& what,
                                  const std::string& why) {
  collective_failed(s, op, "recursive_doubling, " + what + ": " + why);
}

/// Posts a send (`send` true) or a receive of `t` with `peer`; returns at once.
/// The caller holds cpu_start_mutex (see there).
Transfer post(const CommunicatorState& s, const char* op, bool send, const at::Tensor& t, int64_t peer, int tag,
              const std::string& phase) {
  Transfer x;
  x.tensors.push_back(t);
  x.peer = peer;
  x.what = std::string(send ? "sending to rank " : "receiving from rank ") + std::to_string(peer) + " (" + phase + ")";
  try {
    x.work = send ? s.group->send(x.tensors, static_cast<int>(peer), tag)
                  : s.group->recv(x.tensors, static_cast<int>(peer), tag);
  } catch (const c10::Error& e) {
    transfer_failed(s, op, x.what, e.what_without_backtrace());
  } catch (const std::exception& e) {
    transfer_failed(s, op, x.what, e.what());
  }
  return x;
}

/// Waits for a posted transfer, at most the timeout.
void wait(const CommunicatorState& s, const char* op, Transfer& x) {
  try {
    TORCH_CHECK(x.work->wait(s.options.timeout), "did not complete within ", s.options.timeout.count(), " ms");
  } catch (const c10::Error& e) {
    transfer_failed(s, op, x.what, e.what_without_backtrace());
  } catch (const std::exception& e) {
    transfer_failed(s, op, x.what, e.what());
  }
}

/// Calls f(offset, length) over [0, n) in pieces small enough that ATen runs each
/// op on them serially (see the top of the file).
template <typename F>
void in_serial_pieces(int64_t n, F&& f) {
  constexpr int64_t kPiece = 16384;  // half of ATen's at::internal::GRAIN_SIZE (32768)
  for (int64_t offset = 0; offset < n; offset += kPiece) f(offset, std::min(kPiece, n - offset));
}

/// `src` (flat) converted to `dtype`, serially.
at::Tensor converted(const at::Tensor& src, at::ScalarType dtype) {
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(dtype));
  in_serial_pieces(src.numel(), [&](int64_t o, int64_t n) { out.narrow(0, o, n).copy_(src.narrow(0, o, n)); });
  return out;
}

/// a + b (flat, same length) in `dtype`, serially; a's values first.
at::Tensor added(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  at::Tensor out = at::empty(a.sizes(), a.options().dtype(dtype));
  in_serial_pieces(a.numel(), [&](int64_t o, int64_t n) {
    at::Tensor piece = out.narrow(0, o, n);
    at::add_out(piece, a.narrow(0, o, n), b.narrow(0, o, n));
  });
  return out;
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
      recvs.push_back(post(s, op, false, at::empty(buf.sizes(), buf.options().dtype(wire_type)), rank - 1, kFoldInTag,
                           "folding in"));
    }
    if (!sits_out) {
      for (int r = 0; r < rounds; ++r) {
        recvs.push_back(post(s, op, false, at::empty(buf.sizes(), buf.options().dtype(wire_type)),
                             real_rank(vrank ^ (int64_t{1} << r)), kFirstRoundTag + r, "round " + std::to_string(r)));
      }
    }
    if (sits_out) {
      // Receives the result straight into buf, unrounded, after handing in its input.
      const at::Tensor wire = converted(buf, wire_type);
      sends.push_back(post(s, op, true, wire, rank + 1, kFoldInTag, "folding in"));
      recvs.push_back(post(s, op, false, buf, rank + 1, kFoldOutTag, "folding out"));
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
        sends.push_back(post(s, op, true, wire, peer, kFirstRoundTag + r, "round " + std::to_string(r)));
      }
      wait(s, op, recvs[next]);
      const at::Tensor& theirs = recvs[next++].tensors[0];
      buf = peer < rank ? added(theirs, buf, acc) : added(buf, theirs, acc);
    }
    if (folded) {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      sends.push_back(post(s, op, true, buf, rank - 1, kFoldOutTag, "folding out"));
    }
  } else {
    wait(s, op, recvs[next++]);  // the result, into buf
  }
  for (Transfer& x : sends) wait(s, op, x);
  if (t.is_cpu() && t.is_contiguous()) {
    at::Tensor flat = t.view({-1});
    in_serial_pieces(flat.numel(), [&](int64_t o, int64_t n) { flat.narrow(0, o, n).copy_(buf.narrow(0, o, n)); });
  } else {
    t.copy_(buf.view(t.sizes()));
  }
}

}  // namespace tp::detail
