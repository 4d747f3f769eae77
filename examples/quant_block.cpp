// The Llama-style decoder block of llama_block.cpp with quantized projections: one FP8
// format (fp8_block: FP8 E4M3 weights in 128x128 scale blocks, activations in dynamic
// 1x128 groups) and one INT4 format (int4_gptq: 4-bit weights in groups of 128 along
// in_features, GPTQ packing).
//
// For each format the float weights are quantized with tp::quantize_weight into the
// tensors a Hugging Face checkpoint of that format holds (weight + weight_scale_inv;
// qweight + scales + qzeros), written to a safetensors file, and loaded by every rank
// (only its shard, scales and packed words included). The block runs at TP 1, 2 and 4
// (ranks as threads) and is checked against the same block on one device in float64,
// built from tp::dequantize_weight and tp::quantize_activation: exactly what the
// format's kernel computes. The quantization error itself (vs the float block) is
// printed for scale. Built and run by the tests (ctest -R example).
//
//   quant_block_example [--dir DIR]       # where the checkpoints are written (default $TMPDIR or /tmp)

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "llama_block.h"

int main(int argc, char** argv) {
  using namespace example;
  try {
    const std::string dir = checkpoint_dir_from_args(argc, argv, "quant_block_example");
    // head_dim 128: FP8 blocks are 128 wide, so a rank's heads must be whole blocks.
    // With 2 KV heads, TP 4 replicates each KV head on two ranks.
    Config c;
    c.hidden = 512, c.heads = 4, c.kv_heads = 2, c.head_dim = 128, c.intermediate = 1024;
    const auto weights = make_weights(c, 17);
    const auto x = at::randn({c.batch, c.seq, c.hidden}, at::detail::createCPUGenerator(18));
    auto w64 = [&](const std::string& name) { return weights.at(kPrefix + name).to(at::kDouble); };
    const auto norm1 = w64("input_layernorm.weight"), norm2 = w64("post_attention_layernorm.weight");
    const auto float_block = reference_block(
        c, x.to(at::kDouble),
        [&](const at::Tensor& in, const std::string& name) { return at::linear(in, w64(name + ".weight")); }, norm1,
        norm2);

    bool ok = true;
    for (const char* format : {"fp8_block", "int4_gptq:g128"}) {
      const auto quant = tp::parse_quant_config(format);
      // The checkpoint: every projection as the format stores it, the norms as they are.
      std::map<std::string, tp::QuantizedTensors> stored;
      std::map<std::string, at::Tensor> tensors{
          {kPrefix + "input_layernorm.weight", weights.at(kPrefix + "input_layernorm.weight")},
          {kPrefix + "post_attention_layernorm.weight", weights.at(kPrefix + "post_attention_layernorm.weight")}};
      for (const auto& name : projections()) {
        stored[name] = tp::quantize_weight(weights.at(kPrefix + name + ".weight"), quant);
        for (const auto& [suffix, t] : stored[name]) tensors[kPrefix + name + "." + suffix] = t;
      }
      const std::string path = dir + "/tp_quant_block_example_" + std::to_string(::getpid()) + ".safetensors";
      tp::save_safetensors(path, tensors, {{"format", "pt"}});

      // One device, float64: the format's kernel as math.
      const auto want = reference_block(
          c, x.to(at::kDouble),
          [&](const at::Tensor& in, const std::string& name) {
            const auto& t = stored.at(name);
            return at::linear(tp::quantize_activation(in, t, quant).to(at::kDouble),
                              tp::dequantize_weight(t, quant).to(at::kDouble));
          },
          norm1, norm2);
      std::cout << tp::to_string(quant) << ": quantization error ||quantized - float|| / ||float|| = "
                << ((want - float_block).norm() / float_block.norm()).item<double>() << "\n";

      // The weight-only INT formats run ATen's bfloat16 kernel on the CPU even for a
      // float32 block (the only vectorized one; src/quant/int4/method.cpp), so activations are
      // rounded to bf16 (2^-9) before each projection: ~4e-3 through the block. FP8
      // computes in float32 against its float64 model.
      const bool bf16_kernel = quant.format == tp::QuantFormat::kInt4Gptq ||
                               quant.format == tp::QuantFormat::kInt4Awq ||
                               quant.format == tp::QuantFormat::kInt8WeightOnly;
      const double bound = bf16_kernel ? 1e-2 : 1e-5;
      for (const int64_t world : {1, 2, 4}) {
        std::mutex mutex;
        double worst = 0.0;
        run_tp(world, [&](tp::Communicator& comm) {
          const auto ckpt = tp::open_checkpoint(path);
          DecoderBlock block(c, comm, quant);
          block.load(ckpt);
          const auto y = block.forward(x);
          const double rel = ((y.to(at::kDouble) - want).norm() / want.norm()).item<double>();
          std::lock_guard<std::mutex> lock(mutex);
          worst = std::max(worst, rel);
          if (comm.rank() == 0 && world == 4) std::cout << "  " << *block.gate_up << "\n";
        });
        const bool pass = worst < bound;
        ok = ok && pass;
        std::cout << "  TP=" << world << ": ||block - one device|| / ||one device|| = " << worst
                  << (pass ? "  ok" : "  FAILED (bound " + std::to_string(bound) + ")") << "\n";
      }
      std::remove(path.c_str());
    }
    return ok ? 0 : 1;
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 2;
  }
}
