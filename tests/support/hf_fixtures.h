#pragma once
// Where the Hugging Face folders of tests/python/hf_fixtures.py are: TP_HF_FIXTURES
// when set (a folder made elsewhere), else the build's TP_HF_FIXTURE_DIR
// (tests/CMakeLists.txt writes them there before the tests run).

#include <algorithm>
#include <string>

#include <ATen/ATen.h>

#include "common/env.h"
#include "tp/loader/checkpoint.h"

namespace tp::test {

inline std::string fixture_dir() { return tp::detail::env_value("TP_HF_FIXTURES").value_or(TP_HF_FIXTURE_DIR); }

/// What transformers computed for folder `name` (its "<name>.reference.safetensors"): a
/// prompt, its logits, the greedy tokens after it, and max(1, max |logits|) to scale errors by.
struct ModelReference {
  at::Tensor prompt, logits, generated;
  double scale = 1.0;
};

inline ModelReference model_reference(const std::string& name) {
  const auto ref = open_checkpoint(fixture_dir() + "/" + name + ".reference.safetensors");
  ModelReference out{ref.get("model.prompt").read_all(), ref.get("model.logits").read_all(),
                     ref.get("model.generated").read_all()};
  out.scale = std::max(1.0, out.logits.abs().max().item<double>());
  return out;
}

}  // namespace tp::test
