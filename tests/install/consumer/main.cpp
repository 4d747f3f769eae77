// Builds a TP=1 MLP from an installed tp and checks it against at::linear.
#include <ATen/ATen.h>
#include <tp/tp.h>

#include <iostream>

int main() {
  tp::ColumnParallelLinear up(tp::ColumnParallelLinearOptions(16, 32));
  tp::RowParallelLinear down(tp::RowParallelLinearOptions(32, 16));
  const auto x = at::randn({4, 16});
  const auto y = down->forward(up->forward(x));
  const auto ref = at::linear(at::linear(x, up->weight, up->bias), down->weight, down->bias);
  if (!at::allclose(y, ref)) {
    std::cerr << "consumer: tp output differs from at::linear\n";
    return 1;
  }
  std::cout << "consumer ok: " << *up << "\n";
  return 0;
}
