#pragma once
// all_reduce_fusion on CUDA tensors: after the group's all-reduce (NCCL), one kernel
// finishes every row - bias, residual, norm, per-token quantization - with the
// operations and roundings of the CPU epilogue (comm/all_reduce/fusion_rows.h), on the
// current stream. Compiled only with CUDA (fusion_epilogue.cu).

#include "comm/all_reduce/fusion_rows.h"

namespace tp::detail {

/// `rows`' pointers are device pointers; `sum` /* device */ is the all-reduced
/// [rows.rows, rows.hidden] tensor in rows.dtype.
void launch_fusion_epilogue_cuda(const FusionRows& rows, const void* sum);

}  // namespace tp::detail
