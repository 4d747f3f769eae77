#include "models/invariant_activation.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

namespace tp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kSqrtTwoOverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kInvSqrtTwo = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kCubic = 0.044715;                        // the tanh approximation's x^3 term
constexpr double kFastConstant = 0.7978845608;             // gelu_fast's truncated sqrt(2 / pi)

// The tanh approximations: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi) or gelu_fast's.
double tanh_constant(Activation act) { return act == Activation::kGeluFast ? kFastConstant : kSqrtTwoOverPi; }

double value(Activation act, double x) {
  switch (act) {
    case Activation::kSilu: return x / (1.0 + std::exp(-x));
    case Activation::kGelu: return 0.5 * x * (1.0 + std::erf(x * kInvSqrtTwo));
    case Activation::kGeluTanh:
    case Activation::kGeluNew:
    case Activation::kGeluFast: return 0.5 * x * (1.0 + std::tanh(tanh_constant(act) * (x + kCubic * x * x * x)));
  }
  TORCH_INTERNAL_ASSERT(false, "invariant_activation: unknown activation");
}

// d act / dx.
double slope(Activation act, double x) {
  switch (act) {
    case Activation::kSilu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    case Activation::kGelu: return 0.5 * (1.0 + std::erf(x * kInvSqrtTwo)) + x * kInvSqrtTwoPi * std::exp(-0.5 * x * x);
    case Activation::kGeluTanh:
    case Activation::kGeluNew:
    case Activation::kGeluFast: {
      const double c = tanh_constant(act);
      const double t = std::tanh(c * (x + kCubic * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * kCubic * x * x);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "invariant_activation: unknown activation");
}

// out[i] = f(x[i]) (or g[i] * f(x[i]) with a gradient), one element at a time in float64,
// rounded once to float32 and then to `dtype`. One scalar path for every element: nothing
// depends on the element's position, the tensor's length or the threads.
at::Tensor elementwise(Activation act, const at::Tensor& x, const at::Tensor& g, at::ScalarType dtype) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const at::Tensor gf = g.defined() ? g.to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor out = at::empty(xf.sizes(), xf.options());
  const float* in = xf.data_ptr<float>();
  const float* grad = gf.defined() ? gf.data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t n = xf.numel();
  if (grad) {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(static_cast<double>(grad[i]) * slope(act, in[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(value(act, in[i]));
  }
  return out.to(dtype);
}

struct InvariantActivation : torch::autograd::Function<InvariantActivation> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t act) {
    ctx->save_for_backward({x});
    ctx->saved_data["act"] = act;
    return elementwise(static_cast<Activation>(act), x, {}, x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const auto act = static_cast<Activation>(ctx->saved_data.at("act").toInt());
    return {elementwise(act, x, grads[0].expand(x.sizes()), x.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor invariant_activation(Activation act, const at::Tensor& x) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "invariant_activation: expected float32 or bfloat16 input, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.device().is_cpu(), "invariant_activation: invariant numerics runs on the CPU; the input is on ",
                    x.device());
  return InvariantActivation::apply(x, static_cast<int64_t>(act));
}

}  // namespace tp::detail
