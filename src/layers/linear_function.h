#pragma once
// The GEMM of every layer as one autograd function around QuantMethod::apply, so that
// any format's kernel (ATen, our CPU kernels, cuBLASLt) is differentiable the same way:
//
//   forward   y = x W^T (+ b, when add_bias)              through method.apply
//   backward  grad_x = grad_y W_deq                        W_deq = method.dequantized_weight()
//             grad_W = grad_y^T x                          only when W requires grad (kNone)
//             grad_b = sum of grad_y over tokens           even where add_bias is false
//
// grad_x through the dequantized weight is exact for the weight-only formats and the
// straight-through rule for the formats that also quantize activations (the
// activation fake-quantization is taken as the identity in the backward). The bias
// gets its gradient on every rank (RowParallelLinear's bias contract: added by rank 0
// only, yet every copy must get the full gradient to stay identical under an
// optimizer). With no gradient to record, this is method.apply and nothing more.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/comm/communicator.h"
#include "tp/quant/quant_method.h"

namespace tp::detail {

/// Rows of a column layer's local weight (and bias) that other ranks hold copies of
/// (replicated KV heads): their gradients are summed over the ranks that hold them.
/// Every rank has the same `rows` (all replicated groups, one slot each); `mine` says
/// where this rank's replicated pieces sit locally and in the slots.
struct ReplicaSum {
  struct Piece {
    int64_t local_offset = 0;  // first local row
    int64_t slot_offset = 0;   // first row in the all-reduce buffer
    int64_t rows = 0;
  };
  Communicator comm;
  int64_t rows = 0;  // rows of the buffer: every replicated group once
  std::vector<Piece> mine;
};

/// Whether an autograd graph would be recorded for these inputs (grad mode on and one
/// of them requires grad). The same on every rank when the ranks agree on requires_grad.
bool records_grad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// y = x W^T (+ bias if add_bias) for a local weight [out_local, in_local], through
/// `method`, differentiable as described above. `bias` may be undefined. An empty
/// weight (out_local or in_local 0) skips the GEMM: y is zeros (plus the bias), and
/// still part of the graph, so the rank's backward collectives run. `replicas`:
/// null, or the rows whose weight and bias gradients are summed over ranks (one
/// all-reduce in the backward, on every rank).
at::Tensor parallel_linear(const std::shared_ptr<QuantMethod>& method, const at::Tensor& x, const at::Tensor& bias,
                           bool add_bias, int64_t out_local, int64_t in_local,
                           const std::shared_ptr<const ReplicaSum>& replicas = nullptr);

}  // namespace tp::detail
