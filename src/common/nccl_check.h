#pragma once
// The status check for NCCL calls (with common/cuda_check.h, the only place library
// return codes are turned into errors). Private to src/; only NCCL builds include it.

#include <c10/util/Exception.h>
#include <nccl.h>

/// TP_CHECK_NCCL(expr, context...): throws naming the call, NCCL's own message and
/// the context (at least one item, streamed into the message).
#define TP_CHECK_NCCL(expr, ...)                                                                                     \
  do {                                                                                                               \
    const ncclResult_t tp_status_ = (expr);                                                                          \
    TORCH_CHECK(tp_status_ == ncclSuccess, #expr, " failed: ", ncclGetErrorString(tp_status_), " in ", __VA_ARGS__); \
  } while (false)
