#include "comm/run_collective.h"

#include <c10/util/Exception.h>

namespace tp::detail {

std::string op_name(const char* op) { return std::string("tp::Communicator::") + op; }

void collective_failed(const CommunicatorState& s, const char* op, const std::string& original) {
  TORCH_CHECK(false, op_name(op), " failed on rank ", s.rank, " of world_size ", s.world, " (timeout ",
              s.options.timeout.count(),
              " ms). Likely causes: a peer rank died or stopped calling collectives, or the ranks "
              "passed different shapes or dtypes to the same collective. The timeout is "
              "CommunicatorOptions::timeout (default from TP_COMM_TIMEOUT_MS). Do not use this "
              "communicator's group again: its connections are in an unknown state. Original "
              "error: ",
              original);
}

std::mutex& cpu_start_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace tp::detail
