#pragma once
// Catch2 for tests that use torch. c10/util/Logging.h defines a glog-style CHECK
// that aborts the process on failure; included after catch.hpp it silently
// replaces Catch's CHECK. So: torch first, drop its CHECK, then Catch (whose CHECK
// then stays, since Logging.h is include-guarded). Include this instead of
// <catch2/catch.hpp> in every test that includes a torch header.
#include <ATen/ATen.h>
#undef CHECK
#include <catch2/catch.hpp>
