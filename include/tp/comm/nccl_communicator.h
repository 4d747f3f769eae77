#pragma once
// Communicators over NCCL, for ranks with one GPU each: c10d's ProcessGroupNCCL, or
// tp's own raw-NCCL backend (for C++ users who do not want c10d's NCCL group). Both
// are stream-ordered: collectives run on the current torch CUDA stream of the
// current device, so they follow the GEMMs that produced their input and can be
// captured in a CUDA graph.

#include <cstdint>
#include <string>

#include "tp/comm/communicator.h"

namespace c10d {
class Store;
}

namespace tp {

/// Which NCCL backend a communicator uses.
enum class NcclBackend {
  kProcessGroupNccl,  ///< c10d::ProcessGroupNCCL (its own streams, watchdog, flight recorder)
  kRaw,               ///< tp's backend: ncclUniqueId through the store, ops on the current stream
};

/// Whether this build can make NCCL communicators (built with CUDA and NCCL).
bool nccl_available();

/// Rank `rank` of `world` over NCCL on the CURRENT CUDA device (set it first, e.g.
/// with c10::cuda::set_device), meeting through `store`. `name` keeps several
/// communicators on one store apart (every rank passes the same name). NCCL allows
/// one rank per GPU per communicator: ranks as threads need a GPU each.
/// Example: auto comm = tp::make_nccl_communicator(store, rank, world);
Communicator make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                    CommunicatorOptions options = {},
                                    NcclBackend backend = NcclBackend::kProcessGroupNccl,
                                    const std::string& name = "tp");

}  // namespace tp
