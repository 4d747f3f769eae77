#pragma once
// Where the Hugging Face folders of tests/python/hf_fixtures.py are: TP_HF_FIXTURES
// when set (a folder made elsewhere), else the build's TP_HF_FIXTURE_DIR
// (tests/CMakeLists.txt writes them there before the tests run).

#include <string>

#include "common/env.h"

namespace tp::test {

inline std::string fixture_dir() { return tp::detail::env_value("TP_HF_FIXTURES").value_or(TP_HF_FIXTURE_DIR); }

}  // namespace tp::test
