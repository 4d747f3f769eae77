// Builds a TP=1 MLP from an installed tp and checks it against a float64 at::linear.
#include <ATen/ATen.h>
#include <tp/tp.h>

#include <algorithm>
#include <iostream>

int main() {
  tp::ColumnParallelLinear up(tp::ColumnParallelLinearOptions(16, 32));
  tp::RowParallelLinear down(tp::RowParallelLinearOptions(32, 16));
  const auto x = at::randn({4, 16});
  const auto y = down->forward(up->forward(x));
  // The float64 reference: tp's CPU GEMM for this shape may sum in another order than
  // at::linear's, so float32 results agree to rounding, not bit for bit.
  const auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const auto ref = at::linear(at::linear(d(x), d(up->weight), d(up->bias)), d(down->weight), d(down->bias));
  const double error =
      (y.to(at::kDouble) - ref).abs().max().item<double>() / std::max(1.0, ref.abs().max().item<double>());
  if (!(error < 2e-5)) {
    std::cerr << "consumer: tp output differs from the float64 reference by " << error << " (relative)\n";
    return 1;
  }
  std::cout << "consumer ok: " << *up << "\n";
  return 0;
}
