#pragma once
// Which host each rank runs on, exchanged once, so shared memory is used only among
// ranks that can share it (host_identity.cpp).

#include <string>

#include "comm/communicator_state.h"
#include "tp/comm/communicator.h"

namespace tp::detail {

/// This process's host id: CommunicatorOptions::host_id if set, else the hostname
/// followed by the kernel's boot id (so two machines that share a hostname differ).
std::string local_host_id(const CommunicatorOptions& options);

/// On the first call: exchanges every rank's host id over the group (a collective:
/// every rank's first collective gets here) and fills s.host_ids and
/// s.ranks_on_one_host, the same on every rank. Later calls return at once. `op`
/// names the collective in errors.
void ensure_host_ids(const CommunicatorState& s, const char* op);

}  // namespace tp::detail
