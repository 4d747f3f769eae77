// A Llama-style MLP on 4 ranks (threads of this process; one process per rank works
// the same with tp::communicator_from_env()), checked against one device.
// The README's C++ example; built and run by the tests (ctest -R example).

#include <ATen/ATen.h>
#include <tp/tp.h>

#include <iostream>
#include <mutex>

int main() {
  tp::Checkpoint ckpt;  // Hugging Face names -> tensors (or lazily read sources)
  ckpt.add("mlp.gate_proj.weight", at::randn({1408, 512}) * 0.05);
  ckpt.add("mlp.up_proj.weight", at::randn({1408, 512}) * 0.05);
  ckpt.add("mlp.down_proj.weight", at::randn({512, 1408}) * 0.05);
  const auto x = at::randn({8, 512});

  std::mutex mutex;
  double worst = 0.0;
  tp::run_ranks_in_threads(4, [&](tp::Communicator& comm) {
    tp::GateUpParallelLinear gate_up(tp::GateUpParallelLinearOptions(512, 1408), comm);
    tp::RowParallelLinear down(tp::RowParallelLinearOptions(1408, 512).bias(false), comm);
    gate_up->load_weights(ckpt, "mlp");                       // reads only this rank's rows
    down->load_weights(ckpt, "mlp.down_proj");                // ... and columns
    auto [gate, up] = gate_up->split(gate_up->forward(x));    // [8, 352] each
    const at::Tensor y = down->forward(at::silu(gate) * up);  // [8, 512], reduced

    // The same MLP on one device, from the same global weights.
    auto w = [&](const char* name) { return ckpt.get(name).read_all(); };
    const auto ref =
        at::linear(at::silu(at::linear(x, w("mlp.gate_proj.weight"))) * at::linear(x, w("mlp.up_proj.weight")),
                   w("mlp.down_proj.weight"));
    std::lock_guard<std::mutex> lock(mutex);
    worst = std::max(worst, (y - ref).abs().max().item<double>());
    if (comm.rank() == 0) std::cout << *gate_up << "\n" << *down << "\n";
  });
  std::cout << "max |TP - one device| = " << worst << "\n";
  return worst < 1e-4 ? 0 : 1;
}
