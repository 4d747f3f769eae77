#pragma once
// Which dimension of an [out, in] weight a tensor-parallel layer splits. A sharding
// concept (no torch): the loader reads by it, the quant formats align to it.

namespace tp {

/// Which dimension of an `[out, in]` weight a layer splits.
enum class ShardMode {
  kColumn,  ///< split dim 0 (output features): ColumnParallelLinear
  kRow,     ///< split dim 1 (input features): RowParallelLinear
};

/// "COLUMN" or "ROW".
const char* to_string(ShardMode mode);

}  // namespace tp
