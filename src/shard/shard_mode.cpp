#include "tp/shard/shard_mode.h"

namespace tp {

const char* to_string(ShardMode mode) { return mode == ShardMode::kColumn ? "COLUMN" : "ROW"; }

}  // namespace tp
