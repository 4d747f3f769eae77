// The MLP's activation under invariant numerics (src/models/invariant_activation.h): an
// element's bits, forward and backward, do not depend on where it lies (a rank's slice of
// the intermediate dimension, a strided view, a row alone, the batch), and the values are
// the activation's (near ATen's, which may differ in the last bit).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "models/invariant_activation.h"
#include "support/test_util.h"

using namespace tp;
using tp::test::randn;

namespace {

// act(x) and the gradient of sum(act(x) * g), from the invariant activation.
std::pair<at::Tensor, at::Tensor> run(Activation act, const at::Tensor& x, const at::Tensor& g) {
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  const at::Tensor y = tp::detail::invariant_activation(act, xr);
  (y * g).sum().backward();
  return {y.detach(), xr.grad()};
}

}  // namespace

TEST_CASE("invariant: the MLP's activation gives an element the same bits wherever it lies, forward and backward",
          "[invariant][models]") {
  for (const auto act :
       {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kGeluNew, Activation::kGeluFast}) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      INFO("activation=" << to_string(act) << " dtype=" << dtype);
      // A fused [gate | up] output: the gate is a strided view of 1000 of each row's 2000.
      const at::Tensor fused = (3 * randn({7, 2000}, 1)).to(dtype);
      const at::Tensor g = randn({7, 1000}, 2).to(dtype);
      const auto [y, gx] = run(act, fused.narrow(1, 0, 1000), g);
      // The same elements as TP 2-4 ranks hold them (slices off the vector width), and as rows alone.
      for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 500, 1000}, {0, 334, 667, 1000}, {0, 7, 1000}}) {
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          const int64_t b = cuts[i], n = cuts[i + 1] - cuts[i];
          INFO("columns [" << b << ", " << cuts[i + 1] << ")");
          const auto [yp, gp] = run(act, fused.narrow(1, b, n), g.narrow(1, b, n));
          CHECK(at::equal(yp, y.narrow(1, b, n)));
          CHECK(at::equal(gp, gx.narrow(1, b, n)));
        }
      }
      const auto [y3, g3] = run(act, fused.narrow(0, 3, 1).narrow(1, 0, 1000).contiguous(), g.narrow(0, 3, 1));
      CHECK(at::equal(y3, y.narrow(0, 3, 1)));
      CHECK(at::equal(g3, gx.narrow(0, 3, 1)));
      // The activation itself: ATen's forward and gradient within float32 / bfloat16 rounding
      // (ATen's float32 tanh saturates earlier: its gelu_tanh slope is 0 at x = -5.06, where
      // the float64 one is -1e-6, hence the absolute term).
      const at::Tensor x = fused.narrow(1, 0, 1000).to(at::kFloat).requires_grad_(true);
      at::Tensor ref;
      switch (act) {
        case Activation::kSilu: ref = at::silu(x); break;
        case Activation::kGelu: ref = at::gelu(x); break;
        default: ref = at::gelu(x, "tanh"); break;
      }
      (ref * g.to(at::kFloat)).sum().backward();
      const double rtol = dtype == at::kFloat ? 1e-5 : 2e-2, atol = dtype == at::kFloat ? 1e-5 : 1e-2;
      CHECK(at::allclose(y.to(at::kFloat), ref.detach(), rtol, atol));
      CHECK(at::allclose(gx.to(at::kFloat), x.grad(), rtol, atol));
    }
  }
}
