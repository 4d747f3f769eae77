#pragma once
// Private: a linear layer's forward as one *step* — its GEMM and its collectives —
// chosen once, at construction, from the layer's numerics and its reductions
// (tp/comm/reduction.h). A layer's forward checks its input, runs its step and lays out
// the result; it never branches on the mode. A new numerics mode or transport is a new
// step here, not a branch in every layer.
//
//   step               GEMM                                   collectives
//   default column     QuantMethod::apply (linear_function)   entry: copy_to_parallel, or the
//                                                             sequence-parallel all-gather
//   default row        QuantMethod::apply, bias on rank 0     exit: the output Reduction
//                                                             (all-reduce, reduce-scatter, none)
//   invariant column   the canonical GEMM (numerics/)         its backward's canonical sums
//   invariant row      the canonical GEMM                     the canonical sum over ranks

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "layers/linear_function.h"
#include "layers/numerics/invariant_linear.h"
#include "tp/comm/reduction.h"
#include "tp/layers/lora/lora.h"
#include "tp/quant/quant_method.h"

namespace tp::detail {

class LinearStep {
 public:
  virtual ~LinearStep() = default;
  /// x: the layer's checked input ([..., in] for a column layer, [..., in_local] for a row
  /// layer) -> a column layer's local output, or a row layer's output after its reduction.
  /// `weight` and `bias` are the layer's parameters (bias may be undefined).
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const = 0;
  /// A row layer's partial sum before its reduction, with the bias left out on every rank,
  /// for a caller that reduces it itself and adds the bias once (DecoderLayer's fused
  /// boundary, Communicator::all_reduce_fusion). Only the default row step has one; the
  /// others refuse, naming the layer (an invariant sum is taken whole).
  virtual at::Tensor partial(const at::Tensor& x, const at::Tensor& weight) const;
  /// A column layer's local output from its input already quantized per token as the
  /// method's token_quant() says (codes [..., in], scales [..., 1]): what forward gives the
  /// activations they quantize, bit for bit, without a backward. Only the default column
  /// step with a mirrored input has one; the others refuse, naming the layer.
  virtual at::Tensor forward_quantized(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& bias) const;
  /// "default/column", "invariant/row", ...: what pretty_print and the tests see.
  virtual std::string name() const = 0;
};

/// What a column layer's step needs. `entry` is how the input enters: kNone (mirrored:
/// copy_to_parallel) or kAllGather along the token dim (sequence parallelism). A null
/// `method` is the plain at::linear of the weight the layer passes (ParallelLMHead, whose
/// weight may be the embedding's).
struct ColumnStepSpec {
  std::string layer;
  std::shared_ptr<QuantMethod> method;
  Reduction entry;
  int64_t out_local = 0, in_features = 0;
  std::shared_ptr<const ReplicaSum> replicas;      // null when no row is replicated
  std::shared_ptr<const InvariantPlan> invariant;  // set: invariant numerics
};

/// What a row layer's step needs. `exit` is its output Reduction: kAllReduce, kReduceScatter
/// along the token dim (sequence parallelism) or kNone (the partial sum handed on, the bias
/// added by rank 0 only: tp/layers/row_parallel_linear.h's contract).
struct RowStepSpec {
  std::string layer;
  std::shared_ptr<QuantMethod> method;
  Reduction exit;
  int64_t out_features = 0, in_local = 0;
  std::shared_ptr<const InvariantPlan> invariant;  // set: invariant numerics
  std::shared_ptr<const LoRAImpl> lora;            // adapters: their partial sum joins the GEMM's
};

std::unique_ptr<LinearStep> make_column_step(ColumnStepSpec spec);
std::unique_ptr<LinearStep> make_row_step(RowStepSpec spec);

}  // namespace tp::detail
