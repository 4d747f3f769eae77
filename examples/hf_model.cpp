// A whole Llama / Qwen2 / Qwen3 decoder from a Hugging Face folder (config.json and
// safetensors, sharded or not) with tp::CausalLM: read through tp::ModelConfig, loaded
// strictly (each rank reads only its shards), then greedy generation with a KV cache.
// Ranks run as threads of this process (gloo over a local store).
//
//   hf_model_example FOLDER [--tp N] [--tokens N] [--dtype float32|float64|bfloat16]
//                    [--prompt ID,ID,...] [--expect ID,ID,...] [--reference FILE]
//
// --expect: the tokens the model must generate (e.g. transformers' generate(do_sample=
// False)); the exit status is 1 if they differ. --reference: a safetensors file with
// model.prompt [B, P] and model.generated [B, N] (tests/python/hf_fixtures.py writes
// them from transformers); its first row gives the prompt and the expected tokens.
// Without either the prompt is 1, 2, ..., 6.

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tp/comm/launch.h"
#include "tp/loader/checkpoint.h"
#include "tp/models/causal_lm.h"

namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  throw std::invalid_argument("--dtype " + name + ": expected float32, float64 or bfloat16");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string folder;
    int64_t world = 1, tokens = 16;
    at::ScalarType dtype = at::ScalarType::Undefined;  // the checkpoint's
    std::vector<int64_t> prompt{1, 2, 3, 4, 5, 6}, expect;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--tp")
        world = std::stoll(value());
      else if (arg == "--tokens")
        tokens = std::stoll(value());
      else if (arg == "--dtype")
        dtype = parse_dtype(value());
      else if (arg == "--prompt")
        prompt = parse_ids(value());
      else if (arg == "--expect")
        expect = parse_ids(value());
      else if (arg == "--reference") {
        const auto ref = tp::open_checkpoint(value());
        const auto p = ref.get("model.prompt").read_all()[0].contiguous();
        const auto g = ref.get("model.generated").read_all()[0].contiguous();
        prompt.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
        expect.assign(g.data_ptr<int64_t>(), g.data_ptr<int64_t>() + g.numel());
        tokens = g.numel();
      } else if (folder.empty() && arg.rfind("--", 0) != 0)
        folder = arg;
      else
        throw std::invalid_argument("unknown argument " + arg);
    }
    if (folder.empty()) {
      std::cerr << "usage: hf_model_example FOLDER [--tp N] [--tokens N] [--dtype D] [--prompt IDS] [--expect IDS]\n";
      return 2;
    }
    const auto ids = at::tensor(prompt, at::kLong).unsqueeze(0);
    at::Tensor generated;
    tp::run_ranks_in_threads(world, [&](tp::Communicator& comm) {
      const auto model = tp::CausalLMImpl::from_pretrained(folder, tp::CausalLMOptions().dtype(dtype), comm);
      const auto out = model->generate_greedy(ids, tokens);  // the same on every rank
      if (comm.rank() == 0) {
        std::cout << *model << "\n";
        generated = out;
      }
    });
    std::cout << "TP=" << world << " generated:";
    for (int64_t i = 0; i < generated.size(1); ++i) std::cout << " " << generated[0][i].item<int64_t>();
    std::cout << "\n";
    if (!expect.empty()) {
      const bool same = at::equal(generated[0], at::tensor(expect, at::kLong));
      std::cout << (same ? "equal to --expect\n" : "DIFFERENT from --expect\n");
      return same ? 0 : 1;
    }
    return 0;
  } catch (const c10::Error& e) {
    // The message alone; torch's backtrace (frames of addresses) only when asked for.
    const char* bt = std::getenv("TP_BACKTRACE");
    std::cerr << "hf_model_example: " << (bt && *bt == '1' ? e.what() : e.what_without_backtrace()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hf_model_example: " << e.what() << "\n";
    return 1;
  }
}
