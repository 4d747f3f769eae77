// A Llama-style decoder block in C++ (RMSNorm, QKV with RoPE, scaled-dot-product
// attention, O, RMSNorm, gate_up, SiLU(gate)*up, down), composed from the tp layers
// (examples/llama_block.h).
//
// The weights are written once to a safetensors file under Hugging Face's names;
// every rank opens it (tp::open_checkpoint) and reads only its shard. The block runs
// at TP 1, 2, 3 and 4 (ranks as threads; 3 splits the KV heads unevenly) and is
// checked against the same block on one device, in float64, on the full weights.
// Built and run by the tests (ctest -R example).
//
//   llama_block_example [--dir DIR]       # where the checkpoint is written (default $TMPDIR or /tmp)

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "llama_block.h"

int main(int argc, char** argv) {
  using namespace example;
  try {
    const std::string dir = checkpoint_dir_from_args(argc, argv, "llama_block_example");
    const Config c;
    const auto weights = make_weights(c);
    const std::string path = dir + "/tp_llama_block_example_" + std::to_string(::getpid()) + ".safetensors";
    tp::save_safetensors(path, weights, {{"format", "pt"}});

    // One device, float64, the full weights.
    auto w64 = [&](const std::string& name) { return weights.at(kPrefix + name).to(at::kDouble); };
    const auto x = at::randn({c.batch, c.seq, c.hidden}, at::detail::createCPUGenerator(8));
    const auto want = reference_block(
        c, x.to(at::kDouble),
        [&](const at::Tensor& in, const std::string& name) { return at::linear(in, w64(name + ".weight")); },
        w64("input_layernorm.weight"), w64("post_attention_layernorm.weight"));

    bool ok = true;
    for (const int64_t world : {1, 2, 3, 4}) {
      std::mutex mutex;
      double worst = 0.0;
      run_tp(world, [&](tp::Communicator& comm) {
        const auto ckpt = tp::open_checkpoint(path);  // mapped; each rank reads only its slices
        DecoderBlock block(c, comm);
        block.load(ckpt);
        const auto y = block.forward(x);
        const double rel = ((y.to(at::kDouble) - want).norm() / want.norm()).item<double>();
        std::lock_guard<std::mutex> lock(mutex);
        worst = std::max(worst, rel);
        if (comm.rank() == 0 && world == 3) std::cout << *block.qkv << "\n" << *block.o_proj << "\n";
      });
      const bool pass = worst < 1e-5;
      ok = ok && pass;
      std::cout << "TP=" << world << ": ||block - one device|| / ||one device|| = " << worst
                << (pass ? "  ok" : "  FAILED (bound 1e-5)") << "\n";
    }
    std::remove(path.c_str());
    return ok ? 0 : 1;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
