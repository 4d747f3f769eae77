#pragma once
// Point-to-point transfers over the process group (Gloo's send/recv), for the
// algorithms built from them (recursive doubling, the direct reduce_scatter), and the
// element-wise work around them, which runs serially on the calling thread.
//
// Why serially: a parallel ATen op leaves its OpenMP workers spinning for a while
// after it returns (libgomp's wait policy). With as many busy threads as cores they
// keep Gloo's transport thread, which moves the data, off the CPU, and recursive
// doubling fell far behind Gloo's own all_reduce from the first size above ATen's grain
// size, where its copies and adds go parallel (benchmarks/RESULTS.md, "Measurements
// behind the CPU kernels' shapes"). Pieces below the grain size run on this thread.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/communicator_state.h"

namespace tp::detail {

/// One posted send or receive, kept until it is waited for.
struct Transfer {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // the group's API takes a list; keeps the buffer alive
  int64_t peer = -1;
  std::string what;  // "recursive_doubling, receiving from rank 1 (round 0)", for errors
};

/// Posts a send (`send` true) or a receive of `t` (contiguous, CPU) with `peer` under
/// `tag` (Gloo matches a send to a receive by peer and tag, in posting order);
/// returns at once. The caller holds cpu_start_mutex (see there). `algorithm` and
/// `phase` name the transfer in errors.
Transfer post(const CommunicatorState& s, const char* op, const char* algorithm, bool send, const at::Tensor& t,
              int64_t peer, int tag, const std::string& phase);

/// Waits for a posted transfer, at most the communicator's timeout; a failure or
/// timeout is the collective's error, naming the transfer.
void wait(const CommunicatorState& s, const char* op, Transfer& x);

/// The type a sum of `dtype` values accumulates in: fp32 for float32 / float16 /
/// bfloat16, fp64 for float64, the integer type itself for integers.
at::ScalarType accumulate_type(at::ScalarType dtype);

/// `src` (flat) converted to `dtype`, serially.
at::Tensor converted(const at::Tensor& src, at::ScalarType dtype);

/// a + b (flat, same length) in `dtype`, serially; a's values first.
at::Tensor added(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype);

/// dst = src (flat, same length; converting the dtype), serially.
void copy_serially(at::Tensor& dst, const at::Tensor& src);

}  // namespace tp::detail
