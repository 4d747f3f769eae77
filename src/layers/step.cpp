#include "layers/step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "layers/layer_common.h"
#include "tp/comm/differentiable.h"

namespace tp::detail {

at::Tensor LinearStep::partial(const at::Tensor& x, const at::Tensor& weight) const {
  TORCH_CHECK_VALUE(false, "this layer's step (", name(),
                    ") has no partial sum to hand on: a column layer's output is complete, and an invariant sum "
                    "is canonical, taken whole; use forward");
}

at::Tensor LinearStep::forward_quantized(const at::Tensor&, const at::Tensor&, const at::Tensor&) const {
  TORCH_CHECK_VALUE(false, "this layer's step (", name(),
                    ") takes no pre-quantized input: only a column layer under the default numerics with a mirrored "
                    "input (no sequence parallelism) does; use forward");
}

namespace {

class DefaultColumnStep final : public LinearStep {
 public:
  explicit DefaultColumnStep(ColumnStepSpec spec) : s_(std::move(spec)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const override {
    // Megatron's f: identity forward, the input gradient summed over ranks in the backward.
    // Sequence parallel: the token pieces gathered, the gradient reduce-scattered back.
    at::Tensor xin;
    if (s_.entry.op == ReduceOp::kAllGather) {
      Reduction entry = s_.entry;
      entry.dim = *sequence_dim_of(s_.layer, x, true, s_.entry.dim);
      xin = entry.apply(x);
    } else {
      xin = copy_to_parallel(x, s_.entry.group);
    }
    // A rank that owns no output columns skips its GEMM (weighted splits, more ranks than
    // units) but stays in the graph: its backward still takes part in the collectives.
    if (!s_.method) return at::linear(xin, weight, bias);
    return parallel_linear(s_.method, xin, bias, /*add_bias=*/true, s_.out_local, s_.in_features, s_.replicas);
  }
  at::Tensor forward_quantized(const at::Tensor& codes, const at::Tensor& scales,
                               const at::Tensor& bias) const override {
    // Megatron's f is the identity forward: the codes are the layer's input as they are.
    // No backward: the codes are not differentiable, so neither weight nor bias may record.
    TORCH_CHECK_VALUE(s_.entry.op == ReduceOp::kNone, s_.layer,
                      ": a pre-quantized input is not taken under sequence parallelism (the input's all-gather); "
                      "use forward");
    TORCH_CHECK_VALUE(s_.method, s_.layer, ": this layer has no quantization method to take a pre-quantized input");
    TORCH_CHECK_VALUE(!records_grad(at::Tensor(), s_.method->weight(), bias), s_.layer,
                      ": forward_quantized has no backward; call it under torch.no_grad / at::NoGradGuard");
    if (s_.out_local == 0 || s_.in_features == 0) {
      auto shape = codes.sizes().vec();
      shape.back() = s_.out_local;
      at::Tensor y = at::zeros(shape, codes.options().dtype(s_.method->activation_dtype()));
      return bias.defined() ? y.add_(bias) : y;
    }
    return s_.method->apply_quantized(codes, scales, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
  }
  std::string name() const override { return "default/column"; }

 private:
  ColumnStepSpec s_;
};

class DefaultRowStep final : public LinearStep {
 public:
  explicit DefaultRowStep(RowStepSpec spec) : s_(std::move(spec)) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const override {
    Reduction exit = s_.exit;
    if (exit.op == ReduceOp::kReduceScatter) exit.dim = *sequence_dim_of(s_.layer, x, true, exit.dim);
    // Bias contract: only rank 0 adds the bias, so the reduction counts it once; every
    // rank's copy still gets the full gradient. A rank with no input columns skips its
    // GEMM and contributes zeros (plus the bias on rank 0).
    at::Tensor y =
        parallel_linear(s_.method, x, bias, /*add_bias=*/exit.group.rank() == 0, s_.out_features, s_.in_local);
    if (s_.lora && s_.lora->active()) y = s_.lora->add_to(x, std::move(y));  // before the one reduction
    return exit.apply_consuming(std::move(y));  // y is this step's own: reduced in place when nothing records
  }
  at::Tensor partial(const at::Tensor& x, const at::Tensor& weight) const override {
    at::Tensor y = parallel_linear(s_.method, x, /*bias=*/{}, /*add_bias=*/false, s_.out_features, s_.in_local);
    return s_.lora && s_.lora->active() ? s_.lora->add_to(x, std::move(y)) : y;
  }
  std::string name() const override { return "default/row"; }

 private:
  RowStepSpec s_;
};

// Invariant numerics: the GEMM and the layer's collective are one autograd function
// (layers/numerics/invariant_linear.h); the bias is added after the canonical sum, on every rank.
class InvariantStep final : public LinearStep {
 public:
  InvariantStep(std::shared_ptr<const InvariantPlan> plan, const char* name) : plan_(std::move(plan)), name_(name) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const override {
    return invariant_linear(x, weight, bias, /*add_bias=*/true, plan_);
  }
  std::string name() const override { return name_; }

 private:
  std::shared_ptr<const InvariantPlan> plan_;
  const char* name_;
};

}  // namespace

std::unique_ptr<LinearStep> make_column_step(ColumnStepSpec spec) {
  TORCH_INTERNAL_ASSERT(spec.entry.op == ReduceOp::kNone || spec.entry.op == ReduceOp::kAllGather);
  if (spec.invariant) {
    // The input gradient comes out of the canonical sums already reduced over ranks: no
    // copy_to_parallel (its all-reduce would add it up again, in another order).
    TORCH_CHECK_VALUE(spec.entry.op == ReduceOp::kNone, spec.layer,
                      ": sequence parallelism is not covered by invariant numerics (use numerics=default)");
    return std::make_unique<InvariantStep>(std::move(spec.invariant), "invariant/column");
  }
  return std::make_unique<DefaultColumnStep>(std::move(spec));
}

std::unique_ptr<LinearStep> make_row_step(RowStepSpec spec) {
  if (spec.invariant) {
    TORCH_CHECK_VALUE(spec.exit.op == ReduceOp::kAllReduce, spec.layer,
                      ": invariant numerics needs reduce_output and no sequence_parallel (the canonical sum is "
                      "taken whole, on every rank)");
    return std::make_unique<InvariantStep>(std::move(spec.invariant), "invariant/row");
  }
  return std::make_unique<DefaultRowStep>(std::move(spec));
}

}  // namespace tp::detail
