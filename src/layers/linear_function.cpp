#include "layers/linear_function.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <utility>

namespace tp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearArgs {
  std::shared_ptr<QuantMethod> method;
  std::shared_ptr<const ReplicaSum> replicas;
  bool add_bias = false;
  int64_t out_local = 0, in_local = 0;
};

struct Saved : torch::CustomClassHolder {
  LinearArgs args;
  std::vector<int64_t> x_shape;
  at::TensorOptions x_options;
  bool has_weight = false, has_bias = false;
};

std::vector<int64_t> with_last(at::IntArrayRef shape, int64_t last) {
  auto out = shape.vec();
  out.back() = last;
  return out;
}

// The forward itself, with no autograd: the method's GEMM, or zeros for an empty weight.
at::Tensor compute(const LinearArgs& a, const at::Tensor& x, const at::Tensor& bias) {
  const auto b = a.add_bias && bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (a.out_local == 0 || a.in_local == 0) {
    at::Tensor y = at::zeros(with_last(x.sizes(), a.out_local), x.options());
    if (b) y.add_(*b);
    return y;
  }
  return a.method->apply(x, b);
}

// The weight and bias gradients of the replicated rows, summed over the ranks that
// hold them. One all-reduce of a buffer with a slot for every replicated group
// (zeros in the slots this rank does not hold), on every rank: sub-communicators
// per replica group would move less, but a Communicator cannot make sub-groups (that
// takes a store, and every rank creating them together), and the buffer is only the
// replicated heads' rows - for a GQA model num_kv_heads * 2 * head_dim rows of the
// [*, hidden] weight gradient, a small part of the layer's, reduced once per backward.
void sum_replicas(const ReplicaSum& r, at::Tensor& grad_w, at::Tensor& grad_b) {
  const bool w = grad_w.defined(), b = grad_b.defined();
  if (!w && !b) return;
  const int64_t k = w ? grad_w.size(1) : 0;
  const auto options = w ? grad_w.options() : grad_b.options();
  at::Tensor buffer = at::zeros({r.rows, k + (b ? 1 : 0)}, options);
  for (const auto& p : r.mine) {
    auto slot = buffer.narrow(0, p.slot_offset, p.rows);
    if (w) slot.narrow(1, 0, k).copy_(grad_w.narrow(0, p.local_offset, p.rows));
    if (b) slot.select(1, k).copy_(grad_b.narrow(0, p.local_offset, p.rows));
  }
  r.comm.all_reduce(buffer);
  for (const auto& p : r.mine) {
    const auto slot = buffer.narrow(0, p.slot_offset, p.rows);
    if (w) grad_w.narrow(0, p.local_offset, p.rows).copy_(slot.narrow(1, 0, k));
    if (b) grad_b.narrow(0, p.local_offset, p.rows).copy_(slot.select(1, k));
  }
}

struct ParallelLinear : torch::autograd::Function<ParallelLinear> {
  // weight: the method's weight when it is trainable (kNone). Optional, not undefined
  // tensors: a custom function records every tensor argument's metadata, and an
  // undefined one has none; absent optionals are no inputs of the node at all.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const LinearArgs& args) {
    at::Tensor y = compute(args, x, bias.value_or(at::Tensor()));
    // A view as a custom function's output could not be modified in place later.
    if (y.is_view()) y = y.clone();
    auto s = c10::make_intrusive<Saved>();
    s->args = args;
    s->x_shape = x.sizes().vec();
    s->x_options = x.options();
    s->has_weight = weight.has_value();
    s->has_bias = bias.has_value();
    ctx->saved_data["tp"] = at::IValue::make_capsule(std::move(s));
    // x only when the weight gradient needs it; the weight when it is the parameter
    // (a quantized weight is dequantized again in the backward instead of kept).
    const at::Tensor w = weight.value_or(at::Tensor());
    ctx->save_for_backward({w.defined() && w.requires_grad() ? x : at::Tensor(), w});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data.at("tp").toCapsule());
    const auto& a = s->args;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& grad_y = grads[0];
    const bool empty = a.out_local == 0 || a.in_local == 0;
    // [tokens, out_local]; tokens from x's shape, as -1 is ambiguous when out_local is 0.
    int64_t tokens = 1;
    for (size_t i = 0; i + 1 < s->x_shape.size(); ++i) tokens *= s->x_shape[i];
    const at::Tensor g2 = grad_y.reshape({tokens, a.out_local});
    // needs_input_grad counts the node's inputs: x, then the weight and the bias if given.
    const size_t weight_edge = 1, bias_edge = s->has_weight ? 2 : 1;

    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      if (empty) {
        grad_x = at::zeros(s->x_shape, s->x_options);
      } else {
        const at::Tensor w = weight.defined() ? weight : a.method->dequantized_weight();
        grad_x = g2.matmul(w.to(grad_y.scalar_type())).view(s->x_shape);
      }
    }
    if (s->has_weight && ctx->needs_input_grad(weight_edge)) {
      grad_w = empty ? at::zeros_like(weight) : g2.t().matmul(x.reshape({tokens, a.in_local}).to(g2.scalar_type()));
      grad_w = grad_w.to(weight.scalar_type());
    }
    if (s->has_bias && ctx->needs_input_grad(bias_edge)) grad_b = g2.sum(0).to(s->x_options.dtype());
    if (a.replicas) sum_replicas(*a.replicas, grad_w, grad_b);
    return {grad_x, grad_w, grad_b, at::Tensor()};
  }
};

}  // namespace

bool records_grad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!at::GradMode::is_enabled()) return false;
  auto req = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  return req(x) || req(weight) || req(bias);
}

at::Tensor parallel_linear(const std::shared_ptr<QuantMethod>& method, const at::Tensor& x, const at::Tensor& bias,
                           bool add_bias, int64_t out_local, int64_t in_local,
                           const std::shared_ptr<const ReplicaSum>& replicas) {
  const LinearArgs args{method, replicas, add_bias, out_local, in_local};
  const at::Tensor w = method->weight();
  const at::Tensor weight = w.defined() && w.requires_grad() ? w : at::Tensor();
  if (!records_grad(x, weight, bias)) return compute(args, x, bias);
  auto given = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  return ParallelLinear::apply(x, given(weight), given(bias), args);
}

}  // namespace tp::detail
