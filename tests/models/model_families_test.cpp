// The registry of families (src/models/model_families.cpp): one row per ModelType, in
// order, that to_string(ModelType) and the parsing of config.json's model_type read.

#include "support/tp_catch.h"

#include <set>
#include <string>

#include "tp/models/model_config.h"

using namespace tp;

TEST_CASE("the registry of families names every ModelType once, in order, and parsing reads it", "[models]") {
  const auto& families = model_families();
  REQUIRE(families.size() == static_cast<size_t>(ModelType::kGptOss) + 1);
  std::set<std::string> names;
  for (size_t i = 0; i < families.size(); ++i) {
    const auto& f = families[i];
    INFO("family " << f.model_type);
    CHECK(static_cast<size_t>(f.type) == i);
    CHECK(std::string(to_string(f.type)) == f.model_type);
    CHECK(names.insert(f.model_type).second);
    // A config.json naming the family is read as it (the sizes every family needs; a
    // family's own required fields may still refuse it, naming them, never its model_type).
    const std::string json = std::string(R"({"model_type": ")") + f.model_type +
                             R"(", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100})";
    try {
      const ModelType parsed = ModelConfig::from_json(json).model_type;
      CHECK(parsed == f.type);
    } catch (const c10::Error& e) {
      CHECK_THAT(e.what_without_backtrace(), !Catch::Contains("model_type"));
    }
  }
  CHECK(families[static_cast<size_t>(ModelType::kQwen3Moe)].mixture_of_experts);
  CHECK_FALSE(families[static_cast<size_t>(ModelType::kGemma2)].mixture_of_experts);
}
