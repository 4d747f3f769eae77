// CausalLM from quantized Hugging Face folders (tests/python/hf_fixtures.py: GPTQ v1
// INT4 and compressed-tensors FP8 128x128 block checkpoints of a one-layer float32
// Llama, written from the producers' definitions) at TP 1 and 2, against the same
// model dequantized (the producer's dequantized weights loaded into an unquantized
// CausalLM of the same config):
// - INT4 (weight-only): the layers compute with the very float32 weights, so the
//   logits agree to float32 GEMM rounding (max |diff| <= 1e-5 max |logit|) and the 16
//   greedy tokens are equal;
// - FP8 block: the activations are also quantized (dynamic, per 128-group E4M3, a
//   2^-4 relative step), which the dequantized model does not do: the logits agree
//   within 0.1 max |logit| (3.2e-2 measured), and the greedy tokens are reported, not
//   required equal (on this random model they differ from the first token on).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "support/hf_fixtures.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/causal_lm.h"

using namespace tp;
using tp::test::fixture_dir;

namespace {

// The folder's tensors with every linear projection replaced by the producer's
// dequantized weight (and bias) from the reference file, under the float names.
Checkpoint dequantized(const std::string& name) {
  const auto folder = open_checkpoint(fixture_dir() + "/" + name);
  const auto ref = open_checkpoint(fixture_dir() + "/" + name + ".reference.safetensors");
  Checkpoint out;
  for (const auto& n : folder.names())
    if (n.find("_proj.") == std::string::npos) out.add(n, folder.get(n).read_all());
  for (const auto& n : ref.names_with_prefix("w."))
    out.add(n.substr(2) + ".weight", ref.get(n).read_all().to(at::kFloat));
  for (const auto& n : ref.names_with_prefix("b."))
    out.add(n.substr(2) + ".bias", ref.get(n).read_all().to(at::kFloat));
  return out;
}

}  // namespace

TEST_CASE("CausalLM from quantized folders: INT4 generates the tokens of the model dequantized, FP8 is close",
          "[models][hf]") {
  std::ostringstream table;
  table << "\nfolder        TP  max |logit - dequantized| / max |logit|  greedy tokens equal\n";
  const auto prompt = at::randint(0, 128, {2, 6}, test::generator(15), at::kLong);
  for (const std::string name : {"gptq_v1", "ct_fp8_block"}) {
    const auto config = ModelConfig::from_pretrained(fixture_dir() + "/" + name);
    REQUIRE(config.quantization.quantized());
    auto plain = config;
    plain.quantization = CheckpointQuantization();
    const auto deq = dequantized(name);
    const double bound = name == "gptq_v1" ? 1e-5 : 0.1;
    for (int64_t world : {1, 2}) {
      std::vector<at::Tensor> logits(world), want_logits(world), tokens(world), want_tokens(world);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            const int64_t r = comm.rank();
            const auto quantized = CausalLMImpl::from_pretrained(fixture_dir() + "/" + name, {}, comm);
            CausalLMImpl reference(plain, {}, comm);
            reference.load_weights(deq);
            at::NoGradGuard no_grad;
            logits[r] = quantized->gather_logits(quantized->forward(prompt));
            want_logits[r] = reference.gather_logits(reference.forward(prompt));
            tokens[r] = quantized->generate_greedy(prompt, 16);
            want_tokens[r] = reference.generate_greedy(prompt, 16);
          },
          test::test_comm_options());
      double worst = 0.0;
      bool equal = true;
      for (int64_t r = 0; r < world; ++r) {
        INFO(name << " TP " << world << " rank " << r << "\nquantized " << tokens[r] << "\ndequantized "
                  << want_tokens[r]);
        const double rel = ((logits[r] - want_logits[r]).abs().max() / want_logits[r].abs().max()).item<double>();
        CHECK(rel <= bound);
        if (name == "gptq_v1") CHECK(at::equal(tokens[r], want_tokens[r]));
        worst = std::max(worst, rel);
        equal = equal && at::equal(tokens[r], want_tokens[r]);
      }
      table << std::left << std::setw(14) << name << world << "   " << std::setw(39) << std::setprecision(2)
            << std::scientific << worst << (equal ? "yes" : "NO") << "\n";
    }
  }
  std::cout << table.str();
}
