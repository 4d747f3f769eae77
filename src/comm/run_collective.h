#pragma once
// Starting a collective, waiting for it at most the communicator's timeout, and turning
// any failure into one error that names the collective and the rank. Every collective
// of the comm area runs through run_collective.

#include <mutex>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/communicator_state.h"
#include "comm/nccl/nccl_strategy.h"

namespace tp::detail {

/// "tp::Communicator::<op>".
std::string op_name(const char* op);

/// Rethrows whatever a collective threw (or its timeout) as a c10::Error that says
/// which collective, where, and what usually causes it.
[[noreturn]] void collective_failed(const CommunicatorState& s, const char* op, const std::string& original);

/// Held while a CPU collective is being started (not while it runs). torch 2.11's
/// ProcessGroupGloo::enqueue records every op in the process-wide FlightRecorder, whose
/// recordWithResetEnabled reads and inserts into a std::map (all_pg_status_) before
/// taking its own lock: several groups of one process (run_ranks_in_threads) starting
/// collectives at once corrupt it (seen as a segfault in _Rb_tree_insert_and_rebalance).
/// Starting a Gloo op never waits for peers, so holding this cannot deadlock. Not
/// taken for device collectives: NCCL's first op initialises its communicator and
/// blocks until every rank arrives.
std::mutex& cpu_start_mutex();

/// Starts a collective with `start()` (returning a c10d::Work) and waits for it, at
/// most the configured timeout. `cpu`: the op runs on a CPU backend (see cpu_start_mutex).
template <typename Start>
void run_collective(const CommunicatorState& s, const char* op, bool cpu, Start&& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work;
    if (cpu) {
      std::lock_guard<std::mutex> lock(cpu_start_mutex());
      work = start();
    } else {
      work = start();
    }
    if (!cpu && current_stream_capturing()) {
      // Inside CUDA-graph capture the op exists only in the graph: no host wait (it
      // would query an event that is never recorded); the stream orders it.
      work->wait();
    } else {
      TORCH_CHECK(work->wait(s.options.timeout), "the collective did not complete within ", s.options.timeout.count(),
                  " ms");
    }
  } catch (const c10::Error& e) {
    collective_failed(s, op, e.what_without_backtrace());
  } catch (const std::exception& e) {
    collective_failed(s, op, e.what());
  }
}

/// A contiguous tensor's bytes as a 1-D uint8 view (so byte-moving collectives work
/// for every dtype, bool and complex included).
inline at::Tensor as_bytes(const at::Tensor& contiguous) { return contiguous.view({-1}).view(at::kByte); }

}  // namespace tp::detail
