#include "comm/point_to_point.h"

#include <algorithm>
#include <exception>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "comm/run_collective.h"

namespace tp::detail {
namespace {

[[noreturn]] void transfer_failed(const CommunicatorState& s, const char* op, const std::string& what,
                                  const std::string& why) {
  collective_failed(s, op, what + ": " + why);
}

/// Calls f(offset, length) over [0, n) in pieces small enough that ATen runs each op
/// on them serially (see point_to_point.h).
template <typename F>
void in_serial_pieces(int64_t n, F&& f) {
  constexpr int64_t kPiece = 16384;  // half of ATen's at::internal::GRAIN_SIZE (32768)
  for (int64_t offset = 0; offset < n; offset += kPiece) f(offset, std::min(kPiece, n - offset));
}

}  // namespace

Transfer post(const CommunicatorState& s, const char* op, const char* algorithm, bool send, const at::Tensor& t,
              int64_t peer, int tag, const std::string& phase) {
  Transfer x;
  x.tensors.push_back(t);
  x.peer = peer;
  x.what = std::string(algorithm) + (send ? ", sending to rank " : ", receiving from rank ") + std::to_string(peer) +
           " (" + phase + ")";
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

void wait(const CommunicatorState& s, const char* op, Transfer& x) {
  try {
    TORCH_CHECK(x.work->wait(s.options.timeout), "did not complete within ", s.options.timeout.count(), " ms");
  } catch (const c10::Error& e) {
    transfer_failed(s, op, x.what, e.what_without_backtrace());
  } catch (const std::exception& e) {
    transfer_failed(s, op, x.what, e.what());
  }
}

at::ScalarType accumulate_type(at::ScalarType dtype) {
  if (dtype == at::kDouble) return at::kDouble;
  if (at::isFloatingType(dtype)) return at::kFloat;  // float32, float16, bfloat16
  return dtype;                                      // integers sum exactly in their own type
}

at::Tensor converted(const at::Tensor& src, at::ScalarType dtype) {
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(dtype));
  copy_serially(out, src);
  return out;
}

at::Tensor added(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  at::Tensor out = at::empty(a.sizes(), a.options().dtype(dtype));
  in_serial_pieces(a.numel(), [&](int64_t o, int64_t n) {
    at::Tensor piece = out.narrow(0, o, n);
    at::add_out(piece, a.narrow(0, o, n), b.narrow(0, o, n));
  });
  return out;
}

void copy_serially(at::Tensor& dst, const at::Tensor& src) {
  in_serial_pieces(src.numel(), [&](int64_t o, int64_t n) { dst.narrow(0, o, n).copy_(src.narrow(0, o, n)); });
}

}  // namespace tp::detail
