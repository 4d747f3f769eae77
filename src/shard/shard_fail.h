#pragma once
// Private to src/shard: builds a ShardError message from its parts and throws it.

#include <sstream>

#include "tp/shard/split.h"

namespace tp::detail {

template <class... Args>
[[noreturn]] void shard_fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw ShardError(os.str());
}

}  // namespace tp::detail
