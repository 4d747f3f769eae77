#pragma once
// For tests tagged [cuda]: the runner excludes them where torch sees no GPU
// (tools/test.sh: ctest -LE cuda), so one that runs anyway fails, not passes.

#include <torch/cuda.h>

#include "support/tp_catch.h"

namespace tp::test {

/// Fails the running test unless torch sees a CUDA device.
inline void require_gpu() {
  if (!torch::cuda::is_available())
    FAIL("no CUDA device: run this test only on a GPU machine (the runner excludes [cuda])");
}

}  // namespace tp::test
